"""`--tree auto`: the tree that maximises tokens per second on this machine, from measured costs.

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

from dataclasses import dataclass

from .trace import CostCurve
from .training.trees import expected_tokens_per_pass, max_tree_nodes, optimal_choices

AUTO_TREE = "auto"  # the tree spec that asks for this choice
MAX_AUTO_NODES = 64  # the largest tree the curve measures, root excluded: 63 nodes plus the root


@dataclass(frozen=True)
class TreeChoice:
    """The tree auto chose, and the figures it was chosen by."""

    nodes: int  # guesses, root excluded
    choices: list[list[int]]
    expected_tokens: float  # per pass, by the product rule
    pass_cost: float  # the verify pass, in one-token steps
    draft_cost: float  # drafting per round, in one-token steps

    @property
    def estimated_speedup(self) -> float:
        return self.expected_tokens / (self.pass_cost + self.draft_cost)

    @property
    def name(self) -> str:
        return f"auto: optimal-{self.nodes}"


def choose_tree(accuracy: list[list[float]], curve: CostCurve, max_nodes: int = MAX_AUTO_NODES) -> TreeChoice:
    """The optimal-n tree with the highest expected tokens per pass over its measured round cost."""
    largest = min(max_nodes, max_tree_nodes(accuracy), curve.sizes[-1] - 1)
    best: TreeChoice | None = None
    for nodes in range(1, largest + 1):
        choices = optimal_choices(accuracy, nodes)
        candidate = TreeChoice(nodes, choices, expected_tokens_per_pass(accuracy, choices),
                               curve.cost(nodes + 1), curve.draft_cost)
        if best is None or candidate.estimated_speedup > best.estimated_speedup:
            best = candidate
    return best
