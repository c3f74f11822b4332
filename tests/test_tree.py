"""Tree buffers against small trees worked out by hand, and bad trees rejected with reasons."""

import pytest
import torch

from decoding import DecodingError, Tree
from decoding.tree import MC_SIM_7B_63, TREE_PRESETS, full_choices


def test_small_tree_buffers_match_hand_worked_example():
    # Paths given out of order on purpose; sorted by (length, path) they become nodes 1..5:
    #   1:[0]  2:[1]  3:[0,0]  4:[0,1]  5:[1,0]        root 0
    #                                                 /      \
    #                                              1:[0]     2:[1]
    #                                             /    \        \
    #                                         3:[0,0] 4:[0,1]  5:[1,0]
    tree = Tree.from_choices([[1, 0], [0], [0, 1], [1], [0, 0]], num_heads=2)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tree.parents == [-1, 0, 0, 1, 1, 2]
    assert tree.depths == [0, 1, 1, 2, 2, 2]
    assert tree.ranks == [0, 0, 1, 0, 1, 0]
    assert tree.leaves == [3, 4, 5]
    assert tree.children[1] == [3, 4] and tree.children[2] == [5]
    assert tree.top_k == 2
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree.ancestor_mask, expected)
    # Heads' top-k table flattened to (head, rank): head 1 ranks 0,1 -> 0,1; head 2 -> 2,3.
    assert tree.draft_index.tolist() == [0, 1, 2, 3, 2]


def test_reference_tree_shape():
    tree = Tree.from_choices(MC_SIM_7B_63, num_heads=5)
    per_depth = [tree.depths.count(d) for d in range(1, 5)]
    assert tree.size == 64 and per_depth == [10, 28, 23, 2]


def test_full_tree_counts_and_pruning():
    assert len(full_choices(2, 3)) == 2 + 4 + 8
    pruned = Tree.pruned(TREE_PRESETS["mc_sim_7b_63"], num_heads=2, name="mc_sim_7b_63")
    assert pruned.max_depth == 2 and pruned.size == 1 + 10 + 28


@pytest.mark.parametrize("choices, message", [
    ([], "non-empty"),
    ([[0], [1, 0]], "no parent"),
    ([[0], [0]], "twice"),
    ([[-1]], "negative"),
    ([[0], [0, 999]], "rank"),
    ([[0], [0, 0], [0, 0, 0]], "2 heads"),
    ([[0], "x"], "not a non-empty list"),
    ([[0.5]], "whole numbers"),
    ("[[0]]", "non-empty list"),
])
def test_bad_trees_are_rejected_with_a_reason(choices, message):
    with pytest.raises(DecodingError, match=message):
        Tree.from_choices(choices, num_heads=2)


def test_every_preset_is_valid():
    for name, choices in TREE_PRESETS.items():
        assert Tree.from_choices(choices, num_heads=5, name=name).size == len(choices) + 1



def test_cutting_a_tree_keeps_its_first_nodes():
    """Near the context limit only the levels that fit are verified: node i stays node i."""
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], num_heads=3)
    one_level = tree.cut(1)
    assert one_level.paths == ((0,), (1,)) and one_level.parents == [-1, 0, 0]
    assert tree.cut(3) is tree and tree.cut(2).size == 6
    root_only = tree.cut(0)
    assert root_only.size == 1 and root_only.max_depth == 0 and root_only.leaves == [0]
    assert root_only.draft_index.tolist() == [] and root_only.ancestor_mask.tolist() == [[True]]


def test_chains_are_recognised():
    assert Tree.from_choices([[0], [0, 0], [0, 0, 0]], 3).is_chain
    assert Tree.from_choices([[0]], 1).cut(0).is_chain
    assert not Tree.from_choices([[0], [1]], 1).is_chain
    assert not Tree.from_choices([[0], [0, 0], [0, 1]], 2).is_chain
