"""Stepping through a finished run's rounds: the slider, Back and Next, a click on a pass in the
token stream, and Play. Each shows one round's figures (handlers.round_updates) and marks its
tokens in the stream; nothing here runs the model."""

from __future__ import annotations

import gradio as gr

from . import views
from .handlers import Page, round_updates


def show_round(page: Page, values: dict, index: int) -> dict:
    """Round `index` (0-based): its figures, and its tokens marked in the stream."""
    trace = values[page.run_state]
    index = views.clamp_round(trace, index)
    return {**round_updates(page, trace, index, page.look(values)),
            page.stream_box: views.stream_view(trace, current=index) if trace else gr.skip()}


def step_round(page: Page, values: dict, delta: int) -> dict:
    return show_round(page, values, int(values[page.slider]) - 1 + delta)


class RoundClick(gr.EventData):
    """A click on a pass in the token stream (layout.STREAM_CLICKS sends the round it names).
    Gradio builds one for a handler whose event argument has this type, as it does SelectData."""

    def __init__(self, target: object, data: object) -> None:
        super().__init__(target, data)
        self.round = data.get("round") if isinstance(data, dict) else None


def jump_to_round(page: Page, values: dict, event: RoundClick) -> dict:
    """A click on a pass in the stream: show that pass's round."""
    number = event.round
    if not isinstance(number, int) or number < 1:
        return {}
    return show_round(page, values, number - 1)


def toggle_play(page: Page, values: dict) -> dict:
    """Play or pause; playing from the last round starts again at round 1."""
    trace = values[page.run_state]
    start = not values[page.playing] and trace is not None and len(trace.rounds) > 1
    update = {page.playing: start, page.play_timer: gr.Timer(active=start),
              page.play_button: gr.Button(value="⏸ Pause" if start else "▶ Play")}
    if start and int(values[page.slider]) >= len(trace.rounds):
        update |= show_round(page, values, 0)
    return update


def play_tick(page: Page, values: dict) -> dict:
    """Advance one round; stop at the last (the timer and button go back to idle)."""
    trace = values[page.run_state]
    index = int(values[page.slider])  # the next round, 0-based
    if trace is None or index >= len(trace.rounds):
        return {page.playing: False, page.play_timer: gr.Timer(active=False),
                page.play_button: gr.Button(value="▶ Play")}
    return show_round(page, values, index)
