"""The page's events: read the visitor's settings by name, run the engine, hand views to Gradio.

The handlers that run the engine receive their inputs as one dict (Gradio passes a dict when
`inputs` is a set) and read it through `Page`, which names every component, and answer with a
dict of the components they change, so an update touches only what changed. The small ones
that reset or describe controls when the model or tree changes (`switch_model`, `preset_text`,
`tree_status`) take and return plain values instead, in the order their event lists in
layout.py; those that only show and hide the sidebar's controls live in sidebar.py, and the
`/trace` endpoint in api.py.

While a run streams, the token stream updates every `STREAM_EVERY` seconds but the tree and mask
only on the first round, now and then and at the end: redrawing a 64-node tree and its 64x64
mask for every round would keep the browser busy long after the run ends. "Now and then" is
every `FIGURES_EVERY` seconds, or less often where drawing the figures takes longer: the run
waits while they are built, and on a small CPU the browser drawing them takes the cores the run
needs (`BROWSER_COST` times as long as building them), so building and drawing together may
take at most `FIGURES_SHARE` of its time. A 64-node tree on a 2-core CPU is then drawn on the
first round and at the end; a 5-node tree every 2 s.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import gradio as gr
from gradio.components import Component

from decoding.errors import DecodingError
from decoding.measure import stream_on_free_cores
from decoding.medusa_modules import heads_count
from decoding.model import LoadedModel
from decoding.race import RaceResult, race
from decoding.trace import RunTrace
from decoding.training.quick_heads import TrainedHeads, train_heads_live, with_trained_heads

from . import charts, lanes, race_views, training_views, views
from .eagle_views import GuessingAccuracy
from .figure_style import Look
from .inputs import (
    RunRequest,
    decode_settings,
    race_lanes,
    race_request,
)
from .model_thread import on_model_thread
from .models import require_offered
from .store import cache, write_json
from .text import Step, render_steps
from .waiting import BOARD

# Seconds between updates of a run's token stream and summary while the model decodes: each costs
# the browser about 60 ms of a core it shares with the model (SmolLM2, the 64-node tree: 40 updates
# a run kept its main thread busy 6.2-7.3 s, 16 updates 5.1-5.5 s, and the run took 2 s less).
STREAM_EVERY = 1.0
PUSH_EVERY = 0.25  # seconds between frames of the race's replay (its runs are over: nothing is measured)
FIGURES_EVERY = 2.0  # seconds between redraws of the tree and mask while a run streams, at least
FIGURES_SHARE = 0.1  # the most of a run's time spent building and drawing its figures while it streams
# The browser's time to draw a round's tree and mask, in multiples of the server's time to build
# them: on a 2-core CPU with the 64-node mc_sim_7b_63 tree, 0.8-1.2 s of the page's main thread
# (Gradio draws each figure twice per update) against 0.18 s to build them.
BROWSER_COST = 5.0
LOG = logging.getLogger("medusa_playground")


@dataclass
class Page:
    """The components the handlers read and write, by name."""

    request: dict[str, Component]  # RunRequest field name -> the component holding it
    projector: Component
    width: Component
    tabs: Component
    run_state: Component
    race_state: Component
    stream_box: Component
    summary: Component
    slider: Component
    round_md: Component
    tree_plot: Component
    mask_plot: Component
    race_status: Component
    race_lanes: Component
    race_plot: Component
    race_md: Component
    stats_md: Component
    stats_plots: dict[str, Component]  # by figure name (views.STATS_FIGURES)
    banner_md: Component
    step_mds: list[Component]
    run_download: Component
    race_download: Component
    playing: Component
    play_timer: Component
    waiting_timer: Component  # asks what the model is busy with for another visitor (app/waiting.py)
    play_button: Component
    prev_button: Component
    next_button: Component
    steps: list[Step]
    trained_state: Component  # the visitor's own heads, once trained on the Train tab (TrainedHeads)
    use_trained: Component  # whether runs and races decode with them
    train_heads: Component  # which heads learn: "all" or a head number
    train_seconds: Component
    train_status: Component
    train_plot: Component
    learn_plots: dict[str, Component] = field(default_factory=dict)  # the walkthrough's figures, by name

    def inputs(self) -> set[Component]:
        # The states too: a refused run says whether the figures below are still the last one's.
        return {*self.request.values(), self.projector, self.width, self.run_state, self.race_state,
                self.trained_state, self.use_trained}

    def model(self, values: dict[Component, object], name: str) -> LoadedModel:
        """The model a run of this visitor's decodes with: the shared one, or a copy with the heads
        this visitor trained on it, when they asked for them."""
        model = cache.get(require_offered(name))
        trained: TrainedHeads | None = values.get(self.trained_state)
        if values.get(self.use_trained) and trained is not None and trained.model == model.name:
            return with_trained_heads(model, trained)
        return model

    def read(self, values: dict[Component, object]) -> RunRequest:
        return RunRequest.of(**{name: values[component] for name, component in self.request.items()})

    def look(self, values: dict[Component, object]) -> Look:
        return look_of(values[self.projector], values[self.width])

    def playground(self) -> list[Component]:
        return [self.stream_box, self.summary, self.slider, self.round_md, self.tree_plot, self.mask_plot]

    def race_views(self) -> list[Component]:
        return [self.race_status, self.race_lanes, self.race_plot, self.race_md]

    def round_views(self) -> list[Component]:
        return [self.slider, self.round_md, self.tree_plot, self.mask_plot, self.stream_box]

    def after_run(self) -> list[Component]:
        return [self.stats_md, *self.stats_plots.values(), self.banner_md, *self.step_mds,
                *self.learn_plots.values(),
                self.run_download, self.race_download, self.waiting_timer]


def look_of(projector: bool, width: float | None) -> Look:
    return Look(projector=bool(projector), width=int(width or 1280))


def toast_text(error: DecodingError) -> str:
    """An engine message for Gradio's toasts, which render HTML: escaped, as it may quote
    what a visitor typed (quotes are left alone, for API clients reading the same text)."""
    return html.escape(str(error), quote=False)


def refusal(error: DecodingError) -> gr.Error:
    """The error a visitor or API client is shown. A refusal is an answer, not a fault: the
    server's log gets one line for it instead of Gradio's tracebacks."""
    LOG.warning("refused: %s", error)
    return gr.Error(toast_text(error), print_exception=False)


def waiting_asks(page: Page, session: str) -> dict:
    """The page asks what the model is busy with unless the model's work is its own run or race:
    the board has nothing to tell it then, and each ask is a request to the process whose runs
    are being timed (docs/page-race.md)."""
    return {page.waiting_timer: gr.Timer(active=not BOARD.runs_for(session))}


# ----------------------------------------------------------------------------- run

def round_updates(page: Page, trace: RunTrace | None, index: int, look: Look) -> dict:
    """The slider, round numbers, tree and mask for round `index` of a run."""
    view = views.round_view(trace, index, look)
    rounds = len(trace.rounds) if trace else 0
    index = views.clamp_round(trace, index)
    # A slider needs minimum < maximum, so a one-round run still gets a (disabled) 1..2 range.
    slider = gr.Slider(minimum=1, maximum=max(rounds, 2), value=index + 1, step=1,
                       interactive=rounds > 1, label=views.round_label(trace))
    return {page.slider: slider, page.round_md: view.info, page.tree_plot: view.tree, page.mask_plot: view.mask}


def refused(page: Page, values: dict, error: DecodingError, tab: str) -> dict:
    """A run or race that cannot go on, said on its tab's status line and in a warning toast.
    Not a gr.Error: that marks every output panel "Error" and leaves the old status showing."""
    gr.Warning(toast_text(error))
    if tab == "race":
        earlier = values.get(page.race_state) is not None
        return {page.tabs: gr.Tabs(selected="race"), page.race_status: views.refusal_text(error, "raced", earlier)}
    earlier = values.get(page.run_state) is not None
    return {page.tabs: gr.Tabs(selected="playground"), page.summary: views.refusal_text(error, "run", earlier)}


@on_model_thread
def run_drafter(page: Page, values: dict, session: str = "") -> Iterator[dict]:
    """Stream a run of the chosen drafter into the Playground (or say why it cannot run); other
    visitors' pages are told a run is on (`session`: this page's)."""
    request = page.read(values)
    BOARD.post(session, f"run ({lanes.in_sentence(request.method)}, up to {request.max_new_tokens} tokens)")
    try:
        yield from _stream_run(page, values, session)
    except DecodingError as e:
        yield refused(page, values, e, "playground")
    finally:
        BOARD.clear(session)


def _stream_run(page: Page, values: dict, session: str) -> Iterator[dict]:
    pressed = time.perf_counter()
    request, look = page.read(values), page.look(values)
    model = page.model(values, request.model)
    settings = decode_settings(model, request)
    yield {page.tabs: gr.Tabs(selected="playground"), page.summary: "Starting the run…", **waiting_asks(page, session)}
    first_round_after = None
    last_text = next_figures = 0.0
    for trace in stream_on_free_cores(model, request.prompt, settings):
        now = time.perf_counter()
        update = {}
        done = views.finished(trace)
        if done or now - last_text >= STREAM_EVERY:
            last_text = now
            ended = time.time() if done else None
            update |= {page.run_state: trace, page.stream_box: views.stream_view(trace, ended_at=ended),
                       page.summary: views.run_summary(trace, first_round_after)}
        first_round = first_round_after is None and trace.rounds
        if first_round:
            first_round_after = now - pressed
        if first_round or done or (trace.rounds and now >= next_figures):
            update |= round_updates(page, trace, len(trace.rounds) - 1, look)
            drawn = time.perf_counter()
            next_figures = drawn + max(FIGURES_EVERY, (drawn - now) * (1 + BROWSER_COST) / FIGURES_SHARE)
        if update:
            yield update


def show_run(page: Page, values: dict) -> dict:
    """The Playground for the stored run, at its last round (after a race)."""
    trace = values[page.run_state]
    return {page.stream_box: views.stream_view(trace), page.summary: views.run_summary(trace) if trace else "",
            **round_updates(page, trace, len(trace.rounds) - 1 if trace else 0, page.look(values))}


# ----------------------------------------------------------------------------- race

def race_updates(page: Page, view: race_views.RaceView) -> dict:
    return {page.race_status: view.status, page.race_lanes: view.lanes, page.race_plot: view.figure,
            page.race_md: view.verdict}


@on_model_thread
def run_race(page: Page, values: dict, session: str = "") -> Iterator[dict]:
    """Plain decoding and each ticked drafter, several races in rotating order after a warm-up;
    the median race is replayed, then the Playground's drafter's run in it is shown there (or
    the Race tab says why it cannot run). Other visitors' pages are told who leads and about how
    long is left (`session`: this page's)."""
    try:
        yield from _stream_race(page, values, session)
    except DecodingError as e:
        yield refused(page, values, e, "race")
    finally:
        BOARD.clear(session)


def _stream_race(page: Page, values: dict, session: str) -> Iterator[dict]:
    request, look = race_request(page.read(values)), page.look(values)
    model = page.model(values, request.model)
    drafters = race_lanes(model, request)
    settings = decode_settings(model, request, drafters)
    last_push, last_phase = 0.0, ""
    for frame in race(model, request.prompt, settings, drafters, request.races, focus=request.method):
        BOARD.post(session, race_views.waiting_text(frame), frame.left)
        now = time.perf_counter()
        if frame.phase == last_phase and frame.phase != "done" and now - last_push < PUSH_EVERY:
            continue
        if frame.phase == "measuring":  # the status line alone: no figure is redrawn while a lane runs
            update = {page.race_status: race_views.race_status(frame)}
        else:
            update = race_updates(page, race_views.race_view(frame, look))
        if not last_phase:  # the first frame: show the Race tab, clear the last race's verdict
            update |= {page.tabs: gr.Tabs(selected="race"), **waiting_asks(page, session)}
        if frame.result is not None:
            update |= {page.race_state: frame.result, page.run_state: frame.result.shown[frame.result.focus]}
        last_push, last_phase = now, frame.phase
        yield update


# ----------------------------------------------------------------------------- train

def heads_to_train(choice: object, num_heads: int) -> tuple[int, ...]:
    """The Train tab's choice ("all", or a head number) as the heads that learn."""
    if choice == "all":
        return tuple(range(1, num_heads + 1))
    try:
        return (int(choice),)
    except (TypeError, ValueError):
        raise DecodingError(f"pick a head to train (1 to {num_heads}, or all), not {choice!r}") from None


@on_model_thread
def train_heads(page: Page, values: dict, session: str = "") -> Iterator[dict]:
    """Train the chosen heads of the page's model for the chosen seconds, the chart and status
    streaming; the heads end up in this visitor's state, never in the shared model."""
    look = page.look(values)
    try:
        model = cache.get(require_offered(values[page.request["model"]]))
        heads = heads_to_train(values[page.train_heads], heads_count(model))
        BOARD.post(session, f"training ({', '.join(f'head {k}' for k in heads)} of {model.name})")
        for update in train_heads_live(model, heads, values[page.train_seconds]):
            if isinstance(update, TrainedHeads):
                yield {page.trained_state: update,
                       page.use_trained: gr.Checkbox(interactive=True, label=use_label(update))}
            else:
                yield {page.train_status: training_views.training_status(update),
                       page.train_plot: training_views.training_figure(update, look)}
    except DecodingError as e:
        gr.Warning(toast_text(e))
        yield {page.train_status: f"⚠ {toast_text(e)}"}
    finally:
        BOARD.clear(session)


def use_label(trained: TrainedHeads) -> str:
    trace = trained.trace
    return f"Use these heads ({trace.model}, trained {trace.latest.seconds:.0f} s) in the Playground and the Race"


# ----------------------------------------------------------------------------- after a run

def _by_name(components: dict[str, Component], figures: dict[str, object]) -> dict[Component, object]:
    """Figures paired with their components by name: a figure without one fails here, loudly."""
    return {components[name]: figure for name, figure in figures.items()}


def model_accuracy(page: Page, values: dict) -> GuessingAccuracy:
    """What the run's model measured of its drafters (held-out accuracy per depth), if it is
    loaded: of the heads this visitor trained, where the run decoded with them."""
    run: RunTrace | None = values[page.run_state]
    result: RaceResult | None = values[page.race_state]
    trace = run or (result.shown[result.focus] if result else None)
    if trace is None or cache.loaded_model(trace.model) is None:
        return GuessingAccuracy.of(None)
    return GuessingAccuracy.of(page.model(values, trace.model))


def after_run(page: Page, values: dict, session: str = "") -> dict:
    """Stats, the explainer's numbers and the downloads, once a run (or race) has finished; the
    page asks what the model is busy with again, unless its next run or race has already begun
    (a visitor may press Race again while this one's after-work is on its way)."""
    run: RunTrace | None = values[page.run_state]
    result: RaceResult | None = values[page.race_state]
    look = page.look(values)
    accuracy = model_accuracy(page, values)
    run_file = write_json(f"{run.settings.method}_trace.json", run.to_dict()) if run else None
    race_file = (write_json("race_traces.json", {
        "lanes": result.lanes, "focus": result.focus,
        "races": [{lane: trace.to_dict() for lane, trace in runs.items()} for runs in result.races]})
                 if result else None)
    return {
        page.stats_md: views.stats_text(run, result),
        **_by_name(page.stats_plots, views.stats_figures(run, result, look)),
        page.banner_md: views.learn_banner(run, result),
        **dict(zip(page.step_mds, render_steps(page.steps, run, result, accuracy, values.get(page.trained_state)),
                   strict=True)),
        **_by_name(page.learn_plots, views.learn_figures(run, result, look, accuracy)),
        page.run_download: gr.DownloadButton(value=run_file, interactive=run_file is not None),
        page.race_download: gr.DownloadButton(value=race_file, interactive=race_file is not None),
        **waiting_asks(page, session),
    }


def redraw(page: Page, values: dict) -> dict:
    """Every figure again for a new look (projector mode on or off)."""
    run, result, look = values[page.run_state], values[page.race_state], page.look(values)
    view = views.round_view(run, int(values[page.slider]) - 1, look)
    return {page.tree_plot: view.tree, page.mask_plot: view.mask,
            page.race_plot: charts.race_figure(result, look=look),
            **_by_name(page.stats_plots, views.stats_figures(run, result, look)),
            **_by_name(page.learn_plots, views.learn_figures(run, result, look, model_accuracy(page, values)))}
