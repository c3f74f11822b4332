"""The exact attention gives a tree node, bit for bit, what a one-token step at its position gives.

Checked on the attention function alone, over random keys: a verify pass over a tree (up to 128
nodes) after a prefix of any length (across chunk boundaries), against one step per node whose
cache holds the prefix, then the node's ancestors and the node, as plain decoding's cache would.
Grouped-query heads, sliding windows and both dtypes. The products underneath are the library's;
this is what checks, on the machine that runs it, the property the design relies on (a row's
bits do not depend on the rows computed beside it: see decoding/attention.py).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from decoding.attention import CHUNK, gathered_attention
from decoding.passes import additive_mask
from decoding.tree import Tree
from test_lossless import trees

MODULE = nn.Module()


def _tree_pass(query, keys, values, tree: Tree, past: int, window: int | None):
    """One verify pass over every node: returns (1, T, H, D). Keys (1, KVH, past + T, D)."""
    depth = tree.depth_tensor
    positions = torch.cat([torch.arange(past), past + depth])
    visible = torch.zeros(tree.size, past + tree.size, dtype=torch.bool)
    visible[:, :past] = True
    visible[:, past:] = tree.ancestor_mask
    if window is not None:
        query_positions = past + depth
        visible &= positions[None, :] > query_positions[:, None] - window
    mask = additive_mask(visible, query.dtype)[None, None]
    out, _ = gathered_attention(MODULE, query, keys, values, mask, scaling=0.125)
    return out


def _step(query, keys, values, tree: Tree, past: int, node: int, window: int | None):
    """The step plain decoding takes at `node`'s position: its cache is the prefix, the path to
    the node (in order) and the node; a sliding window keeps only its last `window` keys."""
    columns = torch.cat([torch.arange(past), past + torch.tensor(tree.path_to(node))])
    if window is not None:
        columns = columns[-window:]
    out, _ = gathered_attention(MODULE, query[:, :, node:node + 1], keys[:, :, columns].contiguous(),
                                values[:, :, columns].contiguous(), None, scaling=0.125)
    return out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(choices=trees(max_depth=5, max_rank=8, max_nodes=127),
       past=st.one_of(st.integers(1, 3 * CHUNK + 7), st.sampled_from([CHUNK - 1, CHUNK, 2 * CHUNK - 3, 2 * CHUNK])),
       kv_heads=st.integers(1, 3), group=st.integers(1, 3), dim=st.sampled_from([16, 64]),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       window=st.one_of(st.none(), st.integers(4, 2 * CHUNK)), seed=st.integers(0, 2**16))
def test_every_tree_node_gets_the_bits_of_a_step(choices, past, kv_heads, group, dim, dtype, window, seed):
    tree = Tree.from_choices(choices, num_heads=5)
    generator = torch.Generator().manual_seed(seed)
    shape = (1, kv_heads, past + tree.size, dim)
    keys, values = (torch.randn(shape, generator=generator).to(dtype) for _ in range(2))
    query = torch.randn(1, kv_heads * group, tree.size, dim, generator=generator).to(dtype)
    together = _tree_pass(query, keys, values, tree, past, window)
    for node in range(tree.size):
        alone = _step(query, keys, values, tree, past, node, window)
        assert torch.equal(together[:, node], alone[:, 0]), f"node {node} of {tree.size}, past {past}"


def test_it_is_the_attention_the_library_computes():
    """The same maths as SDPA: a step and a tree pass agree with it to rounding."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = nn.Module()
    module.num_key_value_groups, module.is_causal = 2, False
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], num_heads=3)
    past = 2 * CHUNK + 9
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, tree.size, 16, generator=generator)
    keys, values = (torch.randn(1, 2, past + tree.size, 16, generator=generator) for _ in range(2))
    visible = torch.ones(tree.size, past + tree.size, dtype=torch.bool)
    visible[:, past:] = tree.ancestor_mask
    mask = additive_mask(visible, torch.float32)[None, None]
    ours, _ = gathered_attention(module, query, keys, values, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, keys, values, mask, scaling=0.25)
    assert torch.allclose(ours, theirs, atol=1e-5)
    step, _ = gathered_attention(module, query[:, :, :1], keys[:, :, :past], values[:, :, :past], None, scaling=0.25)
    library_step, _ = sdpa_attention_forward(module, query[:, :, :1], keys[:, :, :past], values[:, :, :past],
                                             None, scaling=0.25)
    assert torch.allclose(step, library_step, atol=1e-5)


def test_a_half_precision_pass_multiplies_in_float32_and_answers_in_its_own_dtype():
    """Its products are tiny: in float32 they cost what they cost on any CPU (in bfloat16 a CPU
    without bfloat16 units runs them over 20x slower), and the model gets its own dtype back."""
    tree = Tree.from_choices([[0], [1], [0, 0]], num_heads=2)
    past = CHUNK + 5
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, tree.size, 16, generator=generator).to(torch.bfloat16)
    keys, values = (torch.randn(1, 2, past + tree.size, 16, generator=generator).to(torch.bfloat16) for _ in range(2))
    for window in (None, 8):
        half = _tree_pass(query, keys, values, tree, past, window)
        full = _tree_pass(query.float(), keys.float(), values.float(), tree, past, window)
        assert half.dtype == torch.bfloat16 and torch.equal(half, full.to(torch.bfloat16))
