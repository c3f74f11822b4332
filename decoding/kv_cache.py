"""Keeping the library's KV cache in step with what was accepted.

The verify pass appends one key/value row per tree node to every layer of the cache. Only the
rows of the accepted path belong to the sequence; the rest are candidates that lost. We move the
accepted rows to sit right after the prefix and cut off the remainder, so the cache again holds
exactly the committed sequence (minus its last token, which the next round feeds in as its root).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .errors import DecodingError


def new_cache() -> DynamicCache:
    """A cache of plain full-attention layers.

    We deliberately do not pass the model config: for sliding-window models that would create
    layers that silently drop old rows on every update, which breaks compaction. Full layers
    hold every row; we cap the context at the window instead, so attention is unchanged.
    """
    return DynamicCache()


def compact_cache(cache: DynamicCache, past_length: int, accepted_nodes: list[int]) -> None:
    """Keep the prefix and the accepted nodes' rows (in path order); drop every other tree row."""
    # A path whose i-th node is node i already sits where it belongs (the root always does, and
    # so does a first child numbered 1): only the rows after that run move. Often none does.
    in_place = 0
    while in_place < len(accepted_nodes) and accepted_nodes[in_place] == in_place:
        in_place += 1
    moved = accepted_nodes[in_place:]
    index = torch.tensor(moved, device=cache.layers[0].keys.device) + past_length
    destination = slice(past_length + in_place, past_length + len(accepted_nodes))
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or not layer.is_initialized:
            raise DecodingError(f"unsupported cache layer {type(layer).__name__}")
        tree_rows = layer.keys.shape[-2] - past_length
        if moved:
            # The right-hand side is gathered into a new tensor before the write, so rows can
            # move down safely even when a destination is also a later source.
            layer.keys[..., destination, :] = layer.keys[..., index, :]
            layer.values[..., destination, :] = layer.values[..., index, :]
        drop = tree_rows - len(accepted_nodes)
        if drop:
            layer.crop(-drop)
