"""The race and the statistics, as Plotly figures. No Gradio here; the arithmetic is `decoding.stats`."""

from __future__ import annotations

from collections import Counter

import plotly.graph_objects as go

from decoding.cost_curve import is_rough
from decoding.machine_load import BUSY_CORES
from decoding.race import RaceResult
from decoding.stats import Timing, round_cost, round_end_times
from decoding.trace import CostCurve, RunTrace

from . import lanes
from .figure_style import LAPTOP, Look, base_layout, message_figure
from .palette import ACCEPTED, AR, head_colour


def timeline(trace: RunTrace) -> tuple[list[float], list[int]]:
    """(decoding seconds since the start, tokens produced by then) after the prefill and every round."""
    times, counts = [0.0], [0]
    if trace.prefill_token is not None:
        times.append(trace.time_prefill)
        counts.append(1)
    for end, rnd in zip(round_end_times(trace), trace.rounds, strict=True):
        times.append(end)
        counts.append(counts[-1] + rnd.accepted_length)
    return times, counts


def race_figure(result: RaceResult | None, until: float | None = None, look: Look = LAPTOP) -> go.Figure:
    """Tokens against time for the replayed race, one line per lane, as measured; `until` cuts the replay."""
    if result is None:
        return message_figure("Press Race to measure every lane.", look)
    fig = go.Figure()
    for lane in result.lanes:  # in lane order, not the order this race happened to run them in
        trace, name, colour = result.shown[lane], lanes.title(lane), lanes.colour(lane)
        times, counts = timeline(trace)
        if until is not None:
            keep = [i for i, t in enumerate(times) if t <= until]
            times, counts = [times[i] for i in keep], [counts[i] for i in keep]
        fig.add_trace(go.Scatter(
            x=times, y=counts, mode="lines+markers", line=dict(color=colour, width=3 * look.scale, shape="hv"),
            marker=dict(size=5 * look.scale), name=f"{name}: {trace.forward_passes} passes",
            hovertemplate=f"{name}<br>%{{y}} tokens at %{{x:.3f}} s<extra></extra>",
        ))
    # On a laptop the legend is a row of its own between the title and the plot (beside the
    # title, four lanes ran into it at 1280 px); on a phone it goes below the axis.
    legend = (dict(orientation="h", yanchor="top", y=-0.22, x=0, xanchor="left") if look.narrow
              else dict(orientation="h", yanchor="bottom", y=1.0, x=0, xanchor="left"))
    which = f"race {result.shown_index + 1} of {len(result.races)}"
    title = (f"The median race ({which})" if look.narrow
             else f"The median race, replayed ({which}: {lanes.title(result.focus)}'s median)")
    fig.update_layout(title=dict(text=title, x=0.01, y=0.98, yanchor="top"), legend=legend)
    fig.update_xaxes(title="decoding seconds since the run started (prefill included)", rangemode="tozero")
    fig.update_yaxes(title="tokens", rangemode="tozero")
    fig = base_layout(fig, height=round((440 if look.narrow else 340) * look.scale), look=look, uirevision="race")
    fig.update_layout(margin=dict(l=10, r=10, t=round((60 if look.narrow else 90) * look.scale),
                                  b=round(110 if look.narrow else 10)))
    return fig


def accepted_length_counts(trace: RunTrace) -> Counter[int]:
    """How many rounds added 1, 2, 3, ... tokens."""
    return Counter(rnd.accepted_length for rnd in trace.rounds)


def deepest_guess(trace: RunTrace) -> int:
    """How deep the run's trees reached: the run's tree, or the deepest of the trees EAGLE grew
    round by round (0 for plain decoding)."""
    trees = [trace.round_tree(rnd) for rnd in trace.rounds]
    return max((max(tree.depths) for tree in trees if tree is not None), default=0)


def acceptance_by_depth(trace: RunTrace) -> list[tuple[int, float, float]]:
    """Per depth d (= head d): (d, share of rounds that accepted a depth-d guess,
    share of rounds that reached depth d - 1 and then accepted one at depth d too)."""
    deepest = deepest_guess(trace)
    if not deepest:
        return []
    reached = [len(rnd.accepted_nodes) - 1 for rnd in trace.rounds]  # guesses accepted per round
    rows = []
    for depth in range(1, deepest + 1):
        got = sum(1 for r in reached if r >= depth)
        tried = sum(1 for r in reached if r >= depth - 1)
        rows.append((depth, got / len(reached), got / tried if tried else 0.0))
    return rows


def accepted_histogram(trace: RunTrace, look: Look = LAPTOP) -> go.Figure:
    """Rounds by tokens added: 1 = only the base model's token, more = the drafter was right."""
    counts = accepted_length_counts(trace)
    lengths = list(range(1, max(counts, default=1) + 1))
    fig = go.Figure(go.Bar(
        x=lengths, y=[counts.get(k, 0) for k in lengths], marker_color=lanes.colour(trace.settings.method),
        hovertemplate="%{y} round(s) added %{x} token(s)<extra></extra>",
    ))
    fig.update_layout(title=dict(text=f"Tokens added per pass (mean {trace.mean_accepted:.2f})", x=0.01))
    fig.update_xaxes(title="tokens added in one pass", dtick=1)
    fig.update_yaxes(title="rounds")
    return base_layout(fig, height=round(300 * look.scale), look=look, uirevision="hist")


def head_acceptance_figure(trace: RunTrace, look: Look = LAPTOP) -> go.Figure:
    """Per head (or guess depth): how often its guess made it into the output, overall and once it had a chance."""
    rows = acceptance_by_depth(trace)
    if not rows:
        return message_figure("Run a drafter to see how often its guesses are right.", look)
    method = trace.settings.method
    heads = [lanes.guess_name(method, d) for d, _, _ in rows]
    colours = [head_colour(d) for d, _, _ in rows]
    fig = go.Figure([
        go.Bar(x=heads, y=[a for _, a, _ in rows], name="of all rounds", marker_color=colours,
               hovertemplate="%{x}: accepted in %{y:.0%} of rounds<extra></extra>"),
        go.Bar(x=heads, y=[c for _, _, c in rows], name="when the path reached it",
               marker=dict(color=colours, pattern_shape="/"),
               hovertemplate="%{x}: accepted in %{y:.0%} of the rounds whose path got this deep"
                             "<extra></extra>"),
    ])
    title = f"Acceptance rate per {lanes.guess_noun(method)} (= depth)"
    fig.update_layout(title=dict(text=title, x=0.01), barmode="group",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05])
    fig = base_layout(fig, height=round(300 * look.scale), look=look, uirevision="heads")
    fig.update_layout(margin=dict(l=10, r=10, t=round(80 * look.scale), b=10))
    return fig


def speed_figure(run: RunTrace, race: RaceResult | None, look: Look = LAPTOP) -> go.Figure:
    """Tokens per pass (what the drafter buys) against the measured speedup (what you get)."""
    per_pass = Timing.of(run).tokens_per_pass
    method = run.settings.method
    bars = [("tokens per pass", per_pass, f"{per_pass:.2f}", lanes.colour(method))]
    if race is not None and method in race.lanes:
        cost, median = round_cost(race.timing("ar"), race.timing(method)), race.spread(method).median
        bars += [(f"cost of a {lanes.title(method)} round<br>(in plain steps)", cost, f"{cost:.2f}×", AR),
                 ("measured speedup<br>(median of the races)", median, f"{median:.2f}×", ACCEPTED)]
    names, values, labels, colours = (list(column) for column in zip(*bars, strict=True))
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colours, text=labels, textposition="outside",
                           hovertemplate="%{x}: %{y:.2f}<extra></extra>"))
    fig.update_layout(title=dict(text="Tokens per pass vs. wall-clock speedup", x=0.01))
    fig.update_yaxes(rangemode="tozero", range=[0, max(values) * 1.25 + 0.1])
    return base_layout(fig, height=round(300 * look.scale), look=look, uirevision="speed")


def rough_curve_reason(curve: CostCurve) -> str:
    """Why a cost curve is rough (`cost_curve.is_rough`), as a clause; empty for one measured on a
    quiet machine."""
    if not is_rough(curve):
        return ""
    if curve.other_cores is not None and curve.other_cores >= BUSY_CORES:
        return f"other programs kept {curve.other_cores:.1f} cores busy while it measured"
    return f"its repeats were {curve.spread:.0%} apart"


def cost_curve_figure(curve: CostCurve | None, tree_nodes: int | None = None, look: Look = LAPTOP) -> go.Figure:
    """What a pass over T tokens costs here, in one-token steps, as measured on the loaded model,
    between the two regimes: flat (about 1, a memory-bound GPU) and T (every token a full step).
    `tree_nodes` marks the last run's tree on the curve."""
    if curve is None or max(curve.sizes) < 2:  # no pass over several tokens timed
        return message_figure("Not measured for this run:<br>the cost of a pass over T tokens<br>appears here "
                              "once the engine<br>has timed it on this machine.", look, height=260)
    top = max(curve.sizes)
    threads = f"{curve.threads} thread{'s' if curve.threads != 1 else ''}"
    fig = go.Figure([
        go.Scatter(x=[1, top], y=[1, top], mode="lines", line=dict(color=AR, dash="dot", width=1),
                   name="each token a full step", hoverinfo="skip"),
        go.Scatter(x=[1, top], y=[1, 1], mode="lines", line=dict(color=ACCEPTED, dash="dash", width=1),
                   name="free: one step for any T", hoverinfo="skip"),
        go.Scatter(x=curve.sizes, y=curve.costs, mode="lines+markers",
                   name=f"measured: {curve.device}, {curve.dtype}, {threads}",
                   line=dict(color=lanes.colour(lanes.MEDUSA), width=3), marker=dict(size=round(8 * look.marker_scale)),
                   hovertemplate="a pass over %{x} tokens: %{y:.2f} one-token steps<extra></extra>"),
    ])
    if tree_nodes:
        cost = curve.cost(tree_nodes)
        fig.add_trace(go.Scatter(x=[tree_nodes], y=[cost], mode="markers", name=f"your tree: {cost:.2f} steps",
                                 marker=dict(color=ACCEPTED, size=round(12 * look.marker_scale), symbol="diamond"),
                                 hovertemplate="your tree: %{x} nodes ≈ %{y:.2f} steps<extra></extra>"))
    powers = [2**i for i in range(top.bit_length()) if 2**i <= top]
    # Two lines on a phone, where one was cut at its end ("costs he").
    title = "What a pass over T tokens<br>costs here" if look.narrow else "What a pass over T tokens costs here"
    if rough_curve_reason(curve):
        title += "<br><sup>measured on a busy machine: rough</sup>"
    fig.update_layout(title=dict(text=title, x=0.01),
                      legend=dict(orientation="h", yanchor="top", y=-0.28, x=0, xanchor="left"))
    fig.update_xaxes(title="tokens in one pass (T)", type="log", tickvals=curve.sizes)
    fig.update_yaxes(title="one-token steps", type="log", tickvals=powers)
    fig = base_layout(fig, height=round(360 * look.scale), look=look, uirevision="cost-curve")
    fig.update_layout(margin=dict(l=10, r=10, t=round((70 if look.narrow else 50) * look.scale),
                                  b=round(90 * look.scale)))
    return fig
