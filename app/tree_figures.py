"""One round's candidate tree and its attention mask, as Plotly figures. No Gradio here.

Both figures stay light whatever the tree's size, because the browser redraws them while a run
streams and on every step through the rounds: the tree is one trace per kind of edge and one per
depth (not one per node), the mask one heatmap whose axis labels thin out as the tree grows.
Large trees stay readable through their hover (every node, every mask cell) and Plotly's zoom.
Their axes let tick labels overflow (`ticklabeloverflow="allow"`, the labels sit in the margins
anyway): Plotly's default for numeric axes measures every label against the page on every draw,
which on a 2-core CPU was most of the 64-node mask's drawing time.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import plotly.graph_objects as go

from decoding.trace import RoundTrace, TreeTrace

from . import eagle_views
from .figure_style import LAPTOP, MASK_SHARE, SIDEBAR_CLOSED_BELOW, SIDEBAR_PX, Look, base_layout, message_figure
from .lanes import EAGLE, guess_name, guess_noun
from .palette import ACCEPTED, ALLOWED, BASE, BLOCKED, INK, head_colour
from .tokens import count, figure_text
from .tree_layout import leaf_count, tidy_layout

ROW_PX = 24  # vertical room per tree row (one leaf) when there is room for it
MIN_ROWS = 8
TREE_MAX_PX = 700  # a taller tree is squeezed (smaller labels) and read by zooming
MIN_LABEL_PX = 10  # a guess label any smaller is unreadable at laptop distance
MASK_MAX_PX = 560
TREE_MARGIN_PX = 90  # title and column headings
TICKS_OVERFLOW = "allow"  # no measuring of each tick label against the page on every draw
SHORT_HEADINGS_PAST = 6  # deeper trees (a long lookup chain) get short column headings: "c7", not "copy 7"


@dataclass(frozen=True)
class Frame:
    """Where a tree's nodes sit when more than its nodes are drawn (EAGLE's candidates that the
    rerank cut, beside the verified tree): their positions, the rows, the deepest column, and the
    nodes with something drawn after them (the next token's star steps aside from those)."""

    pos: dict[int, tuple[float, float]]
    rows: int
    depth: int
    with_children: set[int]


def tree_height(tree: TreeTrace, look: Look = LAPTOP, rows: int | None = None) -> int:
    rows = max(leaf_count(tree.parents) if rows is None else rows, MIN_ROWS)
    return round(min(TREE_MARGIN_PX + ROW_PX * rows, TREE_MAX_PX) * look.scale)


def drafter_of(rnd: RoundTrace) -> str:
    """Who proposed the round's guesses, as the trace records it per node ("base" in a round
    that verified its root alone: there is no guess to name, unless EAGLE drafted candidates it cut)."""
    return EAGLE if rnd.drafted is not None else rnd.node_sources[-1]


def guess_prob(rnd: RoundTrace, tree: TreeTrace, node: int) -> float | None:
    """The drafter's own probability for the guess at `node`: a head's softmax or the draft
    model's or EAGLE's draft (None for the root, and for prompt lookup, which copies with no probability)."""
    if node and rnd.drafted is not None:
        return eagle_views.node_prob(rnd, node)
    if node == 0 or not rnd.guess_probs:
        return None
    return rnd.guess_probs[tree.depths[node] - 1][tree.ranks[node]]


def _node_hover(tree: TreeTrace, rnd: RoundTrace, node: int, accepted: set[int]) -> str:
    """What a node is, who guessed it, and what the base model itself predicted there."""
    token = figure_text(rnd.node_texts[node])
    after = (f"base model's most likely token after it: '{figure_text(rnd.base_argmax_texts[node])}' "
             f"(p={rnd.base_argmax_probs[node]:.2f})")
    if node == 0:
        return f"<b>root</b> '{token}'<br>the token the previous pass chose<br>{after}"
    parent = tree.parents[node]
    p_guess = guess_prob(rnd, tree, node)
    p_base = rnd.node_base_probs[node]
    verdict = "accepted ✓" if node in accepted else "rejected ✗"
    lines = [
        f"<b>node {node}</b> '{token}' — {verdict}",
        *_proposer(tree, rnd, node, p_guess),
        f"base model's probability of it: {p_base:.2f}" if p_base is not None else "",
        f"base model's most likely token here: '{figure_text(rnd.base_argmax_texts[parent])}' "
        f"(p={rnd.base_argmax_probs[parent]:.2f})",
        after,
    ]
    return "<br>".join(line for line in lines if line)


def node_origin(rnd: RoundTrace, node: int) -> str:
    """Where the drafter found the node's guess, for a hover, where its trace says ("" otherwise):
    escaped, because Plotly reads a few HTML tags in text, and its line breaks drawn."""
    if node >= len(rnd.node_origins) or not rnd.node_origins[node]:
        return ""
    return html.escape(rnd.node_origins[node], quote=False).replace("\n", "↵")


def _proposer(tree: TreeTrace, rnd: RoundTrace, node: int, p_guess: float | None) -> list[str]:
    """Who proposed the node, and how sure it was: where the drafter says where it found the
    guess, that; EAGLE's draft; else its place in the tree, in the drafter's own word for a guess."""
    depth, rank, drafter = tree.depths[node], tree.ranks[node], drafter_of(rnd)
    if origin := node_origin(rnd, node):
        return [origin]
    if drafter == EAGLE:
        return eagle_views.proposer_lines(rnd, node)
    return [f"{guess_name(drafter, depth)}, rank {rank + 1}: its top-{rank + 1} guess, {count(depth, 'token')} "
            "after the root",
            f"{guess_noun(drafter)}'s probability: {p_guess:.2f}" if p_guess is not None else ""]


def _edge_trace(points: list[tuple[tuple[float, float], tuple[float, float]]], *, name: str,
                colour: str, width: float, dash: str = "solid", legend: bool = True) -> go.Scatter:
    """All edges of one kind as a single line trace (None breaks the line between edges)."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for (x0, y0), (x1, y1) in points:
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    return go.Scatter(x=xs, y=ys, mode="lines", name=name, hoverinfo="skip", showlegend=legend,
                      line=dict(color=colour, width=width, dash=dash))


def _label_size(rows: int, height: int, look: Look) -> int:
    """Label font size that fits the rows (at most 12 px at laptop scale, never under MIN_LABEL_PX)."""
    pitch = (height - TREE_MARGIN_PX * look.scale) / max(rows, 1)
    return round(max(MIN_LABEL_PX * look.scale, min(12.0 * look.scale, pitch * 0.8)))


def tree_figure(tree: TreeTrace, rnd: RoundTrace, look: Look = LAPTOP, frame: Frame | None = None) -> go.Figure:
    """The round's candidate tree: depth left to right, accepted path bold, rejected faded.

    Colour = the depth of the guess (Medusa's head d guesses depth d; a draft model's or a
    copy's d-th token sits there too); dot size = the drafter's probability, where it has one;
    ★ = the token the round chose after the accepted path (the next root). A chain (a draft
    model's or prompt lookup's guesses) is one row, its labels above and below in turn so that
    long chains stay readable. A `frame` places the nodes where more is drawn around them (see
    eagle_figures.py).
    """
    if not rnd.node_tokens:
        return message_figure("This run was traced without per-node detail.", look)
    pos = frame.pos if frame else tidy_layout(tree.parents, tree.depths)
    rows = frame.rows if frame else leaf_count(tree.parents)
    accepted = set(rnd.accepted_nodes)
    max_depth = max(tree.depths + ([frame.depth] if frame else []))
    height = tree_height(tree, look, rows)
    label_size = _label_size(rows, height, look)
    chain = rows == 1 and tree.size > 1
    drafter = drafter_of(rnd)
    fig = go.Figure()

    rejected_edges = [(pos[tree.parents[n]], pos[n]) for n in range(1, tree.size) if n not in accepted]
    accepted_edges = [(pos[tree.parents[n]], pos[n]) for n in rnd.accepted_nodes[1:]]
    fig.add_trace(_edge_trace(rejected_edges, name="rejected branch (faded)", colour=look.rejected_edge,
                              width=1.2 * look.scale))
    fig.add_trace(_edge_trace(accepted_edges, name="accepted path", colour=ACCEPTED, width=5 * look.scale))
    for depth in range(max(tree.depths) + 1):
        nodes = [n for n in range(tree.size) if tree.depths[n] == depth]
        fig.add_trace(_node_trace(tree, rnd, nodes, pos, accepted, look, label_size, chain))
    _add_next_token(fig, tree, rnd, pos, look, label_size, max_depth + 1,
                    frame.with_children if frame else set(tree.parents))

    fig.update_xaxes(
        tickvals=list(range(max_depth + 2)),
        ticktext=[_heading(d, max_depth, look, drafter) for d in range(max_depth + 2)],
        range=[-0.25, max_depth + 1.9], showgrid=False, zeroline=False, side="top", fixedrange=False,
        ticklabeloverflow=TICKS_OVERFLOW,
    )
    # A chain is one row: its own range keeps the row near the top and the star just below it
    # (autorange would stretch the half row between them over the whole figure).
    fig.update_yaxes(visible=False, **(dict(range=[1.6, -1.0]) if chain else dict(autorange="reversed")))
    fig.update_layout(
        title=dict(text=tree_title(tree, rnd), x=0.01, y=0.99, font=dict(size=look.font(15))),
        showlegend=False,  # the column headings, in each head's colour, are the key
        dragmode=look.dragmode,
    )
    fig = base_layout(fig, height=height, look=look, uirevision=f"tree-{tree.name}-{tree.size}")
    # Room for the title above the column headings at any scale (on a projector they collided).
    fig.update_layout(margin=dict(l=10, r=10, t=round(50 * look.scale), b=10))
    return fig


def tree_title(tree: TreeTrace, rnd: RoundTrace) -> str:
    if tree.size == 1:
        return f"Round {rnd.index + 1} · no guesses: a plain step"
    return f"Round {rnd.index + 1} · {len(rnd.accepted_nodes) - 1} of {tree.size - 1} guesses accepted"


def _heading(depth: int, max_depth: int, look: Look, drafter: str) -> str:
    """A column's heading in the colour of its nodes: root, the drafter's guesses by depth
    (head 1..n, draft 1..n, copy 1..n), then the next token (on a phone, or past SHORT_HEADINGS_PAST
    columns, "h1".."hn" and "★", which fit side by side)."""
    short = look.narrow or max_depth > SHORT_HEADINGS_PAST
    if depth == 0:
        name = "root"
    elif depth > max_depth:
        name = "★" if short else "★ next"
    else:
        name = guess_name(drafter, depth, short=short)
    colour = ACCEPTED if depth > max_depth else head_colour(depth)
    return f'<span style="color:{colour}"><b>{name}</b></span>'


def _node_trace(tree: TreeTrace, rnd: RoundTrace, nodes: list[int], pos: dict[int, tuple[float, float]],
                accepted: set[int], look: Look, label_size: int, chain: bool) -> go.Scatter:
    """One depth's nodes: one legend entry per head, so the legend explains every colour."""
    depth = tree.depths[nodes[0]]
    sizes = []
    for n in nodes:
        p = guess_prob(rnd, tree, n)
        sizes.append((8 + 18 * p if p is not None else 18) * look.marker_scale)
    on_path = [n in accepted for n in nodes]
    return go.Scatter(
        x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes],
        mode="markers+text",
        name="root" if depth == 0 else f"{guess_name(drafter_of(rnd), depth)} guess",
        text=[figure_text(rnd.node_texts[n], look.label_chars) for n in nodes],
        textposition=("top center" if depth % 2 else "bottom center") if chain else "middle right",
        # The accepted path's tokens are a size larger: on a crowded tree they are what to read.
        textfont=dict(size=[round(label_size * (1.25 if a else 1)) for a in on_path],
                      color=[INK if a else look.faded_ink for a in on_path]),
        hovertext=[_node_hover(tree, rnd, n, accepted) for n in nodes],
        hoverinfo="text",
        marker=dict(
            color=head_colour(depth), size=sizes,
            opacity=[1.0 if a else look.faded_opacity for a in on_path],
            line=dict(color=[ACCEPTED if a else "white" for a in on_path],
                      width=[3 if a else 1 for a in on_path]),
        ),
        customdata=nodes,
    )


def next_token_hover(rnd: RoundTrace) -> str:
    """The star's hover: the token chosen after the accepted path, and the argmax if it differs."""
    last = rnd.accepted_nodes[-1]
    chosen = figure_text(rnd.next_text)
    lines = [f"<b>next token</b> '{chosen}'",
             "chosen by the base model after the accepted path, from the same verify pass:",
             "it ends this round's output and becomes the next round's root"]
    if rnd.next_token is not None and rnd.next_token != rnd.base_argmax_tokens[last]:
        lines.append(f"sampled: the most likely token there was '{figure_text(rnd.base_argmax_texts[last])}' "
                     f"(p={rnd.base_argmax_probs[last]:.2f})")
    if len(rnd.emitted_tokens) < len(rnd.accepted_nodes):
        lines.append("(not written: the run stopped before it)")
    return "<br>".join(lines)


def _add_next_token(fig: go.Figure, tree: TreeTrace, rnd: RoundTrace, pos: dict[int, tuple[float, float]],
                    look: Look, label_size: int, column: int, with_children: set[int]) -> None:
    """The star after the last accepted node: the token the round actually wrote there. Where that
    node has children (rejected guesses), the star sits half a row lower, so its dotted line does
    not run through them (on a chain, through every rejected guess)."""
    last = rnd.accepted_nodes[-1]
    x0, y0 = pos[last]
    star_x, star_y = column, y0 + (0.5 if last in with_children else 0.0)
    fig.add_trace(_edge_trace([((x0, y0), (star_x, star_y))], name="", colour=ACCEPTED, width=2 * look.scale,
                              dash="dot", legend=False))
    fig.add_trace(go.Scatter(
        x=[star_x], y=[star_y], mode="markers+text", name="next token (the next root)",
        text=[figure_text(rnd.next_text, look.label_chars)], textposition="middle right",
        textfont=dict(size=max(label_size, look.font(12)), color=INK),
        marker=dict(symbol="star", size=20 * look.marker_scale, color=BASE, line=dict(color=ACCEPTED, width=2)),
        hovertext=[next_token_hover(rnd)], hoverinfo="text",
    ))


# ----------------------------------------------------------------------------- attention mask

MASK_MARGIN_PX = 100  # the mask's title, column numbers and key


def mask_height(tree: TreeTrace, look: Look = LAPTOP) -> int:
    """The mask figure's height: its square of cells and margins, no taller (a square bound by its
    column's width would otherwise float in empty space, its key far below it)."""
    return round(mask_plot_px(tree, look) + MASK_MARGIN_PX * look.scale)


def _mask_room_px(tree: TreeTrace, look: Look) -> float:
    """The tallest the mask's cells may be: a row of pixels per node, within MASK_MAX_PX."""
    return min(220 + 9 * tree.size, MASK_MAX_PX) * look.scale - MASK_MARGIN_PX * look.scale


def mask_label(rnd: RoundTrace, node: int, look: Look = LAPTOP) -> str:
    """A row's label: ✓ on the accepted path, the node's index, its token."""
    mark = "✓ " if node in rnd.accepted_nodes else ""
    text = figure_text(rnd.node_texts[node], min(look.label_chars, 8)) if rnd.node_texts else ""
    return f"{mark}{node} {text}"


def labelled_nodes(size: int, accepted: list[int], every: int) -> list[int]:
    """The rows that get a label, at least `every` rows apart so no two overlap: accepted rows
    first (the root always), then every `every`-th row where there is room."""
    keep: list[int] = []
    for node in [*accepted, *range(0, size, every)]:
        if all(abs(node - other) >= every for other in keep):
            keep.append(node)
    return sorted(keep)


def mask_plot_px(tree: TreeTrace, look: Look = LAPTOP) -> float:
    """About how many pixels the mask's square of cells spans: the figure's height less its
    margins, or its column's width where that is smaller (the mask shares the row with the tree,
    and on a laptop the settings sidebar takes its width)."""
    height = _mask_room_px(tree, look)
    content = look.width - 80 - (0 if look.projector or look.width < SIDEBAR_CLOSED_BELOW else SIDEBAR_PX)
    column = content if look.projector or look.narrow else content * MASK_SHARE
    return max(50.0, min(height, column - 110 * look.scale))  # less the row labels


def label_every(tree: TreeTrace, look: Look = LAPTOP) -> int:
    """Label one row in this many, so labels never overlap (1 for a small tree)."""
    label_px = look.font(11) * 1.3
    return max(1, math.ceil(label_px / (mask_plot_px(tree, look) / tree.size)))


def mask_cell_values(tree: TreeTrace, rnd: RoundTrace) -> list[list[int]]:
    """0 = blocked, 1 = may attend, 2 = may attend and the row is on the accepted path."""
    accepted = set(rnd.accepted_nodes)
    return [[cell * (2 if row in accepted else 1) for cell in tree.mask[row]] for row in range(tree.size)]


def _mask_hover(tree: TreeTrace, tokens: list[str], row: int, col: int) -> str:
    """Why node `row` may (or may not) attend to node `col`; short, because a 64-node mask has 4096."""
    if row == col:
        return f"node {row} '{tokens[row]}' sees itself"
    if tree.mask[row][col]:
        why = "the root" if col == 0 else "its ancestor"
        return f"node {row} '{tokens[row]}' sees node {col} '{tokens[col]}': {why}"
    # Blocked: either col comes after row on row's own branch (row is its ancestor), or it is on
    # another branch. Both are hidden, for different reasons.
    why = "it comes later, below it on its own branch" if tree.mask[col][row] else "another branch"
    return f"node {row} '{tokens[row]}' cannot see node {col} '{tokens[col]}': {why}"


# Short enough for the narrowest mask column (a phone, or the laptop's half row).
MASK_KEY = (f'<span style="color:{ALLOWED}">■</span> may attend · <span style="color:{ACCEPTED}">■</span> '
            f'accepted rows · <span style="color:#CBD5E1">■</span> blocked')


def mask_figure(tree: TreeTrace, rnd: RoundTrace, look: Look = LAPTOP) -> go.Figure:
    """The tree attention mask: row i may attend to column j iff j is i or one of its ancestors.

    Integer coordinates with tick text, because tokens repeat and Plotly would merge equal
    category labels into one row; the y axis is reversed so row 0 is on top, like a matrix.
    """
    n = tree.size
    tokens = [figure_text(t) for t in rnd.node_texts] if rnd.node_texts else [""] * n
    hover = [[_mask_hover(tree, tokens, r, c) for c in range(n)] for r in range(n)]
    gap = 1 if n <= 32 else 0
    fig = go.Figure(go.Heatmap(
        z=mask_cell_values(tree, rnd), x=list(range(n)), y=list(range(n)),
        zmin=0, zmax=2, xgap=gap, ygap=gap, showscale=False,
        colorscale=[[0, BLOCKED], [0.33, BLOCKED], [0.33, ALLOWED], [0.67, ALLOWED],
                    [0.67, ACCEPTED], [1, ACCEPTED]],
        text=hover, hovertemplate="%{text}<extra></extra>",
    ))
    shown = labelled_nodes(n, rnd.accepted_nodes, label_every(tree, look))
    axis = dict(tickmode="array", tickvals=shown, showgrid=False, zeroline=False,
                tickfont=dict(size=look.font(11)), ticklabeloverflow=TICKS_OVERFLOW)
    fig.update_xaxes(**axis, ticktext=[str(node) for node in shown], side="top", constrain="domain")
    fig.update_yaxes(**axis, ticktext=[mask_label(rnd, node, look) for node in shown],
                     autorange="reversed", scaleanchor="x", constrain="domain")
    fig.update_layout(
        title=dict(text=f"Attention mask · round {rnd.index + 1}", x=0.01, y=0.99, font=dict(size=look.font(15))),
        dragmode=look.dragmode,
    )
    # Under the square's own left edge ("x domain"): the square is centred in a wide column, and
    # the column's left edge ("paper") left the key far from the cells it explains.
    fig.add_annotation(text=MASK_KEY, showarrow=False,
                       x=0, y=-0.01, xref="x domain", yref="paper", xanchor="left", yanchor="top",
                       font=dict(size=look.font(11)))
    fig = base_layout(fig, height=mask_height(tree, look), look=look, uirevision=f"mask-{tree.name}-{n}")
    fig.update_layout(margin=dict(l=10, r=10, t=round(70 * look.scale), b=round(30 * look.scale)))
    return fig
