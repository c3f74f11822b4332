"""The Train tab's views: a training's status line and its chart, read from its `TrainingTrace`.

The chart puts each learning head's held-out top-1 against the seconds of training, beside two
references measured on the very same held-out answers at the start: the head's fresh start
(dotted) and the shipped head, trained offline for minutes on more answers (dashed).
"""

from __future__ import annotations

import plotly.graph_objects as go

from decoding.medusa_modules import heads_count
from decoding.trace import RunTrace
from decoding.training.quick_heads import TrainedHeads, TrainingTrace

from .figure_style import LAPTOP, Look, base_layout, message_figure
from .palette import head_colour
from .tokens import count

TRAIN_IDLE = ("Pick a head and press **Train**. The base model stays frozen: it reads answers it wrote "
              "earlier once, and only the small head learns.")


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def training_status(trace: TrainingTrace | None) -> str:
    """Where a training is, in a line or two (what the visitor waits for and what it bought)."""
    if trace is None:
        return TRAIN_IDLE
    heads = " and ".join(f"head {k}" for k in trace.trained_heads)
    if trace.phase == "reading":
        done = (f" {count(trace.train_answers, 'answer')} ({trace.train_positions:,} tokens) in "
                f"{trace.read_seconds:.0f} s so far." if trace.train_answers else "")
        return (f"Reading answers {trace.model} wrote earlier (recording *{trace.recording}*) through the frozen "
                f"model, once, for the states a head learns from (up to {trace.read_limit_s:.0f} s)…{done}")
    read = (f"{count(trace.train_answers, 'answer')} ({trace.train_positions:,} tokens) read in "
            f"{trace.read_seconds:.1f} s" if trace.read_now else
            f"{count(trace.train_answers, 'answer')} ({trace.train_positions:,} tokens), read by an earlier training")
    latest = trace.latest
    scores = "; ".join(
        f"head {k}: **{percent(latest.top1[k - 1])}** (fresh {percent(trace.untrained.top1[k - 1])}, "
        f"shipped {percent(trace.shipped.top1[k - 1])})" for k in trace.trained_heads)
    if trace.phase == "training":
        return (f"Training {heads}: {latest.seconds:.0f} of {trace.seconds_limit:.0f} s, "
                f"{latest.positions_seen:,} positions seen · held-out top-1 {scores} · {read}")
    return (f"**Trained {heads} in {latest.seconds:.0f} s** ({count(trace.steps, 'step')}, "
            f"{latest.positions_seen:,} positions seen, {read}). Held-out top-1 on "
            f"{count(trace.heldout_answers, 'answer')} to other questions: {scores}. Tick *Use these heads* to "
            "decode with them in the Playground and the Race.")


def training_figure(trace: TrainingTrace | None, look: Look = LAPTOP) -> go.Figure:
    """Held-out top-1 of each learning head against seconds, with its fresh and shipped references."""
    if trace is None or trace.untrained is None:
        return message_figure("Press Train to watch a head learn.", look)
    fig = go.Figure()
    end = max(trace.seconds_limit, trace.latest.seconds)
    for k in trace.trained_heads:
        colour = head_colour(k)
        checks = [trace.untrained, *trace.checks]
        fig.add_trace(go.Scatter(
            x=[c.seconds for c in checks], y=[c.top1[k - 1] for c in checks], mode="lines+markers",
            name=f"head {k}, learning", line=dict(color=colour, width=3 * look.scale),
            customdata=[c.positions_seen for c in checks],
            hovertemplate=f"head {k} after %{{x:.0f}} s (%{{customdata:,}} positions seen): "
                          "%{y:.1%} right<extra></extra>"))
        for reference, dash, words in ((trace.untrained, "dot", "fresh start"), (trace.shipped, "dash", "shipped")):
            fig.add_trace(go.Scatter(
                x=[0, end], y=[reference.top1[k - 1]] * 2, mode="lines", name=f"head {k}, {words}",
                line=dict(color=colour, dash=dash, width=1.5 * look.scale),
                hovertemplate=f"head {k}, {words}: %{{y:.1%}} right on the same answers<extra></extra>"))
    fig.update_layout(title=dict(text="Held-out top-1: how often the head's first guess is the model's token",
                                 x=0.01),
                      legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
    fig.update_xaxes(title="seconds of training", range=[0, end * 1.02])
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig = base_layout(fig, height=round(360 * look.scale), look=look, uirevision="training")
    fig.update_layout(margin=dict(l=10, r=10, t=round(60 * look.scale), b=10))
    return fig


def train_choices(model) -> list[tuple[str, str]]:
    """The Train tab's head choices for `model`: each head, then all of them."""
    return [*((f"Head {k}", str(k)) for k in range(1, heads_count(model) + 1)), ("All heads", "all")]


TRAINING_INVITATION = ("*Press **Train** on the Train tab: this step then tells what your head learnt, and how "
                       "your runs with it went.*")


def training_step_values(trained: TrainedHeads | None, run: RunTrace | None) -> dict[str, str]:
    """The Learn step "Train a head": what the visitor's training bought, measured, and the last run
    with those heads, if it used them (its drafter says where its heads came from)."""
    if trained is None or trained.trace.latest is None or trained.trace.untrained is None:
        return {"training_result": TRAINING_INVITATION}
    trace = trained.trace
    latest = trace.latest
    heads = " and ".join(f"head {k}" for k in trace.trained_heads)
    scores = "; ".join(
        f"head {k} from **{percent(trace.untrained.top1[k - 1])}** to **{percent(latest.top1[k - 1])}** "
        f"(the shipped head: {percent(trace.shipped.top1[k - 1]) if trace.shipped else '—'})"
        for k in trace.trained_heads)
    said = [f"**Your training** ({heads} of {trace.model}, {latest.seconds:.0f} s, "
            f"{count(trace.steps, 'step')} on {trace.train_positions:,} tokens of its answers): held-out top-1 "
            f"rose {scores}."]
    if run is not None and run.drafter is not None and run.drafter.origin and run.model == trace.model:
        said.append(f"Your last run decoded with them ({run.drafter.origin}): {count(len(run.tokens), 'token')} in "
                    f"{count(run.forward_passes, 'pass', 'passes')}, {run.mean_accepted:.2f} tokens per pass.")
    else:
        said.append("*Tick **Use these heads** and press **Run**: this step then tells that run too.*")
    return {"training_result": " ".join(said)}
