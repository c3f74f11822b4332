"""The race: each decoder measured alone and to the end before anything of it is shown."""

from __future__ import annotations

import pytest

from app.race import race
from decoding import DecodeSettings


def test_both_runs_are_measured_alone_then_replayed_on_one_clock(tiny_llama):
    frames = list(race(tiny_llama, "It is a truth", DecodeSettings(max_new_tokens=12)))
    phases = [f.phase for f in frames]
    first_replay = phases.index("replaying")
    assert phases[:first_replay] == ["warm-up", "measuring AR", "measuring Medusa"]
    assert set(phases[first_replay:-1]) == {"replaying"} and phases[-1] == "done"
    # Nothing is shown until both runs are over: a page redraw never overlaps a measured run.
    assert all(f.ar is None and f.medusa is None for f in frames[:first_replay])
    shown = frames[first_replay:]
    assert all(f.ar.stop_reason and f.medusa.stop_reason for f in shown)
    assert len({id(f.ar) for f in shown}) == 1 and len({id(f.medusa) for f in shown}) == 1
    # The replay clock only moves forward and stops where the slower run ended.
    clocks = [f.clock for f in shown]
    assert clocks == sorted(clocks)
    ar, medusa = shown[-1].ar, shown[-1].medusa
    assert clocks[-1] == pytest.approx(max(ar.total_time, medusa.total_time))
    assert medusa.tokens == ar.tokens and medusa.settings.method == "medusa"
