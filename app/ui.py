"""The page: layout, and the events that turn engine traces into what the visitor sees.

Every event that runs the model shares one concurrency id (`MODEL_QUEUE`, limit 1): visitors
queue for the model and none is dropped. Events that only redraw a stored trace (stepping
rounds, class mode) run freely. Handlers never look inside the model: they read `RunTrace`s.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go

from decoding import DecodeSettings, DecodingError, MedusaModel, RunTrace, Tree, generate, stream
from decoding.prompts import example_prompts

from . import figures
from .gpu import ON_ZERO_GPU, gpu
from .models import ModelCache, model_choices, warm_up
from .race import TIMING_NOTE, RaceFrame, race, race_summary
from .text import load_steps, render_steps
from .tokens import legend_html, stream_html, token_label
from .tree_layout import leaf_count

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MODEL_QUEUE = "model"
CLASS_MODE_SCALE = 1.35
PUSH_EVERY = 0.25  # seconds between page updates while a run streams (the engine's clock
# pauses while we draw, so drawing never inflates the measured times; it only slows the show)
MAX_NEW_TOKENS_UI = 256
DEFAULT_PROMPTS = ["It was a fine morning, and Elizabeth", "My dear Emma, said Mr. Knightley,"]
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
TOGGLE_CLASS_MODE = "(on) => { document.body.classList.toggle('class-mode', on); return on; }"
POINT_AT = """() => {{ const el = document.getElementById('{elem}');
  if (el) {{ el.scrollIntoView({{behavior: 'smooth', block: 'center'}}); el.classList.add('pointed');
             setTimeout(() => el.classList.remove('pointed'), 2200); }} }}"""

cache = ModelCache()


def example_rows(model_names: list[str]) -> list[list[str]]:
    """[prompt, model] rows: every listed model's shipped examples, so picking one picks its model."""
    rows = [[prompt, name] for name in model_names for prompt in example_prompts(name)]
    return rows or [[prompt, model_names[0]] for prompt in DEFAULT_PROMPTS]


def scale_for(class_mode: bool) -> float:
    return CLASS_MODE_SCALE if class_mode else 1.0


# ----------------------------------------------------------------------------- inputs

def parse_tree_json(text: str) -> list[list[int]]:
    """The tree editor's text as a choices list, or DecodingError saying where it is malformed."""
    try:
        choices = json.loads(text)
    except json.JSONDecodeError as e:
        raise DecodingError(f"the tree JSON is malformed: {e.msg} at line {e.lineno}, column {e.colno}") from e
    return choices


def tree_spec(model: MedusaModel, preset: str, text: str, num_heads: int) -> str | list[list[int]]:
    """A preset name when the editor still holds that preset, else the edited, validated list.

    Using the first n heads keeps the paths at most n deep (the engine does the same to presets).
    """
    choices = parse_tree_json(text)
    preset_choices = model.trees.get(preset)
    if choices == preset_choices:
        return preset
    return [list(path) for path in checked_tree(choices, preset_choices, model.num_heads, num_heads).paths]


def decode_settings(model: MedusaModel, max_new_tokens: float, acceptance: str, temperature: float,
                    epsilon: float, delta: float, seed: float | None, preset: str, tree_text: str,
                    num_heads: float) -> DecodeSettings:
    """The visitor's choices as engine settings, validated (DecodingError if anything is off)."""
    heads = int(num_heads)
    if not 1 <= heads <= model.num_heads:
        raise DecodingError(f"{model.name} has {model.num_heads} heads: use 1 to {model.num_heads}")
    settings = DecodeSettings(
        method="medusa", max_new_tokens=int(max_new_tokens), acceptance=acceptance,
        temperature=float(temperature), epsilon=float(epsilon), delta=float(delta),
        seed=None if seed is None or seed < 0 else int(seed),
        tree=tree_spec(model, preset, tree_text, heads), num_heads=heads,
    )
    settings.validate()
    return settings


def checked_tree(choices: object, preset_choices: list[list[int]] | None, model_heads: int,
                 num_heads: int) -> Tree:
    """The tree a run would verify: a preset is cut to the heads in use, as the engine cuts it;
    an edited tree must fit the model's heads, then it is cut the same way."""
    if choices != preset_choices:
        Tree.from_choices(choices, model_heads)
    return Tree.pruned(choices, num_heads, "custom")


def describe_tree(text: str, preset_choices: list[list[int]] | None, model_heads: int,
                  num_heads: int) -> str:
    """The tree editor's status line: what the tree is, or what is wrong with it."""
    try:
        tree = checked_tree(parse_tree_json(text), preset_choices, model_heads, num_heads)
    except DecodingError as e:
        return f"⚠ {e}"
    return f"✓ {tree.size} nodes incl. root · {len(tree.leaves)} candidate paths · {tree.max_depth} deep"


def model_card(model: MedusaModel) -> str:
    return (f"**{model.name}** · {model.num_heads} heads · {model.device} · {model.dtype}"
            f" · context {model.context_length} tokens")


# ----------------------------------------------------------------------------- playground views

def round_info(trace: RunTrace, index: int) -> str:
    """The numbers of one round, as measured."""
    rnd = trace.rounds[index]
    from_heads = sum(rnd.emitted_from_heads)
    from_base = rnd.accepted_length - from_heads
    tokens = " ".join(f"`{token_label(t, 14)}`" for t in rnd.emitted_texts)
    if trace.tree is not None and rnd.tree_size:
        accepted = len(rnd.accepted_nodes) - 1
        tried = (f"verified **{rnd.tree_size} tree nodes** ({leaf_count(trace.tree.parents)} candidate "
                 f"paths) in one pass · accepted **{accepted} guess(es)** · ")
        # The last round may be cut short by the token limit (or end at an end-of-text token).
        cut = " (cut at the end of the run)" if rnd.accepted_length < accepted + 1 else ""
    else:
        tried, cut = "one pass · ", ""
    return (f"**Round {index + 1} of {len(trace.rounds)}** · {tried}added **{rnd.accepted_length} "
            f"token(s)**{cut}: {from_heads} from heads + {from_base} from the base model: {tokens}  \n"
            f"Measured: draft {rnd.time_draft * 1e3:.1f} ms · verify {rnd.time_verify * 1e3:.1f} ms · "
            f"accept {rnd.time_accept * 1e3:.1f} ms · done {rnd.t_end:.3f} s into the run")


def round_figures(trace: RunTrace | None, index: int, scale: float) -> tuple[str, go.Figure, go.Figure]:
    """(round numbers, tree figure, mask figure) for round `index` (0-based) of a run."""
    if trace is None or trace.tree is None or not trace.rounds:
        waiting = "The candidate tree appears after the first round." if trace else "Press Run to see the candidate tree."
        return "", figures.message_figure(waiting, scale=scale), figures.message_figure(
            "…and here, its attention mask.", scale=scale)
    index = max(0, min(index, len(trace.rounds) - 1))
    rnd = trace.rounds[index]
    return (round_info(trace, index), figures.tree_figure(trace.tree, rnd, scale),
            figures.mask_figure(trace.tree, rnd, scale))


def run_summary(trace: RunTrace, first_round_after: float | None) -> str:
    tokens = len(trace.tokens)
    state = f"stopped: {trace.stop_reason}" if trace.stop_reason else "running…"
    latency = f" · first round ready {first_round_after:.2f} s after Run" if first_round_after else ""
    return (f"**{tokens} tokens in {trace.forward_passes} passes** (1 prefill + {len(trace.rounds)} rounds) · "
            f"**{trace.mean_accepted:.2f} tokens per pass** · {trace.total_time:.2f} s measured "
            f"({trace.tokens_per_second:.0f} tokens/s) · {state}{latency}")


def round_slider(trace: RunTrace | None, index: int) -> gr.Slider:
    rounds = len(trace.rounds) if trace else 0
    # A slider needs minimum < maximum, so a one-round run still gets a (disabled) 1..2 range.
    return gr.Slider(minimum=1, maximum=max(rounds, 2), value=min(index, max(rounds - 1, 0)) + 1,
                     step=1, interactive=rounds > 1, label=f"Round (of {rounds})")


def playground_frame(trace: RunTrace, scale: float, first_round_after: float | None) -> tuple:
    """Everything the Playground shows for a run, following its latest round."""
    latest = len(trace.rounds) - 1
    info, tree_fig, mask_fig = round_figures(trace, latest, scale)
    heads = trace.settings.num_heads or 0
    # data-run tells one run's output from the next (same prompt, same text) in browser tests.
    stream = (f'<div data-run="{id(trace)}">{legend_html(heads)}'
              f'{stream_html(trace, caret=not trace.stop_reason)}</div>')
    return (stream,
            run_summary(trace, first_round_after), round_slider(trace, latest), info, tree_fig, mask_fig)


# ----------------------------------------------------------------------------- stats, learn, export

def stats_views(run: RunTrace | None, ar: RunTrace | None, scale: float) -> tuple:
    if run is None or not run.rounds:
        empty = figures.message_figure("Press Run to collect statistics.", scale=scale)
        return "Press **Run** (and then **Race**) to fill this page.", empty, empty, empty
    text = (f"Medusa added **{run.mean_accepted:.2f} tokens per pass** over {len(run.rounds)} rounds. ")
    if ar is not None:
        text += (f"But a round over the {run.tree.size}-node tree cost **{figures.pass_cost_ratio(ar, run):.2f}×** "
                 f"a plain single-token pass (both measured), so the wall-clock speedup is "
                 f"**{figures.speedup(ar, run):.2f}×**, not {run.mean_accepted:.2f}×.")
        verify, draft_accept = figures.round_cost_parts(ar, run)
        if verify:  # a plain run that stopped after its first token has no pass to compare with
            text += (f" Of that round, the verify pass over the whole tree cost {verify:.2f}× and drafting "
                     f"plus accepting {draft_accept:.2f}×: even with free drafting, the ceiling is "
                     f"{run.mean_accepted:.2f} ÷ {verify:.2f} ≈ **{run.mean_accepted / verify:.2f}×**.")
    else:
        text += "Run the **Race** to measure the wall-clock speedup beside it."
    return (text, figures.accepted_histogram(run, scale), figures.head_acceptance_figure(run, scale),
            figures.speed_figure(run, ar, scale))


def write_json(name: str, data: dict) -> str:
    """A file for a download button, in the temp directory Gradio may serve from."""
    folder = Path(tempfile.mkdtemp(prefix="medusa-trace-"))
    path = folder / name
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return str(path)


def downloads(run: RunTrace | None, ar: RunTrace | None) -> tuple:
    run_file = write_json("medusa_trace.json", run.to_dict()) if run else None
    race_file = (write_json("race_traces.json", {"ar": ar.to_dict(), "medusa": run.to_dict()})
                 if run and ar else None)
    return (gr.DownloadButton(value=run_file, interactive=run_file is not None),
            gr.DownloadButton(value=race_file, interactive=race_file is not None))


def learn_banner(run: RunTrace | None, ar: RunTrace | None) -> str:
    if run is None:
        return "Press **Run** (and then **Race**): the numbers in these steps come from your own run."
    race_note = "" if ar else " Run the **Race** to fill in the timing numbers too."
    return f"The numbers below come from your last run: *{run.prompt[:60]}* on {run.model}.{race_note}"


# ----------------------------------------------------------------------------- race views

def race_pane(title: str, trace: RunTrace | None, clock: float) -> str:
    if trace is None:
        return f'<div class="pane"><div class="pane-head">{title}</div><div class="stream stream-empty">waiting…</div></div>'
    times, counts = figures.timeline(trace)
    passes = sum(1 for t in times[1:] if t <= clock)  # the first point is the start, not a pass
    done = clock >= trace.total_time
    finished = f" · done in {trace.total_time:.2f} s" if done else ""
    return (f'<div class="pane"><div class="pane-head">{title}<span>{counts[passes]} tokens · '
            f"{passes} passes{finished}</span></div>"
            f"{stream_html(trace, until=clock, show_prompt=False, caret=not done)}</div>")


RACE_STATUS = {
    "warm-up": "Warming up both decoders (a short run of each)…",
    "measuring AR": "Measuring plain decoding alone…",
    "measuring Medusa": "Measuring Medusa alone…",
    "replaying": "Replaying both measured runs side by side, in real time, on one clock.",
    "done": "✓ Done. Both runs measured alone, after a warm-up.",
}


def race_frame_views(frame: RaceFrame, scale: float) -> tuple:
    summary = race_summary(frame.ar, frame.medusa) if frame.phase == "done" else ""
    return (RACE_STATUS[frame.phase], race_pane("Plain decoding (one token per pass)", frame.ar, frame.clock),
            race_pane("Medusa", frame.medusa, frame.clock),
            figures.race_figure(frame.ar, frame.medusa, until=frame.clock, scale=scale), summary)


# ----------------------------------------------------------------------------- the page

@dataclass
class Controls:
    """The settings every model event reads, in the order the handlers take them."""

    prompt: gr.Textbox
    model: gr.Dropdown
    max_new_tokens: gr.Slider
    acceptance: gr.Radio
    temperature: gr.Slider
    epsilon: gr.Slider
    delta: gr.Slider
    seed: gr.Number
    preset: gr.Dropdown
    tree_json: gr.Code
    num_heads: gr.Slider

    def as_list(self) -> list[gr.components.Component]:
        return [self.prompt, self.model, self.max_new_tokens, self.acceptance, self.temperature,
                self.epsilon, self.delta, self.seed, self.preset, self.tree_json, self.num_heads]


def _load(name: str) -> MedusaModel:
    try:
        return cache.get(name)
    except DecodingError as e:
        raise gr.Error(str(e)) from e


def _settings(model: MedusaModel, *values) -> DecodeSettings:
    try:
        return decode_settings(model, *values)
    except DecodingError as e:
        raise gr.Error(str(e)) from e


def run_medusa(prompt, model_name, max_new_tokens, acceptance, temperature, epsilon, delta, seed,
               preset, tree_text, num_heads, class_mode):
    """Stream a Medusa run into the Playground, one page update per round (or per PUSH_EVERY)."""
    pressed = time.perf_counter()
    model = _load(model_name)
    settings = _settings(model, max_new_tokens, acceptance, temperature, epsilon, delta, seed,
                         preset, tree_text, num_heads)
    scale = scale_for(class_mode)
    first_round_after = None
    last_push = 0.0
    tab = gr.Tabs(selected="playground")  # shown with the first update, then left to the visitor
    try:
        for trace in stream(model, prompt, settings):
            now = time.perf_counter()
            first_round = first_round_after is None and trace.rounds
            if first_round:
                first_round_after = now - pressed
            if first_round or trace.stop_reason or now - last_push >= PUSH_EVERY:
                last_push = now
                yield (tab, trace, None, *playground_frame(trace, scale, first_round_after))
                tab = gr.skip()
    except DecodingError as e:
        raise gr.Error(str(e)) from e


def run_race(prompt, model_name, max_new_tokens, acceptance, temperature, epsilon, delta, seed,
             preset, tree_text, num_heads, class_mode):
    """Measure AR then Medusa alone and replay both; ends with the Medusa run as the current run."""
    model = _load(model_name)
    settings = _settings(model, max_new_tokens, acceptance, temperature, epsilon, delta, seed,
                         preset, tree_text, num_heads)
    scale = scale_for(class_mode)
    last_push, last_phase = 0.0, ""
    tab = gr.Tabs(selected="race")
    try:
        for frame in race(model, prompt, settings):
            now = time.perf_counter()
            if frame.phase != last_phase or frame.phase == "done" or now - last_push >= PUSH_EVERY:
                last_push, last_phase = now, frame.phase
                yield (tab, frame.medusa, frame.ar, *race_frame_views(frame, scale))
                tab = gr.skip()
    except DecodingError as e:
        raise gr.Error(str(e)) from e


def trace_api(prompt: str, max_new_tokens: int = 32, acceptance: str = "greedy", tree: str = "default",
              num_heads: int = 0, model: str = "", temperature: float = 1.0, seed: int = -1) -> dict:
    """Run Medusa on `prompt` and return the whole trace as JSON (the schema of decoding.trace).

    `tree` is a preset name, "default", or a choices list as JSON; `num_heads` 0 uses all heads;
    `model` "" uses the default model; `seed` -1 draws a fresh one.
    """
    mm = _load(model or model_choices()[0][1])
    try:
        spec = tree if tree == "default" or tree in mm.trees else parse_tree_json(tree)
        settings = DecodeSettings(max_new_tokens=int(max_new_tokens), acceptance=acceptance,
                                  temperature=float(temperature), tree=spec,
                                  num_heads=int(num_heads) or None, seed=None if seed < 0 else int(seed))
        return generate(mm, prompt, settings).to_dict()
    except DecodingError as e:
        raise gr.Error(str(e)) from e


# ----------------------------------------------------------------------------- small handlers

def format_choices(choices: list[list[int]]) -> str:
    """One path per line: easier to read and edit than one long line."""
    return "[\n" + ",\n".join(f"  {json.dumps(path)}" for path in choices) + "\n]"


def acceptance_controls(acceptance: str) -> tuple:
    """Temperature and seed matter only when sampling; ε and δ only for typical acceptance."""
    sampling = acceptance != "greedy"
    return (gr.Slider(visible=sampling), gr.Slider(visible=acceptance == "typical"),
            gr.Slider(visible=acceptance == "typical"), gr.Number(visible=sampling))


def switch_model(name: str, previous: str) -> tuple:
    """Load the chosen model; if it cannot load, say why and go back to the previous one."""
    try:
        model = cache.get(name)
    except DecodingError as e:
        gr.Warning(str(e))
        return (previous, previous, gr.skip(), gr.skip(), gr.skip(), gr.skip())
    return (gr.skip(), name, model_card(model),
            gr.Slider(maximum=model.num_heads, value=model.num_heads),
            gr.Dropdown(choices=list(model.trees), value=model.default_tree),
            format_choices(model.trees[model.default_tree]))


def preset_text(model_name: str, preset: str) -> str:
    return format_choices(cache.get(model_name).trees[preset])


def tree_status(text: str, num_heads: float, model_name: str, preset: str) -> str:
    model = cache.get(model_name)
    return describe_tree(text, model.trees.get(preset), model.num_heads, int(num_heads))


def show_round(trace: RunTrace | None, number: float, class_mode: bool) -> tuple:
    return round_figures(trace, int(number) - 1, scale_for(class_mode))


def step_round(trace: RunTrace | None, number: float, delta: int, class_mode: bool) -> tuple:
    rounds = len(trace.rounds) if trace else 0
    index = max(0, min(int(number) - 1 + delta, rounds - 1))
    return (gr.Slider(value=index + 1), *round_figures(trace, index, scale_for(class_mode)))


def toggle_play(playing: bool, trace: RunTrace | None, number: float, class_mode: bool) -> tuple:
    """Play or pause; playing from the last round starts again at round 1."""
    start = not playing and trace is not None and len(trace.rounds) > 1
    controls = (start, gr.Timer(active=start), gr.Button(value="⏸ Pause" if start else "▶ Play"))
    if start and int(number) >= len(trace.rounds):
        return (*controls, gr.Slider(value=1), *round_figures(trace, 0, scale_for(class_mode)))
    return (*controls, gr.skip(), gr.skip(), gr.skip(), gr.skip())


def play_tick(trace: RunTrace | None, number: float, class_mode: bool) -> tuple:
    """Advance one round; stop at the last."""
    rounds = len(trace.rounds) if trace else 0
    index = int(number)  # the next round, 0-based
    if index >= rounds:
        return (gr.skip(), gr.skip(), gr.skip(), gr.skip(), False, gr.Timer(active=False),
                gr.Button(value="▶ Play"))
    return (gr.Slider(value=index + 1), *round_figures(trace, index, scale_for(class_mode)),
            True, gr.skip(), gr.skip())


def after_run(run: RunTrace | None, ar: RunTrace | None, class_mode: bool, steps: list) -> tuple:
    """Stats, the explainer's numbers and the downloads, once a run (or race) has finished."""
    return (*stats_views(run, ar, scale_for(class_mode)), learn_banner(run, ar),
            *render_steps(steps, run, ar), *downloads(run, ar))


def redraw(run: RunTrace | None, ar: RunTrace | None, number: float, class_mode: bool) -> tuple:
    """Every figure again at the new text size (class mode on or off)."""
    scale = scale_for(class_mode)
    race_fig = (figures.race_figure(ar, run, scale=scale) if ar is not None
                else figures.message_figure("Press Race to measure both decoders.", scale=scale))
    return (*round_figures(run, int(number) - 1, scale), race_fig, *stats_views(run, ar, scale)[1:])


# ----------------------------------------------------------------------------- the page

HEADER = """<div id="title"><h1>Medusa Playground</h1>
<p>Watch a language model write <b>several tokens per forward pass</b>: Medusa's heads guess the
next few tokens, one pass of the model checks all the guesses at once as a tree, and every
accepted guess is a pass saved. Everything below is measured live on this machine.</p></div>"""

TREE_KEY = """**Reading the tree:** depth runs left to right, one column per head; colour = which
head guessed the token, dot size = how sure the head was, green path = accepted, faded =
rejected, ★ = the base model's own next token (free, from the same pass). Hover any node for its
head, rank, probabilities and what the base model itself predicted there. The camera icon of a
figure saves it as PNG."""

MASK_KEY = """**Reading the mask.** All tree nodes go through the model in one pass. Row *i* is what
node *i* may look at: column *j* is lit only if node *j* is *i* itself or one of its ancestors
(column 0, the root, is lit for everyone). Siblings and cousins stay dark, so each path is
computed exactly as if it were alone.

Each node also gets the position of its depth, so the model sees every path as ordinary text.

**Green rows** are the accepted path of this round. Hover a cell to see why it is lit or dark."""

EXPORT_NOTE = """The trace is everything the engine recorded: settings, every round's tree, the
heads' guesses and probabilities, the base model's predictions, the accepted path and the time of
each phase. The same JSON comes from the API endpoint `/trace` (see "Use via API" at the foot of
the page) and from `python -m decoding ... --json`. Figures save as PNG from the camera icon in
their toolbar."""


def build_demo() -> gr.Blocks:
    """Load the default model, warm it up, and lay out the page."""
    choices = model_choices()
    default = choices[0][1]
    model = cache.get(default)
    if not ON_ZERO_GPU:  # on ZeroGPU there is no GPU outside a request to warm up on
        warm_up(model)
    steps = load_steps()
    examples = example_rows([name for _, name in choices])
    default_heads = model.num_heads

    with gr.Blocks(title="Medusa Playground") as demo:
        run_state = gr.State(None)
        ar_state = gr.State(None)
        playing = gr.State(False)
        current_model = gr.State(default)

        with gr.Row(elem_id="header"):
            gr.HTML(HEADER)
            class_mode = gr.Checkbox(label="Class mode (large text)", value=False, scale=0,
                                     min_width=210, elem_id="class-mode")

        with gr.Sidebar(label="Decoding settings", open=True, width=330):
            gr.Markdown("### Decoding settings")
            model_dd = gr.Dropdown(choices, value=default, label="Model", elem_id="model-dropdown")
            model_md = gr.Markdown(model_card(model), elem_id="model-card")
            acceptance = gr.Radio([("greedy (output unchanged)", "greedy"), ("typical acceptance", "typical"),
                                   ("lossless sampling", "sample")], value="greedy", label="Acceptance")
            temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature", visible=False)
            epsilon = gr.Slider(0.0, 0.5, value=0.09, step=0.01, label="ε (hard threshold)", visible=False)
            delta = gr.Slider(0.0, 1.0, value=0.3, step=0.05, label="δ (entropy-scaled threshold)", visible=False)
            seed = gr.Number(value=-1, precision=0, label="Seed (-1 = random)", visible=False)
            preset = gr.Dropdown(list(model.trees), value=model.default_tree, label="Tree preset")
            tree_json = gr.Code(format_choices(model.trees[model.default_tree]), language="json",
                                label="Tree (Medusa choices: one path of ranks per node)", lines=6, max_lines=12,
                                elem_id="tree-json")
            tree_md = gr.Markdown(describe_tree(tree_json.value, model.trees[model.default_tree],
                                                 model.num_heads, default_heads), elem_id="tree-status")
            num_heads = gr.Slider(1, model.num_heads, value=default_heads, step=1, precision=0,
                                  label="Heads to use")

        with gr.Row(equal_height=True):
            prompt = gr.Textbox(value=examples[0][0], label="Prompt", lines=4, scale=5, elem_id="prompt")
            with gr.Column(scale=2, min_width=260):
                max_new = gr.Slider(1, MAX_NEW_TOKENS_UI, value=64, step=1, precision=0, label="Max new tokens")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="run-button")
                    race_btn = gr.Button("Race vs plain", elem_id="race-button")
        gr.Examples(examples, inputs=[prompt, model_dd], label="Example prompts (each with its model)")
        controls = Controls(prompt, model_dd, max_new, acceptance, temperature, epsilon, delta, seed,
                            preset, tree_json, num_heads)

        with gr.Tabs() as tabs:
            with gr.Tab("Playground", id="playground"):
                stream_box = gr.HTML(stream_html(None), elem_id="stream-box")
                summary_md = gr.Markdown(elem_id="run-summary")
                with gr.Row(elem_id="round-controls"):
                    prev_btn = gr.Button("◀ Previous", scale=0, min_width=120, elem_id="prev-round")
                    slider = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False,
                                       scale=4, elem_id="round-slider")
                    next_btn = gr.Button("Next ▶", scale=0, min_width=120, elem_id="next-round")
                    play_btn = gr.Button("▶ Play", scale=0, min_width=120, elem_id="play-rounds")
                round_md = gr.Markdown(elem_id="round-info")
                info, tree_fig, mask_fig = round_figures(None, 0, 1.0)
                # The tree gets the full width (a 64-node tree has 42 leaves and 5 columns of
                # labels); the square mask sits beside its key.
                tree_plot = gr.Plot(tree_fig, show_label=False, elem_id="tree-plot")
                gr.Markdown(TREE_KEY)
                with gr.Row(equal_height=False):
                    mask_plot = gr.Plot(mask_fig, show_label=False, elem_id="mask-plot", scale=3)
                    gr.Markdown(MASK_KEY, elem_id="mask-key")

            with gr.Tab("Race", id="race"):
                gr.Markdown(TIMING_NOTE)
                race_status = gr.Markdown("Press **Race vs plain** to measure both decoders on this prompt.")
                with gr.Row(elem_id="race-panes", equal_height=True):
                    ar_pane = gr.HTML(race_pane("Plain decoding (one token per pass)", None, 0))
                    medusa_pane = gr.HTML(race_pane("Medusa", None, 0))
                race_plot = gr.Plot(figures.message_figure("Press Race to measure both decoders."),
                                    show_label=False, elem_id="race-plot")
                race_md = gr.Markdown(elem_id="race-summary")

            with gr.Tab("Stats", id="stats"):
                stats = stats_views(None, None, 1.0)
                stats_md = gr.Markdown(stats[0])
                with gr.Column(elem_id="stats-figures"):
                    with gr.Row():
                        hist_plot = gr.Plot(stats[1], show_label=False)
                        heads_plot = gr.Plot(stats[2], show_label=False)
                    speed_plot = gr.Plot(stats[3], show_label=False)

            with gr.Tab("Learn", id="learn"):
                banner_md = gr.Markdown(learn_banner(None, None))
                step_mds = _walkthrough(steps, tabs)

            with gr.Tab("Export", id="export"):
                gr.Markdown(EXPORT_NOTE)
                with gr.Row():
                    run_dl = gr.DownloadButton("Download this run's trace (JSON)", interactive=False,
                                               elem_id="download-trace")
                    race_dl = gr.DownloadButton("Download the race's two traces (JSON)", interactive=False)

        timer = gr.Timer(0.9, active=False)
        model_inputs = controls.as_list() + [class_mode]
        playground = [stream_box, summary_md, slider, round_md, tree_plot, mask_plot]
        after = [stats_md, hist_plot, heads_plot, speed_plot, banner_md, *step_mds, run_dl, race_dl]
        refresh = dict(fn=lambda run, ar, cm: after_run(run, ar, cm, steps),
                       inputs=[run_state, ar_state, class_mode], outputs=after)
        model_work = dict(concurrency_id=MODEL_QUEUE, concurrency_limit=1)

        for trigger in (run_btn.click, prompt.submit):
            trigger(
                gpu(run_medusa), model_inputs, [tabs, run_state, ar_state, *playground],
                show_progress="minimal", **model_work,
            ).then(**refresh)
        race_btn.click(
            gpu(run_race, duration=120), model_inputs,
            [tabs, run_state, ar_state, race_status, ar_pane, medusa_pane, race_plot, race_md],
            show_progress="minimal", **model_work,
        ).then(
            lambda run, cm: playground_frame(run, scale_for(cm), None), [run_state, class_mode], playground,
        ).then(**refresh)

        round_view = [round_md, tree_plot, mask_plot]
        slider.release(show_round, [run_state, slider, class_mode], round_view)
        prev_btn.click(lambda t, n, c: step_round(t, n, -1, c), [run_state, slider, class_mode], [slider, *round_view])
        next_btn.click(lambda t, n, c: step_round(t, n, +1, c), [run_state, slider, class_mode], [slider, *round_view])
        play_btn.click(toggle_play, [playing, run_state, slider, class_mode],
                       [playing, timer, play_btn, slider, *round_view])
        timer.tick(play_tick, [run_state, slider, class_mode], [slider, *round_view, playing, timer, play_btn])

        acceptance.change(acceptance_controls, acceptance, [temperature, epsilon, delta, seed])
        model_dd.change(gpu(switch_model, duration=180), [model_dd, current_model],
                        [model_dd, current_model, model_md, num_heads, preset, tree_json], **model_work)
        preset.change(preset_text, [model_dd, preset], tree_json)
        for source in (tree_json.change, num_heads.change):
            source(tree_status, [tree_json, num_heads, model_dd, preset], tree_md)
        tabs.change(None, None, None, js=RESIZE_PLOTS)
        class_mode.change(None, class_mode, None, js=TOGGLE_CLASS_MODE)
        class_mode.change(redraw, [run_state, ar_state, slider, class_mode],
                          [*round_view, race_plot, hist_plot, heads_plot, speed_plot])

        gr.api(gpu(trace_api), api_name="trace", **model_work)
    # Redrawing events may run side by side; model work has its own queue of one (MODEL_QUEUE).
    return demo.queue(default_concurrency_limit=8)


def _walkthrough(steps: list, tabs: gr.Tabs) -> list[gr.Markdown]:
    """The Learn steps, each with a button that takes you to the live figure it explains."""
    step_mds = []
    initial = render_steps(steps, None, None)
    with gr.Walkthrough(selected=0) as walkthrough:
        for i, (step, text) in enumerate(zip(steps, initial)):
            with gr.Step(step.label, id=i):
                step_mds.append(gr.Markdown(text, elem_id=f"learn-step-{i + 1}"))
                with gr.Row():
                    if i > 0:
                        gr.Button("◀ Back", size="sm", scale=0).click(
                            lambda i=i: gr.Walkthrough(selected=i - 1), None, walkthrough)
                    if step.shows in POINTERS:
                        tab, elem, label = POINTERS[step.shows]
                        gr.Button(label, size="sm", variant="primary", scale=0).click(
                            lambda tab=tab: gr.Tabs(selected=tab), None, tabs
                        ).then(None, js=POINT_AT.format(elem=elem))
                    if i < len(steps) - 1:
                        gr.Button("Next ▶", size="sm", scale=0).click(
                            lambda i=i: gr.Walkthrough(selected=i + 1), None, walkthrough)
    return step_mds


def launch_options() -> dict:
    """Theme and styling for `launch()` (Gradio 6 takes them there). Host and port are left to
    Gradio, which reads GRADIO_SERVER_NAME and GRADIO_SERVER_PORT."""
    theme = gr.themes.Soft(primary_hue="indigo", secondary_hue="slate", neutral_hue="slate",
                           # System fonts only: the app must look right offline.
                           font=[gr.themes.Font(f) for f in ("Inter", "ui-sans-serif", "system-ui", "sans-serif")],
                           font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "SFMono-Regular", "monospace")])
    return dict(theme=theme, css=(ASSETS / "style.css").read_text(encoding="utf-8"), show_error=True)
