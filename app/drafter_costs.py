"""What each drafter cost on the visitor's own race, for the walkthrough's speculative-decoding
step: each raced drafter's size, memory and passes (the draft model's beside Medusa's heads, the
step's point), and who was faster.

Every number is read from the race's traces (`RunTrace.drafter`, the rounds' draft times and
passes): the argument for Medusa is made on the visitor's run, and where Medusa lost, it says so.
"""

from __future__ import annotations

from decoding.race import RaceResult
from decoding.trace import DrafterInfo

from . import lanes
from .lanes import DRAFT_MODEL, MEDUSA
from .tokens import md_text

INVITATION = ("*Race with the **draft model** lane ticked (on a model that ships one) and this step puts "
              "numbers on that catch, from your own run: the second model's size, its memory and its cost "
              "per round, beside Medusa's heads.*")


def count(parameters: int) -> str:
    """A parameter count in words a visitor reads at a glance: 30.1M, 135K."""
    if parameters >= 1e6:
        return f"{parameters / 1e6:.1f}M"
    return f"{parameters / 1e3:.0f}K" if parameters >= 1e3 else str(parameters)


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"


def _drafter(race: RaceResult, lane: str) -> DrafterInfo | None:
    return race.shown[lane].drafter


def _speed(race: RaceResult, lane: str) -> str:
    spread = race.spread(lane)
    if spread.count == 1:
        return f"**{spread.median:.2f}×**"
    return f"**{spread.median:.2f}×** (range {spread.low:.2f}–{spread.high:.2f}×)"


def draft_passes_per_round(race: RaceResult, lane: str) -> float:
    rounds = [rnd for trace in race.races for rnd in trace[lane].rounds]
    return sum(rnd.draft_passes for rnd in rounds) / len(rounds) if rounds else 0.0


def _bullet(race: RaceResult, lane: str) -> str:
    """One raced drafter in measured numbers: what it drafts with (its own words), its size and
    memory where it has them, its passes of its own, its cost a round, and what that bought."""
    info, timing, passes = _drafter(race, lane), race.timing(lane), draft_passes_per_round(race, lane)
    size = ""
    if info and info.parameters:
        size = f"**{count(info.parameters)} parameters**, {megabytes(info.weight_bytes)} of weights"
    elif info and info.weight_bytes:
        size = f"{megabytes(info.weight_bytes)} in memory"
    if info and info.cache_bytes:
        size += f" plus {megabytes(info.cache_bytes)} of its own KV cache by the end of the run"
    own_passes = f"{passes:.1f} passes of its own a round, " if passes else ""
    return (f"- **{lanes.title(lane)}**, {lanes.drafts_with(lane)}: {size + '; ' if size else ''}{own_passes}"
            f"drafting cost **{race.draft_cost(lane):.2f} plain steps** a round before the big model's check; "
            f"{timing.tokens_per_pass:.2f} tokens per pass → {_speed(race, lane)} the speed of plain decoding.")


def _winner(race: RaceResult, lane: str) -> str:
    """Medusa against one other drafter, by median speedup, with the noise said where it is."""
    theirs, ours = race.spread(lane), race.spread(MEDUSA)
    noise = " — but their ranges overlap, so the gap may be noise" if race.overlap(lane, MEDUSA) else ""
    name = lanes.in_sentence(lane)
    if ours.median >= theirs.median:
        return f"**Here Medusa's heads beat {name}** ({ours.median:.2f}× against {theirs.median:.2f}×){noise}."
    return f"**Here {name} was faster than Medusa's heads** ({theirs.median:.2f}× against {ours.median:.2f}×){noise}."


def drafter_comparison(race: RaceResult | None) -> str:
    """Each raced drafter's size, memory and cost per round, in the race's order, and who won
    against Medusa, measured; before a race with a draft model, an invitation to run one."""
    if race is None:
        return INVITATION
    present = race.drafters
    rows = [] if DRAFT_MODEL in present else [INVITATION, ""]
    rows += [f"**On your race** ({md_text(race.shown[present[0]].model)}, {len(race.races)} race(s)), each "
             "lane's drafting, measured:", "", *[_bullet(race, lane) for lane in present], ""]
    if MEDUSA in present:
        rows.append(" ".join(_winner(race, lane) for lane in present if lane != MEDUSA))
    else:
        rows.append("*Tick Medusa in the race too, to set its heads beside it.*")
    return "\n".join(rows).strip()
