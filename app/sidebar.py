"""The sidebar's decoding settings: the controls of each drafter and of the acceptance rule, and
which of them are shown.

Only the chosen drafter's controls are shown, and only the acceptance rule's own numbers; the
callbacks that show and hide them (`drafter_controls`, `acceptance_controls`) return plain
tuples in the order their events list the components in layout.py. No model is run here.
"""

from __future__ import annotations

import gradio as gr
from gradio.components import Component

from decoding import available_drafters
from decoding.model import LoadedModel
from decoding.settings import MAX_EAGLE_DEPTH, MAX_EAGLE_NODES, MAX_EAGLE_TOP_K, DecodeSettings

from . import lanes
from .inputs import describe_tree, format_choices

DEFAULTS = DecodeSettings()
MAX_DRAFT_UI = 10  # the sliders' ranges; the API takes up to the engine's MAX_DRAFT_TOKENS
MAX_LOOKUP_UI = 20


def drafter_settings(model: LoadedModel) -> dict[str, Component]:
    """The drafter and its settings: the tree for Medusa, the draft length for a draft model, the
    lookup length for prompt lookup, the depth, top-k and size of EAGLE's tree (only the chosen
    drafter's are shown; see `drafter_controls`)."""
    drafters = available_drafters(model)
    method = "medusa" if "medusa" in drafters else drafters[0]
    medusa = method == "medusa"
    controls = dict(method=gr.Radio(lanes.choices(drafters), value=method, label="Drafter (who guesses ahead)",
                                    elem_id="drafter"))
    controls["preset"] = gr.Dropdown(list(model.trees), value=model.default_tree, label="Tree preset",
                                     elem_id="tree-preset", visible=medusa)
    controls["tree_text"] = gr.Code(format_choices(model.trees[model.default_tree]), language="json",
                                    label="Tree: one path of ranks per node", lines=6,
                                    max_lines=12, elem_id="tree-json", visible=medusa)
    controls["tree_status"] = gr.Markdown(describe_tree(controls["tree_text"].value, model.trees[model.default_tree],
                                                        model.num_heads, model.num_heads),
                                          elem_id="tree-status", visible=medusa)
    controls["num_heads"] = gr.Slider(1, model.num_heads, value=model.num_heads, step=1, precision=0,
                                      label="Heads to use", visible=medusa)
    controls["draft_tokens"] = gr.Slider(1, MAX_DRAFT_UI, value=DEFAULTS.draft_tokens, step=1, precision=0,
                                         label="Draft length (tokens the draft model writes a round)",
                                         visible=method == "draft-model", elem_id="draft-tokens")
    controls["lookup_tokens"] = gr.Slider(1, MAX_LOOKUP_UI, value=DEFAULTS.lookup_tokens, step=1, precision=0,
                                          label="Lookup length (most tokens copied a round)",
                                          visible=method == "prompt-lookup", elem_id="lookup-tokens")
    eagle = method == "eagle"
    controls["eagle_depth"] = gr.Slider(1, MAX_EAGLE_DEPTH, value=DEFAULTS.eagle_depth, step=1, precision=0,
                                        label="EAGLE: depth", info="levels its tree grows to", visible=eagle,
                                        elem_id="eagle-depth")
    controls["eagle_top_k"] = gr.Slider(1, MAX_EAGLE_TOP_K, value=DEFAULTS.eagle_top_k, step=1, precision=0,
                                        label="EAGLE: top-k", info="nodes expanded a level, and guesses from each",
                                        visible=eagle, elem_id="eagle-top-k")
    controls["eagle_nodes"] = gr.Slider(0, MAX_EAGLE_NODES, value=0, step=1, precision=0,
                                        label="EAGLE: guesses verified",
                                        info="a round; 0: as many as pay on this machine",
                                        visible=eagle, elem_id="eagle-nodes")
    return controls


def acceptance_settings() -> dict[str, Component]:
    """The acceptance rule and its numbers: a temperature and seed for sampling, ε and δ for
    typical acceptance (hidden until their rule is chosen; see `acceptance_controls`)."""
    return dict(
        acceptance=gr.Radio([("greedy (output unchanged)", "greedy"), ("typical acceptance", "typical"),
                             ("lossless sampling", "sample")], value=DEFAULTS.acceptance, label="Acceptance"),
        temperature=gr.Slider(0.05, 2.0, value=DEFAULTS.temperature, step=0.05, label="Temperature", visible=False),
        epsilon=gr.Slider(0.0, 0.5, value=DEFAULTS.epsilon, step=0.01, label="ε (hard threshold)", visible=False),
        delta=gr.Slider(0.0, 1.0, value=DEFAULTS.delta, step=0.05, label="δ (entropy-scaled threshold)",
                        visible=False),
        seed=gr.Number(value=-1, precision=0, label="Seed (-1 = random)", visible=False),
    )


def drafter_controls(method: str) -> tuple:
    """The tree's controls for Medusa, the draft length for a draft model, the lookup length for
    prompt lookup, the depth, top-k and size of EAGLE's tree: only the chosen drafter's are shown."""
    medusa = method == "medusa"
    return (*[gr.update(visible=medusa)] * 4, gr.Slider(visible=method == "draft-model"),
            gr.Slider(visible=method == "prompt-lookup"), *[gr.Slider(visible=method == "eagle")] * 3)


def acceptance_controls(acceptance: str) -> tuple:
    """Temperature and seed matter only when sampling; ε and δ only for typical acceptance."""
    sampling = acceptance != "greedy"
    return (gr.Slider(visible=sampling), gr.Slider(visible=acceptance == "typical"),
            gr.Slider(visible=acceptance == "typical"), gr.Number(visible=sampling))
