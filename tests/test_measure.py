"""One way of measuring for bench and the race (decoding/measure.py): heats, threads, the load."""

from __future__ import annotations

import itertools

import pytest
import torch

from decoding import machine_load, measure
from decoding.machine_load import MachineLoad
from decoding.measure import busy_note, combined, run_heat, threads_for_load
from decoding.settings import DecodeSettings


def test_the_load_is_other_programs_cpu_time_over_the_wall_time(monkeypatch):
    """The kernel says 3 CPU seconds were busy over 2 s, 1 of them ours: others kept 1 core busy."""
    busy, own, wall = iter([10.0, 13.0]), iter([5.0, 6.0]), iter([100.0, 102.0])
    monkeypatch.setattr(machine_load, "_busy_cpu_seconds", lambda: next(busy))
    monkeypatch.setattr(machine_load, "_own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(machine_load.time, "perf_counter", lambda: next(wall))
    load = machine_load.LoadMeter().stop()
    assert load.others == pytest.approx(1.0) and load.seconds == pytest.approx(2.0) and load.busy


def test_where_the_kernel_does_not_say_the_load_is_unknown_not_quiet(monkeypatch):
    monkeypatch.setattr(machine_load, "_busy_cpu_seconds", lambda: None)
    load = machine_load.LoadMeter().stop()
    assert load.others is None and not load.busy and busy_note(load) == ""


def test_a_busy_machine_gets_fewer_threads_and_a_sentence():
    quiet, busy = MachineLoad(0.1, 2, 2, 5.0), MachineLoad(1.0, 2, 2, 5.0)
    threads = torch.get_num_threads()
    assert threads_for_load(quiet) == threads
    assert threads_for_load(busy) == 1 and threads_for_load(MachineLoad(3.0, 4, 4, 1.0)) == min(threads, 1)
    assert busy_note(quiet) == ""
    note = busy_note(MachineLoad(1.0, 2, 1, 5.0), threads_before=2)
    assert "1.0 of its 2 cores" in note and "1 thread instead of 2" in note
    # Loads over several measurements: others averaged by the time each took.
    assert combined([MachineLoad(0.0, 2, 2, 3.0), MachineLoad(2.0, 2, 1, 1.0)]).others == pytest.approx(0.5)


def test_a_heat_runs_each_named_run_once_in_order_on_the_threads_asked(tiny_llama, monkeypatch):
    seen = []
    real = measure.generate
    monkeypatch.setattr(measure, "generate", lambda lm, prompt, s: seen.append((s.method, torch.get_num_threads()))
                        or real(lm, prompt, s))
    plan = {"plain": DecodeSettings(method="ar", max_new_tokens=4), "heads": DecodeSettings(max_new_tokens=4)}
    before = torch.get_num_threads()
    asked = 2 if before == 1 else 1
    heat = run_heat(tiny_llama, "It is", plan, ["heads", "plain"], threads=asked)
    assert seen == [("medusa", asked), ("ar", asked)] and torch.get_num_threads() == before
    assert list(heat.runs) == ["heads", "plain"] and heat.load.threads == asked and heat.running is None
    assert heat.runs["heads"].tokens == heat.runs["plain"].tokens
    for order in (["heads"], ["heads", "plain", "plain"], ["heads", "other"]):
        with pytest.raises(ValueError, match="each run of the plan"):
            run_heat(tiny_llama, "It is", plan, order)


def test_bench_and_the_race_measure_with_the_same_function(tiny_llama, monkeypatch):
    """Every timed run of both goes through measure.timed_run."""
    from decoding.bench import run_bench
    from decoding.race import race

    counted = itertools.count()
    real = measure.timed_run
    monkeypatch.setattr(measure, "timed_run", lambda *a, **k: next(counted) is None or real(*a, **k))
    settings = DecodeSettings(max_new_tokens=4)
    report = run_bench(tiny_llama, ["It is", "It was"], settings, ["default"], progress=False)
    assert next(counted) == 2 * 3  # per prompt: plain, Medusa traced, Medusa untraced
    assert set(report["load"]) == {"others", "cores", "threads", "seconds", "busy"}
    counted = itertools.count()
    *_, done = race(tiny_llama, "It is", settings, ["medusa"], races=2)
    assert next(counted) == 2 * 2 and len(done.result.loads) == 2


def test_a_visitors_run_looks_at_the_load_first_and_runs_on_the_cores_left_free(tiny_llama, monkeypatch):
    """Every run a visitor waits for (the page's Run, /trace) goes through stream_on_free_cores:
    beside a program holding one core of two it runs on one thread, records so, and the summary
    says it; on a quiet machine it keeps the process's threads and says nothing."""
    from app.views import run_summary
    from decoding.trace import RunTrace

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # a 2-core machine, whatever this one has
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    settings = DecodeSettings(max_new_tokens=6)
    monkeypatch.setattr(measure, "look_at_load", lambda: MachineLoad(1.0, 2, 2, 0.1))
    trace = measure.generate_on_free_cores(tiny_llama, "It is", settings)
    assert set_to == [1, 2]  # one thread while it ran, then the process's two again
    assert trace.load.threads == 1 and trace.threads_before == 2 and trace.load.busy
    assert "other programs held 1.0 of 2 cores, so it ran on 1 thread instead of 2" in run_summary(trace)
    again = RunTrace.from_json(trace.to_json())
    assert again.load == trace.load and again.threads_before == 2

    set_to.clear()
    monkeypatch.setattr(measure, "look_at_load", lambda: MachineLoad(0.1, 2, 2, 0.1))
    quiet = measure.generate_on_free_cores(tiny_llama, "It is", settings)
    assert set_to == [2, 2] and quiet.load.threads == 2 and "other programs" not in run_summary(quiet)
    assert quiet.tokens == trace.tokens


def test_the_look_at_the_load_is_short_and_reads_the_kernel(monkeypatch):
    monkeypatch.setattr(measure.time, "sleep", lambda s: None)
    busy, own, wall = iter([10.0, 10.1]), iter([5.0, 5.0]), iter([100.0, 100.1])
    monkeypatch.setattr(machine_load, "_busy_cpu_seconds", lambda: next(busy))
    monkeypatch.setattr(machine_load, "_own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(machine_load.time, "perf_counter", lambda: next(wall))
    load = measure.look_at_load()
    assert load.others == pytest.approx(1.0) and measure.LOOK_SECONDS <= 0.2
