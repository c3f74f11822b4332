"""One set of colours for every view, so a colour means the same thing on every figure.

A token's colour says who produced it: grey-blue for the base model (the root token and the
"bonus" token each pass ends with), one colour per depth for a drafter's guesses (Medusa's head d,
a draft model's d-th token, the d-th copied token). Each race lane has its own line colour.
Green always means "accepted". The head colours are the Okabe-Ito palette (safe for colour-blind
viewers), minus its green so that green stays free for "accepted".
"""

from __future__ import annotations

BASE = "#475569"
HEADS = ["#0072B2", "#E69F00", "#CC79A7", "#56B4E9", "#D55E00", "#8C6D31", "#6A3D9A", "#B15928"]
ACCEPTED = "#16A34A"
REJECTED = "#CBD5E1"
BLOCKED = "#F1F5F9"
ALLOWED = "#93C5FD"
AR = "#64748B"
INK = "#0F172A"  # text
INK_FADED = "#64748B"  # text of rejected nodes: quieter than INK, still readable on a crowded tree
INK_FADED_STRONG = "#475569"  # the same on a projector, which washes out pale greys
REJECTED_STRONG = "#94A3B8"
FONT = "Inter, ui-sans-serif, system-ui, sans-serif"


def head_colour(depth: int) -> str:
    """Colour of the guesses at `depth` (head `depth`); depth 0 is the base model's root token."""
    if depth <= 0:
        return BASE
    return HEADS[(depth - 1) % len(HEADS)]
