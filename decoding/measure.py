"""One way of measuring a speedup, for `bench` and the page's race alike.

A measurement is a *heat*: each of a few named runs (plain decoding, a drafter, the same drafter
untraced, ...) once, alone, one after the other in a given order, on one prompt. `bench` runs a
heat per prompt and the race one per race; both compute their figures from the heats' traces with
`decoding.stats`, so the two report the same thing under the same names.

What a timed run is kept free of:
- consumers between its rounds: a run goes to its end inside `generate`, nobody is handed the
  trace while its clock runs (a page that streamed each round would draw while measuring);
- Python's garbage collector: a server process holds many objects (earlier traces, figures), so a
  full collection there takes far longer than in `bench`'s small process; it runs before the run
  instead of during it;
- recording the page's details: its time is counted apart and left out (`stats.decoding_seconds`).

What it cannot keep out is another program on the same cores. So each heat records the *load*:
how many cores other programs kept busy meanwhile (from the kernel's CPU accounting, less this
process's own time), and a figure measured on a busy machine says so. On this project's 2-core
machine a neighbour holding one core made two torch threads fight over the other one; one thread
kept the drafters ahead (docs/page-race.md has the measurements), so `threads_for_load` picks
one thread then.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .loops import generate, stream
from .machine_load import LoadMeter, MachineLoad
from .model import LoadedModel
from .settings import DecodeSettings
from .trace import RunTrace

# How long a run looks at the machine's load before it starts: /proc/stat counts in hundredths of
# a second, so a tenth of a second tells a core held by another program (1.0) from a quiet one.
LOOK_SECONDS = 0.1


def busy_note(load: MachineLoad | None, threads_before: int | None = None) -> str:
    """One sentence for a figure measured under `load`: empty on a quiet machine; on a busy one, how
    busy, that the figure is not the method's speed on a quiet machine, and the threads it used
    (`threads_before`: the process's own count, where the measurement used fewer)."""
    if load is None or not load.busy:
        return ""
    fewer = (f"; it ran on {load.threads} thread{'s' if load.threads != 1 else ''} instead of {threads_before}, "
             "so that its threads did not take turns on a shared core"
             if threads_before and load.threads < threads_before else "")
    return (f"Measured on a busy machine: other programs kept {load.others:.1f} of its {load.cores} cores busy "
            f"while it measured{fewer}. Speedups measured so are lower and noisier than on a quiet machine.")


def combined(loads: Sequence[MachineLoad]) -> MachineLoad:
    """Several measurements' loads as one: other programs' cores averaged over the time measured."""
    seconds = sum(load.seconds for load in loads)
    known = [load for load in loads if load.others is not None]
    others = (sum(load.others * load.seconds for load in known) / sum(load.seconds for load in known)
              if known and sum(load.seconds for load in known) > 0 else None)
    return MachineLoad(others, max((load.cores for load in loads), default=os.cpu_count() or 1),
                       min((load.threads for load in loads), default=torch.get_num_threads()), seconds)


def threads_for_load(load: MachineLoad) -> int:
    """The torch threads to measure with on a machine under `load`: as many as now when it is quiet;
    when other programs hold cores, no more threads than the cores they leave free (at least one),
    so our own threads do not take turns on a shared core."""
    threads = torch.get_num_threads()
    if not load.busy or load.others is None:
        return threads
    return max(1, min(threads, int(load.cores - load.others + 0.5)))


def look_at_load(seconds: float = LOOK_SECONDS) -> MachineLoad:
    """The machine's load over a short look now, before anything runs: the cores other programs
    keep busy, from the kernel (this process sits idle meanwhile)."""
    meter = LoadMeter()
    time.sleep(seconds)
    return meter.stop()


def stream_on_free_cores(lm: LoadedModel, prompt: str, settings: DecodeSettings,
                         load: MachineLoad | None = None) -> Iterator[RunTrace]:
    """`stream`, on as many torch threads as the cores other programs leave free: what every run
    a visitor waits for goes through (the page's Run, `/trace`; the race picks its threads the same
    way from its warm-up). `load`: a look taken already, else one taken now. Each trace records the
    look and the threads (`RunTrace.load`), so its figures can say when the machine was busy."""
    load = load or look_at_load()
    threads = threads_for_load(load)
    ran = dataclasses.replace(load, threads=threads)
    with torch_threads(threads):
        for trace in stream(lm, prompt, settings):
            trace.load, trace.threads_before = ran, load.threads
            yield trace


def generate_on_free_cores(lm: LoadedModel, prompt: str, settings: DecodeSettings) -> RunTrace:
    """`stream_on_free_cores` run to its end: the whole trace."""
    *_, trace = stream_on_free_cores(lm, prompt, settings)
    return trace


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` torch threads, then put the number back."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def timed_run(lm: LoadedModel, prompt: str, settings: DecodeSettings, threads: int | None = None) -> RunTrace:
    """One run to its end, timed on the engine's clock, with the garbage collector run before
    it rather than during it; on `threads` torch threads if given. They are set here, in the
    thread that runs it: a server may run each step of a generator in another thread of its pool,
    and a thread that has run torch before keeps the count it started with."""
    gc.collect()
    gc.disable()
    try:
        with torch_threads(threads or torch.get_num_threads()):
            return generate(lm, prompt, settings)
    finally:
        gc.enable()


@dataclass
class Heat:
    """Each named run of one measurement so far, and, once all have run, the machine's load
    while they ran."""

    runs: dict[str, RunTrace] = field(default_factory=dict)
    running: str | None = None  # the run about to start; None once the heat is over
    load: MachineLoad | None = None


def heat_steps(lm: LoadedModel, prompt: str, plan: dict[str, DecodeSettings],
               order: Sequence[str], threads: int | None = None,
               models: dict[str, LoadedModel] | None = None) -> Iterator[Heat]:
    """Run each of `plan`'s settings once on `prompt`, alone, in `order` (every name in `plan`
    once), on `threads` torch threads if given; on `lm`, or on the model `models` names for that
    run (the same model in another plain-decoding variant: see baseline.py). Yields the heat before
    each run (`running` names it: a page may say so while it waits) and once at the end, with the
    load. Nothing the consumer does runs while a clock runs."""
    if sorted(order) != sorted(plan):
        raise ValueError(f"the order {list(order)} must name each run of the plan {list(plan)} once")
    heat, meter = Heat(), LoadMeter()
    for name in order:
        heat.running = name
        yield heat
        heat.runs[name] = timed_run((models or {}).get(name, lm), prompt, plan[name], threads)
    heat.running, heat.load = None, dataclasses.replace(meter.stop(), threads=threads or torch.get_num_threads())
    yield heat


def run_heat(lm: LoadedModel, prompt: str, plan: dict[str, DecodeSettings], order: Sequence[str],
             threads: int | None = None) -> Heat:
    """`heat_steps` to its end: the finished heat."""
    *_, heat = heat_steps(lm, prompt, plan, order, threads)
    return heat
