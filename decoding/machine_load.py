"""How busy the machine was while something was measured: other programs' cores, from the kernel.

A figure measured while another program held a core is not the method's speed; every measurement
that a page or a table presents (bench's heats, the race, the cost curve) records its load with
`LoadMeter` and says so where it was busy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other programs keeping at least this many cores busy on average make a machine "busy": half a
# core taken steals a quarter of a 2-core machine, enough to move a speedup by more than bench's
# run-to-run noise.
BUSY_CORES = 0.5
_STAT = "/proc/stat"


def _busy_cpu_seconds() -> float | None:
    """CPU seconds every core has spent busy since boot (all programs), or None where the kernel
    does not say (not Linux)."""
    try:
        with open(_STAT, encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting for I/O
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is already in user time


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass(frozen=True)
class MachineLoad:
    """What else the machine ran while something was measured."""

    others: float | None  # cores other programs kept busy, on average (None: not known here)
    cores: int
    threads: int  # torch threads the measured runs used
    seconds: float  # how long the measuring took

    @property
    def busy(self) -> bool:
        return self.others is not None and self.others >= BUSY_CORES

    def to_dict(self) -> dict:
        return {"others": self.others, "cores": self.cores, "threads": self.threads, "seconds": self.seconds,
                "busy": self.busy}


class LoadMeter:
    """Measures the machine's load from its creation until `stop()`."""

    def __init__(self) -> None:
        self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())

    def stop(self) -> MachineLoad:
        wall, busy, own = time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds()
        wall0, busy0, own0 = self._start
        seconds = wall - wall0
        others = None
        if busy is not None and busy0 is not None and seconds > 0:
            # Our own threads' time is taken out; what remains is everybody else's. Never negative:
            # the two counters tick at slightly different moments.
            others = max(0.0, ((busy - busy0) - (own - own0)) / seconds)
        import torch  # here, not above: a trace names MachineLoad, and `--help` must not load torch

        return MachineLoad(others, os.cpu_count() or 1, torch.get_num_threads(), seconds)
