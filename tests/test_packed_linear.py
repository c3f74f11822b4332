"""Linear layers packed once for oneDNN: the same products, and greedy output unchanged.

Packed kernels sum in another order than `F.linear`, and may round differently for 1 row and
for 8. Greedy Medusa compares the argmax of a T-row verify pass with what 1-row steps would
choose, so it is checked here on whole runs: Medusa on the packed model, plain decoding on the
packed model and plain decoding on the unpacked one write the same tokens.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from decoding import DecodeSettings, generate, load_model, packed_linear
from decoding.drafters.eagle import NAME as EAGLE
from decoding.medusa_modules import TransposedLinear, few_rows_projection
from decoding.packed_linear import PackedLinear, pack_linear_layers, packed, packing_works
from test_lossless import oracle_heads, prompts, trees, with_heads

NEW_TOKENS = 40
needs_packing = pytest.mark.skipif(
    not packing_works(), reason="this PyTorch build cannot pack linear layers (torch.ops.mkldnn missing or failing)")


@needs_packing
@pytest.mark.parametrize("rows", [1, 2, 8, 17])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("hint", [1, 8])
@pytest.mark.parametrize("one_row_packed", [False, True])
def test_packed_linear_multiplies_like_nn_linear(rows, bias, hint, one_row_packed):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    layer = PackedLinear(linear, batch_size_hint=hint, one_row_packed=one_row_packed)
    with torch.inference_mode():
        for shape in [(rows, 96), (1, rows, 96)]:
            x = torch.randn(shape)
            torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)


class NoMatrixVector:
    """Stands in for torch.nn.functional in packed_linear: a product through F.linear fails."""

    @staticmethod
    def linear(*args):
        raise AssertionError("multiplied through F.linear, not the packed copy")


@needs_packing
def test_one_row_goes_through_the_packed_copy_only_for_a_vocabulary_projection(monkeypatch):
    linear = nn.Linear(16, 300)
    inner, vocabulary = PackedLinear(linear), PackedLinear(linear, one_row_packed=True)
    x = torch.randn(1, 16)
    with torch.inference_mode():
        expected = linear(x)
        monkeypatch.setattr(packed_linear, "F", NoMatrixVector)
        torch.testing.assert_close(vocabulary(x), expected, rtol=1e-5, atol=1e-5)
        with pytest.raises(AssertionError, match="F.linear"):
            inner(x)  # an inner layer's one row is a matrix-vector product
        inner(torch.randn(2, 16))  # several rows are always packed


def test_a_draft_multiplies_few_rows_by_a_copy_laid_out_for_them():
    linear = nn.Linear(16, 300)
    x = torch.randn(3, 16)
    projection = few_rows_projection(linear)
    if packing_works():
        assert isinstance(projection, PackedLinear) and projection.one_row_packed
    else:
        assert isinstance(projection, TransposedLinear)
    half = nn.Linear(16, 300).to(torch.bfloat16)  # not packed: stored transposed instead
    assert isinstance(few_rows_projection(half), TransposedLinear)
    assert few_rows_projection(projection) is projection  # already laid out: kept as it is
    with torch.inference_mode():
        torch.testing.assert_close(projection(x), linear(x), rtol=1e-5, atol=1e-5)


@needs_packing
def test_gradients_flow_as_through_nn_linear():
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    layer = PackedLinear(linear)
    x = torch.randn(3, 16, requires_grad=True)
    layer(x).square().sum().backward()
    expected = torch.autograd.grad(linear(x).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


class Adapter(nn.Linear):
    """A subclass with a forward of its own, which packing must leave alone."""


def test_only_plain_float32_cpu_layers_are_packed():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.bfloat16), nn.Sequential(nn.Linear(8, 4)),
                          Adapter(4, 4))
    keys = list(model.state_dict())
    weights = [model[0].weight, model[2][0].weight]
    expected = 2 if packing_works() else 0
    assert pack_linear_layers(model) == expected
    assert [type(m) for m in (model[1], model[3])] == [nn.Linear, Adapter]
    assert packed(model[1]) is model[1]
    if expected:
        assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
        # The parameters are the very same objects: tied weights stay tied, the state dict is unchanged.
        assert model[0].weight is weights[0] and model[2][0].weight is weights[1]
    assert list(model.state_dict()) == keys


@pytest.fixture(scope="module")
def unpacked(tiny_dirs):
    return {arch: load_model(str(path), pack_linear=False) for arch, path in tiny_dirs.items()}


@needs_packing
def test_load_model_packs_by_default(tiny_models, unpacked):
    assert any(isinstance(m, PackedLinear) for m in tiny_models["llama"].model.modules())
    assert not any(isinstance(m, PackedLinear) for m in unpacked["llama"].model.modules())
    # The EAGLE head's layer too (its fc and the decoder layer's projections).
    assert any(isinstance(m, PackedLinear) for m in tiny_models["llama"].parts[EAGLE].head.modules())
    assert not any(isinstance(m, PackedLinear) for m in unpacked["llama"].parts[EAGLE].head.modules())


@needs_packing
def test_the_lm_head_alone_multiplies_one_row_by_its_packed_copy(tiny_models):
    model = tiny_models["llama"].model
    output = model.get_output_embeddings()
    assert isinstance(output, PackedLinear) and output.one_row_packed
    inner = [m for m in model.modules() if isinstance(m, PackedLinear) and m is not output]
    assert inner and not any(m.one_row_packed for m in inner)


@needs_packing
@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, choices=trees(), arch=st.sampled_from(["llama", "qwen2", "gpt2"]))
def test_packed_medusa_writes_what_unpacked_plain_decoding_writes(tiny_models, unpacked, prompt, choices, arch):
    packed_mm = tiny_models[arch]
    plain = DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS)
    unpacked_tokens = generate(unpacked[arch], prompt, plain).tokens
    packed_tokens = generate(packed_mm, prompt, plain).tokens
    oracle = with_heads(packed_mm, oracle_heads(packed_mm, prompt, num_heads=4, wrong_every=5))  # long paths accepted
    medusa_tokens = generate(oracle, prompt, DecodeSettings(max_new_tokens=NEW_TOKENS, tree=choices)).tokens
    assert medusa_tokens == packed_tokens == unpacked_tokens


@needs_packing
@pytest.mark.parametrize("packed_faster", [True, False])
def test_inner_layers_take_the_one_row_kernel_that_measured_faster(monkeypatch, packed_faster):
    """A big enough model's one rows go through whichever kernel its own weights ran faster."""
    from decoding import packed_linear

    monkeypatch.setattr(packed_linear, "MIN_TIMED_BYTES", 0)
    timed = []

    def seconds(layers, packed_kernel):
        timed.append(packed_kernel)
        return 1.0 if packed_kernel == packed_faster else 2.0

    monkeypatch.setattr(packed_linear, "_one_row_seconds", seconds)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    pack_linear_layers(model)
    assert timed and all(layer.one_row_packed == packed_faster for layer in model)


@needs_packing
def test_a_model_that_fits_in_the_caches_is_not_timed(monkeypatch):
    from decoding import packed_linear

    monkeypatch.setattr(packed_linear, "_one_row_seconds", lambda layers, packed_kernel: pytest.fail("timed"))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    pack_linear_layers(model)
    assert not any(layer.one_row_packed for layer in model)
