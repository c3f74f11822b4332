"""What a visitor asks for, as one typed value, checked before any model work. No Gradio here.

`RunRequest` holds the page's settings by name; `decode_settings` turns it into the engine's
`DecodeSettings`, or a DecodingError whose message the page shows as it is. Every default comes
from `DecodeSettings`, so the page, the CLI and the API start from the same values.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from decoding import available_drafters
from decoding.drafters import DRAFTERS, check_settings, drafter_setting, setting_high
from decoding.drafters.medusa_heads import medusa_tree, named_tree
from decoding.errors import DecodingError
from decoding.limits import PAGE_LIMITS, check_page_limits, tree_problem, tree_text_problem
from decoding.model import LoadedModel
from decoding.race import DEFAULT_RACES
from decoding.settings import COMMON_SETTINGS, PLAIN, DecodeSettings
from decoding.tree import NOT_A_TREE, read_choices
from decoding.tree_choice import AUTO_TREE, EVERY_HEAD_TREE

DEFAULTS = DecodeSettings()
# "Not set" is the engine's None everywhere (an empty seed box, a setting /trace leaves out); a
# slider cannot be empty, so a drafter setting's slider says it with this stop (option_value).
PAGE_UNSET = 0
# The Playground's tree: the fastest that uses every head, so a first run shows what Medusa is
# (several heads, a tree); the race races the fastest tree here (RACE_TREE) unless told otherwise.
PLAYGROUND_TREE = EVERY_HEAD_TREE
RACE_TREE = AUTO_TREE
PLAYGROUND_TREE_IN_RACE = "playground"  # the race's other choice: the tree the Playground runs
RACE_TREE_CHOICES = {RACE_TREE: "the fastest tree here", PLAYGROUND_TREE_IN_RACE: "the Playground's tree"}


@dataclass(frozen=True)
class RunRequest:
    """The settings every model event reads, by name; `options` holds the drafters' own, by the
    names they declare (decoding.drafters)."""

    prompt: str
    model: str
    max_new_tokens: int = DEFAULTS.max_new_tokens
    acceptance: str = DEFAULTS.acceptance
    temperature: float = DEFAULTS.temperature
    top_p: float = DEFAULTS.top_p
    epsilon: float = DEFAULTS.epsilon
    delta: float = DEFAULTS.delta
    seed: int | str | None = DEFAULTS.seed  # None (or the page's empty box): a fresh random seed
    preset: str = ""
    tree_text: str = ""  # the tree editor's JSON; "" means the preset as it is
    races: int = DEFAULT_RACES
    method: str = DEFAULTS.method  # the Playground's drafter
    lanes: tuple[str, ...] = (DEFAULTS.method,)  # the drafters the race runs beside plain decoding
    race_tree: str = RACE_TREE  # a tree-taking lane's tree in the race: RACE_TREE, or PLAYGROUND_TREE_IN_RACE
    options: dict = field(default_factory=dict)

    @classmethod
    def of(cls, **values: object) -> RunRequest:
        """A request from the page's values by name: a drafter's setting goes to `options`."""
        options = dict(values.pop("options", None) or {})
        options.update((name, values.pop(name)) for name in list(values) if drafter_setting(name) is not None)
        return cls(**values, options=options)


def format_choices(choices: list[list[int]]) -> str:
    """One path per line: easier to read and edit than one long line."""
    return "[\n" + ",\n".join(f"  {json.dumps(path)}" for path in choices) + "\n]"


def edited_tree(model: LoadedModel, preset: str, text: str) -> str | list[list[int]]:
    """What the tree editor asks for: the preset's name while it holds that preset unchanged (or
    nothing), else its choices list. The page's size limits (decoding.limits) are checked first:
    a pasted 10,000-path tree is refused before any tree is built."""
    preset = preset or "default"
    if not text.strip():
        return preset
    problem = tree_text_problem(text)
    if problem:
        raise DecodingError(problem)
    choices = read_choices(text)
    if not isinstance(choices, list):  # the editor holds JSON: a name in quotes is not a tree
        raise DecodingError(NOT_A_TREE)
    problem = tree_problem(len(choices))
    if problem:
        raise DecodingError(problem)
    try:
        unchanged = choices == named_tree(model, model.default_tree if preset == "default" else preset).choices
    except DecodingError:  # a preset this model lacks: the text stands alone
        unchanged = False
    return preset if unchanged else choices


def describe_tree(model: LoadedModel, preset: str, text: str, num_heads: int | None) -> str:
    """The tree editor's status line: the tree a run would verify (read by the engine's one tree
    reader, medusa_tree), or what is wrong with it."""
    try:
        tree = medusa_tree(model, edited_tree(model, preset, text), num_heads)
    except DecodingError as e:
        return f"⚠ {e}"
    return f"✓ {tree.size} nodes incl. root · {len(tree.leaves)} candidate paths · {tree.max_depth} deep"


def whole(value: object, name: str) -> int:
    """A number a visitor (or an API client) typed, as an int, or DecodingError saying what is wrong."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DecodingError(f"{name} must be a whole number, not {value!r}") from None
    if not number.is_integer():
        raise DecodingError(f"{name} must be a whole number, not {value!r}")
    return int(number)


def option_value(name: str, value: object) -> int | None:
    """A drafter setting as the page sends it: a whole number, or None for unset (a slider's
    PAGE_UNSET stop, where the setting may be unset)."""
    if value is None:
        return None
    number = whole(value, name)
    setting = drafter_setting(name)
    return None if number == PAGE_UNSET and setting is not None and setting.unset else number


def check_method(model: LoadedModel, method: object, plain: bool = False) -> str:
    """`method` if `model` can run it (plain decoding too where `plain`), else DecodingError."""
    offered = ([PLAIN] if plain else []) + available_drafters(model)
    if method not in offered:
        raise DecodingError(f"{model.name} offers no drafter {method!r}: choose one of {', '.join(offered)}")
    return str(method)


def decode_settings(model: LoadedModel, request: RunRequest, methods: list[str] | None = None) -> DecodeSettings:
    """The visitor's choices as engine settings for `methods` (default: the Playground's drafter),
    all of which the model must offer; the first is the settings' method. Checked by the engine's
    one validation (decoding.drafters.check_settings). The tree is read only where a drafter that
    takes one runs: a half-edited tree never blocks a draft model or prompt lookup. The page's
    limits (decoding.limits) apply: the prompt's length, the tokens a run writes, the tree's size
    and the run's time."""
    methods = [check_method(model, method, plain=True) for method in (methods or [request.method])]
    options = {name: option_value(name, value) for name, value in request.options.items()}
    takes_tree = any(DRAFTERS[m].takes_tree for m in methods if m != PLAIN)
    for setting in (s for m in methods if m != PLAIN for s in DRAFTERS[m].settings if s.model_bound):
        high = setting_high(model, setting)
        if (options.get(setting.name) or 0) > high:
            raise DecodingError(f"{setting.name} on {model.name}: use 1 to {high:g} (or leave it unset)")
    max_new_tokens = whole(request.max_new_tokens, "max_new_tokens")
    check_page_limits(request.prompt, max_new_tokens, None)
    tree = edited_tree(model, request.preset, request.tree_text) if takes_tree else "default"
    if isinstance(tree, list):  # an edited tree is checked before any model work; a name, as the run starts
        medusa_tree(model, tree, options.get("num_heads"))
    return check_settings(DecodeSettings(
        method=methods[0], max_new_tokens=max_new_tokens, acceptance=request.acceptance,
        temperature=request.temperature, top_p=request.top_p, epsilon=request.epsilon, delta=request.delta,
        seed=None if request.seed in (None, "") else whole(request.seed, "seed"), tree=tree,
        time_limit=PAGE_LIMITS.run_seconds, options=options,
    ))


# What `/trace` takes by name, beside the prompt: the model, the drafter, the tree, the settings
# every run has (decoding.settings.COMMON_SETTINGS) and each drafter's own (decoding.drafters).
TRACE_SETTINGS = ("model", "method", "tree", "acceptance", *COMMON_SETTINGS)


def trace_request(prompt: str, settings: object) -> RunRequest:
    """A `/trace` call as the page's request. `settings` maps names (TRACE_SETTINGS and the
    drafters' own) to values; a name left out, or null, takes its default. `tree` is a tree's
    name or a choices list as JSON text, checked as the tree editor's text is."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise DecodingError(f"settings must be an object of settings by name, such as "
                            f"{{\"max_new_tokens\": 16}}, not {settings!r}")
    named = {name: value for name, value in settings.items() if value is not None}
    unknown = [name for name in named if name not in TRACE_SETTINGS and drafter_setting(name) is None]
    if unknown:
        known = [*TRACE_SETTINGS, *(s.name for cls in DRAFTERS.values() for s in cls.settings)]
        raise DecodingError(f"/trace has no setting {unknown[0]!r}: it takes {', '.join(known)}")
    tree = named.pop("tree", DEFAULTS.tree)
    if not isinstance(tree, str):
        raise DecodingError(f"tree must be a tree's name or a choices list as JSON text, not {tree!r}")
    json_tree = tree.lstrip().startswith("[")
    named.setdefault("model", "")
    return RunRequest.of(prompt=prompt, **named, preset="" if json_tree else tree, tree_text=tree if json_tree else "")


def race_request(request: RunRequest) -> RunRequest:
    """The request a race runs: the Playground's, with the fastest tree here unless the visitor
    chose to race the Playground's tree."""
    if request.race_tree == PLAYGROUND_TREE_IN_RACE:
        return request
    if request.race_tree != RACE_TREE:
        raise DecodingError(f"the race's tree is one of {', '.join(RACE_TREE_CHOICES)}, not {request.race_tree!r}")
    return dataclasses.replace(request, preset=RACE_TREE, tree_text="")


def race_lanes(model: LoadedModel, request: RunRequest) -> list[str]:
    """The drafters ticked for the race, in the order the model offers them (each checked)."""
    ticked = list(request.lanes or [])
    if not ticked:
        raise DecodingError("tick at least one drafter to race against plain decoding")
    for lane in ticked:
        check_method(model, lane)
    return [name for name in available_drafters(model) if name in ticked]
