"""What the page shows, as plain values: Markdown, HTML and figures from traces. No Gradio here.

Every function takes traces (and the `Look` of the screen) and returns text or a figure, so each
view is testable without a browser or a server. Visitor text and model output are always escaped
(`md_text`, `md_code`, `html.escape`): nothing a visitor types or a model writes becomes markup.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from decoding.model import MedusaModel
from decoding.stats import Timing, round_cost, round_end_times, verify_cost
from decoding.trace import RunTrace

from . import charts
from .figure_style import LAPTOP, Look, message_figure
from .models import describe
from .race import RaceFrame, RaceResult
from .tokens import legend_html, md_code, md_text, stream_html
from .tree_figures import mask_figure, next_token_text, tree_figure
from .tree_layout import leaf_count

STOP_REASONS = {"max_new_tokens": "reached Max new tokens", "eos": "the model ended its text",
                "context_limit": "the context is full"}


def model_card(model: MedusaModel) -> str:
    return (f"**{md_text(describe(model.name))}** · {model.num_heads} heads · {model.device} · "
            f"{str(model.dtype).removeprefix('torch.')} · context {model.context_length} tokens")


# ----------------------------------------------------------------------------- the playground

def run_summary(trace: RunTrace, first_round_after: float | None = None) -> str:
    """One line: tokens, passes, tokens per pass, measured time, and whether the run is over."""
    state = f"stopped: {STOP_REASONS.get(trace.stop_reason, trace.stop_reason)}" if trace.stop_reason else "running…"
    if not trace.rounds:
        if not trace.stop_reason:
            return "Reading the prompt (the prefill pass)…"
        return (f"**{len(trace.tokens)} token from the prefill pass alone**: the run {state.removeprefix('stopped: ')} "
                "before any Medusa round, so there is no tree to show. Raise *Max new tokens* to see one.")
    latency = f" · first round ready {first_round_after:.2f} s after Run" if first_round_after else ""
    tokens = len(trace.tokens)
    return (f"**{tokens} tokens in {trace.forward_passes} passes** (1 prefill + {len(trace.rounds)} rounds) · "
            f"**{trace.mean_accepted:.2f} tokens per pass** · {trace.total_time:.2f} s measured "
            f"({trace.tokens_per_second:.0f} tokens/s) · {state}{latency}")


def round_info(trace: RunTrace, index: int) -> str:
    """The numbers of one round, as measured."""
    rnd = trace.rounds[index]
    from_heads = sum(rnd.emitted_from_heads)
    from_base = rnd.accepted_length - from_heads
    tokens = " ".join(md_code(t, 14) for t in rnd.emitted_texts)
    if trace.tree is not None and rnd.tree_size:
        accepted = len(rnd.accepted_nodes) - 1
        tried = (f"verified **{rnd.tree_size} tree nodes** ({leaf_count(trace.round_tree(rnd).parents)} candidate "
                 f"paths) in one pass · accepted **{accepted} guess(es)** · ")
        # The last round may be cut short by the token limit (or end at an end-of-text token).
        cut = " (cut at the end of the run)" if rnd.accepted_length < accepted + 1 else ""
        chosen = f" · ★ next token {md_code(next_token_text(rnd), 14)}"
        argmax = rnd.base_argmax_tokens[rnd.accepted_nodes[-1]] if rnd.base_argmax_tokens else None
        if rnd.next_token is not None and argmax is not None and rnd.next_token != argmax:
            chosen += (f", sampled (the most likely was "
                       f"{md_code(rnd.base_argmax_texts[rnd.accepted_nodes[-1]], 14)})")
    else:
        tried, cut, chosen = "one pass · ", "", ""
    return (f"**Round {index + 1} of {len(trace.rounds)}** · {tried}added **{rnd.accepted_length} "
            f"token(s)**{cut}: {from_heads} from heads + {from_base} from the base model: {tokens}{chosen}  \n"
            f"Measured: draft {rnd.time_draft * 1e3:.1f} ms · verify {rnd.time_verify * 1e3:.1f} ms · "
            f"accept {rnd.time_accept * 1e3:.1f} ms · done {round_end_times(trace)[index]:.3f} s into the run")


@dataclass(frozen=True)
class RoundView:
    """Everything that changes when the visitor steps to another round."""

    info: str
    tree: go.Figure
    mask: go.Figure


def round_view(trace: RunTrace | None, index: int, look: Look = LAPTOP) -> RoundView:
    """Round `index` (0-based, clamped) of a run; a message where there is no round to show."""
    if trace is None:
        return RoundView("", message_figure("Press Run to see the candidate tree.", look),
                         message_figure("…and here, its attention mask.", look))
    if trace.tree is None or not trace.rounds:
        waiting = ("No Medusa round ran: the run stopped after the prefill's token."
                   if trace.stop_reason else "The candidate tree appears after the first round.")
        return RoundView("", message_figure(waiting, look), message_figure("…and here, its attention mask.", look))
    index = clamp_round(trace, index)
    rnd = trace.rounds[index]
    tree = trace.round_tree(rnd)
    return RoundView(round_info(trace, index), tree_figure(tree, rnd, look), mask_figure(tree, rnd, look))


def clamp_round(trace: RunTrace | None, index: int) -> int:
    rounds = len(trace.rounds) if trace else 0
    return max(0, min(index, rounds - 1))


def round_label(trace: RunTrace | None) -> str:
    rounds = len(trace.rounds) if trace else 0
    return f"Round (of {rounds})" if rounds else "Round (no rounds yet)"


def stream_view(trace: RunTrace | None, current: int | None = None, ended_at: float | None = None) -> str:
    """The output stream with its colour key; `current` marks a round, `ended_at` (the server's
    clock when the run ended, in seconds since the epoch) lets a browser benchmark time the drawing."""
    if trace is None:
        return stream_html(None)
    heads = trace.settings.num_heads or 0
    ended = f' data-ended="{ended_at:.3f}"' if ended_at is not None else ""
    # data-run tells one run's output from the next (same prompt, same text) in browser tests.
    return (f'<div data-run="{id(trace)}"{ended}>{legend_html(heads)}'
            f'{stream_html(trace, caret=not trace.stop_reason, current=current)}</div>')


# ----------------------------------------------------------------------------- stats and learn

def stats_text(run: RunTrace | None, race: RaceResult | None) -> str:
    if run is None or not run.rounds:
        return "Press **Run** (and then **Race**) to fill this page."
    text = f"Medusa added **{run.mean_accepted:.2f} tokens per pass** over {len(run.rounds)} rounds. "
    if race is None:
        return text + "Run the **Race** to measure the wall-clock speedup beside it."
    ar, medusa, spread = race.ar_timing, race.medusa_timing, race.spread
    cost, verify = round_cost(ar, medusa), verify_cost(ar, medusa)
    text += (f"Over the {spread.count} race(s), Medusa added {medusa.tokens_per_pass:.2f} tokens per pass, "
             f"but a round over the {run.tree.size}-node tree cost **{cost:.2f}×** a plain decoding step "
             f"(both measured), so the speedup is about {medusa.tokens_per_pass:.2f} ÷ {cost:.2f} ≈ "
             f"**{medusa.tokens_per_pass / cost:.2f}×**, not {medusa.tokens_per_pass:.2f}× "
             f"(measured: median **{spread.median:.2f}×**, range {spread.low:.2f}–{spread.high:.2f}×)."
             if cost else "")
    if verify:  # a plain run that stopped after its first token has no step to compare with
        text += (f" Of that round, the verify pass over the whole tree cost {verify:.2f}× and drafting, "
                 f"accepting and bookkeeping {cost - verify:.2f}×: even with free drafting, the ceiling is "
                 f"{medusa.tokens_per_pass:.2f} ÷ {verify:.2f} ≈ **{medusa.tokens_per_pass / verify:.2f}×**.")
    return text


def stats_figures(run: RunTrace | None, race: RaceResult | None, look: Look = LAPTOP) -> tuple[go.Figure, ...]:
    if run is None or not run.rounds:
        empty = message_figure("Press Run to collect statistics.", look)
        return empty, empty, empty
    return (charts.accepted_histogram(run, look), charts.head_acceptance_figure(run, look),
            charts.speed_figure(run, race, look))


def learn_banner(run: RunTrace | None, race: RaceResult | None) -> str:
    if run is None:
        return "Press **Run** (and then **Race**): the numbers in these steps come from your own run."
    race_note = "" if race else " Run the **Race** to fill in the timing numbers too."
    prompt = run.prompt if len(run.prompt) <= 60 else run.prompt[:59] + "…"
    return f"The numbers below come from your last run: *{md_text(prompt)}* on {md_text(run.model)}.{race_note}"


# ----------------------------------------------------------------------------- the race

RACE_IDLE = "Press **Race vs plain** to measure both decoders on this prompt."


def race_status(frame: RaceFrame) -> str:
    """Where the race is: the visitor waits tens of seconds for a real model, so say what runs."""
    if frame.phase == "warm-up":
        return f"Warming up both decoders (a short run of each), then {frame.races} race(s)…"
    if frame.phase == "measuring":
        who = "plain decoding" if frame.measuring == "ar" else "Medusa"
        return (f"Race {frame.finished + 1} of {frame.races}: measuring **{who}** alone… "
                f"(the page waits so it does not slow the run down)")
    if frame.phase == "replaying":
        return "▶ Replaying the median race side by side, in real time, on its measured clock."
    return f"✓ Done: {frame.races} race(s) after a warm-up, each decoder measured alone."


def race_pane(title: str, trace: RunTrace | None, clock: float) -> str:
    if trace is None:
        return (f'<div class="pane"><div class="pane-head">{title}</div>'
                '<div class="stream stream-empty">waiting…</div></div>')
    times, counts = charts.timeline(trace)
    passes = sum(1 for t in times[1:] if t <= clock)  # the first point is the start, not a pass
    end = times[-1]
    finished = f" · done in {end:.2f} s" if clock >= end else ""
    return (f'<div class="pane"><div class="pane-head">{title}<span>{counts[passes]} tokens · '
            f"{passes} passes{finished}</span></div>"
            f"{stream_html(trace, until=clock, show_prompt=False, caret=clock < end)}</div>")


def race_verdict(result: RaceResult | None) -> str:
    """The headline: the median speedup with its range, said plainly when the range crosses 1.0×."""
    if result is None:
        return ""
    spread = result.spread
    ar, medusa = result.shown
    if spread.count == 1:
        headline = f"**Medusa: {spread.median:.2f}× the speed of plain decoding** in a single race"
        caveat = " One race is noisy: race 3-5 times for a median you can quote."
    else:
        headline = (f"**Medusa: {spread.median:.2f}× the speed of plain decoding** (median of {spread.count} "
                    f"races; range {spread.low:.2f}–{spread.high:.2f}×)")
        if spread.crosses:
            caveat = (" **The range crosses 1.0×:** Medusa was faster in some races and slower in others, "
                      "so on this machine, now, it is not clearly faster.")
        elif spread.high < 1.0:
            caveat = " Every race was slower than plain decoding here."
        else:
            caveat = " Every race was faster."
    return (f"{headline} on {md_text(medusa.device)} ({md_text(medusa.model)}).{caveat}  \n"
            f"In the median race: Medusa {medusa.forward_passes} passes for {len(medusa.tokens)} tokens, "
            f"plain decoding {ar.forward_passes} passes for {len(ar.tokens)} tokens; "
            f"{Timing.of(ar).seconds:.2f} s → {Timing.of(medusa).seconds:.2f} s of decoding.")


@dataclass(frozen=True)
class RaceView:
    status: str
    ar_pane: str
    medusa_pane: str
    figure: go.Figure
    verdict: str


def race_view(frame: RaceFrame, look: Look = LAPTOP) -> RaceView:
    ar, medusa = frame.shown
    figure = (charts.race_figure(frame.result, until=frame.clock, look=look) if frame.result
              else message_figure("Measuring… the median race is replayed here once every race has run.", look))
    return RaceView(
        race_status(frame),
        race_pane("Plain decoding (one token per pass)", ar, frame.clock),
        race_pane("Medusa", medusa, frame.clock),
        figure,
        race_verdict(frame.result) if frame.result else "",
    )
