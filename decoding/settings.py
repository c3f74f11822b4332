"""What a user can ask of a run: one dataclass, one table of limits, one "not set" value (None).

The settings every run has are `DecodeSettings`' fields; the settings a drafter owns (a draft
model's length, EAGLE's depth...) are declared by the drafter itself (see drafters/) and travel in
`DecodeSettings.options`, by name. Each is a `Setting`: its default, its limits and its help are
written there once, and the command line's flags, the page's controls, the `/trace` endpoint and
the trace read them. `drafters.check_settings` is the one validation.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import DecodingError

PLAIN = "ar"  # plain autoregressive decoding; every other method names a drafter (see drafters/)
DEFAULT_METHOD = "medusa"
ACCEPTANCE_SCHEMES = ("greedy", "typical", "sample")
# A run longer than this is almost certainly a typo, and would tie up a shared GPU for minutes.
MAX_NEW_TOKENS_LIMIT = 4096
# Tokens each decoder writes once before anything is timed: first calls pay for allocations and
# lazy initialisation (bench, the page's race and its model warm-up all use it).
WARM_UP_TOKENS = 8
# Below this a temperature divides logits into infinities: sampling at it is greedy decoding anyway.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 10.0


@dataclass(frozen=True)
class Setting:
    """One setting a user can choose: its limits, what "not set" (None) means, and its help.

    `default` None with `unset` said means the setting may be left unset, and `unset` is what it
    then asks for ("as many as pay here"); whole numbers from `low` to `high` otherwise.
    """

    name: str
    default: int | float | None
    low: float
    high: float
    help: str
    kind: type = int
    unset: str = ""  # what None asks for, where None is allowed
    label: str = ""  # the page's label; the name where empty
    page_high: float | None = None  # the page's slider stops here (the API takes up to `high`)
    page_low: float | None = None  # ... and starts here (a temperature of 0.001 is greedy anyway)
    page_step: float = 1  # the slider's step (a real number's finer than a whole number's)
    model_bound: bool = False  # the model bounds it further (its drafter's `model_limit`)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def title(self) -> str:
        """What a page calls it: its label, else its help with a capital (never the raw name)."""
        return self.label or self.help[:1].upper() + self.help[1:]

    def check(self, value: object) -> int | float | None:
        """`value` as a plain number within the limits, or None where unset is allowed; else a
        DecodingError in one line that says what is allowed."""
        if value is None and self.unset:
            return None
        number = whole_number(self.name, value) if self.kind is int else real_number(self.name, value)
        if not self.low <= number <= self.high:
            kind = "a whole number" if self.kind is int else "a number"
            unset = f" (or unset: {self.unset})" if self.unset else ""
            raise DecodingError(f"{self.name} must be {kind} from {_plain(self.low)} to {_plain(self.high)}{unset}, "
                                f"not {value!r}")
        return number


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


# The names of the settings drafters own, as each registers (drafters/registry.py).
OPTION_NAMES: set[str] = set()

# The limits of the settings every run has; their defaults are DecodeSettings' own.
COMMON_SETTINGS = {s.name: s for s in (
    Setting("max_new_tokens", None, 1, MAX_NEW_TOKENS_LIMIT, "tokens to write at most"),
    Setting("temperature", None, MIN_TEMPERATURE, MAX_TEMPERATURE, "sampling temperature (typical and sample)",
            kind=float, label="Temperature", page_low=0.05, page_high=2.0, page_step=0.05),
    Setting("top_p", None, 1e-6, 1.0, "keep the smallest set of tokens whose probability reaches top_p "
            "(typical and sample)", kind=float, label="Top-p (nucleus)", page_low=0.05, page_step=0.05),
    Setting("epsilon", None, 0.0, 1.0, "typical acceptance: hard probability threshold", kind=float,
            label="ε (hard threshold)", page_high=0.5, page_step=0.01),
    Setting("delta", None, 0.0, 1.0, "typical acceptance: entropy-scaled threshold", kind=float,
            label="δ (entropy-scaled threshold)", page_step=0.05),
    Setting("seed", None, 0, 2**64 - 1, "the sampler's seed (what torch's generator takes)",
            unset="a fresh random seed", label="Seed"),
)}


@dataclass(init=False)
class DecodeSettings:
    """A run's settings. Keywords other than the fields are drafter settings (`options`):
    `DecodeSettings(method=..., eagle_depth=4)`. The trace records the same type, with the
    tree it verified and its drafter's options filled in."""

    method: str = DEFAULT_METHOD
    max_new_tokens: int = 64
    # greedy: lossless argmax decoding. typical: Medusa's fast, approximate sampling.
    # sample: speculative (rejection) sampling over the tree, exactly the base distribution.
    acceptance: str = "greedy"
    temperature: float = 1.0  # used by "typical" and "sample" only
    top_p: float = 1.0
    epsilon: float = 0.09
    delta: float = 0.3
    seed: int | None = None
    # "auto" for the tree that is fastest on this machine (see tree_choice.py), a preset name,
    # "default" for the one shipped with the heads, or a Medusa choices list such as
    # [[0], [0, 0], [1]] (or that list as JSON text). Read in one place: medusa_heads.medusa_tree.
    # In a trace: the name of the tree the run verified.
    tree: str | list[list[int]] | None = "auto"
    detailed_trace: bool = True
    # Seconds of decoding after which the run stops where it is (stop reason "time_limit"); None:
    # no limit. A shared page sets one so that no run holds the model for everyone else.
    time_limit: float | None = None
    # The drafters' own settings by name; a name left out (or None) takes its drafter's default.
    options: dict[str, int | float | None] = field(default_factory=dict)

    def __init__(self, options: dict[str, int | float | None] | None = None, **values: object) -> None:
        if options is not None and not isinstance(options, Mapping):
            raise DecodingError(f"options must be a dict of a drafter's settings by name, not {options!r}")
        for f in dataclasses.fields(self):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            setattr(self, f.name, values.pop(f.name, default))
        self.options = {**(options or {}), **values}

    def __getattr__(self, name: str) -> object:
        """A drafter's setting read by name (`settings.draft_tokens`): its value, None if unset
        (as in the trace of a run by another drafter). A name no drafter owns is an error."""
        options = self.__dict__.get("options", {})
        if name in options or name in OPTION_NAMES:
            return options.get(name)
        raise AttributeError(f"{type(self).__name__} has no setting {name!r}")

    def check_common(self) -> None:
        """Check the settings every run has (`drafters.check_settings` checks the rest).

        Numbers of any numeric type are taken (a numpy integer, an int where a float is meant)
        and stored back as plain ints and floats, so the trace's JSON holds plain values.
        """
        if self.acceptance not in ACCEPTANCE_SCHEMES:
            raise DecodingError(f"acceptance must be one of {', '.join(ACCEPTANCE_SCHEMES)}, not {self.acceptance!r}")
        for name, setting in COMMON_SETTINGS.items():
            if name == "temperature" and self.acceptance == "greedy":  # never read: any number will do
                self.temperature = real_number(name, self.temperature)
                continue
            setattr(self, name, setting.check(getattr(self, name)))
        if not isinstance(self.tree, str | list | tuple | None):
            raise DecodingError(f"tree must be a name or a list of paths such as [[0], [0, 0], [1]], "
                                f"not a {type(self.tree).__name__}")
        if not isinstance(self.options, dict):
            raise DecodingError(f"options must be a dict of a drafter's settings by name, not {self.options!r}")
        if self.time_limit is not None:
            self.time_limit = real_number("time_limit", self.time_limit)
            if not self.time_limit > 0:
                raise DecodingError(f"time_limit must be a positive number of seconds, not {self.time_limit}")


def whole_number(name: str, value: object) -> int:
    """`value` as a plain int, or a DecodingError. A bool is not a number here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DecodingError(f"{name} must be a whole number, not {value!r}")
    return int(value)


def real_number(name: str, value: object) -> float:
    """`value` as a plain, finite float, or a DecodingError naming what was passed instead."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise DecodingError(f"{name} must be a number, not {value!r}")
    return float(value)
