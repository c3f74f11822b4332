"""The trees a training run saves beside its heads: the paper's optimal tree and the joint tree.

The paper's optimal tree is grown from the per-rank accuracies alone (`decoding/tree_choice.py`,
where `--tree auto` grows it at load time too). The heads are not independent, though. They all
read the same hidden state, so on an easy stretch (closing brackets, a repeated name) head 2 is
right far more often when head 1 was right than its overall accuracy says, and the product
underrates deep paths. The *joint* tree drops the assumption: on held-out text, count how often
each path was exactly right (position by position, the ranks at which the true tokens appeared)
and keep the n most frequent paths. A path is never more frequent than its parent, so the same
greedy finds the best tree for that text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import DecodingError
from ..tree_choice import (
    Path,
    check_budget,
    expected_tokens_per_pass,
    grow_tree,
    optimal_choices,
    path_acceptance,
)

TOP_K = 10  # ranks measured per head: the deepest rank a grown tree may use
DEFAULT_TREE_NODES = (4, 8, 12, 16, 24)
TREE_FAMILIES = ("optimal", "joint")


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
    check_budget(acc, num_nodes)
    return grow_tree(lambda path: (path_counts.get(path, 0), path_acceptance(acc, path)),
                 len(acc[0]), len(acc), num_nodes)


def measured_tokens_per_pass(
    path_counts: Mapping[Path, int], positions: int, choices: Sequence[Sequence[int]]
) -> float:
    """1 (the root) + how many of the tree's nodes were right per position, on the counted text."""
    if positions <= 0:
        raise DecodingError("no positions were counted")
    return 1.0 + sum(path_counts.get(tuple(p), 0) for p in choices) / positions


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
