"""Speed arithmetic shared by `bench` and the web page: one definition of each figure.

Definitions (every one from the engine's own clock, which only runs inside the decoding loop):
- *decoding seconds* of a run: its total time minus the time spent recording per-node details
  for the page (`RoundTrace.time_trace`): what the decoder itself took, prefill included;
- *speedup* of Medusa over plain (AR) decoding: Medusa's tokens per decoding second divided by
  plain decoding's; tokens per second, not total seconds, because two runs may stop at
  different lengths (an end-of-text token, a sampled run);
- *round cost*: the decoding seconds of the rounds alone (prefill left out) per round, in plain
  decoding steps (the AR run's seconds per round). One Medusa round (draft, verify, accept)
  costing 1.5 steps and adding 2.4 tokens gives a speedup of about 2.4 / 1.5 = 1.6;
- its *verify cost*: the verify passes alone, in the same steps; the *rest of the round*
  (round cost less verify cost) is drafting, accepting and bookkeeping. Tokens per pass /
  verify cost is the ceiling a free draft would reach; the *draft cost* is the drafting alone
  (the heads, a draft model's passes, or the lookup) per round, in the same steps;
- *recording overhead*: the seconds spent recording details for the page over the decoding
  seconds (what `bench` calls trace cost).

`Timing` sums any number of traces of one method, so a bench over many prompts and a single
race on the page compute their figures with the same functions.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from .trace import RunTrace


@dataclass(frozen=True)
class Timing:
    """Totals over one or more runs of one method."""

    tokens: int = 0
    passes: int = 0  # forward passes of the base model, prefill included
    rounds: int = 0
    round_tokens: int = 0  # tokens the rounds added (the prefill's first token left out)
    seconds: float = 0.0  # decoding seconds, prefill included, recording excluded
    round_seconds: float = 0.0  # the same for the rounds alone
    verify_seconds: float = 0.0  # the rounds' base-model passes alone
    draft_seconds: float = 0.0  # the rounds' drafting alone, before each verify pass
    recording_seconds: float = 0.0  # spent recording per-node details for the page (not decoding)

    @classmethod
    def of(cls, traces: RunTrace | Iterable[RunTrace]) -> Timing:
        runs = [traces] if isinstance(traces, RunTrace) else list(traces)
        seconds = sum(decoding_seconds(t) for t in runs)
        return cls(
            tokens=sum(len(t.tokens) for t in runs),
            passes=sum(t.forward_passes for t in runs),
            rounds=sum(len(t.rounds) for t in runs),
            round_tokens=sum(r.accepted_length for t in runs for r in t.rounds),
            seconds=seconds,
            round_seconds=seconds - sum(t.time_prefill for t in runs),
            verify_seconds=sum(r.time_verify for t in runs for r in t.rounds),
            draft_seconds=sum(r.time_draft for t in runs for r in t.rounds),
            recording_seconds=sum(r.time_trace for t in runs for r in t.rounds),
        )

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def seconds_per_round(self) -> float:
        return self.round_seconds / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens each round added on average (1.0 for plain decoding)."""
        return self.round_tokens / self.rounds if self.rounds else 0.0


def decoding_seconds(trace: RunTrace) -> float:
    """The run's time on the engine's clock, less the time spent recording details for the page."""
    return trace.total_time - sum(r.time_trace for r in trace.rounds)


def round_end_times(trace: RunTrace) -> list[float]:
    """When each round's tokens were ready, in decoding seconds since the start (recording
    excluded): the clock on which the page replays a race."""
    times, recorded = [], 0.0
    for rnd in trace.rounds:
        recorded += rnd.time_trace
        times.append(rnd.t_end - recorded)
    return times


def speedup(plain: Timing, drafted: Timing) -> float:
    """The drafted run's tokens per second over plain decoding's (0 when either is unmeasured)."""
    if plain.tokens_per_second <= 0:
        return 0.0
    return drafted.tokens_per_second / plain.tokens_per_second


def in_steps(seconds_per_round: float, plain: Timing) -> float:
    """Seconds per round as plain decoding steps (0 when plain decoding took no round)."""
    return seconds_per_round / plain.seconds_per_round if plain.seconds_per_round > 0 else 0.0


def round_cost(plain: Timing, drafted: Timing) -> float:
    """One drafted round (draft, verify, accept) in plain decoding steps: speedup ≈ tokens per
    pass / round cost."""
    return in_steps(drafted.seconds_per_round, plain)


def verify_cost(plain: Timing, drafted: Timing) -> float:
    """The verify pass of one drafted round in plain decoding steps."""
    return in_steps(drafted.verify_seconds / drafted.rounds, plain) if drafted.rounds else 0.0


def draft_cost(plain: Timing, drafted: Timing) -> float:
    """The drafting of one round in plain decoding steps: what a drafter costs before it is checked."""
    return in_steps(drafted.draft_seconds / drafted.rounds, plain) if drafted.rounds else 0.0


def rest_of_round_cost(plain: Timing, drafted: Timing) -> float:
    """The rest of one drafted round, in plain decoding steps: drafting, accepting, bookkeeping."""
    return round_cost(plain, drafted) - verify_cost(plain, drafted)


def recording_overhead(timing: Timing) -> float:
    """Seconds spent recording details for the page, over the seconds spent decoding."""
    return timing.recording_seconds / timing.seconds if timing.seconds > 0 else 0.0


@dataclass(frozen=True)
class Spread:
    """The median of a few measurements and their range."""

    median: float
    low: float
    high: float
    count: int


def spread(values: Iterable[float]) -> Spread:
    numbers = sorted(values)
    if not numbers:
        raise ValueError("spread() needs at least one value")
    return Spread(statistics.median(numbers), numbers[0], numbers[-1], len(numbers))
