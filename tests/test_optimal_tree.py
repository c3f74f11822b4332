"""The greedy optimal tree: hand-worked examples and properties over random accuracy tables."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from decoding.errors import DecodingError
from decoding.optimal_tree import (
    expected_tokens_per_pass,
    max_tree_nodes,
    optimal_choices,
    path_acceptance,
)
from decoding.tree import Tree

# Two heads, three ranks. Node acceptances (product along the path):
#   depth 1: [0] 0.6    [1] 0.2    [2] 0.1
#   depth 2: [0,0] 0.6*0.4 = 0.24   [0,1] 0.6*0.15 = 0.09   [0,2] 0.6*0.05 = 0.03
#            [1,0] 0.2*0.4 = 0.08   [1,1] 0.2*0.15 = 0.03   [1,2] 0.2*0.05 = 0.01
#            [2,0] 0.1*0.4 = 0.04   [2,1] 0.1*0.15 = 0.015  [2,2] 0.1*0.05 = 0.005
HAND_TABLE = [[0.6, 0.2, 0.1], [0.4, 0.15, 0.05]]


def test_hand_table_four_nodes() -> None:
    # Best four: 0.6 [0], 0.24 [0,0], 0.2 [1], 0.1 [2]; [0,0] is listed last in (length, path) order.
    choices = optimal_choices(HAND_TABLE, 4)
    assert choices == [[0], [1], [2], [0, 0]]
    # 1 (root) + 0.6 + 0.2 + 0.1 + 0.24 = 2.14
    assert expected_tokens_per_pass(HAND_TABLE, choices) == pytest.approx(2.14)


def test_hand_table_next_nodes() -> None:
    # The fifth node is [0,1] (0.09) rather than [1,0] (0.08); the sixth is [1,0].
    assert optimal_choices(HAND_TABLE, 5) == [[0], [1], [2], [0, 0], [0, 1]]
    assert optimal_choices(HAND_TABLE, 6) == [[0], [1], [2], [0, 0], [0, 1], [1, 0]]
    # 2.14 + 0.09 + 0.08 = 2.31
    assert expected_tokens_per_pass(HAND_TABLE, optimal_choices(HAND_TABLE, 6)) == pytest.approx(2.31)


def test_ties_go_to_shorter_then_smaller_paths() -> None:
    # [1], [0,0] and [0,1] all score exactly 0.25 (powers of two, no rounding).
    table = [[0.5, 0.25], [0.5, 0.5]]
    assert optimal_choices(table, 2) == [[0], [1]]
    assert optimal_choices(table, 3) == [[0], [1], [0, 0]]
    assert optimal_choices(table, 4) == [[0], [1], [0, 0], [0, 1]]


def test_whole_table_and_bad_budgets() -> None:
    assert max_tree_nodes(HAND_TABLE) == 3 + 9
    assert len(optimal_choices(HAND_TABLE, 12)) == 12
    for bad in (0, 13):
        with pytest.raises(DecodingError):
            optimal_choices(HAND_TABLE, bad)
    with pytest.raises(DecodingError):
        optimal_choices([[0.5, 1.5]], 1)


def test_expected_tokens_of_the_root_alone_is_one() -> None:
    assert expected_tokens_per_pass(HAND_TABLE, []) == 1.0


@st.composite
def accuracy_tables(draw: st.DrawFn) -> list[list[float]]:
    heads = draw(st.integers(1, 3))
    ranks = draw(st.integers(1, 3))
    # Few distinct values make ties common, which is where ordering bugs hide.
    value = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0))
    return [[draw(value) for _ in range(ranks)] for _ in range(heads)]


def all_paths(acc: list[list[float]]) -> list[tuple[int, ...]]:
    ranks = range(len(acc[0]))
    return [p for d in range(1, len(acc) + 1) for p in itertools.product(ranks, repeat=d)]


@settings(max_examples=150, deadline=None)
@given(acc=accuracy_tables(), data=st.data())
def test_greedy_trees_nest_are_valid_and_optimal(acc: list[list[float]], data: st.DataObject) -> None:
    assume(max_tree_nodes(acc) >= 2)  # a one-node table has no n + 1 to compare with
    n = data.draw(st.integers(1, max_tree_nodes(acc) - 1), label="n")
    small, large = optimal_choices(acc, n), optimal_choices(acc, n + 1)

    assert len(small) == n and len(large) == n + 1
    assert {tuple(p) for p in small} < {tuple(p) for p in large}
    for choices in (small, large):
        assert choices == sorted(choices, key=lambda p: (len(p), p))
        tree = Tree.from_choices(choices, num_heads=len(acc))  # raises if a parent is missing
        assert [list(p) for p in tree.paths] == choices

    # No set of n nodes can beat the n best single nodes, so matching that bound proves optimality.
    best = sorted((path_acceptance(acc, p) for p in all_paths(acc)), reverse=True)[:n]
    assert expected_tokens_per_pass(acc, small) == pytest.approx(1 + sum(best))
