"""Growing candidate trees from measured heads: the Medusa paper's "optimal" tree and the joint tree.

Only training grows trees: it saves them, as choice lists, beside the heads it measured, and the
decoding engine reads those lists (`decoding.tree`) without needing any of this.

`acc[h][r]` is how often head h+1's rank-r guess was the right token (measured on held-out text,
see `evaluate.evaluate_heads`). Treating the heads as independent, the node for the path
`[r1, r2, ..., rd]` is accepted with probability

    acc[0][r1] * acc[1][r2] * ... * acc[d-1][rd]

because a node only counts when every guess above it was right too. The expected number of tokens
one verify pass yields is 1 (the root, the base model's own token, always lands) plus the sum of
these products over the tree's nodes.

A child's product is never larger than its parent's (every factor is at most 1), so the best tree
of n nodes is simply the n most likely nodes, and the greedy below — repeatedly take the most
likely node whose parent is already in the tree — finds it. Ties go to the shorter, then the
lexicographically smaller path; ancestors win every tie against their descendants, so the chosen
nodes always form a tree, and the tree for n + 1 nodes contains the tree for n.

The heads are not independent, though. They all read the same hidden state, so on an easy
stretch (closing brackets, a repeated name) head 2 is right far more often when head 1 was right
than its overall accuracy says, and the product underrates deep paths. The *joint* tree drops the
assumption: on held-out text, count how often each path was exactly right (position by position,
the ranks at which the true tokens appeared) and keep the n most frequent paths. A path is never
more frequent than its parent, so the same greedy finds the best tree for that text.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import DecodingError

Path = tuple[int, ...]
TOP_K = 10  # ranks measured per head: the deepest rank a grown tree may use
DEFAULT_TREE_NODES = (4, 8, 12, 16, 24)
TREE_FAMILIES = ("optimal", "joint")


def path_acceptance(acc: Sequence[Sequence[float]], path: Sequence[int]) -> float:
    """Expected acceptance of one node: the product of its guesses' accuracies along the path."""
    return math.prod(acc[depth][rank] for depth, rank in enumerate(path))


def _check_table(acc: Sequence[Sequence[float]]) -> None:
    if len(acc) == 0 or any(len(row) == 0 for row in acc):
        raise DecodingError("the accuracy table needs at least one head and one rank")
    if len({len(row) for row in acc}) != 1:
        raise DecodingError("every head's accuracy row must cover the same number of ranks")
    if any(not 0.0 <= a <= 1.0 for row in acc for a in row):
        raise DecodingError("accuracies are fractions: every entry must lie in [0, 1]")


def max_tree_nodes(acc: Sequence[Sequence[float]]) -> int:
    """How many nodes the table can describe: R + R^2 + ... + R^H for H heads and R ranks."""
    ranks = len(acc[0])
    return sum(ranks**depth for depth in range(1, len(acc) + 1))


def _grow(
    score: Callable[[Path], tuple[float, ...]], ranks: int, depth_limit: int, num_nodes: int
) -> list[list[int]]:
    """Greedy: take the highest-scoring node whose parent is in the tree, `num_nodes` times.

    `score` must never rank a child above its parent. Returned in (length, path) order, the order
    `Tree.from_choices` uses.
    """
    # Min-heap keyed by (-score, length, path): the best node, ties to short/small paths.
    frontier: list[tuple[tuple[float, ...], int, Path]] = []

    def push_children(parent: Path) -> None:
        if len(parent) == depth_limit:
            return
        for rank in range(ranks):
            child = (*parent, rank)
            heapq.heappush(frontier, (tuple(-x for x in score(child)), len(child), child))

    push_children(())
    chosen: list[Path] = []
    while len(chosen) < num_nodes:
        _, _, path = heapq.heappop(frontier)
        chosen.append(path)
        push_children(path)
    return [list(p) for p in sorted(chosen, key=lambda p: (len(p), p))]


def _check_budget(acc: Sequence[Sequence[float]], num_nodes: int) -> None:
    _check_table(acc)
    if not 1 <= num_nodes <= max_tree_nodes(acc):
        raise DecodingError(
            f"a tree for {len(acc)} heads x {len(acc[0])} ranks holds 1 to "
            f"{max_tree_nodes(acc)} nodes, not {num_nodes}"
        )


def optimal_choices(acc: Sequence[Sequence[float]], num_nodes: int) -> list[list[int]]:
    """The paper's tree: the `num_nodes` (root excluded) paths of highest accuracy product."""
    _check_budget(acc, num_nodes)
    return _grow(lambda path: (path_acceptance(acc, path),), len(acc[0]), len(acc), num_nodes)


def count_paths(rank_rows: Iterable[Sequence[int]], top_k: int) -> Counter[Path]:
    """How often each path was exactly right.

    Each row is one position: the rank at which head 1, 2, ... ranked its true token (`top_k` or
    more: not among its guesses). The path of ranks (r1, ..., rd) was right at that position iff
    the row starts with r1, ..., rd, so every prefix of the row up to the first miss is counted.
    """
    counts: Counter[Path] = Counter()
    for row in rank_rows:
        for depth, rank in enumerate(row):
            if rank >= top_k:
                break
            counts[tuple(row[: depth + 1])] += 1
    return counts


def joint_optimal_choices(
    acc: Sequence[Sequence[float]], path_counts: Mapping[Path, int], num_nodes: int
) -> list[list[int]]:
    """The tree of the `num_nodes` paths most often exactly right on measured text.

    Paths never seen right are ranked after every seen one, by the product rule, so any budget
    the table allows gets a full tree.
    """
    _check_budget(acc, num_nodes)
    return _grow(lambda path: (path_counts.get(path, 0), path_acceptance(acc, path)),
                 len(acc[0]), len(acc), num_nodes)


def measured_tokens_per_pass(
    path_counts: Mapping[Path, int], positions: int, choices: Sequence[Sequence[int]]
) -> float:
    """1 (the root) + how many of the tree's nodes were right per position, on the counted text."""
    if positions <= 0:
        raise DecodingError("no positions were counted")
    return 1.0 + sum(path_counts.get(tuple(p), 0) for p in choices) / positions


def expected_tokens_per_pass(
    acc: Sequence[Sequence[float]], choices: Sequence[Sequence[int]]
) -> float:
    """1 (the root always lands) + the expected acceptance of every node in the tree."""
    return 1.0 + sum(path_acceptance(acc, path) for path in choices)


# ----- the trees a training run saves ------------------------------------------------------------
@dataclass
class TreeSettings:
    """Which trees a run grows and which one decoding uses by default."""

    top_k: int = TOP_K
    tree_nodes: list[int] = field(default_factory=lambda: list(DEFAULT_TREE_NODES))  # budgets, root excluded
    default_tree_nodes: int | None = None  # None: the largest budget
    # optimal: the paper's tree; joint: from how often each path was right on the held-out text.
    default_tree_family: str = "optimal"

    @property
    def default_tree(self) -> str:
        return f"{self.default_tree_family}-{self.default_tree_nodes or max(self.tree_nodes)}"


class HeadMeasurements(Protocol):
    """What trees are grown from: per-rank accuracies and the joint path counts."""

    accuracy: list[list[float]]
    path_counts: Mapping[Path, int]
    joint_positions: int


@dataclass
class BuiltTrees:
    trees: dict[str, list[list[int]]]
    expected: dict[str, float]  # the paper's product rule, for the optimal-N trees
    measured: dict[str, float]  # tokens per pass on the held-out positions, for every tree


def build_trees(measured: HeadMeasurements, budgets: Sequence[int]) -> BuiltTrees:
    """For each node budget, the paper's optimal tree and the joint tree, with their figures."""
    acc, counts, positions = measured.accuracy, measured.path_counts, measured.joint_positions
    budgets = sorted(set(budgets))
    trees = {f"optimal-{n}": optimal_choices(acc, n) for n in budgets}
    trees |= {f"joint-{n}": joint_optimal_choices(acc, counts, n) for n in budgets}
    expected = {name: round(expected_tokens_per_pass(acc, c), 4)
                for name, c in trees.items() if name.startswith("optimal-")}
    tokens_per_pass = ({name: round(measured_tokens_per_pass(counts, positions, c), 4) for name, c in trees.items()}
                       if positions else {})
    return BuiltTrees(trees, expected, tokens_per_pass)
