"""What the page shows, as plain values: Markdown, HTML and figures from traces. No Gradio here.

Every function takes traces (and the `Look` of the screen) and returns text or a figure, so each
view is testable without a browser or a server. Visitor text and model output are always escaped
(`md_text`, `md_code`, `html.escape`): nothing a visitor types or a model writes becomes markup.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from decoding import available_drafters
from decoding.drafters.medusa_heads import fastest_tree_forecast
from decoding.limits import PAGE_LIMITS
from decoding.medusa_modules import heads_count
from decoding.model import LoadedModel
from decoding.race import RaceResult
from decoding.stats import round_cost, round_end_times, verify_cost
from decoding.trace import RoundTrace, RunTrace

from . import charts, eagle_views, lanes
from .eagle_figures import guessing_figure, round_tree_figure
from .eagle_views import NO_ACCURACY, GuessingAccuracy
from .figure_style import LAPTOP, Look, message_figure
from .models import describe
from .text import divided_as_printed, measured_curve, walkthrough_run
from .tokens import count, legend_html, md_code, md_text, stream_html
from .tree_figures import mask_figure
from .tree_layout import leaf_count

STOP_REASONS = {"max_new_tokens": "reached Max new tokens", "eos": "the model ended its text",
                "context_limit": "the context is full",
                "time_limit": f"reached this page's time limit ({PAGE_LIMITS.run_seconds:.0f} s a run)"}


def model_card(model: LoadedModel) -> str:
    drafters = ", ".join(label for label, _ in lanes.choices(available_drafters(model), short=True))
    return (f"**{md_text(describe(model.name))}** · {heads_count(model)} heads · {model.device} · "
            f"{str(model.dtype).removeprefix('torch.')} · context {model.context_length} tokens · "
            f"guesses from: {drafters}{expectation(model)}")


def expectation(model: LoadedModel) -> str:
    """What Medusa can show on this model and machine, before anything runs: the tokens a pass its
    heads' held-out accuracy promises, over what a pass of the tree chosen by it costs here
    (measured when the model loaded). Empty where either was not measured."""
    choice = fastest_tree_forecast(model)
    if choice is None:
        return ""
    reason = charts.rough_curve_reason(model.cost_curve)
    noisy = f"; the machine was busy then ({reason}), so this is rough" if reason else ""
    return (f"  \n**What to expect here**, with the fastest tree here ({md_text(choice.name)}): Medusa's heads "
            f"guess about {choice.expected_tokens:.2f} tokens a pass (their held-out accuracy), and a round costs "
            f"{choice.pass_cost + choice.draft_cost:.2f} one-token steps on this machine (a pass over its "
            f"{choice.nodes + 1} nodes, {choice.pass_cost:.2f}, and the heads' drafting, {choice.draft_cost:.2f}; "
            f"measured when the model loaded{noisy}): about **{choice.estimated_speedup:.2f}× at best**. A forecast: "
            "the race measures what a real answer gets, and the Stats tab divides its figures.")


# ----------------------------------------------------------------------------- the playground

def finished(trace: RunTrace) -> bool:
    """The run is over and timed: the engine yields the trace once more after its last round, with
    `total_time` set (the yield before it already has `stop_reason`)."""
    return bool(trace.stop_reason) and trace.total_time > 0


@dataclass(frozen=True)
class RunFacts:
    """A run's counts as its summary line tells them (`run_summary`)."""

    tokens: int
    passes: int  # passes of the model: the prefill's and one a round
    draft_passes: int  # passes of the drafter's own smaller network, counted apart
    from_prefill: int  # the prefill's token (0 where a round's tokens were all that was kept)
    from_rounds: int
    rounds: int
    tokens_per_round: float
    seconds: float  # measured once the run is over; until then, the clock at the last round
    tokens_per_second: float | None  # None while no time has passed
    finished: bool


def run_facts(trace: RunTrace) -> RunFacts:
    tokens = len(trace.tokens)
    added = sum(rnd.accepted_length for rnd in trace.rounds)
    done = finished(trace)
    seconds = trace.total_time if done else (round_end_times(trace)[-1] if trace.rounds else 0.0)
    per_second = trace.tokens_per_second if done else (tokens / seconds if seconds > 0 else None)
    return RunFacts(tokens, trace.forward_passes, sum(rnd.draft_passes for rnd in trace.rounds), tokens - added,
                    added, len(trace.rounds), trace.mean_accepted, seconds, per_second, done)


def run_summary(trace: RunTrace, first_round_after: float | None = None) -> str:
    """One line: tokens, passes, tokens per pass, measured time, and whether the run is over."""
    facts = run_facts(trace)
    reason = STOP_REASONS.get(trace.stop_reason, trace.stop_reason)
    state = f"stopped: {reason}" if facts.finished else "running…"
    if not trace.rounds:
        if not trace.stop_reason:
            return "Reading the prompt (the prefill pass)…"
        return (f"**{facts.tokens} token from the prefill pass alone**: the run {reason} "
                "before any round, so there is no tree to show. Raise *Max new tokens* to see one.")
    latency = f" · first round ready {first_round_after:.2f} s after Run" if first_round_after else ""
    # The drafter's own passes are passes of a smaller network: counted apart, never added in.
    own = (f", and {count(facts.draft_passes, 'pass', 'passes')} of {lanes.passes_of(trace.settings.method)}"
           if facts.draft_passes else "")
    if facts.finished:
        timing = f"{facts.seconds:.2f} s measured ({rate(facts.tokens_per_second)})"
    else:
        speed = f" ({rate(facts.tokens_per_second)})" if facts.tokens_per_second is not None else ""
        timing = f"{facts.seconds:.2f} s so far{speed}"
    if trace.stop_reason == "time_limit":
        state += f" after {facts.tokens} of the {trace.settings.max_new_tokens} tokens asked for"
    origin = f" ({trace.drafter.origin})" if trace.drafter and trace.drafter.origin else ""
    return (f"{lanes.title(trace.settings.method)}{origin} · **{count(facts.tokens, 'token')} in "
            f"{count(facts.passes, 'pass', 'passes')} of the model**{own}: {facts.from_prefill} from the prefill + "
            f"{facts.from_rounds} from {count(facts.rounds, 'round')}, **{facts.tokens_per_round:.2f} tokens per "
            f"round** · {timing}{load_clause(trace)} · {state}{latency}{idle_clause(trace, facts.finished)}")


def idle_clause(trace: RunTrace, finished: bool) -> str:
    """After a run in which the drafter proposed nothing in most rounds: how often, and what to try
    (its declared `idle_hint`); empty otherwise."""
    hint = lanes.idle_hint(trace.settings.method)
    idle = sum(1 for rnd in trace.rounds if rnd.tree_size <= 1)
    if not finished or not hint or not trace.detailed or idle * 2 <= len(trace.rounds):
        return ""
    return (f"  \nⓘ {lanes.title(trace.settings.method)} had nothing to propose in {idle} of "
            f"{count(len(trace.rounds), 'round')}: {hint}.")


def rate(tokens_per_second: float) -> str:
    """A speed as the page prints it: whole tokens a second, one decimal below ten."""
    return f"{tokens_per_second:.1f} tokens/s" if tokens_per_second < 10 else f"{tokens_per_second:.0f} tokens/s"


def load_clause(trace: RunTrace) -> str:
    """Beside a run's time, where the machine was busy when it started: how busy, and the threads
    it ran on instead (measure.stream_on_free_cores); empty on a quiet machine."""
    load = trace.load
    if load is None or not load.busy:
        return ""
    fewer = (f", so it ran on {count(load.threads, 'thread')} instead of {trace.threads_before}"
             if trace.threads_before and load.threads < trace.threads_before else "")
    return f" · ⚠ other programs held {load.others:.1f} of {load.cores} cores{fewer}"


def refusal_text(error: Exception, what: str = "run", earlier: bool = False) -> str:
    """The status line of a run (or race) that could not start or stopped on an error; `earlier`:
    the figures below still show the one before."""
    note = f" What is shown below is still your last {'run' if what == 'run' else 'race'}." if earlier else ""
    return f"⚠ **Not {what}:** {md_text(str(error))}.{note}"


def drafting_text(trace: RunTrace, rnd: RoundTrace) -> str:
    """What the drafter did this round, before the verify pass: its own words where it says them,
    EAGLE's draft, or the passes of its own it ran (nothing for Medusa's heads, whose guesses the
    tree shows)."""
    method, guesses = trace.settings.method, rnd.tree_size - 1
    if rnd.drafting_note:  # the drafter's own words
        return f"{md_text(rnd.drafting_note)} · "
    if method == lanes.EAGLE:
        return eagle_views.drafting_text(rnd)
    if not rnd.draft_passes:
        return ""
    return (f"{lanes.passes_of(method)} wrote {count(guesses, 'guess', 'guesses')} in "
            f"**{count(rnd.draft_passes, 'pass', 'passes')}** of its own (**{rnd.time_draft * 1e3:.1f} ms**) · ")


@dataclass(frozen=True)
class RoundFacts:
    """One round's numbers as its details tell them (`round_info`), as measured."""

    number: int  # from 1
    rounds: int
    verified: int | None  # the nodes its one pass verified; None: a plain step, no tree
    paths: int | None  # that tree's candidate paths (1: a chain)
    accepted_guesses: int | None
    added: int  # the tokens it added: `guessed` from the drafter, `from_base` from the base model
    guessed: int
    from_base: int
    cut: bool  # cut short by the token limit (or an end-of-text token): fewer added than accepted
    sampled_over: str | None  # the base model's most likely token where the next one was sampled
    draft_ms: float
    verify_ms: float
    accept_ms: float
    done_at: float  # seconds into the run


def round_facts(trace: RunTrace, index: int) -> RoundFacts:
    rnd = trace.rounds[index]
    tree = trace.round_tree(rnd)
    guessed = sum(rnd.emitted_from_drafter)
    verified = paths = accepted = sampled_over = None
    if tree is not None and rnd.tree_size:
        verified, paths, accepted = rnd.tree_size, leaf_count(tree.parents), len(rnd.accepted_nodes) - 1
        last = rnd.accepted_nodes[-1]
        argmax = rnd.base_argmax_tokens[last] if rnd.base_argmax_tokens else None
        if rnd.next_token is not None and argmax is not None and rnd.next_token != argmax:
            sampled_over = rnd.base_argmax_texts[last]
    cut = accepted is not None and rnd.accepted_length < accepted + 1
    return RoundFacts(index + 1, len(trace.rounds), verified, paths, accepted, rnd.accepted_length, guessed,
                      rnd.accepted_length - guessed, cut, sampled_over, rnd.time_draft * 1e3,
                      rnd.time_verify * 1e3, rnd.time_accept * 1e3, round_end_times(trace)[index])


def round_info(trace: RunTrace, index: int) -> str:
    """The numbers of one round, as measured."""
    rnd, facts = trace.rounds[index], round_facts(trace, index)
    method = trace.settings.method
    tokens = " ".join(md_code(t, 14) for t in rnd.emitted_texts)
    if facts.verified is not None:
        tried = drafting_text(trace, rnd) + (
            "verified **the root alone** in one pass (a plain step) · " if facts.verified == 1 else
            f"verified **{facts.verified} tree nodes** "
            f"({'a chain' if facts.paths == 1 else f'{facts.paths} candidate paths'}) "
            f"in one pass · accepted **{count(facts.accepted_guesses, 'guess', 'guesses')}** · ")
        cut = " (cut at the end of the run)" if facts.cut else ""
        chosen = f" · ★ next token {md_code(rnd.next_text, 14)}"
        if facts.sampled_over is not None:
            chosen += f", sampled (the most likely was {md_code(facts.sampled_over, 14)})"
    else:
        tried, cut, chosen = "one pass · ", "", ""
    return (f"**Round {facts.number} of {facts.rounds}** ({lanes.title(method)}) · {tried}added "
            f"**{count(facts.added, 'token')}**{cut}: {facts.guessed} from {lanes.who_guessed(method)} + "
            f"{facts.from_base} from the base model: {tokens}{chosen}  \n"
            f"Measured: draft {facts.draft_ms:.1f} ms · verify {facts.verify_ms:.1f} ms · "
            f"accept {facts.accept_ms:.1f} ms · done {facts.done_at:.3f} s into the run")


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
    if not trace.rounds or trace.round_tree(trace.rounds[-1]) is None:
        waiting = ("No round ran: the run stopped after the prefill's token."
                   if trace.stop_reason else "The candidate tree appears after the first round.")
        return RoundView("", message_figure(waiting, look), message_figure("…and here, its attention mask.", look))
    index = clamp_round(trace, index)
    rnd = trace.rounds[index]
    tree = trace.round_tree(rnd)
    return RoundView(round_info(trace, index), round_tree_figure(tree, rnd, look), mask_figure(tree, rnd, look))


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
    depth = max(trace.tree.depths) if trace.tree is not None else charts.deepest_guess(trace)
    ended = f' data-ended="{ended_at:.3f}"' if ended_at is not None else ""
    # data-run tells one run's output from the next (same prompt, same text) in browser tests.
    return (f'<div data-run="{id(trace)}"{ended}>{legend_html(trace.settings.method, depth)}'
            f'{stream_html(trace, caret=not trace.stop_reason, current=current)}</div>')


# ----------------------------------------------------------------------------- stats and learn

def stats_text(run: RunTrace | None, race: RaceResult | None) -> str:
    if run is None or not run.rounds:
        return "Press **Run** (and then **Race**) to fill this page."
    method, name = run.settings.method, lanes.title(run.settings.method)
    text = f"{name} added **{run.mean_accepted:.2f} tokens per pass** over {len(run.rounds)} rounds. "
    if race is None or method not in race.lanes:
        return text + f"Run the **Race** (with {name} ticked) to measure the wall-clock speedup beside it."
    ar, lane, spread = race.timing("ar"), race.timing(method), race.spread(method)
    cost, verify = round_cost(ar, lane), verify_cost(ar, lane)
    text += (f"Over the {spread.count} race(s), {lanes.in_sentence(method)} added {lane.tokens_per_pass:.2f} "
             "tokens per pass, "
             f"but a round (drafting, verifying {_tree_nodes(run)}, accepting) cost **{cost:.2f}×** "
             f"a plain decoding step (both measured), so the speedup is about {lane.tokens_per_pass:.2f} ÷ "
             f"{cost:.2f} ≈ **{divided_as_printed(lane.tokens_per_pass, cost)}×**, not {lane.tokens_per_pass:.2f}× "
             f"(measured: median **{spread.median:.2f}×**, range {spread.low:.2f}–{spread.high:.2f}×)."
             if cost else "")
    if verify:  # a plain run that stopped after its first token has no step to compare with
        text += (f" Of that round, the verify pass cost {verify:.2f}× and the rest {cost - verify:.2f}× "
                 f"(drafting alone {race.draft_cost(method):.2f}×, then accepting and bookkeeping): even with "
                 f"free drafting, the ceiling is {lane.tokens_per_pass:.2f} ÷ {verify:.2f} ≈ "
                 f"**{divided_as_printed(lane.tokens_per_pass, verify)}×** (Learn's speedup step divides the same "
                 "totals; the model card's \"at best\" is a forecast made before any run).")
    return text


def _tree_nodes(run: RunTrace) -> str:
    """The tree a round verified: the run's, or EAGLE's new one each round, on average."""
    if run.tree is not None:
        return f"up to {run.tree.size} nodes"
    return f"{eagle_views.mean_tree_size(run):.1f} nodes on average"


STATS_FIGURES = ("histogram", "depths", "speed")  # the Stats tab's figures, by name


def stats_figures(run: RunTrace | None, race: RaceResult | None, look: Look = LAPTOP) -> dict[str, go.Figure]:
    """The Stats tab's figures by name (STATS_FIGURES): tokens per pass, acceptance per depth, speed."""
    if run is None or not run.rounds:
        return dict.fromkeys(STATS_FIGURES, message_figure("Press Run to collect statistics.", look))
    return {"histogram": charts.accepted_histogram(run, look), "depths": charts.head_acceptance_figure(run, look),
            "speed": charts.speed_figure(run, race, look)}


SMALL_MODEL_NOTE = ("  \n<small>A small model like this one states false facts with confidence. Medusa changes "
                    "how fast it writes, never what it says: with greedy acceptance, its text is plain "
                    "decoding's, token for token.</small>")


def learn_banner(run: RunTrace | None, race: RaceResult | None) -> str:
    return _learn_source(run, race) + SMALL_MODEL_NOTE


LEARN_FIGURES = ("cost-curve", "guessing")  # the walkthrough's own figures, by the name a step gives


def learn_figures(run: RunTrace | None, race: RaceResult | None, look: Look = LAPTOP,
                  accuracy: GuessingAccuracy = NO_ACCURACY) -> dict[str, go.Figure]:
    """The walkthrough's own figures, by the name a step gives for its figure (`Step.figure`): the
    measured cost of a T-token pass ("cost-curve"), and Medusa's heads and EAGLE guessing ahead,
    side by side, held-out and on the visitor's runs ("guessing")."""
    guessing = guessing_figure(accuracy, eagle_views.medusa_run(run, race), eagle_views.eagle_run(run, race), look)
    if run is None and race is None:
        return {"cost-curve": message_figure("Press Run: what a pass over T tokens<br>costs on this machine "
                                             "appears here.", look, height=260), "guessing": guessing}
    medusa = walkthrough_run(run, race)
    nodes = medusa.tree.size if medusa is not None and medusa.tree is not None else None
    return {"cost-curve": charts.cost_curve_figure(measured_curve(run, race), nodes, look), "guessing": guessing}


def _learn_source(run: RunTrace | None, race: RaceResult | None) -> str:
    if run is None:
        return "Press **Run** (and then **Race**): the numbers in these steps come from your own run."
    medusa = walkthrough_run(run, race)
    if medusa is None:
        told = " Step 7, *After Medusa*, tells this EAGLE run." if run.settings.method == lanes.EAGLE else ""
        return (f"Your last run used {lanes.in_sentence(run.settings.method)}; these steps follow Medusa's "
                f"heads. Pick *Medusa heads* and press **Run** (or race with Medusa ticked) to fill them in.{told}")
    race_note = "" if race else " Run the **Race** to fill in the timing numbers too."
    prompt = medusa.prompt if len(medusa.prompt) <= 60 else medusa.prompt[:59] + "…"
    source = "your last run" if medusa is run else "the Medusa lane of your last race"
    return f"The numbers below come from {source}: *{md_text(prompt)}* on {md_text(medusa.model)}.{race_note}"
