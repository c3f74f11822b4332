"""Linear layers whose weights are packed once for the CPU's matrix library, not on every call.

On a CPU, `F.linear` with a handful of rows (a tree of 4-16 candidates) runs a matrix product
that first re-packs the whole weight matrix into the blocked layout its
kernel reads. For a 1536 x 576 layer that copy costs about as much as the product itself, so a
verify pass of 8 tokens moved the weights about twice and cost 1.8-2.1 one-token steps on
SmolLM2 (measured with `python -m scripts.pass_cost`). oneDNN can pack the weights once, ahead of time: PyTorch's
`torch.ops.mkldnn._reorder_linear_weight` does it and `torch.ops.mkldnn._linear_pointwise`
multiplies by the packed copy. These are the ops inductor's weight freezing emits for CPU
linear layers (torch/_inductor/fx_passes/mkldnn_fusion.py); they are private, so the packing
is tried once and everything falls back to plain `nn.Linear` where they are missing or fail.

A single row (a one-token step) can go either way. A vocabulary projection always takes the
packed kernel (`one_row_packed`): tens of thousands of outputs, where it streams the matrix faster
even for one row (measured with the weights out of cache: SmolLM2's 49152 x 576 lm_head in 5.4 ms
against 8.9 ms; a draft vocabulary's 8192 rows, 8 inputs, in 1.6 ms against 4.4 ms for the
transposed product the drafts used before). For the inner layers it depends on the processor: on
an Intel Xeon their one row ran as fast or faster through `F.linear`'s matrix-vector product (576 x
192: 0.16 ms against 0.30 packed), on an AMD EPYC with AVX-512 the packed kernel took a whole
SmolLM2 step from 60 to 51 ms. So `pack_linear_layers` times one row both ways on the model's own
weights (`one_row_packed_is_faster`) and takes the faster. So a step and a verify pass
sum in different orders, and their logits differ in the last bits (on SmolLM2 an 8-token pass
and 8 steps differ by at most 5e-5, as they do unpacked by 2e-5; argmax equal). Greedy identity is therefore
checked on whole runs: Medusa on the packed model, plain decoding on it, and plain decoding on
the unpacked model write the same tokens (tests/test_packed_linear.py).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

# A model whose weights fit in a processor's caches is timed by call overheads, not by its memory
# traffic (the embedded models, the tests' tiny ones): its one rows are not timed, they stay on F.linear.
MIN_TIMED_BYTES = 48 * 2**20
SAMPLE_BYTES = 64 * 2**20  # enough of a model's weights to miss the caches, as a whole model does
ONE_ROW_REPEATS = 5
# The packed kernel must win clearly for one row: F.linear is the library's own path, and a busy
# machine's noise must not flip the choice.
ONE_ROW_MARGIN = 0.95
# oneDNN lays the packed weights out for this many rows. Measured on SmolLM2 (1 thread, past 150,
# scripts/pass_cost.py): with 8, passes of 4-16 tokens cost 1.2-1.6 one-token steps; with 1,
# 1.5-1.9. 16 measured like 8.
BATCH_SIZE_HINT = 8


@functools.cache
def packing_works() -> bool:
    """Whether this PyTorch build can pack a linear layer for oneDNN and multiply by it."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, x = torch.randn(3, 2), torch.randn(1, 2)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):  # op missing, or not built in
        return False
    return torch.allclose(out, F.linear(x, weight), atol=1e-5)


def can_pack(linear: nn.Module) -> bool:
    """A plain float32 nn.Linear on the CPU, in a build that packs.

    Subclasses (quantized or adapter layers) keep their own forward. Only float32 is packed:
    it is what the CPU runs here (see `resolve_dtype`), and oneDNN's reduced-precision
    kernels depend on what the processor supports.
    """
    return (
        type(linear) is nn.Linear
        and linear.weight.device.type == "cpu"
        and linear.weight.dtype == torch.float32
        and packing_works()
    )


class PackedLinear(nn.Module):
    """A stand-in for a CPU nn.Linear that multiplies by a copy of its weights packed once.

    It keeps the original `weight` and `bias` parameters (shared, not copied), so code that
    reads `lm_head.weight`, tied embeddings and `state_dict()` see what they saw before; the
    packed copy is a plain attribute, outside the state dict and out of reach of `.to()`.
    That costs a second copy of the weights in memory, but it lets two cases use `weight` as
    nn.Linear does: a single row (a one-token step) is a matrix-vector product, which re-packs
    nothing and measured 10-20% faster than the packed kernel here; and the packed op has no
    backward pass, so where a gradient is wanted it would silently hand back none.
    """

    def __init__(self, linear: nn.Linear, batch_size_hint: int = BATCH_SIZE_HINT,
                 one_row_packed: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.one_row_packed = one_row_packed  # a vocabulary projection: see the module's docstring
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_size_hint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one_row = x.numel() == self.in_features and not self.one_row_packed
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if one_row or wants_grad:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"one_row_packed={self.one_row_packed}")


def packed(linear: nn.Module, batch_size_hint: int = BATCH_SIZE_HINT) -> nn.Module:
    """`linear` with its weights packed where that works here; `linear` itself elsewhere."""
    return PackedLinear(linear, batch_size_hint) if can_pack(linear) else linear


def _one_row_seconds(layers: list[PackedLinear], packed_kernel: bool) -> float:
    """One row through each layer, by its packed copy or by F.linear: the seconds it took."""
    inputs = {layer.in_features: torch.randn(1, layer.in_features) for layer in layers}
    start = time.perf_counter()
    for layer in layers:
        x = inputs[layer.in_features]
        if packed_kernel:
            torch.ops.mkldnn._linear_pointwise(x, layer.packed_weight, layer.bias, "none", [], "")
        else:
            F.linear(x, layer.weight, layer.bias)
    return time.perf_counter() - start


@torch.inference_mode()
def one_row_packed_is_faster(layers: list[PackedLinear]) -> bool:
    """Whether one row through these layers' packed copies beats F.linear on this processor:
    medians of interleaved repeats over the first layers' weights, up to SAMPLE_BYTES."""
    sample, total = [], 0
    for layer in layers:
        if total >= SAMPLE_BYTES:
            break
        sample.append(layer)
        total += layer.weight.numel() * layer.weight.element_size()
    if total < MIN_TIMED_BYTES:
        return False
    _one_row_seconds(sample, True), _one_row_seconds(sample, False)  # warm-up
    times = [(_one_row_seconds(sample, True), _one_row_seconds(sample, False)) for _ in range(ONE_ROW_REPEATS)]
    return statistics.median(p for p, _ in times) < ONE_ROW_MARGIN * statistics.median(f for _, f in times)


def pack_linear_layers(model: nn.Module, batch_size_hint: int = BATCH_SIZE_HINT) -> int:
    """Swap every packable nn.Linear inside `model` for a PackedLinear, in place; return how many.

    The model's vocabulary projection (its output embeddings, where it says which they are)
    multiplies one row by the packed copy too; the inner layers do where that measures faster here
    (`one_row_packed_is_faster`). Where nothing can be packed (a GPU, half precision, a build
    without oneDNN) the model is left as it was and 0 comes back.
    """
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if can_pack(child)]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child, batch_size_hint, one_row_packed=child is output))
    inner = [getattr(parent, name) for parent, name, child in swaps if child is not output]
    if inner and one_row_packed_is_faster(inner):
        for layer in inner:
            layer.one_row_packed = True
    return len(swaps)
