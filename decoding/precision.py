"""`--dtype auto` on a CPU: float32 or bfloat16, whichever this processor multiplies faster.

A CPU with bfloat16 matrix units (Intel's AMX, AVX512-BF16) runs a 16-row product through a
model's weights in bfloat16 for little more than a 1-row one: the regime Medusa is built for.
Most laptops have no such units and emulate bfloat16, 2-3x slower than float32. The processor's
flags say only part of it (memory bandwidth moves the float32 step too), so we time it: the
model's own linear weights, past the size of the caches, multiplied by 16 rows in each dtype,
float32 through the same packed weights decoding would use (`packed_linear.py`). A verify pass
is mostly such products, so the faster dtype for them is the faster dtype for Medusa.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .packed_linear import BATCH_SIZE_HINT, MIN_TIMED_BYTES, SAMPLE_BYTES, packing_works

ROWS = 16  # about a verify pass of a CPU-sized tree
REPEATS = 3
# bfloat16 must win clearly: float32 is the more exact of the two, and a busy machine's noise
# must not flip the choice. Where bfloat16 has matrix units it takes about half the time.
BFLOAT16_MARGIN = 0.8


def _sample_weights(model: nn.Module) -> list[torch.Tensor]:
    """The first linear layers' float32 weights, up to SAMPLE_BYTES (the lm_head left out)."""
    lm_head = model.get_output_embeddings()
    weights, total = [], 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not lm_head and total < SAMPLE_BYTES:
            weights.append(module.weight.detach().float())
            total += weights[-1].numel() * 4
    return weights


def products(weights: list[torch.Tensor], dtype: torch.dtype, rows: int = ROWS) -> list[Callable[[], object]]:
    """One call per weight multiplying `rows` rows by it in `dtype` (float32: packed, if possible)."""
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]).to(dtype) for w in weights}
    if dtype == torch.float32 and packing_works():
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, BATCH_SIZE_HINT) for w in weights]
        return [lambda p=p, x=inputs[w.shape[1]]: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                for w, p in zip(weights, packed, strict=True)]
    cast = [w.to(dtype) for w in weights]
    return [lambda w=w, x=inputs[w.shape[1]]: F.linear(x, w) for w in cast]


def _seconds(calls: list[Callable[[], object]]) -> float:
    start = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - start


@torch.inference_mode()
def bfloat16_time_ratio(weights: list[torch.Tensor]) -> float:
    """bfloat16's time over float32's for the same products: medians of interleaved repeats, so
    that a busy machine slows both alike."""
    float32, bfloat16 = products(weights, torch.float32), products(weights, torch.bfloat16)
    _seconds(float32), _seconds(bfloat16)  # warm-up
    times = [(_seconds(float32), _seconds(bfloat16)) for _ in range(REPEATS)]
    return statistics.median(b for _, b in times) / statistics.median(f for f, _ in times)


def choose_cpu_dtype(model: nn.Module) -> tuple[torch.dtype, str]:
    """float32 or bfloat16 for this model on this CPU, and why, in a sentence."""
    weights = _sample_weights(model)
    if sum(w.numel() * 4 for w in weights) < MIN_TIMED_BYTES:
        return torch.float32, "float32: the model is small enough to sit in the processor's caches"
    ratio = bfloat16_time_ratio(weights)
    if ratio < BFLOAT16_MARGIN:
        return torch.bfloat16, (f"bfloat16: on this CPU a {ROWS}-row product through the model's weights "
                                f"took {ratio:.2f}x the float32 time (bfloat16 matrix units)")
    return torch.float32, (f"float32: on this CPU bfloat16 took {ratio:.2f}x the float32 time for a "
                           f"{ROWS}-row product through the model's weights (no fast bfloat16 units)")
