"""The page: where each component sits, and which event runs which handler.

Everything a visitor asked for is in view at 1280x800 after Run or Race: the prompt row is
compact (examples in a menu, not a table), the results' tabs follow at once, and a click on Run
or Race scrolls them to the top. The settings live in a sidebar that starts closed on narrow
screens and in projector mode.

Which event runs which handler is in events.py (one queue for the model's work, every event
private); here, only `/trace` is public, so the API page lists what the README documents.
"""

from __future__ import annotations

import gradio as gr

from decoding import available_drafters
from decoding.assets import ASSETS_DIR
from decoding.limits import PAGE_LIMITS
from decoding.prompts import example_prompts
from decoding.race import DEFAULT_RACES, MAX_RACES, default_lanes
from decoding.settings import DecodeSettings

from . import handlers, lanes, sidebar, store, training_views
from .api import trace_api
from .events import (
    MODEL_QUEUE,
    PRIVATE,
    handler_of,
    waiting_notice,
    wire_rounds,
    wire_runs,
    wire_settings,
    wire_training,
)
from .figure_style import MASK_SHARE, SIDEBAR_CLOSED_BELOW, SIDEBAR_PX, message_figure
from .gpu import ON_ZERO_GPU, gpu
from .handlers import Page
from .inputs import RACE_TREE, RACE_TREE_CHOICES
from .models import model_choices, model_note, warm_up
from .race_views import RACE_IDLE
from .text import Step, load_steps, load_text, render_steps
from .views import learn_banner, learn_figures, model_card, stats_figures, stats_text, stream_view

WAITING_EVERY = 2.0  # seconds between a page's looks at what the model is busy with
PLAY_EVERY = 1.5  # seconds per round when playing; drawing a 64-node round takes most of a second
# The embedded code model: small enough that its verify pass costs little more than a step on a
# CPU, and code is predictable, so its heads guess more tokens a pass than a chat model's.
CODE_MODEL = "stdlib"
DEFAULT_PROMPTS = ["It was a fine morning, and Elizabeth", "My dear Emma, said Mr. Knightley,"]
TRAIN_SECONDS = 30  # the Train tab's default: head 1 of SmolLM2 climbs most of the way in that time
DEFAULTS = DecodeSettings()
# Where each explainer step points: (tab id, element id, button label).
POINTERS = {
    "race": ("race", "race-panes", "Show me the race"),
    "stream": ("playground", "stream-box", "Show me the output"),
    "tree": ("playground", "tree-plot", "Show me the tree"),
    "mask": ("playground", "mask-plot", "Show me the mask"),
    "stats": ("stats", "stats-figures", "Show me the stats"),
}
# Plotly sizes a figure drawn inside a hidden tab wrongly; a resize event after every tab switch
# makes each visible figure fit its box again (Gradio's figures are responsive to resizes).
RESIZE_PLOTS = "() => { setTimeout(() => window.dispatchEvent(new Event('resize')), 80); }"
CLOSE_SIDEBAR = "document.querySelector('.sidebar.open .toggle-button')?.click();"
ON_LOAD = f"""() => {{ if (window.innerWidth < {SIDEBAR_CLOSED_BELOW}) {{ {CLOSE_SIDEBAR} }}
  return window.innerWidth; }}"""
TOGGLE_PROJECTOR = f"""(on) => {{ document.body.classList.toggle('projector', on);
  if (on) {{ {CLOSE_SIDEBAR} }} return on; }}"""
# After Run the results' tabs go to the top; on a projector, the round's tree itself.
POINT_AT = """() => {{ const el = document.getElementById('{elem}');
  if (el) {{ el.scrollIntoView({{behavior: 'smooth', block: 'center'}}); el.classList.add('pointed');
             setTimeout(() => el.classList.remove('pointed'), 2200); }} }}"""
# A click on a pass in the output stream selects its round (see rounds.jump_to_round).
# New output scrolls into view, or the marked round when one is selected; then the box is set on
# a whole line, so its top line is never cut in half (the box's height is whole lines: style.css).
FOLLOW_OUTPUT = """watch('value', () => { for (const box of element.querySelectorAll('.stream')) {
  const current = box.querySelector('.pass.current');
  if (current) current.scrollIntoView({block: 'nearest'}); else box.scrollTop = box.scrollHeight;
  const line = parseFloat(getComputedStyle(box).lineHeight);
  box.scrollTop = Math.round(box.scrollTop / line) * line; } });"""
STREAM_CLICKS = FOLLOW_OUTPUT + """
element.addEventListener('click', (e) => {
  const pass = e.target.closest('[data-round]');
  if (pass) trigger('click', {round: Number(pass.dataset.round)}); });"""


def example_rows(model_names: list[str]) -> list[tuple[str, str]]:
    """(prompt, model) pairs: every offered model's shipped examples, so picking one picks its model."""
    rows = [(prompt, name) for name in model_names for prompt in example_prompts(name)]
    return rows or [(prompt, model_names[0]) for prompt in DEFAULT_PROMPTS]


def example_label(prompt: str, model: str) -> str:
    first = prompt.strip().splitlines()[0]
    return f"{model} · {first if len(first) <= 56 else first[:55] + '…'}"


def build_demo() -> gr.Blocks:
    """Load the default model, warm it up, and lay out the page."""
    choices = model_choices()
    default = choices[0][1]
    model = store.cache.get(default)
    if not ON_ZERO_GPU:  # on ZeroGPU there is no GPU outside a request to warm up on
        warm_up(model)
    steps = load_steps()
    examples = example_rows([name for _, name in choices])

    with gr.Blocks(title="Medusa Playground", delete_cache=(3600, 3600)) as demo:
        run_state, race_state, playing = gr.State(None), gr.State(None), gr.State(False)
        current_model = gr.State(default)
        width = gr.Number(value=1280, visible=False)

        with gr.Row(elem_id="header"):
            gr.HTML(load_text("header.html"))
            projector = gr.Checkbox(label="Projector mode", value=False, scale=0, min_width=170,
                                    elem_id="projector")

        with gr.Sidebar(label="Decoding settings", open=True, width=SIDEBAR_PX):
            gr.Markdown("### Decoding settings")
            drafter = sidebar.drafter_settings(model)
            acceptance = sidebar.acceptance_settings()

        with gr.Row(elem_id="prompt-row"):
            with gr.Column(scale=3):
                prompt = gr.Textbox(value=examples[0][0], label="Prompt", lines=3, max_lines=8, elem_id="prompt")
                example_dd = gr.Dropdown([(example_label(p, m), str(i)) for i, (p, m) in enumerate(examples)],
                                         value=None, label="Examples (each picks its model)", elem_id="examples")
            with gr.Column(scale=2, min_width=300):
                model_dd = gr.Dropdown(choices, value=default, label="Model", info=model_note(),
                                       elem_id="model-dropdown")
                with gr.Row(elem_id="run-row"):
                    max_new = gr.Slider(1, PAGE_LIMITS.max_new_tokens, value=DEFAULTS.max_new_tokens, step=1,
                                        precision=0, label="Max new tokens", min_width=150, elem_id="max-new-tokens",
                                        info=f"1 to {PAGE_LIMITS.max_new_tokens} on this page: a number beyond is "
                                             "set to the nearest")
                    with gr.Column(min_width=120, scale=0, elem_id="run-buttons"):
                        run_btn = gr.Button("Run", variant="primary", elem_id="run-button", size="md")
                        race_btn = gr.Button("Race vs plain", elem_id="race-button", size="md")
                waiting_md = gr.Markdown("", elem_id="waiting")
        # The card, then the button under it: side by side, a phone squeezed the card to a word a line.
        model_md = gr.Markdown(model_card(model), elem_id="model-card")
        code = next(((p, m) for p, m in examples if m == CODE_MODEL), None)
        try_code = gr.Button(f"Where Medusa's gain is clear on a CPU: the code model ({CODE_MODEL}) →",
                             size="sm", elem_id="try-code", visible=code is not None and default != CODE_MODEL)

        # On a phone the six tabs wrap onto a second row instead of hiding four behind a "..." menu.
        with gr.Tabs(elem_id="results", overflow_behavior="wrap") as tabs:
            with gr.Tab("Playground", id="playground"):
                playground = _playground_tab()
            with gr.Tab("Race", id="race"):
                race_tab = _race_tab(tabs, available_drafters(model))
            with gr.Tab("Train", id="train"):
                train_tab = _train_tab(model)
            with gr.Tab("Stats", id="stats"):
                stats_md = gr.Markdown(stats_text(None, None), elem_id="stats-explanation")
                with gr.Column(elem_id="stats-figures"):
                    empty = stats_figures(None, None)
                    with gr.Row():
                        hist_plot = gr.Plot(empty["histogram"], show_label=False)
                        heads_plot = gr.Plot(empty["depths"], show_label=False)
                    speed_plot = gr.Plot(empty["speed"], show_label=False)
            with gr.Tab("Learn", id="learn"):
                banner_md = gr.Markdown(learn_banner(None, None))
                step_mds, learn_plots = _walkthrough(steps, tabs)
            with gr.Tab("Export", id="export"):
                gr.Markdown(load_text("export_note.md"))
                with gr.Row():
                    run_dl = gr.DownloadButton("Download this run's trace (JSON)", interactive=False,
                                               elem_id="download-trace")
                    race_dl = gr.DownloadButton("Download the races' traces (JSON)", interactive=False,
                                                elem_id="download-races")

        play_timer = gr.Timer(PLAY_EVERY, active=False)
        waiting_timer = gr.Timer(WAITING_EVERY)
        page = Page(
            request=dict(prompt=prompt, model=model_dd, max_new_tokens=max_new, **acceptance,
                         races=race_tab["races"], lanes=race_tab["lanes"], race_tree=race_tab["race_tree"],
                         **{k: v for k, v in drafter.items() if k != "tree_status"}),
            projector=projector, width=width, tabs=tabs, run_state=run_state, race_state=race_state,
            stats_md=stats_md, stats_plots=dict(histogram=hist_plot, depths=heads_plot, speed=speed_plot),
            banner_md=banner_md,
            step_mds=step_mds, run_download=run_dl, race_download=race_dl, playing=playing, play_timer=play_timer,
            waiting_timer=waiting_timer,
            steps=steps, learn_plots=learn_plots, **playground,
            **{k: v for k, v in race_tab.items() if k not in ("races", "lanes", "race_tree")},
            **{k: v for k, v in train_tab.items() if k != "train_button"},
        )
        wire_runs(page, run_btn, race_btn)
        wire_training(page, train_tab["train_button"])
        # Outside the queue: a waiting visitor's page asks every few seconds what the model is busy
        # with, and those questions must neither wait behind the model nor fill the queue.
        waiting_timer.tick(waiting_notice, None, waiting_md, queue=False, show_progress="hidden",
                                     **PRIVATE)
        wire_rounds(page)
        wire_settings(page, model_dd, current_model, model_md, example_dd, examples, drafter["tree_status"])
        if code is not None:  # one click: its example prompt and its model (the menu's change loads it)
            try_code.click(lambda: code, None, [prompt, model_dd], **PRIVATE)
        demo.load(None, None, width, js=ON_LOAD, **PRIVATE)
        tabs.change(None, js=RESIZE_PLOTS, **PRIVATE)
        projector.change(None, projector, None, js=TOGGLE_PROJECTOR, **PRIVATE)
        projector.change(handler_of(handlers.redraw, page), {run_state, race_state, page.slider, projector, width,
                                                           page.trained_state, page.use_trained},
                         [page.tree_plot, page.mask_plot, page.race_plot, *page.stats_plots.values(),
                          *page.learn_plots.values()],
                         **PRIVATE)
        gr.api(gpu(trace_api), api_name="trace", concurrency_id=MODEL_QUEUE, concurrency_limit=1)
    # Redrawing events may run side by side; model work has its own queue of one (MODEL_QUEUE).
    # The queue is bounded: a crowd waits in line (each visitor sees its place), and past
    # PAGE_LIMITS.queue_size the next visitor is told the page is busy rather than piling up.
    return demo.queue(default_concurrency_limit=8, max_size=PAGE_LIMITS.queue_size)


def _playground_tab() -> dict:
    stream_box = gr.HTML(stream_view(None), elem_id="stream-box", js_on_load=STREAM_CLICKS)
    summary = gr.Markdown(elem_id="run-summary")
    with gr.Row(elem_id="round-controls"):
        prev_btn = gr.Button("◀", scale=0, min_width=50, elem_id="prev-round")
        slider = gr.Slider(1, 2, value=1, step=1, label="Round (no rounds yet)", interactive=False,
                           scale=4, elem_id="round-slider")
        next_btn = gr.Button("▶", scale=0, min_width=50, elem_id="next-round")
        play_btn = gr.Button("▶ Play", scale=0, min_width=130, elem_id="play-rounds")
    round_md = gr.Markdown(elem_id="round-info")
    with gr.Row(elem_id="round-figures"):
        tree_plot = gr.Plot(message_figure("Press Run to see the candidate tree."), show_label=False,
                            elem_id="tree-plot", scale=round(10 * (1 - MASK_SHARE)), min_width=420)
        mask_plot = gr.Plot(message_figure("…and here, its attention mask."), show_label=False,
                            elem_id="mask-plot", scale=round(10 * MASK_SHARE), min_width=340)
    with gr.Accordion("How to read the tree and the mask", open=False, elem_id="figure-keys"):
        gr.Markdown(load_text("tree_key.md"))
        gr.Markdown(load_text("mask_key.md"))
    return dict(stream_box=stream_box, summary=summary, slider=slider, round_md=round_md,
                tree_plot=tree_plot, mask_plot=mask_plot, prev_button=prev_btn, next_button=next_btn,
                play_button=play_btn)


def _race_tab(tabs: gr.Tabs, drafters: list[str]) -> dict:
    with gr.Row(equal_height=True):
        races = gr.Slider(1, MAX_RACES, value=DEFAULT_RACES, step=1, precision=0, scale=3,
                          label="Races (which lane runs first rotates, after a warm-up)", elem_id="race-count")
        lanes_box = gr.CheckboxGroup(lanes.choices(drafters, short=True), value=default_lanes(drafters), scale=3,
                                     elem_id="race-lanes-picker",
                                     label="Lanes beside plain decoding")
        race_tree = gr.Radio([(words, name) for name, words in RACE_TREE_CHOICES.items()], value=RACE_TREE,
                             label="Medusa's tree in the race", elem_id="race-tree", scale=2)
        why = gr.Button("Why this speedup? See the Stats tab →", scale=1, elem_id="why-speedup")
    why.click(lambda: gr.Tabs(selected="stats"), None, tabs, **PRIVATE)
    race_md = gr.Markdown(elem_id="race-summary")
    race_status = gr.Markdown(RACE_IDLE, elem_id="race-status")
    race_lanes = gr.HTML(elem_id="race-panes", js_on_load=FOLLOW_OUTPUT)
    race_plot = gr.Plot(message_figure("Press Race to measure every lane."), show_label=False,
                        elem_id="race-plot")
    gr.Markdown(load_text("timing_note.md"))
    return dict(races=races, lanes=lanes_box, race_tree=race_tree, race_md=race_md, race_status=race_status,
                race_lanes=race_lanes, race_plot=race_plot)


def _train_tab(model) -> dict:
    gr.Markdown(load_text("train_note.md"), elem_id="train-note")
    with gr.Row(equal_height=True):
        heads = gr.Radio(training_views.train_choices(model), value="1", label="Heads that learn", scale=3,
                         elem_id="train-heads")
        seconds = gr.Slider(5, PAGE_LIMITS.train_seconds, value=TRAIN_SECONDS, step=5, precision=0, scale=3,
                            label="Seconds of training", elem_id="train-seconds",
                            info=f"5 to {PAGE_LIMITS.train_seconds:.0f} on this page, after the answers are read")
        button = gr.Button("Train", variant="primary", scale=0, min_width=140, elem_id="train-button")
    status = gr.Markdown(training_views.TRAIN_IDLE, elem_id="train-status")
    plot = gr.Plot(training_views.training_figure(None), show_label=False, elem_id="train-plot")
    use = gr.Checkbox(False, label="Use these heads in the Playground and the Race (train some first)",
                      interactive=False, elem_id="use-trained")
    return dict(train_heads=heads, train_seconds=seconds, train_button=button, train_status=status,
                train_plot=plot, use_trained=use, trained_state=gr.State(None))


def _walkthrough(steps: list[Step], tabs: gr.Tabs) -> tuple[list[gr.Markdown], dict[str, gr.Plot]]:
    """The Learn steps, each with a button that takes you to the live figure it explains; a step
    with a figure of its own (the measured cost of a pass) draws it beside its text."""
    step_mds, plots = [], {}
    initial = render_steps(steps, None, None)
    figures = learn_figures(None, None)
    with gr.Walkthrough(selected=0) as walkthrough:
        for i, (step, text) in enumerate(zip(steps, initial, strict=True)):
            with gr.Step(step.label, id=i):
                if step.figure:
                    with gr.Row(elem_classes="learn-with-figure"):
                        step_mds.append(gr.Markdown(text, elem_id=f"learn-step-{i + 1}"))
                        plots[step.figure] = gr.Plot(figures[step.figure], show_label=False,
                                                     elem_id=f"learn-{step.figure}")
                else:
                    step_mds.append(gr.Markdown(text, elem_id=f"learn-step-{i + 1}"))
                with gr.Row():
                    if i > 0:
                        gr.Button("◀ Back", size="sm", scale=0).click(
                            lambda i=i: gr.Walkthrough(selected=i - 1), None, walkthrough, **PRIVATE)
                    if step.shows in POINTERS:
                        tab, elem, label = POINTERS[step.shows]
                        gr.Button(label, size="sm", variant="primary", scale=0).click(
                            lambda tab=tab: gr.Tabs(selected=tab), None, tabs, **PRIVATE
                        ).then(None, js=POINT_AT.format(elem=elem), **PRIVATE)
                    if i < len(steps) - 1:
                        gr.Button("Next ▶", size="sm", scale=0).click(
                            lambda i=i: gr.Walkthrough(selected=i + 1), None, walkthrough, **PRIVATE)
    return step_mds, plots


def launch_options() -> dict:
    """Theme and styling for `launch()` (Gradio 6 takes them there). Host and port are left to
    Gradio, which reads GRADIO_SERVER_NAME and GRADIO_SERVER_PORT."""
    theme = gr.themes.Soft(primary_hue="indigo", secondary_hue="slate", neutral_hue="slate",
                           # System fonts only: the app must look right offline.
                           font=[gr.themes.Font(f) for f in ("Inter", "ui-sans-serif", "system-ui", "sans-serif")],
                           font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "SFMono-Regular", "monospace")])
    return dict(theme=theme, css=(ASSETS_DIR / "style.css").read_text(encoding="utf-8"), show_error=True)
