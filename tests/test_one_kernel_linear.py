"""A half-precision step's linear layers give the bits a verify pass gives at that row.

On a CPU a bfloat16 product of one row runs another kernel than a product of several, and the two
round differently (one_kernel_linear.py). These tests hold the layer to what identity needs: a
row's result does not depend on how many rows were multiplied beside it, one included, for every
row count a tree's verify pass uses; and loading a model for exact half-precision decoding puts
the layer in place of each of the base model's linear layers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from decoding import load_model
from decoding.one_kernel_linear import OneKernelLinear

# SmolLM2's linear shapes (out, in): where a lone row first parted here (576 x 1536, down_proj).
SHAPES = [(576, 1536), (1536, 576), (576, 576), (192, 576)]
ROWS = [2, 3, 4, 5, 8, 12, 16, 17, 24, 32, 48, 63, 64, 96, 128]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_gets_the_same_bits_alone_and_beside_any_number_of_rows(shape):
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0], bias=False).to(torch.bfloat16)
    layer = OneKernelLinear(linear)
    x = torch.randn(max(ROWS), 1, shape[1]).to(torch.bfloat16)
    with torch.inference_mode():
        alone = torch.cat([layer(x[j:j + 1]) for j in range(max(ROWS))])
        for rows in ROWS:
            together = layer(x[:rows].view(1, rows, shape[1]))[0]
            assert torch.equal(together, alone[:rows, 0]), f"{rows} rows"


def test_a_lone_row_keeps_its_shape_and_its_gradient_free_value():
    linear = nn.Linear(8, 3)
    layer = OneKernelLinear(linear)
    x = torch.randn(1, 1, 8)
    assert layer(x).shape == (1, 1, 3)
    assert torch.allclose(layer(x), linear(x), atol=1e-6)


def test_exact_half_precision_swaps_the_base_models_linear_layers(tiny_dirs):
    exact = load_model(str(tiny_dirs["llama"]), device="cpu", dtype="bfloat16", attention="gathered", drafters=())
    library = load_model(str(tiny_dirs["llama"]), device="cpu", dtype="bfloat16", attention="library", drafters=())
    linear_types = {type(m) for m in exact.model.model.modules() if isinstance(m, OneKernelLinear | nn.Linear)}
    assert linear_types == {OneKernelLinear}
    assert not any(isinstance(m, OneKernelLinear) for m in library.model.modules())
