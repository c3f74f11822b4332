"""Which event runs which handler: the page's wiring, beside layout.py's components.

Every event that runs the model shares one concurrency id (`MODEL_QUEUE`, limit 1): visitors
queue for the model, up to `PAGE_LIMITS.queue_size` waiting (see decoding.limits). Every event
here is private (`PRIVATE`): only `/trace` is a public API endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import gradio as gr
from gradio.components import Component

from decoding.settings import DecodeSettings

from . import handlers, rounds, sidebar
from .gpu import gpu
from .handlers import Page
from .waiting import BOARD

MODEL_QUEUE = "model"
PRIVATE = dict(api_visibility="private")
DEFAULTS = DecodeSettings()
SCROLL_TO_RESULTS = """() => { document.getElementById('results')?.scrollIntoView({block: 'start'}); }"""
SCROLL_TO_TRAINING = """() => { document.getElementById('train-status')?.scrollIntoView({block: 'start'}); }"""
SCROLL_TO_ROUND = """() => { const projector = document.body.classList.contains('projector');
  document.getElementById(projector ? 'round-controls' : 'results')?.scrollIntoView({block: 'start'}); }"""


def wire_training(page: Page, button: gr.Button) -> None:
    """Train queues for the model like a run (MODEL_QUEUE): one training or run at a time."""
    button.click(gpu(streaming(handlers.train_heads, page), duration=180),
                 {page.request["model"], page.train_heads, page.train_seconds, page.projector, page.width},
                 [page.train_status, page.train_plot, page.trained_state, page.use_trained, page.waiting_timer],
                 concurrency_id=MODEL_QUEUE, concurrency_limit=1, show_progress="hidden",
                 show_progress_on=page.trained_state, **PRIVATE)
    button.click(None, js=SCROLL_TO_TRAINING, **PRIVATE)


def handler_of(fn: Callable, page: Page) -> Callable[[dict], dict]:
    """`fn(page, values)` as a one-argument event handler (Gradio passes a set's values as a dict)."""
    def handler(values: dict) -> dict:
        return fn(page, values)
    return handler


def in_session(fn: Callable, page: Page) -> Callable[[dict, gr.Request], dict]:
    """`fn(page, values, session)` as an event handler that knows which page asked (app/waiting.py)."""
    def handler(values: dict, request: gr.Request) -> dict:
        return fn(page, values, request.session_hash or "")
    return handler


def streaming(fn: Callable, page: Page) -> Callable[[dict, gr.Request], Iterator[dict]]:
    """`fn(page, values, session)` as a streaming event handler; the session tells this page's own
    model work from another visitor's (app/waiting.py)."""
    def handler(values: dict, request: gr.Request) -> Iterator[dict]:
        yield from fn(page, values, request.session_hash or "")
    return handler


def waiting_notice(request: gr.Request) -> str:
    return BOARD.notice(request.session_hash or "")


def wire_runs(page: Page, run_btn: gr.Button, race_btn: gr.Button) -> None:
    after = dict(fn=in_session(handlers.after_run, page),
                 inputs={page.run_state, page.race_state, page.projector, page.width, page.trained_state,
                         page.use_trained},
                 outputs=page.after_run(), **PRIVATE)
    # No progress animation: the run's summary and the race's status line say where they are, and
    # Gradio's ticking timers kept the browser drawing on the cores the measured runs need. Gradio
    # ticks one every animation frame for each output it marks pending, even hidden: so it marks
    # only a State, which draws nothing.
    model_work = dict(concurrency_id=MODEL_QUEUE, concurrency_limit=1, show_progress="hidden", **PRIVATE)
    run_outputs = [page.tabs, page.run_state, *page.playground(), page.waiting_timer]
    for trigger in (run_btn.click, page.request["prompt"].submit):
        trigger(gpu(streaming(handlers.run_drafter, page)), page.inputs(), run_outputs,
                show_progress_on=page.run_state, **model_work).then(**after)
    run_btn.click(None, js=SCROLL_TO_ROUND, **PRIVATE)
    race_btn.click(None, js=SCROLL_TO_RESULTS, **PRIVATE)
    race_outputs = [page.tabs, page.run_state, page.race_state, *page.race_views(), page.waiting_timer]
    race_btn.click(gpu(streaming(handlers.run_race, page), duration=300), page.inputs(), race_outputs,
                   show_progress_on=page.race_state, **model_work).then(
        handler_of(handlers.show_run, page), {page.run_state, page.projector, page.width}, page.playground(),
        **PRIVATE,
    ).then(**after)


def wire_rounds(page: Page) -> None:
    """Stepping through a finished run's rounds: slider, buttons, Play, and clicks on the stream."""
    inputs = {page.run_state, page.slider, page.projector, page.width}
    outputs = page.round_views()
    # A step takes a fraction of a second: a "processing" badge on every panel would only flicker.
    quiet = dict(show_progress="hidden", **PRIVATE)

    def show(values: dict) -> dict:
        return rounds.show_round(page, values, int(values[page.slider]) - 1)

    def previous(values: dict) -> dict:
        return rounds.step_round(page, values, -1)

    def following(values: dict) -> dict:
        return rounds.step_round(page, values, +1)

    def clicked(values: dict, event: rounds.RoundClick) -> dict:
        return rounds.jump_to_round(page, values, event)

    page.slider.release(show, inputs, outputs, **quiet)
    page.prev_button.click(previous, inputs, outputs, **quiet)
    page.next_button.click(following, inputs, outputs, **quiet)
    page.stream_box.click(clicked, inputs, outputs, **quiet)
    play_outputs = [*outputs, page.playing, page.play_timer, page.play_button]
    page.play_button.click(handler_of(rounds.toggle_play, page), inputs | {page.playing}, play_outputs, **quiet)
    page.play_timer.tick(handler_of(rounds.play_tick, page), inputs, play_outputs, **quiet)


def by_name(fn: Callable[..., dict], components: dict[str, Component], example: object = None,
             names: tuple[str, ...] | None = None) -> tuple[Callable[..., dict], list[Component]]:
    """`fn`, which returns updates by name, as a Gradio handler returning them by component, and
    the components it may update (`names`, or the names it returns for `example`)."""
    outputs = [components[name] for name in (names or fn(example))]

    def handler(*args: object) -> dict:
        return {components[name]: update for name, update in fn(*args).items()}
    return handler, outputs


def wire_settings(page: Page, model_dd: gr.Dropdown, current_model: gr.State, model_md: gr.Markdown,
                   example_dd: gr.Dropdown, examples: list[tuple[str, str]], tree_md: gr.Markdown) -> None:
    request = page.request
    controls = {**request, "tree_status": tree_md, "model": model_dd, "current_model": current_model,
                "model_card": model_md, "train_heads": page.train_heads}
    show, outputs = by_name(sidebar.acceptance_controls, controls, DEFAULTS.acceptance)
    request["acceptance"].change(show, request["acceptance"], outputs, **PRIVATE)
    switch, outputs = by_name(sidebar.switch_model, controls, names=sidebar.SWITCH_MODEL_OUTPUTS)
    model_dd.change(gpu(switch, duration=180), [model_dd, current_model, request["method"]], outputs,
                    concurrency_id=MODEL_QUEUE, concurrency_limit=1, **PRIVATE)
    show, outputs = by_name(sidebar.drafter_controls, controls, DEFAULTS.method)
    request["method"].change(show, request["method"], outputs, **PRIVATE)
    request["preset"].change(sidebar.preset_text, [model_dd, request["preset"]], request["tree_text"], **PRIVATE)
    for source in (request["tree_text"].change, request["num_heads"].change):
        source(sidebar.tree_status, [request["tree_text"], request["num_heads"], model_dd, request["preset"]],
               tree_md, **PRIVATE)

    def pick_example(index: str | None) -> tuple:
        if index is None:
            return gr.skip(), gr.skip()
        prompt, model = examples[int(index)]
        return prompt, model

    example_dd.change(pick_example, example_dd, [request["prompt"], model_dd], **PRIVATE)
