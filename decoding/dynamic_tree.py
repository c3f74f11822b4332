"""EAGLE-2's dynamic draft tree: grow it where the draft is confident, then keep the best N nodes.

A static tree (Medusa's) spends its nodes in the same places every round. EAGLE-2 (Li et al.,
2024) noticed that the draft's own *confidence* in a node, the product of its probabilities
along the path from the root, tracks how often the base model accepts that node; so it builds a
new tree each round:

    grow:    at each depth, expand only the `beam` most confident nodes of that depth; each gets
             the draft's `top_k` guesses as children (the others stay leaves, never expanded)
    rerank:  of every node drafted, keep the N most confident as the tree to verify

A child is never more confident than its parent (a probability is at most 1), so the N most
confident nodes always include their parents: they form a tree. Their summed confidence is the
draft's estimate of the tokens the round will accept, so N can be chosen each round by this
machine's cost curve: the most expected tokens per unit of time (`best_size`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from .trace import CostCurve, DraftedTree
from .tree import Tree

DYNAMIC_TREE = "dynamic"  # the name a round's grown tree goes by
# How much a new measurement of a round's drafting time moves the running estimate a drafter sizes
# its tree by (`best_size`'s `draft_cost`).
DRAFT_COST_SMOOTHING = 0.3
T = TypeVar("T")


@dataclass
class DraftTree:
    """Every candidate drafted in one round. Candidate i is a guess at depth `depths[i]` below the
    root; `parents[i]` is -1 for the root's children, else the candidate it continues."""

    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    log_confidences: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # its rank among its parent's children
    expanded: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_children(self, parent: int, tokens: list[int], log_probs: list[float]) -> None:
        """The draft's guesses after `parent` (-1: after the root), most probable first."""
        base = 0.0 if parent < 0 else self.log_confidences[parent]
        depth = 1 if parent < 0 else self.depths[parent] + 1
        for rank, (token, log_prob) in enumerate(zip(tokens, log_probs, strict=True)):
            self.parents.append(parent)
            self.tokens.append(token)
            self.log_confidences.append(base + log_prob)
            self.depths.append(depth)
            self.ranks.append(rank)
            self.expanded.append(False)

    def most_confident(self, candidates: list[int], count: int) -> list[int]:
        """The `count` most confident of `candidates`; ties go to the shallower, then earlier one,
        which keeps a parent ahead of a child as confident as itself."""
        order = sorted(candidates, key=lambda i: (-self.log_confidences[i], self.depths[i], i))
        return order[:count]

    def frontier(self, depth: int, beam: int) -> list[int]:
        """The `beam` most confident candidates at `depth`, marked as expanded."""
        chosen = self.most_confident([i for i, d in enumerate(self.depths) if d == depth], beam)
        for i in chosen:
            self.expanded[i] = True
        return chosen

    def path(self, candidate: int) -> tuple[int, ...]:
        """Its ranks from the root down: the Medusa "choice" that names its place in a tree."""
        ranks = []
        while candidate >= 0:
            ranks.append(self.ranks[candidate])
            candidate = self.parents[candidate]
        return tuple(reversed(ranks))


def best_size(confidences: list[float], curve: CostCurve | None, draft_cost: float, max_nodes: int) -> int:
    """How many of the most confident guesses to verify: the n that maximises the expected tokens
    of a round, 1 + (their summed confidence), over its cost, c(n + 1) + drafting, in steps.
    `confidences` are sorted, most confident first. Without a curve, as many as allowed."""
    return len(best_prefix(confidences, lambda confidence: confidence, curve, draft_cost, max_nodes))


def least_added_costs(curve: CostCurve, max_nodes: int) -> list[float]:
    """For n guesses (0 to `max_nodes`), the least the round's cost rises per guess added to them,
    however many are added: the smallest slope of the cost curve from n guesses to any more. It
    does not depend on the drafting cost, which adds the same to every size."""
    cost = [curve.cost(n + 1) for n in range(max_nodes + 1)]
    return [min(((cost[more] - cost[n]) / (more - n) for more in range(n + 1, max_nodes + 1)), default=math.inf)
            for n in range(max_nodes + 1)]


def best_prefix(candidates: Iterable[T], confidence: Callable[[T], float], curve: CostCurve | None,
                draft_cost: float, max_nodes: int, ceiling: Callable[[T], float] | None = None,
                added_costs: list[float] | None = None) -> list[T]:
    """The prefix of `candidates` (best first) that `best_size` keeps. Given a `ceiling`, they are
    read only as far as one more could pay: a drafter that makes its candidates as they are read
    then makes no more than it needs (`added_costs`: `least_added_costs` of the curve, kept).

    `ceiling(c)` bounds the confidence of every candidate after c. After n candidates, the best
    rate so far is R; k more, each at most e confident, give at most (1 + S_n + k e) over
    C(n + k), where 1 + S_n <= R C(n), so they cannot beat R when e <= R (C(n + k) - C(n)) / k for
    every k: when e <= R times the least added cost. Then reading stops, and the cut is the one
    made of every candidate."""
    if curve is None:
        return list(itertools.islice(candidates, max_nodes))
    if ceiling is not None and added_costs is None:
        added_costs = least_added_costs(curve, max_nodes)
    taken: list[T] = []
    best, best_rate, expected = 0, 1.0 / (curve.cost(1) + draft_cost), 1.0
    for candidate in itertools.islice(candidates, max_nodes):
        taken.append(candidate)
        expected += confidence(candidate)
        rate = expected / (curve.cost(len(taken) + 1) + draft_cost)
        if rate > best_rate:
            best, best_rate = len(taken), rate
        if ceiling is not None and ceiling(candidate) <= best_rate * added_costs[len(taken)]:
            break
    return taken[:best]


def rerank(draft: DraftTree, curve: CostCurve | None, draft_cost: float, max_nodes: int) -> list[int]:
    """The candidates to verify, most confident first: as many as `best_size` says pay."""
    ranked = draft.most_confident(list(range(len(draft))), max_nodes)
    confidences = [math.exp(draft.log_confidences[i]) for i in ranked]
    return ranked[: best_size(confidences, curve, draft_cost, max_nodes)]


def verified_tree(draft: DraftTree, kept: list[int], root: int) -> tuple[Tree, list[int], list[int]]:
    """The tree of the `kept` candidates, its node tokens (the root first), and for every
    candidate its node in that tree (-1 where the rerank cut it)."""
    if not kept:
        return Tree((), name=DYNAMIC_TREE), [root], [-1] * len(draft)
    paths = {draft.path(i): i for i in kept}
    tree = Tree.from_choices(list(paths), max(len(p) for p in paths), name=DYNAMIC_TREE)
    node_of = [-1] * len(draft)
    for node, path in enumerate(tree.paths, start=1):
        node_of[paths[path]] = node
    tokens = [root] + [draft.tokens[paths[path]] for path in tree.paths]
    return tree, tokens, node_of


def drafted_trace(draft: DraftTree, node_of: list[int]) -> DraftedTree:
    """What the page shows of a round's draft: every candidate, expanded or cut or verified (the
    texts are filled in with the rest of the round's details, outside the drafting's time)."""
    return DraftedTree(parents=list(draft.parents), tokens=list(draft.tokens), texts=[],
                       confidences=[math.exp(c) for c in draft.log_confidences], depths=list(draft.depths),
                       expanded=list(draft.expanded), nodes=node_of)
