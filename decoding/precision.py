"""`--dtype auto` on a CPU: float32 or bfloat16, whichever *decodes* faster here.

A CPU with bfloat16 matrix units (Intel's AMX) verifies a 16-token tree in bfloat16 for little
more than a one-token step: the regime Medusa is built for. Most laptops have no such units and
emulate bfloat16, 2-3x slower than float32; and even with them, bfloat16's one-token step can be
slower than float32's (AMX tiles pay for many rows, not one). Timing a matrix product says little
of that, so we time decoding itself: each dtype's cost curve (`cost_curve.py`: the plain step and
every verify pass a tree would use, with the attention and linear layers that dtype will run, and
the heads' drafting), cached per machine. From the curve and the heads' measured accuracy,
`--tree auto`'s own estimate (`tree_choice.py`) says how fast Medusa's best tree would write in
each dtype; the dtype whose best lane (Medusa, or plain decoding where no tree pays) writes
fastest wins. Figures are counted against the fastest plain decoding of the two, in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .cost_curve import model_cost_curve
from .medusa_modules import medusa_part
from .model import LoadedModel
from .packed_linear import MIN_TIMED_BYTES
from .tree_choice import choose_tree

# bfloat16 must win clearly: float32 is the more exact of the two, and a busy machine's noise must
# not flip the choice.
BFLOAT16_MARGIN = 0.95


def fits_in_caches(model: nn.Module) -> bool:
    """Whether the model's linear weights are small enough to sit in a processor's caches: it is then
    timed by call overheads, not by its arithmetic (the embedded models, the tests' tiny ones)."""
    lm_head = model.get_output_embeddings()
    # Linear layers, and the project's stand-ins for them (packed or one-kernel): each has `in_features`.
    linears = [m for m in model.modules() if hasattr(m, "in_features") and isinstance(getattr(m, "weight", None),
                                                                                    torch.Tensor)]
    total = sum(m.weight.numel() * 4 for m in linears if m is not lm_head)
    return total < MIN_TIMED_BYTES


@dataclass(frozen=True)
class DecodingEstimate:
    """How fast one dtype decodes here, from its measured cost curve."""

    dtype: torch.dtype
    step_seconds: float  # plain decoding's one-token step
    seconds_per_token: float  # the best lane's
    best_lane: str  # "plain decoding", or Medusa on its best tree

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def estimate(lm: LoadedModel) -> DecodingEstimate:
    """The dtype's plain step and its best lane: Medusa's best tree by `--tree auto`'s estimate
    (expected tokens a pass over the round's measured cost), or plain decoding if no tree pays."""
    curve = model_cost_curve(lm)
    step = curve.step_seconds
    part = medusa_part(lm)
    if part is not None and part.accuracy:
        choice = choose_tree(part.accuracy, curve)
        if choice.estimated_speedup > 1.0:
            return DecodingEstimate(lm.dtype, step, step / choice.estimated_speedup, f"Medusa on {choice.name}")
    return DecodingEstimate(lm.dtype, step, step, "plain decoding")


def choose_cpu_dtype(candidates: dict[torch.dtype, LoadedModel]) -> tuple[torch.dtype, str]:
    """float32 or bfloat16 (the keys of `candidates`, the same model in each), and why, in a sentence."""
    estimates = {dtype: estimate(lm) for dtype, lm in candidates.items()}
    float32, bfloat16 = estimates[torch.float32], estimates[torch.bfloat16]
    chosen = bfloat16 if bfloat16.seconds_per_token < BFLOAT16_MARGIN * float32.seconds_per_token else float32
    other = bfloat16 if chosen is float32 else float32
    fastest_plain = min(estimates.values(), key=lambda e: e.step_seconds)
    return chosen.dtype, (
        f"{chosen.name}: measured here, {chosen.best_lane} writes a token every "
        f"{chosen.seconds_per_token * 1e3:.1f} ms in {chosen.name} against {other.seconds_per_token * 1e3:.1f} ms "
        f"({other.best_lane}) in {other.name}; plain decoding's step is {float32.step_seconds * 1e3:.1f} ms in "
        f"float32 and {bfloat16.step_seconds * 1e3:.1f} ms in bfloat16, the fastest in {fastest_plain.name}")
