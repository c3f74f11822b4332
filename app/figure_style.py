"""What every figure shares: the screen it is drawn for (`Look`), fonts, heights, and empty figures.

A `Look` says how the page is being watched: on a laptop, on a projector (bigger type, higher
contrast), or on a phone (short labels). The page reads the browser's width once on load; the
figure builders take the `Look` and never ask Gradio.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from .palette import BASE, FONT, INK, INK_FADED, INK_FADED_STRONG, REJECTED, REJECTED_STRONG

PROJECTOR_SCALE = 1.5
NARROW_WIDTH = 700  # CSS pixels: below this the page is on a phone
# The page's layout, as far as figure sizes depend on it (app/layout.py sets these).
SIDEBAR_PX = 320
SIDEBAR_CLOSED_BELOW = 1000  # window width under which the sidebar starts closed
MASK_SHARE = 0.5  # the mask's share of the row it shares with the tree (a 64-row mask needs the room)


@dataclass(frozen=True)
class Look:
    """The screen a figure is drawn for."""

    projector: bool = False
    width: int = 1280  # the browser window's width in CSS pixels

    @property
    def scale(self) -> float:
        """Every font and marker is multiplied by this."""
        return PROJECTOR_SCALE if self.projector else 1.0

    @property
    def narrow(self) -> bool:
        return self.width < NARROW_WIDTH

    @property
    def label_chars(self) -> int:
        """How many characters of a token a crowded figure shows (the hover has all of it)."""
        return 6 if self.narrow else 10

    @property
    def faded_ink(self) -> str:
        """Text colour of rejected nodes: darker on a projector, whose contrast washes out."""
        return INK_FADED_STRONG if self.projector else INK_FADED

    @property
    def rejected_edge(self) -> str:
        return REJECTED_STRONG if self.projector else REJECTED

    @property
    def faded_opacity(self) -> float:
        return 0.55 if self.projector else 0.35

    @property
    def dragmode(self) -> str | bool:
        """Drag pans a large figure; on a phone a drag must scroll the page instead."""
        return False if self.narrow else "pan"

    @property
    def marker_scale(self) -> float:
        """Markers shrink on a phone, where the columns of a tree are close together."""
        return 0.7 if self.narrow else self.scale

    def font(self, size: float) -> int:
        return round(size * self.scale)


LAPTOP = Look()


def base_layout(fig: go.Figure, *, height: int, look: Look, uirevision: str) -> go.Figure:
    """Fonts, margins and a fixed `uirevision`, so zoom survives the updates a run streams in."""
    fig.update_layout(
        template="plotly_white",
        height=height,
        font=dict(family=FONT, size=look.font(13), color=INK),
        margin=dict(l=10, r=10, t=50, b=10),
        uirevision=uirevision,
        hoverlabel=dict(font_size=look.font(13), align="left"),
    )
    return fig


def message_figure(message: str, look: Look = LAPTOP, height: int = 320) -> go.Figure:
    """An empty figure that says what to do to fill it.

    It holds one invisible point: Gradio shows a figure without data as "Empty value" and would
    skip loading Plotly until the first real figure, making the first run feel slow.
    """
    fig = go.Figure(go.Scatter(x=[0], y=[0], mode="markers", marker=dict(opacity=0),
                               hoverinfo="skip", showlegend=False))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=look.font(15), color=BASE))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return base_layout(fig, height=round(height * look.scale), look=look, uirevision="message")
