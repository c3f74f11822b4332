"""What a visitor asks for, as one typed value, checked before any model work. No Gradio here.

`RunRequest` holds the page's settings by name; `decode_settings` turns it into the engine's
`DecodeSettings`, or a DecodingError whose message the page shows as it is. Every default comes
from `DecodeSettings`, so the page, the CLI and the API start from the same values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from decoding import available_drafters
from decoding.errors import DecodingError
from decoding.limits import PAGE_LIMITS, check_page_limits, tree_problem, tree_text_problem
from decoding.model import LoadedModel
from decoding.race import DEFAULT_RACES
from decoding.settings import MAX_EAGLE_NODES, DecodeSettings
from decoding.tree import Tree

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
    method: str = "medusa"  # the Playground's drafter
    draft_tokens: int = DEFAULTS.draft_tokens
    lookup_tokens: int = DEFAULTS.lookup_tokens
    eagle_depth: int = DEFAULTS.eagle_depth
    eagle_top_k: int = DEFAULTS.eagle_top_k
    eagle_nodes: int = 0  # 0: as many as this machine's cost curve says pay
    lanes: tuple[str, ...] = ("medusa",)  # the drafters the race runs beside plain decoding


def parse_tree_json(text: str) -> list[list[int]]:
    """The tree editor's text as a choices list, or DecodingError saying where it is malformed
    (or that it is too long to read: see decoding.limits)."""
    problem = tree_text_problem(text)
    if problem:
        raise DecodingError(problem)
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
    an edited tree must fit the model's heads and the page's size limit, then it is cut the same
    way. The size is checked first: a pasted 10,000-path tree is refused before it is built."""
    problem = tree_problem(len(choices)) if isinstance(choices, list) else None
    if problem:
        raise DecodingError(problem)
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


def tree_spec(model: LoadedModel, preset: str, text: str, num_heads: int) -> str | list[list[int]]:
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


def whole(value: object, name: str) -> int:
    """A number a visitor (or an API client) typed, as an int, or DecodingError saying what is wrong."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DecodingError(f"{name} must be a whole number, not {value!r}") from None
    if not number.is_integer():
        raise DecodingError(f"{name} must be a whole number, not {value!r}")
    return int(number)


def eagle_nodes(value: object) -> int | None:
    """The page's and the API's count of EAGLE guesses verified a round: 0 asks for as many as
    pay on this machine (the engine's None)."""
    nodes = whole(value, "eagle_nodes")
    if not 0 <= nodes <= MAX_EAGLE_NODES:
        raise DecodingError(f"eagle_nodes must be a whole number from 1 to {MAX_EAGLE_NODES}, or 0 for as many "
                            f"as pay here, not {nodes}")
    return nodes or None


def check_method(model: LoadedModel, method: object, plain: bool = False) -> str:
    """`method` if `model` can run it (plain decoding "ar" too where `plain`), else DecodingError."""
    offered = (["ar"] if plain else []) + available_drafters(model)
    if method not in offered:
        raise DecodingError(f"{model.name} offers no drafter {method!r}: choose one of {', '.join(offered)}")
    return str(method)


def decode_settings(model: LoadedModel, request: RunRequest, methods: list[str] | None = None) -> DecodeSettings:
    """The visitor's choices as engine settings for `methods` (default: the Playground's drafter),
    all of which the model must offer; the first is the settings' method. Validated: DecodingError
    if anything is off. The tree is read only where Medusa runs: a half-edited tree never blocks a
    draft model or prompt lookup. The page's limits (decoding.limits) apply: the prompt's
    length, the tokens a run writes, the tree's size and the run's time."""
    methods = [check_method(model, method, plain=True) for method in (methods or [request.method])]
    medusa = "medusa" in methods
    heads = int(request.num_heads) or model.num_heads
    if medusa and not 1 <= heads <= model.num_heads:
        raise DecodingError(f"{model.name} has {model.num_heads} heads: use 1 to {model.num_heads}")
    seed = request.seed
    max_new_tokens = whole(request.max_new_tokens, "max_new_tokens")
    check_page_limits(request.prompt, max_new_tokens, None)
    settings = DecodeSettings(
        method=methods[0], max_new_tokens=max_new_tokens,
        acceptance=request.acceptance,
        temperature=float(request.temperature), epsilon=float(request.epsilon), delta=float(request.delta),
        seed=None if seed is None or seed < 0 else int(seed),
        tree=tree_spec(model, request.preset, request.tree_text, heads) if medusa else "default",
        num_heads=heads if medusa else None,
        draft_tokens=whole(request.draft_tokens, "draft_tokens"),
        lookup_tokens=whole(request.lookup_tokens, "lookup_tokens"),
        eagle_depth=whole(request.eagle_depth, "eagle_depth"),
        eagle_top_k=whole(request.eagle_top_k, "eagle_top_k"),
        eagle_nodes=eagle_nodes(request.eagle_nodes),
        time_limit=PAGE_LIMITS.run_seconds,
    )
    settings.validate()
    return settings


def api_request(prompt: str, model: str, tree: str, **fields: object) -> RunRequest:
    """A `/trace` call as the page's request: `tree` is a preset name, "default" (the model's
    own) or a choices list as JSON, which is checked as the tree editor's text is."""
    json_tree = isinstance(tree, str) and tree.lstrip().startswith("[")
    return RunRequest(prompt=prompt, model=model, preset="" if json_tree else tree,
                      tree_text=tree if json_tree else "", **fields)


def race_lanes(model: LoadedModel, request: RunRequest) -> list[str]:
    """The drafters ticked for the race, in the order the model offers them (each checked)."""
    ticked = list(request.lanes or [])
    if not ticked:
        raise DecodingError("tick at least one drafter (Medusa, draft model, prompt lookup) to race against "
                            "plain decoding")
    for lane in ticked:
        check_method(model, lane)
    return [name for name in available_drafters(model) if name in ticked]
