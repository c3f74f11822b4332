"""EAGLE's figures: a round's dynamic tree (the verified nodes and the candidates the rerank cut),
and the Learn step's per-depth accuracies of Medusa's heads and EAGLE side by side. No Gradio here.

The dynamic tree is the ordinary tree figure (tree_figures.py, the same tidy layout) with more
drawn around it: the layout is made for the verified tree *plus* the most confident candidates
the rerank cut, so each cut candidate sits beside the siblings that were kept, faded. Because a
candidate is never more confident than its parent, the most confident candidates form a tree:
the verified ones, then the next `CUT_SHOWN` by confidence, hang together.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from decoding.trace import RoundTrace, RunTrace, TreeTrace

from . import eagle_views, lanes
from .eagle_views import GuessingAccuracy
from .figure_style import LAPTOP, Look, base_layout, message_figure
from .palette import BASE, INK, REJECTED_STRONG, head_colour
from .tokens import figure_text
from .tree_figures import Frame, _label_size, tree_figure, tree_height
from .tree_layout import leaf_count, tidy_layout

CUT_SHOWN = 16  # candidates the rerank cut drawn beside the verified tree, the most confident first
CUT_OPACITY = 0.22


@dataclass(frozen=True)
class DrawnDraft:
    """The nodes the figure draws: 0 the root, then the verified nodes in their own order, then the
    cut candidates shown. `candidates[i]` is drawn node i's index in the round's draft (-1: root)."""

    parents: list[int]
    depths: list[int]
    candidates: list[int]
    verified: int  # drawn nodes 0 .. verified - 1 are the verified tree's nodes, same numbers
    hidden: int  # cut candidates not drawn


def drawn_draft(tree: TreeTrace, rnd: RoundTrace, cut_shown: int = CUT_SHOWN) -> DrawnDraft:
    """The verified tree and the `cut_shown` most confident candidates the rerank cut (with any
    cut ancestor they need, should ties have put one behind its child)."""
    drafted = rnd.drafted
    of_node = eagle_views.candidate_of(rnd)
    candidates = [-1] + [of_node[node] for node in range(1, tree.size)]
    cut = [i for i, node in enumerate(drafted.nodes) if node < 0]
    cut.sort(key=lambda i: (-drafted.confidences[i], drafted.depths[i], i))
    chosen = set(cut[:cut_shown])
    for i in list(chosen):
        parent = drafted.parents[i]
        while parent >= 0 and drafted.nodes[parent] < 0 and parent not in chosen:
            chosen.add(parent)
            parent = drafted.parents[parent]
    # Draft order is rank order among siblings, so cut siblings stack in the draft's own order.
    candidates += sorted(chosen)
    drawn_of = {candidate: i for i, candidate in enumerate(candidates) if candidate >= 0}
    parents = [-1] + [tree.parents[node] for node in range(1, tree.size)]
    parents += [drawn_of.get(drafted.parents[c], 0) for c in candidates[tree.size:]]
    depths = list(tree.depths) + [drafted.depths[c] for c in candidates[tree.size:]]
    return DrawnDraft(parents, depths, candidates, tree.size, len(cut) - len(chosen))


def dynamic_tree_figure(tree: TreeTrace, rnd: RoundTrace, look: Look = LAPTOP,
                        cut_shown: int = CUT_SHOWN) -> go.Figure:
    """An EAGLE round: the verified tree as every drafter's (accepted path bold, ★ next token),
    the candidates the rerank cut faded beside it, a ring on every node the draft expanded, and
    each node's confidence in its hover."""
    if rnd.drafted is None or not rnd.node_tokens:
        return tree_figure(tree, rnd, look)
    drawn = drawn_draft(tree, rnd, cut_shown)
    pos = tidy_layout(drawn.parents, drawn.depths)
    frame = Frame({node: pos[node] for node in range(drawn.verified)}, leaf_count(drawn.parents),
                  max(drawn.depths), {parent for parent in drawn.parents if 0 <= parent < drawn.verified})
    fig = tree_figure(tree, rnd, look, frame)
    label_size = _label_size(frame.rows, tree_height(tree, look, frame.rows), look)
    behind = [trace for trace in (_cut_edges(drawn, pos, look), _cut_nodes(rnd, drawn, pos, look, label_size))
              if trace is not None]
    drawn_before = len(fig.data)
    fig.add_traces([*behind, _expanded_rings(rnd, drawn, pos, look)])
    # The cut candidates go first, behind the verified tree; the rings last, over the nodes.
    data = fig.data
    fig.data = data[drawn_before:drawn_before + len(behind)] + data[:drawn_before] + data[-1:]
    fig.update_layout(title_text=short_title(tree, rnd) if look.narrow else dynamic_title(tree, rnd))
    fig.add_annotation(text=dynamic_key(drawn, look), showarrow=False, x=0, y=0, xref="paper", yref="paper",
                       xanchor="left", yanchor="top", yshift=-4, align="left",
                       font=dict(size=look.font(11), color=BASE))
    fig.update_layout(margin=dict(b=round(44 * look.scale)))
    return fig


def dynamic_title(tree: TreeTrace, rnd: RoundTrace) -> str:
    drafted, kept = len(rnd.drafted.parents), tree.size - 1
    if not kept:
        return f"Round {rnd.index + 1} · none of {drafted} drafted kept: a plain step"
    return f"Round {rnd.index + 1} · {len(rnd.accepted_nodes) - 1} of {kept} accepted · {kept} of {drafted} drafted"


def short_title(tree: TreeTrace, rnd: RoundTrace) -> str:
    """The title on a phone, whose figure has room for about forty characters."""
    kept = tree.size - 1
    accepted = f"{len(rnd.accepted_nodes) - 1} of {kept} accepted" if kept else "none kept"
    return f"Round {rnd.index + 1} · {accepted} · {len(rnd.drafted.parents)} drafted"


def dynamic_key(drawn: DrawnDraft, look: Look) -> str:
    """The key under the tree: what faded and ringed nodes are, and what is left out."""
    hidden = f" ({drawn.hidden} more not drawn)" if drawn.hidden else ""
    if look.narrow:
        return f"faded: cut by the rerank{hidden}<br>◯ expanded · tap a node: its confidence"
    return f"faded, dotted: cut by the rerank{hidden}<br>◯ expanded: its children drafted · hover a node: confidence"


def _cut_edges(drawn: DrawnDraft, pos: dict, look: Look) -> go.Scatter | None:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for node in range(drawn.verified, len(drawn.parents)):
        (x0, y0), (x1, y1) = pos[drawn.parents[node]], pos[node]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    if not xs:
        return None
    return go.Scatter(x=xs, y=ys, mode="lines", name="cut by the rerank", hoverinfo="skip", showlegend=False,
                      line=dict(color=look.rejected_edge, width=1 * look.scale, dash="dot"))


def _cut_nodes(rnd: RoundTrace, drawn: DrawnDraft, pos: dict, look: Look, label_size: int) -> go.Scatter | None:
    nodes = list(range(drawn.verified, len(drawn.parents)))
    if not nodes:
        return None
    drafted = rnd.drafted
    candidates = [drawn.candidates[n] for n in nodes]
    kept = eagle_views.kept_count(rnd)
    hover = [f"<b>cut</b> '{figure_text(drafted.texts[c])}' — not verified<br>"
             + "<br>".join(eagle_views.confidence_lines(rnd, c))
             + f"<br>the rerank kept only the {kept} most confident candidates" for c in candidates]
    return go.Scatter(
        x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text",
        name="cut by the rerank", showlegend=False,
        text=[figure_text(drafted.texts[c], look.label_chars) for c in candidates], textposition="middle right",
        textfont=dict(size=max(round(label_size * 0.9), 8), color=REJECTED_STRONG),
        hovertext=hover, hoverinfo="text",
        marker=dict(color=[head_colour(drafted.depths[c]) for c in candidates], opacity=CUT_OPACITY,
                    size=[(8 + 18 * eagle_views.step_prob(rnd, c)) * look.marker_scale for c in candidates],
                    line=dict(color="white", width=1)),
        customdata=[-1] * len(nodes),
    )


def _expanded_rings(rnd: RoundTrace, drawn: DrawnDraft, pos: dict, look: Look) -> go.Scatter:
    """A ring around every drawn candidate whose children the draft guessed."""
    nodes = [n for n in range(1, len(drawn.parents)) if rnd.drafted.expanded[drawn.candidates[n]]]
    sizes = [(14 + 18 * eagle_views.step_prob(rnd, drawn.candidates[n])) * look.marker_scale for n in nodes]
    return go.Scatter(x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers",
                      name="expanded (its children drafted)", showlegend=False, hoverinfo="skip",
                      marker=dict(symbol="circle-open", size=sizes, color=INK,
                                  line=dict(width=1.5 * look.scale), opacity=0.55))


def round_tree_figure(tree: TreeTrace, rnd: RoundTrace, look: Look = LAPTOP) -> go.Figure:
    """A round's tree: EAGLE's dynamic one with its cut candidates, any other drafter's as it is."""
    return dynamic_tree_figure(tree, rnd, look) if rnd.drafted is not None else tree_figure(tree, rnd, look)


# ----------------------------------------------------------------------------- Learn

def guessing_figure(accuracy: GuessingAccuracy, medusa: RunTrace | None, eagle: RunTrace | None,
                    look: Look = LAPTOP) -> go.Figure:
    """Per depth: how often Medusa's head and EAGLE's step guess right (held-out, measured when
    they were trained), and how often their top-1 guesses were right in the visitor's runs."""
    eagle_name = "EAGLE step d (held-out)" if look.narrow else "EAGLE step d, given the steps before (held-out)"
    medusa_colour, eagle_colour = lanes.colour(lanes.MEDUSA), lanes.colour(lanes.EAGLE)
    series = [("Medusa head d, top-1 (held-out)", accuracy.medusa, medusa_colour, ""),
              (eagle_name, accuracy.eagle, eagle_colour, ""),
              ("your Medusa run, top-1", eagle_views.top1_rates(medusa) if medusa else None, medusa_colour, "/"),
              ("your EAGLE run, top-1", eagle_views.top1_rates(eagle) if eagle else None, eagle_colour, "/")]
    series = [s for s in series if s[1]]
    if not series:
        return message_figure("No measured accuracy ships with<br>this model's drafters: press Run<br>"
                              "with EAGLE to measure your own.", look, height=260)
    fig = go.Figure([
        go.Bar(x=[f"d = {d + 1}" for d in range(len(rates))], y=rates, name=name,
               marker=dict(color=colour, pattern_shape=pattern, opacity=1.0 if not pattern else 0.75),
               hovertemplate=f"{name}<br>%{{x}}: %{{y:.0%}}<extra></extra>")
        for name, rates, colour, pattern in series])
    title = "Right how often, d ahead?" if look.narrow else "Guessing d tokens ahead: right how often?"
    fig.update_layout(title=dict(text=title, x=0.01), barmode="group",
                      legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, xanchor="left"))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig = base_layout(fig, height=round(380 * look.scale), look=look, uirevision="guessing")
    fig.update_layout(margin=dict(l=10, r=10, t=round(50 * look.scale), b=round(110 * look.scale)))
    return fig
