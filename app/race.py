"""The race: plain decoding against Medusa on the same prompt, each timed alone, then replayed.

How the timing is taken (the page says so too):
1. warm-up: a short run of each decoder, so neither pays for first-call initialisation;
2. plain (AR) decoding runs to the end, alone on the hardware; its clock is the engine's own,
   which counts only time inside the decoding loop;
3. Medusa runs next, alone, on the same clock. While it runs, the page shows both panes on that
   clock: Medusa's tokens as they arrive, and the AR run's tokens as recorded at the same
   moment of its own run. After Medusa ends, the AR replay continues in real time to its end.
The two decoders never run at the same moment, so neither slows the other.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

from decoding import DecodeSettings, MedusaModel, RunTrace, generate, stream

from .figures import speedup

REPLAY_STEP = 0.05  # seconds between frames of the AR tail replay
WARM_UP_TOKENS = 4

TIMING_NOTE = (
    "**How this was timed.** Both decoders first do a short warm-up run. Then plain decoding "
    "runs to the end, alone; then Medusa runs, alone: the two never share the hardware at the "
    "same moment. Each is timed by the engine's own clock, which counts only time spent "
    "decoding (prefill included) and stops while the page is being updated. The panes replay "
    "both measured timelines on one clock, live as the Medusa run proceeds."
)


@dataclass
class RaceFrame:
    """What the page shows at one moment of the race."""

    phase: str  # "warm-up", "measuring AR", "racing", "replaying", "done"
    ar: RunTrace | None
    medusa: RunTrace | None
    clock: float  # seconds on the measured clock; the panes show what each run had by then


def _with(settings: DecodeSettings, **changes) -> DecodeSettings:
    return dataclasses.replace(settings, **changes)


def _latest_time(trace: RunTrace) -> float:
    return trace.rounds[-1].t_end if trace.rounds else trace.time_prefill


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

    medusa = None
    for medusa in stream(model, prompt, medusa_settings):
        yield RaceFrame("racing", ar, medusa, _latest_time(medusa))

    clock = medusa.total_time
    started = time.perf_counter() - clock
    while clock < ar.total_time:
        time.sleep(min(REPLAY_STEP, ar.total_time - clock))
        clock = min(time.perf_counter() - started, ar.total_time)
        yield RaceFrame("replaying", ar, medusa, clock)
    yield RaceFrame("done", ar, medusa, max(ar.total_time, medusa.total_time))


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
