"""The race: plain decoding against Medusa on the same prompt, several times, then one replayed.

How the timing is taken (the page says so too, from assets/texts/timing_note.md):
1. warm-up: a short run of each decoder, so neither pays for first-call initialisation;
2. `races` races, each one plain (AR) run and one Medusa run to the end, alone on the hardware,
   in alternating order (AR first, then Medusa first, ...), so neither always runs on a warmer or
   busier machine. The clock is the engine's own: it counts only time inside the decoding loop;
3. the speedup of each race (tokens per second, see `decoding.stats`) gives a median and a range;
4. the race whose speedup is the median is replayed side by side in real time, on its clock.
The two decoders never run at the same moment, and the page is not redrawn while either runs: on
a laptop the browser shares the CPU, and a run measured while the page redraws would be measured
under a load the other never had.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from decoding.generate import generate
from decoding.model import MedusaModel
from decoding.settings import DecodeSettings
from decoding.stats import Spread, Timing, speedup, spread
from decoding.trace import RunTrace

REPLAY_STEP = 0.05  # seconds between frames of the replay
WARM_UP_TOKENS = 4
DEFAULT_RACES = 3
MAX_RACES = 7


@dataclass
class RaceResult:
    """Every race run so far, as (plain run, Medusa run) pairs in the order they were measured."""

    pairs: list[tuple[RunTrace, RunTrace]] = field(default_factory=list)

    @property
    def speedups(self) -> list[float]:
        return [speedup(Timing.of(ar), Timing.of(medusa)) for ar, medusa in self.pairs]

    @property
    def spread(self) -> Spread:
        return spread(self.speedups)

    @property
    def shown(self) -> tuple[RunTrace, RunTrace]:
        """The race whose speedup is the median (the lower of the middle two for an even count)."""
        order = sorted(range(len(self.pairs)), key=lambda i: self.speedups[i])
        return self.pairs[order[(len(order) - 1) // 2]]

    @property
    def ar_timing(self) -> Timing:
        return Timing.of(ar for ar, _ in self.pairs)

    @property
    def medusa_timing(self) -> Timing:
        return Timing.of(medusa for _, medusa in self.pairs)


@dataclass
class RaceFrame:
    """What the page shows at one moment of the race."""

    phase: str  # "warm-up", "measuring", "replaying", "done"
    races: int  # how many races were asked for
    finished: int = 0  # races measured so far
    measuring: str = ""  # "ar" or "medusa" while measuring
    result: RaceResult | None = None  # set once every race is measured
    clock: float = 0.0  # seconds on the replayed race's clock

    @property
    def shown(self) -> tuple[RunTrace | None, RunTrace | None]:
        return self.result.shown if self.result else (None, None)


def race(model: MedusaModel, prompt: str, settings: DecodeSettings,
         races: int = DEFAULT_RACES) -> Iterator[RaceFrame]:
    """Measure `races` alternating races after a warm-up, then replay the median one."""
    races = max(1, min(int(races), MAX_RACES))
    methods = {"ar": dataclasses.replace(settings, method="ar"),
               "medusa": dataclasses.replace(settings, method="medusa")}
    methods["medusa"].validate()

    yield RaceFrame("warm-up", races)
    for warm in methods.values():
        generate(model, prompt, dataclasses.replace(warm, max_new_tokens=min(WARM_UP_TOKENS, settings.max_new_tokens)))

    result = RaceResult()
    for index in range(races):
        order = ("ar", "medusa") if index % 2 == 0 else ("medusa", "ar")
        runs = {}
        for method in order:
            yield RaceFrame("measuring", races, index, method)
            runs[method] = generate(model, prompt, methods[method])
        result.pairs.append((runs["ar"], runs["medusa"]))

    ar, medusa = result.shown
    end = max(ar.total_time, medusa.total_time)
    clock, started = 0.0, time.perf_counter()
    while clock < end:
        yield RaceFrame("replaying", races, races, result=result, clock=clock)
        time.sleep(min(REPLAY_STEP, end - clock))
        clock = min(time.perf_counter() - started, end)
    yield RaceFrame("done", races, races, result=result, clock=end)
