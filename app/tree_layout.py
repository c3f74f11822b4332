"""A tidy layout for the candidate tree: depth runs left to right, leaves stack top to bottom.

Every leaf gets its own row, in depth-first order with children in rank order, and each parent
sits centred on the rows of its first and last child. Rows never collide, so labels on a
64-node tree stay readable; the figure only needs to be tall enough for one row per leaf.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx

from decoding.tree import tree_graph


def tidy_layout(parents: list[int], depths: list[int]) -> dict[int, tuple[float, float]]:
    """Map each node to (x, y): x is its depth, y its row (0 = top, one row per leaf)."""
    return _layout(tuple(parents), tuple(depths))


@lru_cache(maxsize=32)  # a run redraws one tree shape on every round
def _layout(parents: tuple[int, ...], depths: tuple[int, ...]) -> dict[int, tuple[float, float]]:
    graph = tree_graph(list(parents))
    rows: dict[int, float] = {}
    next_leaf_row = 0
    # Post-order visits children before their parent, so a parent can average its children.
    for node in nx.dfs_postorder_nodes(graph, source=0, sort_neighbors=sorted):
        children = sorted(graph.successors(node))
        if children:
            rows[node] = (rows[children[0]] + rows[children[-1]]) / 2
        else:
            rows[node] = float(next_leaf_row)
            next_leaf_row += 1
    return {node: (float(depths[node]), rows[node]) for node in graph.nodes}


def leaf_count(parents: list[int]) -> int:
    """Rows the layout needs: one per leaf."""
    has_child = {parent for parent in parents if parent >= 0}
    return sum(1 for node in range(len(parents)) if node not in has_child)

