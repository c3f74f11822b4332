"""The greedy optimal tree: hand-worked examples and properties over random accuracy tables."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from decoding.errors import DecodingError
from decoding.training.trees import count_paths, joint_optimal_choices, measured_tokens_per_pass
from decoding.tree import Tree
from decoding.tree_choice import expected_tokens_per_pass, max_tree_nodes, optimal_choices, path_acceptance

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


# Two heads, top-3 guesses, ten positions. Each row: the rank at which head 1 and head 2 found
# their true tokens (3 = not among the guesses). The heads are right *together*: when head 1's
# second guess is right, so is head 2's. Both heads score 0.4 / 0.3 / 0.3 by rank.
CORRELATED_ROWS = [(0, 0)] * 4 + [(1, 1)] * 3 + [(2, 2)] * 3
CORRELATED_ACC = [[0.4, 0.3, 0.3], [0.4, 0.3, 0.3]]


def test_count_paths_counts_every_prefix_up_to_the_first_miss() -> None:
    counts = count_paths([(0, 1, 2), (0, 3, 0), (3, 0, 0), (0, 1, 0)], top_k=3)
    assert counts == {(0,): 3, (0, 1): 2, (0, 1, 2): 1, (0, 1, 0): 1}


def test_joint_tree_follows_paths_that_are_right_together() -> None:
    counts = count_paths(CORRELATED_ROWS, top_k=3)
    # Four nodes: both methods agree on [0], [1], [2], [0,0].
    assert joint_optimal_choices(CORRELATED_ACC, counts, 4) == optimal_choices(CORRELATED_ACC, 4)
    # The fifth: the product rule takes [0,1] (0.4 * 0.3 = 0.12) though it was never right;
    # the counts take [1,1] (right 3 times in 10).
    joint, paper = joint_optimal_choices(CORRELATED_ACC, counts, 5), optimal_choices(CORRELATED_ACC, 5)
    assert paper == [[0], [1], [2], [0, 0], [0, 1]]
    assert joint == [[0], [1], [2], [0, 0], [1, 1]]
    # 1 + (4 + 3 + 3 + 4 + 3) / 10 against 1 + (4 + 3 + 3 + 4 + 0) / 10.
    assert measured_tokens_per_pass(counts, 10, joint) == pytest.approx(2.7)
    assert measured_tokens_per_pass(counts, 10, paper) == pytest.approx(2.4)


def test_joint_tree_fills_unseen_nodes_by_the_product_rule() -> None:
    counts = count_paths([(0, 0)], top_k=2)
    acc = [[0.5, 0.25], [0.5, 0.125]]
    # Seen: [0], [0,0]. Then unseen by product: [1] 0.25, [0,1] 0.0625, [1,0] 0.125 -> [1], [1,0].
    assert joint_optimal_choices(acc, counts, 4) == [[0], [1], [0, 0], [1, 0]]
    with pytest.raises(DecodingError):
        measured_tokens_per_pass(counts, 0, [[0]])


@st.composite
def rank_rows(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, ...]]]:
    heads, top_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rank = st.integers(0, top_k)  # top_k itself is a miss
    rows = draw(st.lists(st.tuples(*[rank] * heads), min_size=1, max_size=30))
    return heads, top_k, rows


@settings(max_examples=150, deadline=None)
@given(case=rank_rows(), data=st.data())
def test_joint_trees_nest_are_valid_and_best_for_their_counts(
    case: tuple[int, int, list[tuple[int, ...]]], data: st.DataObject
) -> None:
    heads, top_k, rows = case
    counts = count_paths(rows, top_k)
    acc = [[sum(r[h] == k for r in rows) / len(rows) for k in range(top_k)] for h in range(heads)]
    assume(max_tree_nodes(acc) >= 2)
    n = data.draw(st.integers(1, max_tree_nodes(acc) - 1), label="n")
    small, large = joint_optimal_choices(acc, counts, n), joint_optimal_choices(acc, counts, n + 1)
    assert {tuple(p) for p in small} < {tuple(p) for p in large}
    Tree.from_choices(small, num_heads=heads)  # raises if a parent is missing
    # Measured tokens per pass, checked against decoding each row by hand: a position yields 1 +
    # the depth of the deepest tree node its ranks match.
    nodes = {tuple(p) for p in small}
    by_hand = sum(1 + max((d for d in range(1, heads + 1) if r[:d] in nodes), default=0) for r in rows)
    assert measured_tokens_per_pass(counts, len(rows), small) == pytest.approx(by_hand / len(rows))
    # No n-node tree beats the n most frequent single paths.
    best = sorted(counts.values(), reverse=True)[:n]
    assert measured_tokens_per_pass(counts, len(rows), small) == pytest.approx(1 + sum(best) / len(rows))
