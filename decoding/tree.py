"""The candidate tree, described by Medusa "choices", and the buffers that verification needs.

A choice is a path of ranks: `[0, 1]` means "head 1's top-1 guess, then head 2's second-best
guess below it". Node 0 is the root (the token the base model already chose); the node for a path
of length d sits at depth d and holds a guess from head d. Paths are sorted by (length, path) so
that every parent comes before its children — the order the published trees and buffers use.

From the paths we derive, once per tree:
- `parents`, `depths`, `heads`, `ranks` per node;
- the *tree attention mask*: node i may attend to node j iff j is i or an ancestor of i. In one
  forward pass every root-to-leaf path is then computed exactly as if it had been run alone;
- `draft_index`: where each node's token sits in the heads' flattened top-k table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import networkx as nx
import torch

from .errors import DecodingError
from .trace import TreeTrace

# How deep into a head's ranking a tree may reach. The published trees stop at rank 9.
MAX_RANK = 64

# The 63-node tree the Medusa authors found for Vicuna-7B on an A100 (10/28/23/2 nodes per
# depth). Data from FasterDecoding/Medusa, medusa/model/medusa_choices.py (Apache-2.0).
MC_SIM_7B_63 = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0],
    [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0],
    [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4],
    [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7],
    [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1],
    [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
    [1, 6], [0, 7, 0],
]


def chain_choices(depth: int) -> list[list[int]]:
    """Only each head's top-1 guess: one path, like classic speculative decoding."""
    return [[0] * d for d in range(1, depth + 1)]


def full_choices(top_k: int, depth: int) -> list[list[int]]:
    """Every combination of each head's top-k guesses down to `depth` (k + k^2 + ... nodes)."""
    level: list[list[int]] = [[]]
    out: list[list[int]] = []
    for _ in range(depth):
        level = [path + [r] for path in level for r in range(top_k)]
        out.extend(level)
    return out


TREE_PRESETS: dict[str, list[list[int]]] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    "chain-5": chain_choices(5),
    "chain-3": chain_choices(3),
    "full-2x3": full_choices(2, 3),
    "full-3x2": full_choices(3, 2),
    # A small hand-made tree for CPUs, where verifying many nodes is not free: the top-1 chain
    # to depth 5 plus runner-up guesses near the root, where they are most often right.
    "cpu-12": chain_choices(5) + [[1], [2], [0, 1], [1, 0], [0, 0, 1], [0, 2], [0, 0, 0, 1]],
}


def tree_graph(parents: Sequence[int]) -> nx.DiGraph:
    """Parent -> child edges over node indices; node 0 is the root (its parent is -1).

    The one graph of a tree, for the engine's `Tree` and for the page's drawing of a traced tree
    alike: networkx answers the ancestry, leaf and traversal questions for both.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(parents)))
    graph.add_edges_from((parent, child) for child, parent in enumerate(parents) if parent >= 0)
    return graph


NOT_A_TREE = "a tree needs a non-empty list of paths, e.g. [[0], [0, 0], [1]]"


def read_choices(text: str) -> list[list[int]]:
    """A choices list written as JSON (`[[0], [0, 0], [1]]`), or a DecodingError saying where it
    is malformed. Its paths are checked when a tree is made of it (`Tree.from_choices`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DecodingError(f"the tree JSON is malformed: {e.msg} at line {e.lineno}, column {e.colno}") from e
    except RecursionError:
        raise DecodingError("the tree JSON is nested too deeply: a tree is a list of paths, each a list of ranks, "
                            "e.g. [[0], [0, 0], [1]]") from None
    except ValueError:  # what is left: a number too long for Python to turn into an int
        raise DecodingError("the tree JSON holds a number far too long to be a rank") from None


def _check_choices(choices: object, num_heads: int) -> list[tuple[int, ...]]:
    """Validate a choices list; return its paths as tuples, or raise DecodingError saying why."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int):
        raise DecodingError(f"num_heads must be a whole number, not {num_heads!r}")
    if not isinstance(choices, (list, tuple)) or len(choices) == 0:
        raise DecodingError(NOT_A_TREE)
    paths: list[tuple[int, ...]] = []
    for path in choices:
        if not isinstance(path, (list, tuple)) or len(path) == 0:
            raise DecodingError(f"tree path {path!r} is not a non-empty list of ranks")
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in path):
            raise DecodingError(f"tree path {list(path)} must hold whole numbers (ranks)")
        if any(r < 0 for r in path):
            raise DecodingError(f"tree path {list(path)} has a negative rank")
        if any(r >= MAX_RANK for r in path):
            raise DecodingError(f"tree path {list(path)} has a rank of {MAX_RANK} or more")
        if len(path) > num_heads:
            raise DecodingError(
                f"tree path {list(path)} is {len(path)} deep but the model has {num_heads} heads"
            )
        paths.append(tuple(path))
    seen = set()
    for path in paths:
        if path in seen:
            raise DecodingError(f"tree path {list(path)} appears twice")
        seen.add(path)
    for path in paths:
        if len(path) > 1 and path[:-1] not in seen:
            raise DecodingError(
                f"tree path {list(path)} has no parent: add {list(path[:-1])} to the tree"
            )
    return paths


@dataclass(frozen=True)
class Tree:
    """A validated tree. Node 0 is the root; node i (i >= 1) is the path `paths[i - 1]`."""

    paths: tuple[tuple[int, ...], ...]
    name: str = "custom"

    @classmethod
    def from_choices(
        cls, choices: object, num_heads: int, name: str = "custom"
    ) -> Tree:
        paths = _check_choices(choices, num_heads)
        return _shared(cls(tuple(sorted(paths, key=lambda p: (len(p), p))), name))

    @classmethod
    def pruned(cls, choices: list[list[int]], num_heads: int, name: str) -> Tree:
        """Keep the paths no deeper than `num_heads` (a tree is valid after cutting its depth)."""
        if num_heads < 1:
            raise DecodingError("Medusa needs at least one head")
        return cls.from_choices([p for p in choices if len(p) <= num_heads], num_heads, name)

    def cut(self, depth: int) -> Tree:
        """This tree without its nodes deeper than `depth`; at depth 0, the root alone.

        Paths are sorted by length first, so the nodes kept are the first ones: node i of the
        cut tree is node i of this one.
        """
        return _shared(Tree(tuple(p for p in self.paths if len(p) <= depth), self.name))

    # ----- per-node facts -----
    @property
    def choices(self) -> list[list[int]]:
        """The paths as a choices list, the form a tree is written in."""
        return [list(path) for path in self.paths]

    @property
    def size(self) -> int:
        """Number of nodes, root included: the tokens one verify pass processes."""
        return len(self.paths) + 1

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def ranks(self) -> list[int]:
        return [0] + [p[-1] for p in self.paths]

    @cached_property
    def parents(self) -> list[int]:
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return [-1] + [index.get(p[:-1], 0) for p in self.paths]

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Parent -> child edges (see `tree_graph`)."""
        return tree_graph(self.parents)

    @cached_property
    def is_chain(self) -> bool:
        """One branch: each node the child of the one before (the root alone is a chain too)."""
        return self.parents == [-1, *range(self.size - 1)]

    @cached_property
    def max_depth(self) -> int:
        return max(self.depths)

    @cached_property
    def top_k(self) -> int:
        """How many guesses per head the tree reads: 1 + the largest rank it uses."""
        return 1 + max(self.ranks)

    @cached_property
    def leaves(self) -> list[int]:
        return [n for n in range(self.size) if self.graph.out_degree(n) == 0]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root down to `node`."""
        return nx.shortest_path(self.graph, 0, node)

    @cached_property
    def children(self) -> list[list[int]]:
        """Children of each node in rank order (the order the paths were sorted in)."""
        return [sorted(self.graph.successors(n)) for n in range(self.size)]

    # ----- buffers for the verify pass -----
    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """(T, T) bool: True where row i may attend to column j (j is i or an ancestor of i)."""
        mask = torch.eye(self.size, dtype=torch.bool)
        for node in range(1, self.size):
            mask[node, self.path_to(node)] = True
        return mask

    @cached_property
    def depth_tensor(self) -> torch.Tensor:
        return torch.tensor(self.depths, dtype=torch.long)

    @cached_property
    def draft_index(self) -> torch.Tensor:
        """For nodes 1..T-1: index into the heads' top-k table flattened to (heads * top_k)."""
        return torch.tensor(
            [(d - 1) * self.top_k + r for d, r in zip(self.depths[1:], self.ranks[1:], strict=True)],
            dtype=torch.long,
        )

    def to_trace(self) -> TreeTrace:
        return TreeTrace(
            choices=[list(p) for p in self.paths],
            parents=self.parents,
            depths=self.depths,
            ranks=self.ranks,
            mask=self.ancestor_mask.int().tolist(),
            name=self.name,
        )


@lru_cache(maxsize=64)
def _shared(tree: Tree) -> Tree:
    """The first instance seen of an equal tree: its derived buffers are then computed only once,
    not on every run that asks for the same tree."""
    return tree
