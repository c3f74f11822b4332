"""The forward passes: prefill, one-token decode, drafting with the heads, and tree verification.

Everything here is one call of the model (or of the heads) and nothing else; the round loops in
`loops.py` decide what to do with the results.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin

from .features import FINAL_STATE, chosen_states
from .medusa_modules import MedusaPart
from .model import LoadedModel
from .tree import Tree


def run_model(
    lm: LoadedModel,
    input_ids: list[int] | torch.Tensor,
    cache: DynamicCache,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    last_only: bool = False,
    hidden_layers: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass over `input_ids` (batch 1) that appends to `cache`.

    Returns logits (T, V) — or (1, V) with `last_only` — and, with `hidden_layers`, those layers'
    hidden states side by side (T, len(hidden_layers) * H), see features.py.
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=lm.device).view(1, -1)
    kwargs = {lm.cache_argument: cache}
    if last_only and "logits_to_keep" in lm.forward_parameters:
        kwargs["logits_to_keep"] = 1
    out = lm.model(
        input_ids=ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        output_hidden_states=bool(hidden_layers),
        **kwargs,
    )
    logits = out.logits[0, -1:] if last_only else out.logits[0]
    hidden = chosen_states(out.hidden_states, hidden_layers) if hidden_layers else None
    return logits, hidden


def prefill(
    lm: LoadedModel, prompt_ids: list[int], cache: DynamicCache, hidden_layers: tuple[int, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the prompt; return the logits after its last token (V,) and, if asked, those layers'
    states at every prompt position (P, ...): the last chose the first token; EAGLE reads them all."""
    logits, hidden = run_model(lm, prompt_ids, cache, last_only=True, hidden_layers=hidden_layers)
    return logits[-1], hidden


def decode_one_token(lm: LoadedModel, token: int, cache: DynamicCache) -> torch.Tensor:
    """Plain autoregressive step: feed one token, get the logits (V,) for the next."""
    logits, _ = run_model(lm, [token], cache)
    return logits[-1]


def draft(
    lm: LoadedModel, part: MedusaPart, hidden: torch.Tensor, tree: Tree, root: int, with_probs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The top-k guesses of the heads the tree reads, from one hidden state: (depth, k) each.

    Head k's guesses are for the token k+1 places after the position whose hidden state this is,
    i.e. k places after the root token the base model has just chosen. A tree of depth d reads
    heads 1..d only, and k is one more than the largest rank it reads: nothing else is computed. The
    probabilities are only for showing; decoding needs the ranking alone. Heads that read the
    root get its embedding too (see heads.py).
    """
    root_embedding = None
    if part.heads.config.reads_root:
        root_embedding = lm.model.get_input_embeddings()(torch.tensor([root], device=lm.device))[0]
    head_logits = part.heads(hidden, lm_head=part.lm_head, num_heads=tree.max_depth,
                             root_embedding=root_embedding).float()
    top_logits, top_guesses = head_logits.topk(tree.top_k, dim=-1)
    top_tokens = part.heads.token_ids(top_guesses)
    if not with_probs:
        return top_tokens, None
    return top_tokens, torch.exp(top_logits - head_logits.logsumexp(dim=-1, keepdim=True))


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool table of what each row may see, as the additive mask attention takes: 0 where it
    may attend, the dtype's most negative number elsewhere (see `tree_attention_mask`)."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)


@lru_cache(maxsize=32)
def _tree_block(tree: Tree, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(T, T) additive mask over the tree itself: 0 where a node may attend, -inf-ish elsewhere."""
    return additive_mask(tree.ancestor_mask.to(device), dtype)


def _layer_mask(
    tree: Tree, layer: CacheLayerMixin, past_length: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """(1, 1, T, kv) additive mask for one cache layer: each node sees the prefix and its ancestors.

    The layer says how many key rows its attention will see (`get_mask_sizes`): all of them for
    full attention, the last `window - 1` prefix rows plus the T new ones for a sliding window,
    where a node at position p also must not see a key at or before p - window.
    """
    kv_length, _ = layer.get_mask_sizes(tree.size)
    prefix = kv_length - tree.size
    mask = torch.zeros(tree.size, kv_length, dtype=dtype, device=device)
    mask[:, prefix:] = _tree_block(tree, dtype, device)
    if layer.is_sliding:
        depths = tree.depth_tensor.to(device)
        query_positions = past_length + depths
        key_positions = torch.cat([torch.arange(past_length - prefix, past_length, device=device), query_positions])
        too_far = key_positions[None, :] <= query_positions[:, None] - layer.sliding_window
        mask.masked_fill_(too_far, torch.finfo(dtype).min)
    return mask[None, None]


def tree_attention_mask(
    tree: Tree, cache: DynamicCache, layer_types: list[str], dtype: torch.dtype, device: torch.device
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The verify pass's attention mask: one (1, 1, T, kv) tensor, or one per layer type.

    It must be additive floats, not bools: transformers takes a 4D mask as given, and under eager
    attention a bool mask would be *added* to the scores as 0/1 — silently wrong. Models that mix
    full and sliding-window layers (Gemma 2 and 3, ...) take a dict `{layer_type: mask}`.
    """
    past = cache.get_seq_length()
    masks = {
        kind: _layer_mask(tree, cache.layers[layer_types.index(kind)], past, dtype, device)
        for kind in dict.fromkeys(layer_types)
    }
    return masks if len(masks) > 1 else masks[layer_types[0]]


def tree_inputs(
    lm: LoadedModel, tree: Tree, cache: DynamicCache
) -> tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]:
    """The attention mask and position ids that let one pass verify every node of `tree`.

    Position ids are past + depth: siblings share a position, because each is a candidate for
    the same slot in the sequence. Leaving them out would number the nodes 0..T-1 — silently wrong.
    """
    past = cache.get_seq_length()
    mask = tree_attention_mask(tree, cache, lm.layer_types, lm.dtype, lm.device)
    positions = (tree.depth_tensor.to(lm.device) + past).view(1, -1)
    return mask, positions


def verify_tree(
    lm: LoadedModel, tree: Tree, node_tokens: torch.Tensor, cache: DynamicCache,
    hidden_layers: tuple[int, ...] = FINAL_STATE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass over all T tree nodes: logits (T, V) and, if asked, those layers' states (T, ...)."""
    if tree.size == 1 or (tree.is_chain and not lm.gathered_attention):
        # A chain's tree mask is the ordinary causal mask and its positions the ordinary ones:
        # the library builds those itself, on its fastest path (and a lone root is a plain step).
        # Gathered attention needs the mask spelled out: a pass of several tokens without one
        # is how it recognises the prefill (see attention.py).
        return run_model(lm, node_tokens, cache, hidden_layers=hidden_layers)
    mask, positions = tree_inputs(lm, tree, cache)
    return run_model(lm, node_tokens, cache, mask, positions, hidden_layers=hidden_layers)
