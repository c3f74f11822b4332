"""One attention arithmetic for every pass, so a verified tree node computes exactly what a step would.

Greedy Medusa is lossless only if the verify pass gives, at every node, the logits plain decoding
would give at that position. In float32 the two agree to ~1e-5 and the argmax never flips in
practice. In bfloat16 they do not: logits near 16 are 0.06-0.12 apart, so near-ties are common,
and the library's attention kernel reduces over a different number of keys in a T-token pass
(the masked keys of the other candidates are still in the sum, and the vector lanes split the
sum differently) than in a one-token step. On SmolLM2 that flipped 11 of 20 answers.

The fix is to make the arithmetic of a query row depend on nothing but that row:

    a step at position p:    q_p  ·  keys [0 .. p]                      (the cache, in order)
    a tree node at depth d:  q_n  ·  keys [prefix] + [ancestors] + [n]  (gathered, in order)

Both are the same key vectors in the same order (the ancestors are exactly the tokens plain
decoding would have cached), so gathering each node's visible keys into one contiguous block and
computing `softmax(q K^T) V` on it with the same batched matmuls a step uses gives the same bits.
Nodes of equal depth see the same number of keys, so they are batched together; a batched matmul
computes each batch element as if it were alone (checked on this CPU for 1-40 elements, float32
and bfloat16, and by tests/test_gathered_attention.py). What it costs: every node's prefix keys are
copied once per layer, which is why it is only used where it buys identity (see `loading.py`).

The prefill is one causal product over all its rows instead: plain decoding and Medusa run the
very same prefill, so it cannot make them part, and a long prompt would otherwise need one gather
per row. It is recognised as what it is: a pass of several tokens that brings no mask of its own.
"""

from __future__ import annotations

import weakref
from functools import lru_cache

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GATHERED = "medusa_gathered"  # the name it is registered under with transformers

# One group of query rows that see equally many keys: the rows, and either each row's key
# positions in sequence order (n, L), or, for a single row that sees one contiguous run of
# the cache (a step), that run as a slice, read in place.
RowGroup = tuple[torch.Tensor, torch.Tensor | None, slice | None]


def _group_rows(visible: torch.Tensor) -> list[RowGroup]:
    """Split the (T, kv) visibility matrix into groups of rows that see equally many keys."""
    counts = visible.sum(dim=-1)
    groups: list[RowGroup] = []
    for count in torch.unique(counts).tolist():
        if count == 0:  # a row that sees no key (some models mask padding so): its output stays zero
            continue
        rows = (counts == count).nonzero().flatten()
        keys = visible[rows].nonzero()[:, 1].view(len(rows), count)
        first = int(keys[0, 0])
        if len(rows) == 1 and int(keys[0, -1]) - first == count - 1:
            groups.append((rows, None, slice(first, first + count)))  # contiguous: read in place
        else:
            groups.append((rows, keys, None))
    return groups


@lru_cache(maxsize=64)
def _step_groups(kv_length: int, device: torch.device) -> list[RowGroup]:
    """A one-token step without a mask sees every cached key."""
    return [(torch.zeros(1, dtype=torch.long, device=device), None, slice(0, kv_length))]


class _GroupCache:
    """Every layer of one pass receives the same mask tensor: group its rows once per pass.

    Keyed by the mask object itself through a weak reference, so a later mask that happens to
    reuse a freed one's memory is never mistaken for it.
    """

    def __init__(self) -> None:
        self._mask: weakref.ref | None = None
        self._groups: list[RowGroup] = []

    def groups(self, mask: torch.Tensor) -> list[RowGroup]:
        if self._mask is None or self._mask() is not mask:
            # Our own tree masks are additive floats (0 = attend); the library's are booleans.
            plane = mask[0, 0]
            visible = plane if plane.dtype == torch.bool else plane == 0
            self._groups = _group_rows(visible)
            self._mask = weakref.ref(mask)
        return self._groups


_group_cache = _GroupCache()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, softcap: float | None,
            blocked: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T) v for a batch of rows: q (n, KVH, G, D), k and v (n, KVH, L, D), all contiguous.

    The same few operations for a step (n = 1) and for every group of tree nodes, so each row's
    numbers do not depend on how many rows were computed beside it. `blocked` (True = masked) is
    only for the prefill.
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    if softcap is not None:  # Gemma 2 caps its attention logits
        scores = torch.tanh(scores / softcap) * softcap
    if blocked is not None:
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(weights, v)


def gathered_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls in every layer (see `AttentionInterface`).

    query (1, H, T, D); key and value (1, KVH, kv, D), the whole cache after this pass's rows were
    appended. Returns (1, T, H, D), as the library's own functions do.
    """
    batch, heads, length, dim = query.shape
    if batch != 1:
        raise ValueError("gathered attention decodes one sequence at a time (batch 1)")
    kv_heads, kv_length = key.shape[1], key.shape[2]
    group = heads // kv_heads  # query heads sharing one key/value head (grouped-query attention)
    scale = dim**-0.5 if scaling is None else scaling
    if attention_mask is None and length > 1:  # the prefill: shared by every decoder, see above
        rows = torch.arange(kv_length - length, kv_length, device=query.device)
        blocked = torch.arange(kv_length, device=query.device)[None, :] > rows[:, None]
        q = query.view(1, kv_heads, group, length, dim).flatten(2, 3)
        out = _attend(q, key, value, scale, softcap, blocked.repeat(group, 1))
        return out.view(1, kv_heads, group, length, dim).permute(0, 3, 1, 2, 4).reshape(1, length, heads, dim), None
    groups = _step_groups(kv_length, key.device) if attention_mask is None else _group_cache.groups(attention_mask)
    queries = query[0].view(kv_heads, group, length, dim)
    out = query.new_zeros(length, kv_heads, group, dim)
    for rows, keys, run in groups:
        q = queries[:, :, rows].permute(2, 0, 1, 3).contiguous()  # (n, KVH, G, D)
        if run is not None:
            k, v = key[:, :, run].contiguous(), value[:, :, run].contiguous()
        else:
            k = key[0][:, keys].transpose(0, 1).contiguous()  # (n, KVH, L, D)
            v = value[0][:, keys].transpose(0, 1).contiguous()
        out[rows] = _attend(q, k, v, scale, softcap)
    return out.view(1, length, heads, dim), None


def can_gather(model: nn.Module) -> bool:
    """Whether the model's layers call the attention function its config names (transformers'
    `AttentionInterface`), so that gathered attention can replace it. A few families (Falcon,
    GPT-Neo, StableLM, ...) call their own kernels and would silently ignore it."""
    return type(model).is_backend_compatible()


def register() -> None:
    """Make `GATHERED` a valid `attn_implementation`, with the library's boolean masks for steps."""
    AttentionInterface.register(GATHERED, gathered_attention)
    AttentionMaskInterface.register(GATHERED, sdpa_mask)


register()
