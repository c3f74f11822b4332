"""The plain decoding every speedup counts against: the fastest this machine has for the model.

A drafter's speedup is only honest against the fastest plain decoding at hand, not against plain
decoding in whatever dtype the drafter happens to run. On a CPU the same model decodes plainly in
float32 (packed linear layers) or in bfloat16, and neither always wins: on an Intel Xeon with AMX
float32's step was the faster, on an AMD EPYC with AVX512-BF16 bfloat16's. Plain decoding has no
tree to agree with, so it runs on the library's own attention, the faster one. So beside the
model's own plain decoding, `plain_rivals` loads the model in each other CPU variant, for plain
decoding alone; bench and the page's race time them in the same run, and `fastest_plain` names
the one every speedup is counted against.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .model import LoadedModel
from .settings import PLAIN
from .stats import Timing

OWN = "own"  # the model's own plain decoding, in its own dtype and attention
# The CPU's plain-decoding variants: a name for each, and the dtype it runs in (library attention).
CPU_VARIANTS = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def variant_name(lm: LoadedModel) -> str:
    """The variant `lm` itself is, if it is one of CPU_VARIANTS (its dtype, the library's attention)."""
    dtype = str(lm.dtype).removeprefix("torch.")
    return dtype if dtype in CPU_VARIANTS and not lm.gathered_attention else ""


def plain_rivals(lm: LoadedModel, name: str | None = None, heads: str | None = None,
                 pack_linear: bool = True) -> dict[str, LoadedModel]:
    """The model in every other CPU variant, loaded for plain decoding alone, by variant name.

    None on a GPU, where the model's dtype is the fast one, and for a model small enough to sit in
    the processor's caches, which stays float32 (`precision.fits_in_caches`).
    """
    from .loading import load_model
    from .precision import fits_in_caches

    if lm.device.type != "cpu" or fits_in_caches(lm.model):
        return {}
    own = variant_name(lm)
    return {variant: load_model(name or lm.name, heads, str(lm.device), variant, self_test=False,
                                pack_linear=pack_linear, attention="library", drafters=())
            for variant in CPU_VARIANTS if variant != own}


def cached_plain_rivals(lm: LoadedModel) -> dict[str, LoadedModel]:
    """`plain_rivals(lm)`, loaded on first use and kept with the model (the page's races reuse them)."""
    if lm.plain_rivals is None:
        lm.plain_rivals = plain_rivals(lm)
    return lm.plain_rivals


def rival_run(variant: str) -> str:
    """The name a rival's plain decoding runs under in a heat, beside the lanes: "ar@float32"."""
    return f"{PLAIN}@{variant}"


def fastest_plain(timings: Mapping[str, Timing]) -> str:
    """The name of the fastest plain decoding among `timings` (OWN is the model's own): the one
    every speedup counts against."""
    return max(timings, key=lambda name: timings[name].tokens_per_second)


def describe(lm: LoadedModel) -> str:
    """A plain decoding in words, by the model it runs on: "plain decoding in float32"."""
    dtype = str(lm.dtype).removeprefix("torch.")
    return f"plain decoding in {dtype}" + (", exact attention" if lm.gathered_attention else "")
