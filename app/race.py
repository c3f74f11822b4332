"""The race: plain decoding against Medusa on the same prompt, each timed alone, then replayed.

How the timing is taken (the page says so too):
1. warm-up: a short run of each decoder, so neither pays for first-call initialisation;
2. plain (AR) decoding runs to the end, alone on the hardware; its clock is the engine's own,
   which counts only time inside the decoding loop;
3. Medusa runs next, to the end, alone, on the same clock;
4. both measured runs are replayed side by side in real time, on that one clock.
The two decoders never run at the same moment, so neither slows the other. Nor is either
measured while the page redraws: on a laptop the browser shares the CPU, and a run streamed to
the page while the other ran unwatched would be measured under a load the other never had.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

from decoding import DecodeSettings, MedusaModel, RunTrace, generate

from .figures import speedup

REPLAY_STEP = 0.05  # seconds between frames of the AR tail replay
WARM_UP_TOKENS = 4

TIMING_NOTE = (
    "**How this was timed.** Both decoders first do a short warm-up run. Then plain decoding "
    "runs to the end, alone; then Medusa runs to the end, alone: the two never share the "
    "hardware at the same moment, and the page is not redrawn while either runs. Each is timed "
    "by the engine's own clock, which counts only time spent decoding (prefill included). The "
    "panes then replay both measured timelines side by side, in real time, on one clock."
)


@dataclass
class RaceFrame:
    """What the page shows at one moment of the race."""

    phase: str  # "warm-up", "measuring AR", "measuring Medusa", "replaying", "done"
    ar: RunTrace | None
    medusa: RunTrace | None
    clock: float  # seconds on the measured clock; the panes show what each run had by then


def _with(settings: DecodeSettings, **changes) -> DecodeSettings:
    return dataclasses.replace(settings, **changes)


def race(model: MedusaModel, prompt: str, settings: DecodeSettings) -> Iterator[RaceFrame]:
    """Measure AR, then Medusa, each alone; yield frames to replay them side by side."""
    ar_settings = _with(settings, method="ar")
    medusa_settings = _with(settings, method="medusa")
    medusa_settings.validate()

    yield RaceFrame("warm-up", None, None, 0.0)
    for warm in (ar_settings, medusa_settings):
        generate(model, prompt, _with(warm, max_new_tokens=min(WARM_UP_TOKENS, settings.max_new_tokens)))

    yield RaceFrame("measuring AR", None, None, 0.0)
    ar = generate(model, prompt, ar_settings)
    yield RaceFrame("measuring Medusa", None, None, 0.0)
    medusa = generate(model, prompt, medusa_settings)

    end = max(ar.total_time, medusa.total_time)
    clock, started = 0.0, time.perf_counter()
    while clock < end:
        time.sleep(min(REPLAY_STEP, end - clock))
        clock = min(time.perf_counter() - started, end)
        yield RaceFrame("replaying", ar, medusa, clock)
    yield RaceFrame("done", ar, medusa, end)


def race_summary(ar: RunTrace, medusa: RunTrace) -> str:
    """The headline: passes and measured time for each, and the speedup."""
    ratio = speedup(ar, medusa)
    verdict = "faster" if ratio >= 1 else "as fast: slower than plain decoding here"
    return (
        f"**Medusa: {medusa.forward_passes} passes for {len(medusa.tokens)} tokens; "
        f"plain decoding: {ar.forward_passes} passes for {len(ar.tokens)} tokens.**  \n"
        f"Measured: plain {ar.total_time:.2f} s, Medusa {medusa.total_time:.2f} s → "
        f"**{ratio:.2f}× {verdict}**"
        f" on {medusa.device} ({medusa.model})."
    )
