"""Pure builders: a trace in, a Plotly figure out. No Gradio here, so each one is unit-testable.

Figures share one look (`_base_layout`): the same fonts, a fixed height chosen for the content,
and a fixed `uirevision` so a user's zoom survives the updates a live run streams in.
`scale` enlarges every font for class mode (a projector at the back of a room).
"""

from __future__ import annotations

from collections import Counter

import plotly.graph_objects as go

from decoding.trace import RoundTrace, RunTrace, TreeTrace

from .palette import (
    ACCEPTED, ALLOWED, AR, BASE, BLOCKED, FONT, MEDUSA, REJECTED, head_colour,
)
from .tokens import figure_text
from .tree_layout import leaf_count, tidy_layout

ROW_PX = 20  # vertical room per tree row (one leaf), enough for one line of label text


def _base_layout(fig: go.Figure, *, height: int, scale: float, uirevision: str) -> go.Figure:
    fig.update_layout(
        template="plotly_white",
        height=height,
        font=dict(family=FONT, size=round(13 * scale)),
        margin=dict(l=10, r=10, t=50, b=10),
        uirevision=uirevision,
        hoverlabel=dict(font_size=round(13 * scale), align="left"),
    )
    return fig


def message_figure(message: str, height: int = 320, scale: float = 1.0) -> go.Figure:
    """An empty figure that says what to do to fill it.

    It holds one invisible point: Gradio shows a figure without data as "Empty value" and would
    skip loading Plotly until the first real figure, making the first run feel slow.
    """
    fig = go.Figure(go.Scatter(x=[0], y=[0], mode="markers", marker=dict(opacity=0),
                               hoverinfo="skip", showlegend=False))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=round(15 * scale), color=BASE))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _base_layout(fig, height=height, scale=scale, uirevision="message")


# ----------------------------------------------------------------------------- candidate tree

def head_prob(rnd: RoundTrace, tree: TreeTrace, node: int) -> float | None:
    """The head's own softmax probability for the guess at `node` (None for the root)."""
    if node == 0 or not rnd.heads_topk_probs:
        return None
    return rnd.heads_topk_probs[tree.heads[node] - 1][tree.ranks[node]]


def _node_hover(tree: TreeTrace, rnd: RoundTrace, node: int, accepted: set[int]) -> str:
    """What a node is, who guessed it, and what the base model itself predicted there."""
    token = figure_text(rnd.node_texts[node])
    after = (f"base model's next token after it: '{figure_text(rnd.base_argmax_texts[node])}' "
             f"(p={rnd.base_argmax_probs[node]:.2f})")
    if node == 0:
        return (f"<b>root</b> '{token}'<br>the base model's own token from the last pass"
                f"<br>{after}")
    parent = tree.parents[node]
    p_head = head_prob(rnd, tree, node)
    p_base = rnd.node_base_probs[node]
    verdict = "accepted ✓" if node in accepted else "rejected ✗"
    lines = [
        f"<b>node {node}</b> '{token}' — {verdict}",
        f"head {tree.heads[node]}, rank {tree.ranks[node] + 1} (its top-{tree.ranks[node] + 1} guess)",
        f"head's probability: {p_head:.2f}" if p_head is not None else "",
        f"base model's probability of it: {p_base:.2f}" if p_base is not None else "",
        f"base model's own prediction here: '{figure_text(rnd.base_argmax_texts[parent])}' "
        f"(p={rnd.base_argmax_probs[parent]:.2f})",
        after,
    ]
    return "<br>".join(line for line in lines if line)


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


def tree_figure(tree: TreeTrace, rnd: RoundTrace, scale: float = 1.0) -> go.Figure:
    """The round's candidate tree: depth left to right, accepted path bold, rejected faded.

    Colour = the head that guessed the node (depth d is head d); dot size = the head's
    probability; hover = head, rank, probabilities and the base model's own prediction.
    """
    if not rnd.node_tokens:
        return message_figure("This run was traced without per-node detail.", scale=scale)
    pos = tidy_layout(tree.parents, tree.depths)
    accepted = set(rnd.accepted_nodes)
    max_depth = max(tree.depths)
    fig = go.Figure()

    rejected_edges = [(pos[tree.parents[n]], pos[n]) for n in range(1, tree.size) if n not in accepted]
    accepted_edges = [(pos[tree.parents[n]], pos[n]) for n in rnd.accepted_nodes[1:]]
    fig.add_trace(_edge_trace(rejected_edges, name="rejected branch (faded)", colour=REJECTED, width=1.2))
    fig.add_trace(_edge_trace(accepted_edges, name="accepted path", colour=ACCEPTED, width=5))

    for depth in range(max_depth + 1):
        nodes = [n for n in range(tree.size) if tree.depths[n] == depth]
        fig.add_trace(_node_trace(tree, rnd, nodes, pos, accepted, scale))

    _add_bonus_token(fig, tree, rnd, pos, scale)

    rows = leaf_count(tree.parents)
    fig.update_xaxes(
        tickvals=list(range(max_depth + 2)),
        ticktext=["root"] + [f"head {d}" for d in range(1, max_depth + 1)] + ["next root"],
        range=[-0.25, max_depth + 1.9], showgrid=False, zeroline=False, side="top",
    )
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(
        title=dict(text=f"Round {rnd.index + 1} · {len(rnd.accepted_nodes) - 1} of {tree.size - 1} guesses accepted",
                   x=0.01, y=0.99, font=dict(size=round(15 * scale))),
        legend=dict(orientation="h", yanchor="top", y=-0.02, x=0, font=dict(size=round(11 * scale))),
    )
    height = int(140 + ROW_PX * scale * max(rows, 4))
    return _base_layout(fig, height=height, scale=scale, uirevision=f"tree-{tree.name}-{tree.size}")


def _node_trace(tree: TreeTrace, rnd: RoundTrace, nodes: list[int],
                pos: dict[int, tuple[float, float]], accepted: set[int], scale: float) -> go.Scatter:
    """One depth's nodes: one legend entry per head, so the legend explains every colour."""
    depth = tree.depths[nodes[0]]
    sizes = []
    for n in nodes:
        p = head_prob(rnd, tree, n)
        sizes.append((10 + 22 * p if p is not None else 22) * scale)
    on_path = [n in accepted for n in nodes]
    return go.Scatter(
        x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes],
        mode="markers+text",
        name="root (base model)" if depth == 0 else f"head {depth} guess",
        text=[figure_text(rnd.node_texts[n], 10) for n in nodes],
        textposition="middle right",
        textfont=dict(size=round(12 * scale),
                      color=["#0F172A" if a else "#94A3B8" for a in on_path]),
        hovertext=[_node_hover(tree, rnd, n, accepted) for n in nodes],
        hoverinfo="text",
        marker=dict(
            color=head_colour(depth), size=sizes,
            opacity=[1.0 if a else 0.35 for a in on_path],
            line=dict(color=[ACCEPTED if a else "white" for a in on_path],
                      width=[3 if a else 1 for a in on_path]),
        ),
        customdata=nodes,
    )


def _add_bonus_token(fig: go.Figure, tree: TreeTrace, rnd: RoundTrace,
                     pos: dict[int, tuple[float, float]], scale: float) -> None:
    """The base model's own token after the last accepted node: free, and the next root."""
    last = rnd.accepted_nodes[-1] if rnd.accepted_nodes else 0
    x0, y0 = pos[last]
    bonus_x = max(tree.depths) + 1
    text = rnd.base_argmax_texts[last]
    fig.add_trace(_edge_trace([((x0, y0), (bonus_x, y0))], name="", colour=ACCEPTED, width=2,
                              dash="dot", legend=False))
    fig.add_trace(go.Scatter(
        x=[bonus_x], y=[y0], mode="markers+text", name="base model's bonus token",
        text=[figure_text(text, 10)], textposition="middle right",
        textfont=dict(size=round(12 * scale), color="#0F172A"),
        marker=dict(symbol="star", size=20 * scale, color=BASE, line=dict(color=ACCEPTED, width=2)),
        hovertext=[f"<b>bonus</b> '{figure_text(text)}'<br>the base model's own next token after the "
                   f"accepted path, read from the same verify pass: it becomes the next root"],
        hoverinfo="text",
    ))


# ----------------------------------------------------------------------------- attention mask

def mask_labels(tree: TreeTrace, rnd: RoundTrace) -> list[str]:
    """Axis labels, one per node: index + token, so repeated tokens stay distinct rows."""
    texts = rnd.node_texts or [""] * tree.size
    accepted = set(rnd.accepted_nodes)
    return [f"{'✓ ' if n in accepted else ''}{n} {figure_text(texts[n], 8)}" for n in range(tree.size)]


def mask_cell_values(tree: TreeTrace, rnd: RoundTrace) -> list[list[int]]:
    """0 = blocked, 1 = may attend, 2 = may attend and the row is on the accepted path."""
    accepted = set(rnd.accepted_nodes)
    return [[cell * (2 if row in accepted else 1) for cell in tree.mask[row]]
            for row in range(tree.size)]


def _mask_hover(tree: TreeTrace, tokens: list[str], row: int, col: int) -> str:
    """Why row may (or may not) attend to column. Blocked cells are most of a big mask: their
    text stays short to keep the figure light."""
    who = f"node {row} '{tokens[row]}'"
    if row == col:
        return f"{who} sees itself"
    if tree.mask[row][col]:
        why = "the root, the token every guess follows" if col == 0 else "its ancestor"
        return f"{who} may see node {col} '{tokens[col]}' because {col} is {why}"
    return f"node {row} may not see node {col}: not on its path"


def mask_figure(tree: TreeTrace, rnd: RoundTrace, scale: float = 1.0) -> go.Figure:
    """The tree attention mask: row i may attend to column j iff j is i or one of its ancestors.

    Integer coordinates with tick text, because tokens repeat and Plotly would merge equal
    category labels into one row; the y axis is reversed so row 0 is on top, like a matrix.
    """
    labels = mask_labels(tree, rnd)
    n = tree.size
    tokens = [figure_text(t) for t in rnd.node_texts] if rnd.node_texts else [""] * n
    hover = [[_mask_hover(tree, tokens, r, c) for c in range(n)] for r in range(n)]
    fig = go.Figure(go.Heatmap(
        z=mask_cell_values(tree, rnd), x=list(range(n)), y=list(range(n)),
        zmin=0, zmax=2, xgap=1, ygap=1,
        colorscale=[[0, BLOCKED], [0.33, BLOCKED], [0.33, ALLOWED], [0.67, ALLOWED],
                    [0.67, ACCEPTED], [1, ACCEPTED]],
        colorbar=dict(tickvals=[1 / 3, 1, 5 / 3], ticktext=["blocked", "may attend", "accepted row"],
                      orientation="h", thickness=12, len=0.9, x=0.5, y=-0.02, yanchor="top"),
        text=hover, hovertemplate="%{text}<extra></extra>",
    ))
    tick_size = round(max(7, min(12, 560 / n)) * scale)
    axis = dict(tickmode="array", tickvals=list(range(n)), ticktext=labels,
                tickfont=dict(size=tick_size), showgrid=False, zeroline=False)
    fig.update_xaxes(**axis, tickangle=-60, side="top", constrain="domain")
    fig.update_yaxes(**axis, autorange="reversed", scaleanchor="x", constrain="domain")
    fig.update_layout(title=dict(text=f"Attention mask · round {rnd.index + 1}", x=0.01, y=0.995,
                                 font=dict(size=round(15 * scale))))
    height = int((300 + 9 * n) * scale)
    fig = _base_layout(fig, height=height, scale=scale, uirevision=f"mask-{tree.name}-{n}")
    fig.update_layout(margin=dict(l=10, r=10, t=110, b=50))
    return fig


# ----------------------------------------------------------------------------- race

def timeline(trace: RunTrace) -> tuple[list[float], list[int]]:
    """(seconds since start, tokens produced by then) after the prefill and after every round."""
    times, counts = [0.0], [0]
    if trace.prefill_token is not None:
        times.append(trace.time_prefill)
        counts.append(1)
    for rnd in trace.rounds:
        times.append(rnd.t_end)
        counts.append(counts[-1] + rnd.accepted_length)
    return times, counts


def speedup(ar: RunTrace, medusa: RunTrace) -> float:
    """Measured wall-clock speedup: how many times faster Medusa finished the same length."""
    return ar.total_time / medusa.total_time if medusa.total_time > 0 else 0.0


def race_figure(ar: RunTrace | None, medusa: RunTrace | None, until: float | None = None,
                scale: float = 1.0) -> go.Figure:
    """Tokens produced against time for both decoders, as measured; `until` cuts a replay."""
    fig = go.Figure()
    for trace, name, colour in ((ar, "plain decoding (AR)", AR), (medusa, "Medusa", MEDUSA)):
        if trace is None:
            continue
        times, counts = timeline(trace)
        if until is not None:
            keep = [i for i, t in enumerate(times) if t <= until]
            times, counts = [times[i] for i in keep], [counts[i] for i in keep]
        fig.add_trace(go.Scatter(
            x=times, y=counts, mode="lines+markers", line=dict(color=colour, width=3, shape="hv"),
            marker=dict(size=5 * scale), name=f"{name}: {trace.forward_passes} passes",
            hovertemplate=f"{name}<br>%{{y}} tokens at %{{x:.3f}} s<extra></extra>",
        ))
    title = "Tokens produced over time (measured)"
    if ar is not None and medusa is not None and medusa.stop_reason and ar.stop_reason:
        title += f" — speedup {speedup(ar, medusa):.2f}×"
    fig.update_layout(title=dict(text=title, x=0.01),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    fig.update_xaxes(title="seconds since the run started (prefill included)", rangemode="tozero")
    fig.update_yaxes(title="tokens", rangemode="tozero")
    fig = _base_layout(fig, height=int(380 * scale), scale=scale, uirevision="race")
    fig.update_layout(margin=dict(l=10, r=10, t=80, b=10))
    return fig


# ----------------------------------------------------------------------------- stats

def accepted_length_counts(trace: RunTrace) -> Counter[int]:
    """How many rounds added 1, 2, 3, ... tokens."""
    return Counter(rnd.accepted_length for rnd in trace.rounds)


def acceptance_by_depth(trace: RunTrace) -> list[tuple[int, float, float]]:
    """Per depth d (= head d): (d, share of rounds that accepted a depth-d guess,
    share of rounds that reached depth d - 1 and then accepted one at depth d too)."""
    if trace.tree is None or not trace.rounds:
        return []
    reached = [rnd.accepted_length - 1 for rnd in trace.rounds]  # guesses accepted per round
    rows = []
    for depth in range(1, max(trace.tree.depths) + 1):
        got = sum(1 for r in reached if r >= depth)
        tried = sum(1 for r in reached if r >= depth - 1)
        rows.append((depth, got / len(reached), got / tried if tried else 0.0))
    return rows


def accepted_histogram(trace: RunTrace, scale: float = 1.0) -> go.Figure:
    """Rounds by tokens added: 1 = only the base model's token, more = heads were right."""
    counts = accepted_length_counts(trace)
    lengths = list(range(1, max(counts, default=1) + 1))
    fig = go.Figure(go.Bar(
        x=lengths, y=[counts.get(k, 0) for k in lengths], marker_color=MEDUSA,
        hovertemplate="%{y} round(s) added %{x} token(s)<extra></extra>",
    ))
    fig.update_layout(title=dict(text=f"Tokens added per pass (mean {trace.mean_accepted:.2f})", x=0.01))
    fig.update_xaxes(title="tokens added in one pass", dtick=1)
    fig.update_yaxes(title="rounds")
    return _base_layout(fig, height=int(320 * scale), scale=scale, uirevision="hist")


def head_acceptance_figure(trace: RunTrace, scale: float = 1.0) -> go.Figure:
    """Per head: how often its guess made it into the output, overall and once it had a chance."""
    rows = acceptance_by_depth(trace)
    if not rows:
        return message_figure("Run Medusa to see how often each head is right.", scale=scale)
    heads = [f"head {d}" for d, _, _ in rows]
    colours = [head_colour(d) for d, _, _ in rows]
    fig = go.Figure([
        go.Bar(x=heads, y=[a for _, a, _ in rows], name="of all rounds", marker_color=colours,
               hovertemplate="%{x}: accepted in %{y:.0%} of rounds<extra></extra>"),
        go.Bar(x=heads, y=[c for _, _, c in rows], name="when the path reached it",
               marker=dict(color=colours, pattern_shape="/"),
               hovertemplate="%{x}: accepted in %{y:.0%} of the rounds whose path got this deep"
                             "<extra></extra>"),
    ])
    fig.update_layout(title=dict(text="Acceptance rate per head (= depth)", x=0.01), barmode="group",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05])
    fig = _base_layout(fig, height=int(320 * scale), scale=scale, uirevision="heads")
    fig.update_layout(margin=dict(l=10, r=10, t=80, b=10))
    return fig


def seconds_per_pass(trace: RunTrace) -> float:
    """Mean measured time of one decoding round (draft + verify + accept), prefill excluded."""
    if not trace.rounds:
        return 0.0
    return sum(r.time_draft + r.time_verify + r.time_accept for r in trace.rounds) / len(trace.rounds)


def pass_cost_ratio(ar: RunTrace, medusa: RunTrace) -> float:
    """How many plain single-token passes one Medusa round costs, both measured."""
    ar_pass = seconds_per_pass(ar)
    return seconds_per_pass(medusa) / ar_pass if ar_pass > 0 else 0.0


def round_cost_parts(ar: RunTrace, medusa: RunTrace) -> tuple[float, float]:
    """A Medusa round's two costs in plain passes: the verify pass, and drafting + accepting.

    They add up to `pass_cost_ratio`. The first alone sets a ceiling: with free drafting and
    accepting, the speedup would be tokens per pass ÷ verify cost.
    """
    ar_pass = seconds_per_pass(ar)
    if ar_pass <= 0 or not medusa.rounds:
        return 0.0, 0.0
    per_round = len(medusa.rounds) * ar_pass
    verify = sum(r.time_verify for r in medusa.rounds) / per_round
    return verify, sum(r.time_draft + r.time_accept for r in medusa.rounds) / per_round


def speed_figure(medusa: RunTrace, ar: RunTrace | None, scale: float = 1.0) -> go.Figure:
    """Tokens per pass (what the heads buy) against the measured speedup (what you get)."""
    bars = [("tokens per pass", medusa.mean_accepted, f"{medusa.mean_accepted:.2f}", MEDUSA)]
    if ar is not None:
        cost, ratio = pass_cost_ratio(ar, medusa), speedup(ar, medusa)
        bars += [("cost of a Medusa pass<br>(in plain passes)", cost, f"{cost:.2f}×", AR),
                 ("measured speedup", ratio, f"{ratio:.2f}×", ACCEPTED)]
    names, values, labels, colours = (list(column) for column in zip(*bars))
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colours, text=labels, textposition="outside",
                           hovertemplate="%{x}: %{y:.2f}<extra></extra>"))
    fig.update_layout(title=dict(text="Tokens per pass vs. wall-clock speedup", x=0.01))
    fig.update_yaxes(rangemode="tozero", range=[0, max(values) * 1.25 + 0.1])
    return _base_layout(fig, height=int(320 * scale), scale=scale, uirevision="speed")
