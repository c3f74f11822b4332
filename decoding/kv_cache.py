"""Keeping the library's KV cache in step with what was accepted.

The verify pass appends one key/value row per tree node to every layer of the cache. Only the
rows of the accepted path belong to the sequence; the rest are candidates that lost. We move the
accepted rows to sit right after the prefix and cut off the remainder, so the cache again holds
exactly the committed sequence (minus its last token, which the next round feeds in as its root).

The cache is the one the model's own `generate` builds from its config: a full layer keeps every
row, a sliding-window layer only the last `window - 1`. Sliding layers need one change for trees:
a verify pass appends T candidate rows at once, and losing candidates must not push rows the
window still needs out of the cache. `activate_past_recording` makes such layers keep every row
until `crop` is called, and `crop` then trims them back to the window and keeps their count of
tokens seen (`cumulative_length`) right.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import get_layer_types_and_kwargs

from .errors import DecodingError

# The layer kinds whose cache holds one key/value row per token, which is what lets a tree of
# candidates be verified in one pass and the losers be dropped afterwards.
TREE_LAYER_TYPES = ("full_attention", "sliding_attention")


def attention_layer_types(config: PreTrainedConfig) -> list[str]:
    """Each layer's attention type as the library reads it from `config`, or a DecodingError.

    Recurrent layers (Mamba's state-space layers, linear attention) keep a running state instead
    of rows, and chunked attention masks differently from a sliding window: both are refused, for
    every method. Plain decoding could run on them, but here it is the baseline the drafters are
    raced against on the same cache code, which counts the text by rows.
    """
    types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    unsupported = sorted(set(types) - set(TREE_LAYER_TYPES))
    if unsupported:
        raise DecodingError(
            f"{config.model_type} has {', '.join(unsupported)} layers, which keep a running state "
            "instead of one key/value row per token: this engine's decoding loop, plain decoding "
            "included, counts, verifies and trims its cache by those rows (full or sliding-window "
            "attention), so it cannot load this model"
        )
    return types


def new_cache(config: PreTrainedConfig, for_trees: bool = False) -> DynamicCache:
    """The cache `generate` would use for this model; `for_trees` for one that `compact_cache` trims."""
    cache = DynamicCache(config=config)
    if for_trees:
        cache.activate_past_recording()
    return cache


def compact_cache(cache: DynamicCache, past_length: int, accepted_nodes: list[int]) -> None:
    """Keep the prefix and the accepted nodes' rows (in path order); drop every other tree row."""
    # A path whose i-th node is node i already sits where it belongs (the root always does, and
    # so does a first child numbered 1): only the rows after that run move. Often none does.
    in_place = 0
    while in_place < len(accepted_nodes) and accepted_nodes[in_place] == in_place:
        in_place += 1
    moved = accepted_nodes[in_place:]
    index = torch.tensor(moved, device=cache.layers[0].keys.device)
    for layer in cache.layers:
        # Counted in tokens seen, not rows held: a sliding layer may hold fewer prefix rows.
        tree_rows = layer.get_seq_length() - past_length
        first_tree_row = layer.keys.shape[-2] - tree_rows
        if moved:
            for tensor in (layer.keys, layer.values):
                tree = tensor[..., first_tree_row:, :]  # a view: writing to it writes the cache
                # The right-hand side is gathered into a new tensor before the write, so rows can
                # move down safely even when a destination is also a later source.
                tree[..., in_place : len(accepted_nodes), :] = tree[..., index, :]
        # Also trims a sliding layer back to its window (so crop(0) is not a no-op there).
        layer.crop(len(accepted_nodes) - tree_rows)
