"""Compaction: after a round the cache must hold the prefix and the accepted path, nothing else."""

import pytest
import torch
from transformers import DynamicCache

from decoding.kv_cache import compact_cache


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
