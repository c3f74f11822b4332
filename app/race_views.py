"""The Race tab's views: where the race is, one row per lane on one clock, and the verdict with
each lane's measured figures. Plain values from traces; no Gradio here."""

from __future__ import annotations

import html
from dataclasses import dataclass

import plotly.graph_objects as go

from decoding.baseline import OWN
from decoding.drafters import drafter_class
from decoding.measure import busy_note
from decoding.race import PLAIN, RaceFrame, RaceResult, lane_order
from decoding.stats import Spread, round_cost, spread
from decoding.trace import RunTrace

from . import charts, eagle_views, lanes
from .figure_style import LAPTOP, Look, message_figure
from .tokens import count, md_text, stream_html

RACE_IDLE = "Press **Race vs plain** to measure plain decoding and every ticked drafter on this prompt."


def race_status(frame: RaceFrame) -> str:
    """Where the race is: the visitor waits tens of seconds for a real model, so say what runs,
    who is ahead so far and about how long the rest takes (from what the race has measured)."""
    count = len(frame.lanes)
    if frame.phase == "warm-up":
        return f"Warming up {count} lanes (a short run of each), then {frame.races} race(s)…"
    if frame.phase == "measuring":
        runs_each = len(frame.done) or count  # the lanes, and plain decoding in its other variants
        place = lane_order(list(frame.done) or frame.lanes, frame.finished).index(frame.measuring) + 1
        run, runs = frame.finished * runs_each + place, frame.races * runs_each
        left = f" · about {frame.left:.0f} s left" if frame.left is not None else ""
        return (f"Race {frame.finished + 1} of {frame.races}: measuring **{_run_title(frame.measuring)}** alone "
                f"(run {place} of {runs_each} in this race; {run} of {runs}){left}… "
                f"(the page waits so it does not slow the run down)  \n{_lane_progress(frame)}{_leader(frame)}")
    if frame.phase == "replaying":
        pace = f" at {frame.pace:.1f}× real speed" if frame.pace > 1 else ""
        return f"▶ Replaying the median race{pace}, every lane on its own measured clock, side by side."
    return (f"✓ Done: {frame.races} race(s) of {count} lanes after a warm-up, each lane measured alone, "
            "in an order that rotates from race to race.")


def _run_title(run: str) -> str:
    """A lane's title, or for plain decoding in another variant (`baseline.rival_run`) its own."""
    lane, _, variant = run.partition("@")
    return f"{lanes.title(lane)} in {variant}" if variant else lanes.title(lane)


def waiting_text(frame: RaceFrame) -> str:
    """The race as another visitor's page tells it while they wait: which race, who leads."""
    names = ", ".join(lanes.title(lane) for lane in frame.lanes)
    where = {"warm-up": "warming up", "measuring": f"race {frame.finished + 1} of {frame.races}",
             "replaying": "replaying", "done": "done"}[frame.phase]
    lead = f"; {lanes.title(frame.leader)} leads at {frame.lead:.2f}×" if frame.leader else ""
    return f"race ({names}: {where}{lead})"


def _leader(frame: RaceFrame) -> str:
    """Who is ahead after the races measured so far."""
    if not frame.leader:
        return ""
    return (f"  \nSo far ({frame.finished} race{'s' if frame.finished != 1 else ''}): "
            f"**{lanes.title(frame.leader)}** leads at {frame.lead:.2f}× the fastest plain decoding's speed.")


def _lane_progress(frame: RaceFrame) -> str:
    """Each lane's races: ● measured, ◐ running now, ○ still to run."""
    def marks(lane: str) -> str:
        done = frame.done.get(lane, 0)
        running = int(lane == frame.measuring)
        return "●" * done + "◐" * running + "○" * (frame.races - done - running)
    return " · ".join(f"{lanes.title(lane)} {marks(lane)}" for lane in frame.lanes)


def lane_note(lane: str, trace: RunTrace | None) -> str:
    """A lane's settings in a few words, from its trace."""
    if lane == PLAIN:
        return "one token per pass"
    if trace is None:
        return ""
    settings = trace.settings
    if lane == lanes.EAGLE:
        return eagle_views.lane_note(trace)
    return drafter_class(lane).shape(settings)


def lane_row(lane: str, trace: RunTrace | None, clock: float) -> str:
    """One lane of the replay: its name, what it has written by `clock`, and its counts."""
    note = lane_note(lane, trace)
    name = f"<div>{lanes.title(lane)}" + (f" <small>({html.escape(note)})</small>" if note else "") + "</div>"
    if trace is None:
        return (f'<div class="lane" data-lane="{lane}" style="--lane:{lanes.colour(lane)}">'
                f'<div class="pane-head">{name}</div><div class="stream stream-empty">waiting…</div></div>')
    times, counts = charts.timeline(trace)
    passes = sum(1 for t in times[1:] if t <= clock)  # the first point is the start, not a pass
    end = times[-1]
    finished = f" · done in {end:.2f} s" if clock >= end else ""
    so_far = f"{count(counts[passes], 'token')} · {count(passes, 'pass', 'passes')}{finished}"
    return (f'<div class="lane" data-lane="{lane}" style="--lane:{lanes.colour(lane)}">'
            f'<div class="pane-head">{name}<span>{so_far}</span></div>'
            f"{stream_html(trace, until=clock, show_prompt=False, caret=clock < end)}</div>")


def lanes_html(frame: RaceFrame) -> str:
    shown = frame.shown
    rows = "".join(lane_row(lane, shown.get(lane), frame.clock) for lane in frame.lanes)
    return f'<div class="lanes">{rows}</div>'


def _range(spread: Spread) -> str:
    median = f"{spread.median:.2f}×"
    return median if spread.count == 1 else f"{median} ({spread.low:.2f}–{spread.high:.2f}×)"


def lane_table(result: RaceResult) -> str:
    """Per lane, as measured: passes and tokens in the median race, tokens per pass over every race,
    a round's cost and its drafting alone in plain steps, and the speedup's median and range."""
    plain = result.timing(PLAIN)
    rows = ["| lane | passes (tokens) | tokens / pass | round cost | drafting / round | speedup: median (range) |",
            "|:--|--:|--:|--:|--:|--:|"]
    for lane in result.lanes:
        trace, timing = result.shown[lane], result.timing(lane)
        drafting = "—" if lane == PLAIN else f"{result.draft_cost(lane):.2f}"
        own_baseline = lane == PLAIN and result.baseline == OWN
        speed = "1× by definition" if own_baseline else _range(result.spread(lane))
        rows.append(f"| {lanes.title(lane)} | {trace.forward_passes} ({len(trace.tokens)}) | "
                    f"{timing.tokens_per_pass:.2f} | {round_cost(plain, timing):.2f} | {drafting} | {speed} |")
    rows.append("\n<small>Passes and tokens: the median race. The rest over every race; round cost and "
                "drafting in plain decoding steps (a plain step = 1.00).</small>")
    rows.append(f"\n{baseline_line(result)}")
    return "\n".join(rows)


def _against_medusa(result: RaceResult) -> str:
    """Said plainly where another drafter beat Medusa's heads on this prompt."""
    fastest = result.fastest()
    if lanes.MEDUSA not in result.drafters or fastest == lanes.MEDUSA:
        return ""
    theirs, ours = result.spread(fastest), result.spread(lanes.MEDUSA)
    noise = "; their ranges overlap, so the gap may be noise" if result.overlap(fastest, lanes.MEDUSA) else ""
    return (f"  \n**Medusa was not the fastest here:** {lanes.in_sentence(fastest)} reached "
            f"**{theirs.median:.2f}×** against Medusa's {ours.median:.2f}× (medians){noise}.")


SAME_TEXT = "Every lane wrote exactly plain decoding's text (greedy acceptance changes nothing but speed)."


def _same_text(result: RaceResult) -> str:
    differing = result.differing()
    if differing:
        where = ", ".join(f"{lanes.in_sentence(lane)} in race {number}" for lane, number in differing)
        return (f"**⚠ Not the same text:** {where} wrote other tokens than plain decoding. Greedy speculative "
                "decoding should write exactly what plain decoding writes: either two tokens were nearly tied "
                "and verifying several tokens in one pass (a different order of arithmetic) tipped the choice, "
                "or this is a bug worth reporting.")
    if all(race[PLAIN].settings.acceptance == "greedy" for race in result.races):
        return SAME_TEXT
    return "Sampling: each lane drew its own text, from the base model's distribution."


def baseline_line(result: RaceResult) -> str:
    """Which plain decoding the speedups count against, and the others timed beside it."""
    others = [f"{result.baseline_words[name]} {_range(spread(result.plain_speedups(name)))}"
              for name in result.plain_runs(0) if name != result.baseline]
    beside = f" (timed beside it: {'; '.join(others)})" if others else ""
    return (f"<small>Speedups count against the fastest plain decoding measured in these races: "
            f"**{result.baseline_name}**{beside}.</small>")


ONE_RACE_CAVEAT = " One race is noisy: race 3-5 times for a median you can quote."


def race_verdict(result: RaceResult | None) -> str:
    """The headline (the focus drafter's median speedup and range, said plainly when the range
    crosses 1.0×), where Medusa lost, each lane's figures, and whether the texts agree."""
    if result is None:
        return ""
    focus, spread = result.focus, result.spread(result.focus)
    name, trace = lanes.title(focus), result.shown[focus]
    if spread.count == 1:
        headline = f"**{name}: {spread.median:.2f}× the speed of plain decoding** in a single race"
        caveat = ONE_RACE_CAVEAT
    else:
        headline = (f"**{name}: {spread.median:.2f}× the speed of plain decoding** (median of {spread.count} "
                    f"races; range {spread.low:.2f}–{spread.high:.2f}×)")
        caveat = RANGE_CAVEATS[range_reading(spread)].format(name=name)
    busy = busy_note(result.load, result.threads_before)
    busy = f'\n\n<div class="busy-note" data-others="{result.load.others:.2f}">⚠ {busy}</div>' if busy else ""
    return (f"{headline} on {md_text(trace.device)} ({md_text(trace.model)}).{caveat}{_against_medusa(result)}"
            f"{busy}\n\n{lane_table(result)}\n\n{_same_text(result)}")


# What the range of several races says, by `range_reading`; {name} is the lane's.
RANGE_CAVEATS = {
    "slower": " Every race was slower than plain decoding here.",
    "faster": " Every race was faster.",
    "even": " Every race ran at plain decoding's speed.",
    "crosses": (" **The range crosses 1.0×:** {name} was faster in some races and slower in others, "
                "so on this machine, now, it is not clearly faster."),
    "reaches": (" **The range reaches 1.0×:** {name} was not faster in every race, "
                "so on this machine, now, it is not clearly faster."),
}


def range_reading(spread: Spread) -> str:
    """Where the range of several races lies against 1.0× (a key of RANGE_CAVEATS), read from the
    figures as printed: a slowest race of 0.998× is printed 1.00×, and is not called slower."""
    low, high = round(spread.low, 2), round(spread.high, 2)
    if high < 1.0:
        return "slower"
    if low > 1.0:
        return "faster"
    if low == high == 1.0:
        return "even"
    return "crosses" if low < 1.0 < high else "reaches"


@dataclass(frozen=True)
class RaceView:
    status: str
    lanes: str
    figure: go.Figure
    verdict: str


def race_view(frame: RaceFrame, look: Look = LAPTOP) -> RaceView:
    figure = (charts.race_figure(frame.result, until=frame.clock, look=look) if frame.result
              else message_figure("Measuring… the median race is replayed here once every race has run.", look))
    return RaceView(race_status(frame), lanes_html(frame), figure, race_verdict(frame.result))
