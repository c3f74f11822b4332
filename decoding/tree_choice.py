"""Choosing a tree from measured accuracies: the paper's optimal tree, and `--tree auto`.

`acc[h][r]` is how often head h+1's rank-r guess was the right token (measured on held-out text,
saved with the heads). Treating the heads as independent, the node for the path
`[r1, r2, ..., rd]` is accepted with probability

    acc[0][r1] * acc[1][r2] * ... * acc[d-1][rd]

because a node only counts when every guess above it was right too. The expected number of tokens
one verify pass yields is 1 (the root, the base model's own token, always lands) plus the sum of
these products over the tree's nodes. A child's product is never larger than its parent's (every
factor is at most 1), so the best tree of n nodes is simply the n most likely nodes, and the greedy
below — repeatedly take the most likely node whose parent is already in the tree — finds it. Ties
go to the shorter, then the lexicographically smaller path; ancestors win every tie against their
descendants, so the chosen nodes always form a tree, and the tree for n + 1 nodes contains the
tree for n.

`--tree auto` then picks the size: the tree that maximises tokens per second on this machine.
`--tree every-head` does the same among trees whose top-1 path reaches every head: on a steep
cost curve the fastest tree may read head 1 alone, which shows little of what Medusa is.

Two measurements decide it. The heads' accuracy table, `acc[h][r]` (how often head h+1's rank-r
guess was right on held-out text, saved with the heads), gives each tree's expected tokens per
pass: 1 + the sum over its nodes of the product of accuracies along the node's path (the paper's
rule, see `training/trees.py`). The machine's cost curve (`cost_curve.py`) gives what a pass over
that many tokens costs in one-token steps, and the heads' drafting adds a fixed cost per round.
So for each size n the best tree is the paper's optimal-n tree, and

    speedup(n) ≈ expected_tokens(n) / (cost(n + 1) + drafting)

is its estimated speedup over plain decoding; auto takes the n that maximises it. On a flat curve
(a GPU, bfloat16 matrix units) that is a big tree; on a steep one a handful of nodes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import DecodingError
from .trace import CostCurve

Path = tuple[int, ...]

AUTO_TREE = "auto"  # the tree spec that asks for this choice: the fastest tree here
# The fastest tree that uses every head: the auto tree's rule, each candidate's top-1 path carried
# down to the last head. What a page shows to teach Medusa: several heads, a tree.
EVERY_HEAD_TREE = "every-head"
MAX_AUTO_NODES = 64  # the largest tree the curve measures, root excluded: 63 nodes plus the root


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


def grow_tree(
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


def check_budget(acc: Sequence[Sequence[float]], num_nodes: int) -> None:
    _check_table(acc)
    if not 1 <= num_nodes <= max_tree_nodes(acc):
        raise DecodingError(
            f"a tree for {len(acc)} heads x {len(acc[0])} ranks holds 1 to "
            f"{max_tree_nodes(acc)} nodes, not {num_nodes}"
        )


def optimal_choices(acc: Sequence[Sequence[float]], num_nodes: int) -> list[list[int]]:
    """The paper's tree: the `num_nodes` (root excluded) paths of highest accuracy product."""
    check_budget(acc, num_nodes)
    return grow_tree(lambda path: (path_acceptance(acc, path),), len(acc[0]), len(acc), num_nodes)


def expected_tokens_per_pass(
    acc: Sequence[Sequence[float]], choices: Sequence[Sequence[int]]
) -> float:
    """1 (the root always lands) + the expected acceptance of every node in the tree."""
    return 1.0 + sum(path_acceptance(acc, path) for path in choices)


def with_top_chain(choices: list[list[int]], depth: int) -> list[list[int]]:
    """`choices` with the top-1 path carried down to `depth`: every [0]*d not yet in the tree
    added, so that each head guesses at least once a round. In (length, path) order."""
    paths = {tuple(path) for path in choices} | {(0,) * d for d in range(1, depth + 1)}
    return [list(p) for p in sorted(paths, key=lambda p: (len(p), p))]


@dataclass(frozen=True)
class TreeChoice:
    """The tree auto chose, and the figures it was chosen by."""

    nodes: int  # guesses, root excluded
    choices: list[list[int]]
    expected_tokens: float  # per pass, by the product rule
    pass_cost: float  # the verify pass, in one-token steps
    draft_cost: float  # drafting per round, in one-token steps
    # The optimal tree this one grew from (its guesses), and how deep its top-1 path was carried
    # on (1: not at all: the optimal tree itself).
    optimal_nodes: int = 0
    reach: int = 1

    @property
    def estimated_speedup(self) -> float:
        return self.expected_tokens / (self.pass_cost + self.draft_cost)

    @property
    def name(self) -> str:
        if self.reach <= 1:
            return f"{AUTO_TREE}: optimal-{self.nodes}"
        return f"{EVERY_HEAD_TREE}: optimal-{self.optimal_nodes} + top-1 to head {self.reach}"


def choose_tree(accuracy: list[list[float]], curve: CostCurve, max_nodes: int = MAX_AUTO_NODES,
                reach: int = 1) -> TreeChoice:
    """The optimal-n tree with the highest expected tokens per pass over its measured round cost;
    with `reach` > 1, each candidate's top-1 path is first carried down to head `reach`."""
    largest = min(max_nodes, max_tree_nodes(accuracy), curve.sizes[-1] - 1)
    reach = min(reach, len(accuracy))
    best: TreeChoice | None = None
    for optimal in range(1, largest + 1):
        choices = optimal_choices(accuracy, optimal)
        if reach > 1:
            choices = with_top_chain(choices, reach)
        nodes = len(choices)
        if nodes > largest:
            break
        candidate = TreeChoice(nodes, choices, expected_tokens_per_pass(accuracy, choices),
                               curve.cost(nodes + 1), curve.draft_cost, optimal, reach)
        if best is None or candidate.estimated_speedup > best.estimated_speedup:
            best = candidate
    return best
