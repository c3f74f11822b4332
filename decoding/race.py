"""The race: plain decoding against every drafter the visitor ticked, on one prompt, several times.

How the timing is taken (the page says so too, from assets/texts/timing_note.md):
1. warm-up: a short run of each lane, so none pays for first-call initialisation;
2. `races` races; each is one heat of `decoding.measure`, the function `bench` measures with:
   every lane runs to the end alone on the hardware, in an order that rotates from race to race
   (plain, Medusa, draft model; then Medusa, draft model, plain; ...), so no lane always runs
   first, on a colder or a warmer machine. The clock is the engine's own: it counts only time
   inside the decoding loop. The warm-up also measures how busy the machine is; where other
   programs hold cores, the races run on the threads the free cores allow, and every race
   records the load it was measured under, so the page can say so beside the figure;
3. each lane's speedup in a race is its tokens per second over plain decoding's in that same race
   (see `decoding.stats`); over the races, a median and a range per lane;
4. the race whose speedup for the focus lane is that lane's median is replayed, every lane on
   one clock (sped up, every lane alike, to end within REPLAY_SECONDS).
No two lanes ever run at the same moment, and the page is not redrawn while one runs (only a
status line changes between runs): on a laptop the browser shares the CPU, and a lane measured
while the page redraws would be measured under a load the others never had.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .baseline import OWN, cached_plain_rivals, describe, fastest_plain, rival_run
from .drafters import check_settings
from .errors import DecodingError
from .machine_load import LoadMeter, MachineLoad
from .measure import combined, heat_steps, look_at_load, threads_for_load, timed_run
from .model import LoadedModel
from .settings import DEFAULT_METHOD, PLAIN, WARM_UP_TOKENS, DecodeSettings
from .stats import Spread, Timing, draft_cost, speedup, spread
from .trace import RunTrace

REPLAY_STEP = 0.05  # seconds between frames of the replay
REPLAY_SECONDS = 5.0  # a longer race is replayed faster, every lane at the same pace, to end in this time
DEFAULT_RACES = 3
MAX_RACES = 7


def replay_pace(seconds: float) -> float:
    """How many times real speed the replay of a `seconds`-long race runs: 1 up to REPLAY_SECONDS,
    then fast enough to end in REPLAY_SECONDS (a class has already waited for the measuring)."""
    return max(1.0, seconds / REPLAY_SECONDS)


def default_lanes(drafters: list[str]) -> list[str]:
    """The lanes ticked before the visitor picks: the default drafter (Medusa's heads) alone beside
    plain decoding where the model has it (the lesson, in half the wait of every lane); the others
    on request."""
    return [DEFAULT_METHOD] if DEFAULT_METHOD in drafters else drafters[:1]


def lane_order(lanes: list[str], index: int) -> list[str]:
    """The order race `index` runs its lanes in: the list rotated by one more place each race."""
    shift = index % len(lanes)
    return lanes[shift:] + lanes[:shift]


@dataclass
class RaceResult:
    """Every race run so far: one trace per lane, in the order the races were measured."""

    lanes: list[str]  # plain decoding first, then the drafters
    focus: str  # the drafter whose median race is replayed and shown in the Playground
    races: list[dict[str, RunTrace]] = field(default_factory=list)
    # Per race, plain decoding in the model's other variants (by `baseline.rival_run` name), timed
    # in the same heat: the speedups count against the fastest plain decoding (baseline.py).
    rivals: list[dict[str, RunTrace]] = field(default_factory=list)
    baseline_words: dict[str, str] = field(default_factory=dict)  # each plain decoding's name, in words
    loads: list[MachineLoad] = field(default_factory=list)  # what else the machine ran, per race
    # Torch threads the races ran on: fewer than the process's own where other programs held cores.
    threads: int = 0
    threads_before: int = 0  # the process's own

    @property
    def load(self) -> MachineLoad | None:
        """The machine's load over every race (None before the first)."""
        return combined(self.loads) if self.loads else None

    @property
    def drafters(self) -> list[str]:
        return [lane for lane in self.lanes if lane != PLAIN]

    def plain_runs(self, index: int) -> dict[str, RunTrace]:
        """Race `index`'s plain decodings: the model's own (OWN) and its rivals'."""
        return {OWN: self.races[index][PLAIN], **(self.rivals[index] if index < len(self.rivals) else {})}

    @property
    def baseline(self) -> str:
        """The plain decoding the speedups count against: the fastest over every race (OWN is the
        lane PLAIN itself)."""
        if not self.races:
            return OWN
        names = self.plain_runs(0)
        return fastest_plain({name: Timing.of(self.plain_runs(i)[name] for i in range(len(self.races)))
                              for name in names})

    @property
    def baseline_name(self) -> str:
        """The baseline in words, e.g. "plain decoding in float32"."""
        return self.baseline_words.get(self.baseline, "plain decoding")

    def speedups(self, lane: str) -> list[float]:
        """The lane's speed over the baseline's in each race (1.0 for the baseline itself)."""
        baseline = self.baseline
        return [speedup(Timing.of(self.plain_runs(i)[baseline]), Timing.of(race[lane]))
                for i, race in enumerate(self.races)]

    def plain_speedups(self, name: str) -> list[float]:
        """A plain decoding's speed (OWN or a rival's) over the baseline's in each race."""
        baseline = self.baseline
        return [speedup(Timing.of(self.plain_runs(i)[baseline]), Timing.of(self.plain_runs(i)[name]))
                for i in range(len(self.races))]

    def spread(self, lane: str) -> Spread:
        return spread(self.speedups(lane))

    def timing(self, lane: str) -> Timing:
        """The lane's totals over every race."""
        return Timing.of(race[lane] for race in self.races)

    def draft_cost(self, lane: str) -> float:
        """The lane's drafting alone, per round, in plain decoding steps (its time before each
        verify pass: the heads, the draft model's passes or the lookup)."""
        return draft_cost(self.timing(PLAIN), self.timing(lane))

    def median_index(self, lane: str) -> int:
        """The race whose speedup for `lane` is the median (the lower of the middle two for an even count)."""
        speeds = self.speedups(lane)
        order = sorted(range(len(self.races)), key=lambda i: speeds[i])
        return order[(len(order) - 1) // 2]

    @property
    def shown_index(self) -> int:
        """The race replayed: the focus drafter's median one."""
        return self.median_index(self.focus)

    @property
    def shown(self) -> dict[str, RunTrace]:
        return self.races[self.shown_index]

    def overlap(self, lane: str, other: str) -> bool:
        """Whether two lanes' ranges of speedups overlap over several races: then the gap between
        their medians may be noise."""
        one, two = self.spread(lane), self.spread(other)
        return len(self.races) > 1 and one.low <= two.high and two.low <= one.high

    def fastest(self) -> str:
        """The drafter with the highest median speedup."""
        return max(self.drafters, key=lambda lane: self.spread(lane).median)

    def differing(self) -> list[tuple[str, int]]:
        """(lane, race number) wherever a greedy lane wrote other tokens than plain decoding:
        greedy speculative decoding must not change the text, so each one is a finding to report."""
        return [(lane, number) for number, race in enumerate(self.races, 1) for lane in self.drafters
                if race[lane].settings.acceptance == "greedy" and race[lane].tokens != race[PLAIN].tokens]


@dataclass
class RaceFrame:
    """What the page shows at one moment of the race."""

    phase: str  # "warm-up", "measuring", "replaying", "done"
    races: int  # how many races were asked for
    lanes: list[str]
    finished: int = 0  # races measured so far
    measuring: str = ""  # the lane running while measuring
    result: RaceResult | None = None  # set once every race is measured
    clock: float = 0.0  # seconds on the replayed race's clock
    done: dict[str, int] = field(default_factory=dict)  # runs measured so far, per lane
    elapsed: float = 0.0  # wall-clock seconds since the first measured run began
    pace: float = 1.0  # the replay's speed, in times real time
    left: float | None = None  # about how many seconds the measuring and the replay still take
    leader: str = ""  # the drafter with the highest median speedup over the races measured so far
    lead: float = 0.0  # that median speedup

    @property
    def shown(self) -> dict[str, RunTrace]:
        return self.result.shown if self.result else {}


def expected_seconds(trace: RunTrace, max_new_tokens: int) -> float:
    """How long a run of `max_new_tokens` takes, from a shorter run of the same lane: its prefill,
    then as many of its rounds as the tokens need at its rate of tokens per round."""
    timing = Timing.of(trace)
    if not timing.rounds:
        return trace.total_time
    rounds = max(0, max_new_tokens - 1) / max(timing.tokens_per_pass, 1.0)
    return trace.time_prefill + rounds * timing.seconds_per_round


def seconds_left(per_lane: dict[str, float], done: dict[str, int], races: int) -> float:
    """The runs still to measure, each at its lane's expected time, and the replay after them."""
    measuring = sum(seconds * (races - done.get(lane, 0)) for lane, seconds in per_lane.items())
    return measuring + min(max(per_lane.values(), default=0.0), REPLAY_SECONDS)


def race(model: LoadedModel, prompt: str, settings: DecodeSettings, drafters: list[str],
         races: int = DEFAULT_RACES, focus: str | None = None) -> Iterator[RaceFrame]:
    """Race plain decoding and each of `drafters` (every one with `settings`, its method changed)
    `races` times in rotating order after a warm-up, then replay the focus drafter's median race."""
    if not drafters or PLAIN in drafters or len(set(drafters)) < len(drafters):
        raise DecodingError("tick at least one drafter to race against plain decoding (each once)")
    races = max(1, min(int(races), MAX_RACES))
    lanes = [PLAIN, *drafters]
    methods = {lane: check_settings(dataclasses.replace(settings, method=lane)) for lane in lanes}

    yield RaceFrame("warm-up", races, lanes)
    rivals = {rival_run(name): rival for name, rival in cached_plain_rivals(model).items()}
    plan = methods | dict.fromkeys(rivals, methods[PLAIN])
    # The threads come from a look at the load before the warm-up, so that the warm-up runs as the
    # races will and its rates make an estimate of the time left that holds; fewer still if the
    # machine got busier while it warmed up.
    threads, meter = threads_for_load(look_at_load()), LoadMeter()
    warm_tokens = min(WARM_UP_TOKENS, settings.max_new_tokens)
    warm = {run: timed_run(rivals.get(run, model), prompt, dataclasses.replace(step, max_new_tokens=warm_tokens),
                           threads)
            for run, step in plan.items()}
    threads = min(threads, threads_for_load(meter.stop()))
    expected = {run: expected_seconds(trace, settings.max_new_tokens) for run, trace in warm.items()}

    words = {OWN: describe(model)} | {run: describe(rival) for run, rival in rivals.items()}
    result = RaceResult(lanes, focus if focus in drafters else drafters[0], threads=threads,
                        threads_before=torch.get_num_threads(), baseline_words=words)
    done, started = dict.fromkeys(plan, 0), time.perf_counter()
    for index in range(races):
        for heat in heat_steps(model, prompt, plan, lane_order([*lanes, *rivals], index), threads, rivals):
            if heat.running is None:
                break
            if not result.races:  # until a race ends, a measured run beats the warm-up's guess
                expected |= {lane: trace.total_time for lane, trace in heat.runs.items()}
            leader = result.fastest() if result.races else ""
            yield RaceFrame("measuring", races, lanes, index, heat.running, done=dict(done),
                            elapsed=time.perf_counter() - started, left=seconds_left(expected, done, races),
                            leader=leader, lead=result.spread(leader).median if leader else 0.0)
            done[heat.running] += 1
        result.races.append({lane: heat.runs[lane] for lane in lanes})
        result.rivals.append({run: heat.runs[run] for run in rivals})
        result.loads.append(heat.load)
        expected = {run: Timing.of([result.plain_runs(i)[run] if run in rivals else result.races[i][run]
                                    for i in range(len(result.races))]).seconds / len(result.races)
                    for run in plan}

    end = max(trace.total_time for trace in result.shown.values())
    pace = replay_pace(end)
    clock, started = 0.0, time.perf_counter()
    while clock < end:
        yield RaceFrame("replaying", races, lanes, races, result=result, clock=clock, pace=pace)
        time.sleep(min(REPLAY_STEP, (end - clock) / pace))
        clock = min((time.perf_counter() - started) * pace, end)
    yield RaceFrame("done", races, lanes, races, result=result, clock=end)
