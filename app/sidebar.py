"""The sidebar's decoding settings: the controls of each drafter and of the acceptance rule, and
which of them are shown.

Each drafter's controls come from the settings it declares (decoding.drafters); only the chosen
drafter's are shown, and only the acceptance rule's own numbers. The callbacks that show and hide
them (`drafter_controls`, `acceptance_controls`) name the controls they update. Then what the
settings themselves do: switching the model, a preset's tree text, the tree editor's status line.
No model is run here.
"""

from __future__ import annotations

import gradio as gr
from gradio.components import Component

from decoding import available_drafters
from decoding.drafters import DRAFTERS, Drafter, setting_high
from decoding.drafters.medusa_heads import CHOSEN_TREES, named_tree, tree_names
from decoding.errors import DecodingError
from decoding.medusa_modules import heads_count
from decoding.model import LoadedModel
from decoding.race import default_lanes
from decoding.settings import COMMON_SETTINGS, DecodeSettings, Setting

from . import lanes, training_views, views
from .handlers import refusal, toast_text
from .inputs import PAGE_UNSET, PLAYGROUND_TREE, describe_tree, format_choices, option_value
from .models import require_offered
from .store import cache

DEFAULTS = DecodeSettings()
TREE_CONTROLS = ("preset", "tree_text", "tree_status")  # shown for a drafter that takes a tree
SAMPLING_SETTINGS = ("temperature", "top_p")  # read by typical acceptance and sampling
TYPICAL_SETTINGS = ("epsilon", "delta")  # read by typical acceptance alone


def setting_slider(setting: Setting, model: LoadedModel, visible: bool) -> gr.Slider:
    """A drafter setting's slider, from its declaration: its limits (the page's own where it
    stops sooner), its default, and 0 for "unset" where unset is allowed."""
    high = min(setting_high(model, setting), setting.page_high or setting.high)
    low, value = (PAGE_UNSET, PAGE_UNSET) if setting.unset else (setting.low, setting.default)
    info = f"{PAGE_UNSET}: {setting.unset}" if setting.unset else None
    return gr.Slider(low, high, value=value, step=1, precision=0, label=setting.title,
                     info=info, visible=visible, elem_id=setting.name.replace("_", "-"))


def drafter_settings(model: LoadedModel) -> dict[str, Component]:
    """The drafter and its settings: the tree for a drafter that takes one (Medusa), and a slider
    for each setting each drafter declares (only the chosen drafter's are shown; see
    `drafter_controls`)."""
    drafters = available_drafters(model)
    method = DEFAULTS.method if DEFAULTS.method in drafters else drafters[0]
    takes_tree = DRAFTERS[method].takes_tree
    controls = dict(method=gr.Radio(lanes.choices(drafters), value=method, label="Drafter (who guesses ahead)",
                                    elem_id="drafter"))
    trees = tree_controls(model)
    controls["preset"] = gr.Dropdown(**trees["preset"], label="Tree preset", elem_id="tree-preset",
                                     visible=takes_tree)
    controls["tree_text"] = gr.Code(trees["tree_text"], language="json", label="Tree: one path of ranks per node",
                                    lines=6, max_lines=12, elem_id="tree-json", visible=takes_tree)
    controls["tree_status"] = gr.Markdown(trees["tree_status"], elem_id="tree-status", visible=takes_tree)
    for name, cls in DRAFTERS.items():
        for setting in cls.settings:
            controls[setting.name] = setting_slider(setting, model, visible=name == method)
    return controls


def tree_menu(model: LoadedModel) -> list[tuple[str, str]]:
    """(label, name) pairs for the tree preset menu: the trees chosen on this machine, named for
    what they are and what they came to here, then the model's presets. The chosen trees' names
    are the same for every model, so the menu's value never names a tree the next model lacks."""
    if heads_count(model) == 0:
        return []

    def label(name: str) -> str:
        if name not in CHOSEN_TREES:
            return name
        if model.cost_curve is None:  # not timed yet (on ZeroGPU, until a run): no size to tell
            return CHOSEN_TREES[name]
        tree = named_tree(model, name)
        return f"{CHOSEN_TREES[name]}: {tree.size - 1} guesses, {tree.max_depth} deep"
    return [(label(name), name) for name in tree_names(model)]


def tree_controls(model: LoadedModel, preset: str = PLAYGROUND_TREE) -> dict[str, object]:
    """The tree menu, the editor's text and its status line for `preset` on `model`, by name."""
    menu = tree_menu(model)
    if not menu:
        return {"preset": dict(choices=[], value=None), "tree_text": "", "tree_status": ""}
    choices = named_tree(model, preset).choices
    text = format_choices(choices)
    return {"preset": dict(choices=menu, value=preset), "tree_text": text,
            "tree_status": describe_tree(model, preset, text, None)}


def common_slider(name: str) -> gr.Slider:
    """A slider for one of the settings every run has, from its declaration: its page range and
    step, its label, and DecodeSettings' default (hidden until its acceptance rule is chosen)."""
    setting = COMMON_SETTINGS[name]
    low = setting.low if setting.page_low is None else setting.page_low
    high = setting.high if setting.page_high is None else setting.page_high
    return gr.Slider(low, high, value=getattr(DEFAULTS, name), step=setting.page_step, label=setting.title,
                     visible=False, elem_id=name.replace("_", "-"))


def acceptance_settings() -> dict[str, Component]:
    """The acceptance rule and its numbers: a temperature, top-p and seed for sampling, ε and δ
    for typical acceptance (hidden until their rule is chosen; see `acceptance_controls`). An
    empty seed is the engine's unset one: a fresh random seed."""
    seed = COMMON_SETTINGS["seed"]
    return dict(
        acceptance=gr.Radio([("greedy (output unchanged)", "greedy"), ("typical acceptance", "typical"),
                             ("lossless sampling", "sample")], value=DEFAULTS.acceptance, label="Acceptance",
                             elem_id="acceptance"),
        **{name: common_slider(name) for name in SAMPLING_SETTINGS + TYPICAL_SETTINGS},
        # A text box, so that it can be empty (a number box shows and sends 0 for "no value").
        seed=gr.Textbox("", label=seed.title, placeholder=f"empty: {seed.unset}", max_lines=1, visible=False,
                        elem_id="seed"),
    )


def drafter_controls(method: str) -> dict[str, dict]:
    """Visibility updates, by control name: the tree's controls for a drafter that takes one, and
    each drafter's own settings for that drafter alone."""
    chosen: type[Drafter] | None = DRAFTERS.get(method)
    shown = dict.fromkeys(TREE_CONTROLS, chosen is not None and chosen.takes_tree)
    for name, cls in DRAFTERS.items():
        shown.update((setting.name, name == method) for setting in cls.settings)
    return {name: gr.update(visible=visible) for name, visible in shown.items()}


def acceptance_controls(acceptance: str) -> dict[str, dict]:
    """Visibility updates, by control name: temperature, top-p and seed matter only when
    sampling; ε and δ only for typical acceptance."""
    sampling, typical = acceptance != "greedy", acceptance == "typical"
    return {**{name: gr.update(visible=sampling) for name in (*SAMPLING_SETTINGS, "seed")},
            **{name: gr.update(visible=typical) for name in TYPICAL_SETTINGS}}


def _load(name: str) -> LoadedModel:
    try:
        return cache.get(require_offered(name))
    except DecodingError as e:
        raise refusal(e) from e


# The drafter settings whose limit is the model's: switching the model resets them.
MODEL_BOUND_SETTINGS = tuple(s for cls in DRAFTERS.values() for s in cls.settings if s.model_bound)
# What `switch_model` updates, by name (layout.py maps the names to the components).
SWITCH_MODEL_OUTPUTS = ("model", "current_model", "model_card", *(s.name for s in MODEL_BOUND_SETTINGS), "preset",
                        "tree_text", "tree_status", "method", "lanes", "train_heads")


def switch_model(name: str, previous: str, method: str) -> dict[str, object]:
    """Load the chosen model; if it cannot load, say why and go back to the previous one. The
    drafter choices become the new model's; the chosen drafter stays where the model offers it;
    the tree goes back to the Playground's default, from the new model's own figures.
    Updates by name (one of SWITCH_MODEL_OUTPUTS); a name left out keeps its component as it is."""
    try:
        model = cache.get(require_offered(name))
    except DecodingError as e:
        gr.Warning(toast_text(e))
        return {"model": previous, "current_model": previous}
    drafters = available_drafters(model)
    trees = tree_controls(model)
    return {"current_model": name, "model_card": views.model_card(model),
            **{s.name: gr.Slider(maximum=setting_high(model, s), value=PAGE_UNSET if s.unset else s.default)
               for s in MODEL_BOUND_SETTINGS},
            "preset": gr.Dropdown(**trees["preset"]), "tree_text": trees["tree_text"],
            "tree_status": trees["tree_status"],
            "method": gr.Radio(choices=lanes.choices(drafters), value=method if method in drafters else drafters[0]),
            "lanes": gr.CheckboxGroup(choices=lanes.choices(drafters, short=True), value=default_lanes(drafters)),
            "train_heads": gr.Radio(choices=training_views.train_choices(model), value="1")}


def preset_text(model_name: str, preset: str) -> str:
    try:
        return format_choices(named_tree(_load(model_name), preset).choices)
    except DecodingError:
        return gr.skip()


def tree_status(text: str, num_heads: float, model_name: str, preset: str) -> str:
    """The tree editor's status line; the heads slider's PAGE_UNSET stop means all the model's heads."""
    return describe_tree(_load(model_name), preset, text, option_value("num_heads", num_heads))
