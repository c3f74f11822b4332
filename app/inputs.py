"""What a visitor asks for, as one typed value, checked before any model work. No Gradio here.

`RunRequest` holds the page's settings by name; `decode_settings` turns it into the engine's
`DecodeSettings`, or a DecodingError whose message the page shows as it is. Every default comes
from `DecodeSettings`, so the page, the CLI and the API start from the same values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from decoding.errors import DecodingError
from decoding.model import MedusaModel
from decoding.settings import DecodeSettings
from decoding.tree import Tree

from .race import DEFAULT_RACES

DEFAULTS = DecodeSettings()


@dataclass(frozen=True)
class RunRequest:
    """The settings every model event reads, by name."""

    prompt: str
    model: str
    max_new_tokens: int = DEFAULTS.max_new_tokens
    acceptance: str = DEFAULTS.acceptance
    temperature: float = DEFAULTS.temperature
    epsilon: float = DEFAULTS.epsilon
    delta: float = DEFAULTS.delta
    seed: int = -1  # -1: a fresh random seed
    preset: str = ""
    tree_text: str = ""  # the tree editor's JSON; "" means the preset as it is
    num_heads: int = 0  # 0: all the model's heads
    races: int = DEFAULT_RACES


def parse_tree_json(text: str) -> list[list[int]]:
    """The tree editor's text as a choices list, or DecodingError saying where it is malformed."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DecodingError(f"the tree JSON is malformed: {e.msg} at line {e.lineno}, column {e.colno}") from e


def format_choices(choices: list[list[int]]) -> str:
    """One path per line: easier to read and edit than one long line."""
    return "[\n" + ",\n".join(f"  {json.dumps(path)}" for path in choices) + "\n]"


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


def tree_spec(model: MedusaModel, preset: str, text: str, num_heads: int) -> str | list[list[int]]:
    """A preset name when the editor still holds that preset (or is empty), else the edited,
    validated list. Using the first n heads keeps the paths at most n deep, as the engine does."""
    preset = preset if preset in model.trees else model.default_tree
    if not text.strip():
        return preset
    choices = parse_tree_json(text)
    preset_choices = model.trees[preset]
    if choices == preset_choices:
        return preset
    return [list(path) for path in checked_tree(choices, preset_choices, model.num_heads, num_heads).paths]


def decode_settings(model: MedusaModel, request: RunRequest) -> DecodeSettings:
    """The visitor's choices as engine settings, validated (DecodingError if anything is off)."""
    heads = int(request.num_heads) or model.num_heads
    if not 1 <= heads <= model.num_heads:
        raise DecodingError(f"{model.name} has {model.num_heads} heads: use 1 to {model.num_heads}")
    seed = request.seed
    settings = DecodeSettings(
        method="medusa", max_new_tokens=int(request.max_new_tokens), acceptance=request.acceptance,
        temperature=float(request.temperature), epsilon=float(request.epsilon), delta=float(request.delta),
        seed=None if seed is None or seed < 0 else int(seed),
        tree=tree_spec(model, request.preset, request.tree_text, heads), num_heads=heads,
    )
    settings.validate()
    return settings
