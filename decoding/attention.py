"""One attention arithmetic for every pass, so a verified tree node computes exactly what a step would.

Greedy Medusa is lossless only if the verify pass gives, at every node, the logits plain decoding
would give at that position. In float32 the two agree to ~1e-5 and the argmax never flips in
practice. In bfloat16 they do not: logits near 16 are 0.06-0.12 apart, so near-ties are common,
and the library's attention kernel reduces over a different number of keys in a T-token pass
(the masked keys of the other candidates are still in the sum, and the vector lanes split the
sum differently) than in a one-token step. On SmolLM2 that flipped 11 of 20 answers.

The fix is to make the arithmetic of a query row depend on nothing but that row's *key list*,
the keys it may see in sequence order:

    a step at position p:    q_p  ·  keys [0 .. p]                      (the cache, in order)
    a tree node at depth d:  q_n  ·  keys [prefix] + [ancestors] + [n]  (the same vectors, in order)

The ancestors are exactly the tokens plain decoding would have cached, so both lists hold the same
vectors. Each row's attention is then computed in three steps whose bits depend only on its list:

1. scores: every row's query by every key of the pass, in products of CHUNK keys each, then each
   row's scores picked out in list order (a score is one query times one key, whatever else the
   product computed beside it);
2. softmax over the row's own scores, on a row of its own (the library's softmax treats each row
   alone, in vector lanes that start at the row's first element);
3. weights times values in fixed chunks of CHUNK keys, counted from the start of the list, each
   chunk a matrix product over exactly those keys, the chunks' results added in list order.

Step 3 is what makes it cheap: the prefix is the start of every node's list, so its chunks are the
same keys for every row and are multiplied once for all rows, straight from the cache; only the
last chunk or two of each row (the rest of the prefix after its last whole chunk, and the node's
ancestors) is gathered, fewer than CHUNK + depth keys a row. A step runs the very same chunks.

Every product is in float32, whatever the model's dtype: they are tiny, so they cost the call, not
the arithmetic, and a CPU without bfloat16 units runs bfloat16 ones over 20x slower.

What the bits rely on, checked by tests/test_exact_attention.py on the machine that runs them:
a row of a matrix product of a given layout does not depend on how many rows or columns were
computed beside it, nor on how many products were batched together, *provided* every product has
a multiple of MIN_ROWS rows. Measured on an AMD EPYC: bfloat16 products (oneDNN) gave every row
the same bits however many rows there were; float32 products (MKL) ran 1-3 rows through another
kernel, and a row in a tile's remainder (the 9th of 9) differed from the same row in a full
tile. Padding each product's rows with zeros to a multiple of 16 puts every row in a full tile.

The prefill is one causal product over all its rows instead: plain decoding and Medusa run the
very same prefill, so it cannot make them part, and a long prompt would otherwise need one gather
per row. It is recognised as what it is: a pass of several tokens that brings no mask of its own.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GATHERED = "medusa_gathered"  # the name it is registered under with transformers
CHUNK = 64  # keys a chunk of step 3 holds: fewer means more products a pass, more means longer gathers
MIN_ROWS = 16  # every product's rows are padded with zeros to a multiple of this (see above)


@dataclass(frozen=True)
class PassPlan:
    """Which keys each row of a pass sees, in list order, and which of its chunks every row shares.

    `columns` (T, L) holds each row's key list as cache columns, padded at the end to the longest
    list (`valid` says which are real); None for a step, whose list is the cache, in order. The first
    `shared` chunks of every list are the same cache columns, `first` to `first + shared * CHUNK`.
    """

    columns: torch.Tensor | None
    valid: torch.Tensor | None
    length: int  # the longest list
    first: int
    shared: int
    blind_rows: bool = False  # some row sees no key at all (some models mask padding so)


def _plan_rows(visible: torch.Tensor) -> PassPlan:
    """The plan of a pass from its (T, kv) visibility matrix (True = the row sees that key)."""
    counts = visible.sum(dim=-1)
    length = int(counts.max())
    # Each row's visible columns in order, then the columns it does not see: the first `count` are its list.
    order = torch.sort((~visible).to(torch.int8), dim=-1, stable=True).indices[:, :length]
    valid = torch.arange(length, device=visible.device)[None, :] < counts[:, None]
    columns = order.masked_fill(~valid, 0)
    seen = counts > 0
    starts = columns[seen, 0]
    first = int(starts[0]) if len(starts) else 0
    shared = 0
    if len(starts) and bool((starts == first).all()):  # sliding windows of different starts share nothing
        run = int(visible[seen, first:].int().cumprod(dim=-1).sum(dim=-1).min())  # the run every row starts with
        shared = run // CHUNK
    return PassPlan(columns, valid, length, first, shared, blind_rows=not bool(seen.all()))


@lru_cache(maxsize=64)
def _step_plan(kv_length: int) -> PassPlan:
    """A one-token step without a mask sees every cached key, in order."""
    return PassPlan(None, None, kv_length, 0, kv_length // CHUNK)


class _PlanCache:
    """Every layer of one pass receives the same mask tensor: plan its rows once per pass.

    Keyed by the mask object itself through a weak reference, so a later mask that happens to
    reuse a freed one's memory is never mistaken for it.
    """

    def __init__(self) -> None:
        self._mask: weakref.ref | None = None
        self._plan = _step_plan(0)

    def plan(self, mask: torch.Tensor) -> PassPlan:
        if self._mask is None or self._mask() is not mask:
            # Our own tree masks are additive floats (0 = attend); the library's are booleans.
            plane = mask[0, 0]
            self._plan = _plan_rows(plane if plane.dtype == torch.bool else plane == 0)
            self._mask = weakref.ref(mask)
        return self._plan


_plan_cache = _PlanCache()


def _at_least_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """`x` with zero rows appended along `dim` up to a multiple of MIN_ROWS (see the module's docstring)."""
    missing = -x.shape[dim] % MIN_ROWS
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with a's rows (dim -2) padded to a multiple of MIN_ROWS, and the padding dropped again.
    `a` is laid out contiguously first: the library picks its kernel by the layout too."""
    rows = a.shape[-2]
    return torch.matmul(_at_least_rows(a, -2).contiguous(), b)[..., :rows, :]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, softcap: float | None,
            blocked: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T) v with a mask (True = blocked), for the prefill: q (1, KVH, R, D), k and v (1, KVH, L, D)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    if softcap is not None:  # Gemma 2 caps its attention logits
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(weights, v)


def _scores(queries: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """Step 1: every row's query by every key, scaled in float32: (KVH, R, kv).

    The keys are multiplied a chunk of CHUNK at a time, in one batched product (the last chunk
    padded with zero keys), so that every score comes out of a product of the same shape whatever
    the pass: a step and a tree differ only in how many rows and chunks there are.
    """
    kv_heads, kv_length, dim = keys.shape
    chunks = -(-kv_length // CHUNK)
    padded = F.pad(keys, (0, 0, 0, chunks * CHUNK - kv_length))
    per_chunk = _product(queries.unsqueeze(1), padded.view(kv_heads, chunks, CHUNK, dim).transpose(-1, -2))
    return (per_chunk.transpose(1, 2).reshape(kv_heads, queries.shape[1], chunks * CHUNK)[..., :kv_length]
            .float() * scale)


def _weights(scores: torch.Tensor, plan: PassPlan, softcap: float | None, dtype: torch.dtype) -> torch.Tensor:
    """Step 2: each row's scores in list order, softmaxed on a row of its own: (KVH, G, T, L).

    Rows shorter than the longest are padded with -inf at the end, whose weight is exactly 0: the
    library's softmax adds a row's terms in vector lanes from its first element, so zeros after
    the last real term leave every sum as it was (tests/test_exact_attention.py checks it).
    """
    if plan.columns is None:
        mine = scores
    else:
        rows = torch.arange(plan.columns.shape[0], device=scores.device).unsqueeze(-1)
        mine = scores[:, :, rows, plan.columns].masked_fill(~plan.valid, float("-inf"))
    if softcap is not None:  # Gemma 2 caps its attention logits
        mine = torch.tanh(mine / softcap) * softcap
    weights = torch.softmax(mine, dim=-1)
    if plan.blind_rows:  # a row that sees nothing: weights 0, not the NaN of an empty softmax
        weights = weights.masked_fill(~plan.valid, 0.0)
    return weights.to(dtype)


def _weighted_values(weights: torch.Tensor, value: torch.Tensor, plan: PassPlan) -> torch.Tensor:
    """Step 3: weights (KVH, G, T, L) times each row's values, a chunk of CHUNK keys at a time,
    the chunks' results added in list order: (KVH, G, T, D) in float32.

    Every chunk is one product of the same shape, (rows, CHUNK) by (CHUNK, D), a chunk shorter
    than CHUNK padded with zero weights: the chunks every row shares come straight from the cache,
    once for all rows; the rest of each row's list (after the shared chunks) is gathered.
    """
    kv_heads, group, length = weights.shape[:3]
    rows = group * length
    out = None
    shared = plan.shared * CHUNK
    if plan.shared:
        chunk_weights = weights[..., :shared].reshape(kv_heads, rows, plan.shared, CHUNK).transpose(1, 2)
        chunk_values = value[:, plan.first: plan.first + shared].view(kv_heads, plan.shared, CHUNK, -1)
        parts = _product(chunk_weights, chunk_values).float()  # (KVH, c, G*T, D)
        for chunk in range(plan.shared):
            out = parts[:, chunk] if out is None else out + parts[:, chunk]
    rest = plan.length - shared
    if rest:
        chunks = -(-rest // CHUNK)
        padding = chunks * CHUNK - rest
        if plan.columns is None:  # a step: the rest of the cache, in place
            rest_values = F.pad(value[:, shared: plan.length], (0, 0, 0, padding)).unsqueeze(1)  # (KVH, 1, r, D)
        else:
            rest_values = F.pad(value[:, plan.columns[:, shared:]], (0, 0, 0, padding))  # (KVH, T, r, D)
        rest_weights = F.pad(weights[..., shared:], (0, padding)).transpose(1, 2)  # (KVH, T, G, r)
        for start in range(0, chunks * CHUNK, CHUNK):
            part = _product(rest_weights[..., start: start + CHUNK],
                            rest_values[:, :, start: start + CHUNK]).float().transpose(1, 2).reshape(kv_heads, rows, -1)
            out = part if out is None else out + part
    return out.view(kv_heads, group, length, -1)


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
    dtype = query.dtype
    # In float32 (see the module's docstring): a step's products are 16 x 64 by 64 x 64, which on
    # an AMD EPYC with AVX2 take 22 us in float32 and 551 us in bfloat16.
    query, key, value = query.float(), key.float(), value.float()
    kv_heads, kv_length = key.shape[1], key.shape[2]
    group = heads // kv_heads  # query heads sharing one key/value head (grouped-query attention)
    scale = dim**-0.5 if scaling is None else scaling
    if attention_mask is None and length > 1:  # the prefill: shared by every decoder, see above
        rows = torch.arange(kv_length - length, kv_length, device=query.device)
        blocked = torch.arange(kv_length, device=query.device)[None, :] > rows[:, None]
        q = query.view(1, kv_heads, group, length, dim).flatten(2, 3)
        out = _attend(q, key, value, scale, softcap, blocked.repeat(group, 1)).to(dtype)
        return out.view(1, kv_heads, group, length, dim).permute(0, 3, 1, 2, 4).reshape(1, length, heads, dim), None
    plan = _step_plan(kv_length) if attention_mask is None else _plan_cache.plan(attention_mask)
    scores = _scores(query[0].reshape(kv_heads, group * length, dim), key[0], scale).view(
        kv_heads, group, length, kv_length)
    out = _weighted_values(_weights(scores, plan, softcap, value.dtype), value[0], plan)
    return out.to(dtype).permute(2, 0, 1, 3).reshape(1, length, heads, dim), None


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
