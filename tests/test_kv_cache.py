"""Compaction: after a round the cache must hold the prefix and the accepted path, nothing else."""

import pytest
import torch
from transformers import DynamicCache, MistralConfig

from decoding.kv_cache import compact_cache, new_cache


@pytest.mark.parametrize("accepted", [[0], [0, 1], [0, 1, 3], [0, 2, 5], [0, 3], [0, 1, 2, 3, 4, 5]])
def test_compact_cache_keeps_the_prefix_and_the_accepted_rows_in_path_order(accepted):
    past, tree_rows, layers = 4, 6, 3
    keys = [torch.randn(1, 2, past + tree_rows, 8) for _ in range(layers)]
    values = [torch.randn(1, 2, past + tree_rows, 8) for _ in range(layers)]
    cache = DynamicCache()
    for i in range(layers):
        cache.update(keys[i].clone(), values[i].clone(), i)
    compact_cache(cache, past, accepted)
    rows = list(range(past)) + [past + n for n in accepted]
    assert cache.get_seq_length() == past + len(accepted)
    for i, layer in enumerate(cache.layers):
        assert torch.equal(layer.keys, keys[i][..., rows, :])
        assert torch.equal(layer.values, values[i][..., rows, :])


@pytest.mark.parametrize("accepted", [[0], [0, 2, 5], [0, 1, 2, 3, 4, 5]])
@pytest.mark.parametrize("past", [3, 7, 30])
def test_a_sliding_window_layer_keeps_the_rows_its_window_needs(accepted, past):
    """After compaction a sliding layer holds the last window - 1 rows of the committed sequence
    (fewer when the sequence is shorter) and counts every token of it, dropped rows included."""
    window, tree_rows = 8, 6
    cache = new_cache(MistralConfig(num_hidden_layers=1, sliding_window=window), for_trees=True)
    keys = torch.randn(1, 2, past + tree_rows, 8)
    values = torch.randn(1, 2, past + tree_rows, 8)
    cache.update(keys[..., :past, :], values[..., :past, :], 0)
    cache.crop(0)  # the state a previous round leaves: trimmed to the window
    cache.update(keys[..., past:, :], values[..., past:, :], 0)
    compact_cache(cache, past, accepted)
    sequence = list(range(past)) + [past + n for n in accepted]
    kept = sequence[-(window - 1):]
    assert cache.get_seq_length() == len(sequence)
    assert torch.equal(cache.layers[0].keys, keys[..., kept, :])
    assert torch.equal(cache.layers[0].values, values[..., kept, :])
