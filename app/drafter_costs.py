"""What each drafter cost on the visitor's own race, for the walkthrough's speculative-decoding
step: the draft model's parameters, memory and passes beside Medusa's heads, and who was faster.

Every number is read from the race's traces (`RunTrace.drafter`, the rounds' draft times and
passes): the argument for Medusa is made on the visitor's run, and where Medusa lost, it says so.
"""

from __future__ import annotations

from decoding.race import RaceResult
from decoding.trace import DrafterInfo

from . import lanes
from .lanes import DRAFT_MODEL, EAGLE, MEDUSA, PROMPT_LOOKUP
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


def _draft_model(race: RaceResult) -> str:
    info, timing = _drafter(race, DRAFT_MODEL), race.timing(DRAFT_MODEL)
    size = (f"**{count(info.parameters)} parameters**, {megabytes(info.weight_bytes)} of weights plus "
            f"{megabytes(info.cache_bytes)} of its own KV cache by the end of the run; " if info else "")
    return (f"- **The draft model**, a second network: {size}{draft_passes_per_round(race, 'draft-model'):.1f} "
            f"passes of its own a round, costing **{race.draft_cost('draft-model'):.2f} plain steps** before the "
            f"big model's check could start; {timing.tokens_per_pass:.2f} tokens per pass → "
            f"{_speed(race, 'draft-model')} the speed of plain decoding.")


def _medusa(race: RaceResult) -> str:
    info, timing = _drafter(race, "medusa"), race.timing("medusa")
    size = (f"**{count(info.parameters)} parameters** ({megabytes(info.weight_bytes)}), " if info else "")
    return (f"- **Medusa's heads** (next step): {size}no cache and no pass of their own; drafting cost "
            f"**{race.draft_cost('medusa'):.2f} plain steps** a round; {timing.tokens_per_pass:.2f} tokens per pass "
            f"→ {_speed(race, 'medusa')}.")


def _eagle(race: RaceResult) -> str:
    info, timing = _drafter(race, EAGLE), race.timing(EAGLE)
    size = (f"**{count(info.parameters)} parameters** ({megabytes(info.weight_bytes)}) over the big model's own "
            f"features, with a small KV cache of its own ({megabytes(info.cache_bytes)}); " if info else "")
    return (f"- **EAGLE's draft layer** (one decoder layer; see *After Medusa*): {size}"
            f"{draft_passes_per_round(race, EAGLE):.1f} passes of that one layer a round, costing "
            f"**{race.draft_cost(EAGLE):.2f} plain steps**; {timing.tokens_per_pass:.2f} tokens per pass → "
            f"{_speed(race, EAGLE)}.")


def _lookup(race: RaceResult) -> str:
    timing = race.timing(PROMPT_LOOKUP)
    return (f"- **Prompt lookup**: no weights at all, it copies earlier text; drafting cost "
            f"**{race.draft_cost('prompt-lookup'):.2f} plain steps** a round; {timing.tokens_per_pass:.2f} tokens "
            f"per pass → {_speed(race, 'prompt-lookup')}.")


def _winner(race: RaceResult, lane: str) -> str:
    """Medusa against one other drafter, by median speedup, with the noise said where it is."""
    theirs, ours = race.spread(lane), race.spread("medusa")
    noise = " — but their ranges overlap, so the gap may be noise" if race.overlap(lane, "medusa") else ""
    name = lanes.in_sentence(lane)
    if ours.median >= theirs.median:
        return f"**Here Medusa's heads beat {name}** ({ours.median:.2f}× against {theirs.median:.2f}×){noise}."
    return f"**Here {name} was faster than Medusa's heads** ({theirs.median:.2f}× against {ours.median:.2f}×){noise}."


def drafter_comparison(race: RaceResult | None) -> str:
    """Each raced drafter's size, memory and cost per round (the draft model's against Medusa's
    heads, prompt lookup's where it raced), and who won, measured; before a race with a draft
    model, an invitation to run one."""
    if race is None:
        return INVITATION
    bullets = {DRAFT_MODEL: _draft_model, MEDUSA: _medusa, EAGLE: _eagle, PROMPT_LOOKUP: _lookup}
    present = [lane for lane in bullets if lane in race.lanes]
    rows = [] if DRAFT_MODEL in present else [INVITATION, ""]
    rows += [f"**On your race** ({md_text(race.shown[present[0]].model)}, {len(race.races)} race(s)), each "
             "lane's drafting, measured:", "", *[bullets[lane](race) for lane in present], ""]
    if "medusa" in present:
        rows.append(" ".join(_winner(race, lane) for lane in present if lane != "medusa"))
    else:
        rows.append("*Tick Medusa in the race too, to set its heads beside it.*")
    return "\n".join(rows).strip()
