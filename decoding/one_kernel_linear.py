"""Half-precision linear layers whose one-row product runs through the same kernel as several rows.

Greedy Medusa is lossless only if a verify pass computes, at every node, the bits a one-token step
computes there (see attention.py for the attention's half of it). The linear layers are the other
half. On a CPU, a product of one row by a bfloat16 weight matrix runs a matrix-vector kernel, and
several rows a matrix-matrix kernel; the two add a row's terms in different orders. Measured on an
AMD EPYC with AVX512-BF16 (SmolLM2's 576 x 1536 `down_proj`, random inputs): a row computed with
2 to 128 others gave the same bits whatever their number, but ~10% of rows computed alone
differed from it in the last bit, enough to flip a near-tie: greedy Medusa on the 64-node tree
`mc_sim_7b_63` parted from plain decoding on 4 of 5 chat questions, while small trees (whose
passes happened to give the same bits) did not.

So the one row of a step is multiplied as two (itself twice) and the first kept: every pass then
takes the matrix-matrix kernel, whose rows do not depend on how many were computed beside them
(tests/test_one_kernel_linear.py checks that on this machine, for every row count a tree uses).
A step reads the weights once either way, so the second row costs little.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class OneKernelLinear(nn.Module):
    """A stand-in for an nn.Linear that multiplies a single row as two, keeping the weights shared."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features:
            return F.linear(x, self.weight, self.bias)
        row = x.reshape(1, self.in_features)
        return F.linear(torch.cat([row, row]), self.weight, self.bias)[:1].view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_one_kernel(model: nn.Module) -> int:
    """Swap every plain nn.Linear inside `model` for a OneKernelLinear, in place; return how many."""
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, OneKernelLinear(child))
    return len(swaps)
