"""The race (several alternating races, each decoder measured alone) and the speed arithmetic it
shares with `bench` (`decoding.stats`)."""

from __future__ import annotations

import pytest

from app.race import RaceResult, race
from app_helpers import SMALL_CHOICES, make_ar_run, make_run
from decoding.settings import DecodeSettings
from decoding.stats import Timing, round_cost, speedup, spread, verify_cost


def test_races_alternate_after_a_warm_up_and_the_median_is_replayed(tiny_llama):
    frames = list(race(tiny_llama, "It is a truth", DecodeSettings(max_new_tokens=12), races=3))
    phases = [f.phase for f in frames]
    first_replay = phases.index("replaying")
    assert phases[0] == "warm-up" and phases[-1] == "done"
    measuring = [(f.finished, f.measuring) for f in frames[:first_replay] if f.phase == "measuring"]
    assert measuring == [(0, "ar"), (0, "medusa"), (1, "medusa"), (1, "ar"), (2, "ar"), (2, "medusa")]
    # Nothing is shown until every race is over: a page redraw never overlaps a measured run.
    assert all(f.result is None for f in frames[:first_replay])
    result = frames[-1].result
    assert len(result.pairs) == 3 and all(a.tokens == m.tokens for a, m in result.pairs)
    assert sorted(result.speedups)[1] == pytest.approx(speedup(Timing.of(result.shown[0]), Timing.of(result.shown[1])))
    clocks = [f.clock for f in frames[first_replay:]]
    assert clocks == sorted(clocks)


def test_the_race_count_is_bounded(tiny_llama):
    frames = list(race(tiny_llama, "It is", DecodeSettings(max_new_tokens=3), races=0))
    assert len(frames[-1].result.pairs) == 1


# ----------------------------------------------------------------------------- decoding.stats

def test_speedup_is_tokens_per_second_so_runs_of_different_lengths_compare_fairly():
    ar = make_ar_run(20, seconds_per_token=0.01)  # 20 tokens in 0.01 + 19 x 0.01 s
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6, 0])  # 1 + 4 + 1 = 6 tokens in 0.01 + 2 x 0.0055 s
    expected = (6 / (0.01 + 2 * 0.0055)) / (20 / 0.2)
    assert speedup(Timing.of(ar), Timing.of(medusa)) == pytest.approx(expected)


def test_round_cost_is_a_rounds_decoding_time_in_plain_steps():
    ar = make_ar_run(10, seconds_per_token=0.004)
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5])
    # Hand-made rounds: draft 1 ms + verify 4 ms + accept 0.5 ms; a plain step 4 ms.
    assert round_cost(Timing.of(ar), Timing.of(medusa)) == pytest.approx(5.5 / 4)
    assert verify_cost(Timing.of(ar), Timing.of(medusa)) == pytest.approx(1.0)
    # Time spent recording the page's details is not decoding time.
    for rnd in medusa.rounds:
        rnd.t_end += 0.002
        rnd.time_trace = 0.002
    medusa.total_time += 0.002 * 3
    assert round_cost(Timing.of(ar), Timing.of(medusa)) == pytest.approx(5.5 / 4)


def test_timing_sums_runs_and_spread_gives_median_and_range():
    runs = [make_ar_run(5), make_ar_run(7)]
    total = Timing.of(runs)
    assert total.tokens == 12 and total.rounds == 4 + 6
    s = spread([1.3, 0.9, 1.1])
    assert (s.median, s.low, s.high, s.count, s.crosses) == (1.1, 0.9, 1.3, 3, True)
    assert not spread([1.2, 1.4]).crosses
    with pytest.raises(ValueError):
        spread([])


def test_the_shown_race_is_the_median_one():
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    pairs = [(make_ar_run(len(medusa.tokens), s), medusa) for s in (0.002, 0.009, 0.004)]
    assert RaceResult(pairs).shown[0] is pairs[2][0]
