"""What a user can ask of a run, in one dataclass with its own validation."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .errors import DecodingError

# "ar" is plain decoding; the others name a drafter (see drafters/).
METHODS = ("medusa", "ar", "eagle", "draft-model", "prompt-lookup")
ACCEPTANCE_SCHEMES = ("greedy", "typical", "sample")
# A run longer than this is almost certainly a typo, and would tie up a shared GPU for minutes.
MAX_NEW_TOKENS_LIMIT = 4096
# Tokens each decoder writes once before anything is timed: first calls pay for allocations and
# lazy initialisation (bench, the page's race and its model warm-up all use it).
WARM_UP_TOKENS = 8
# A chain longer than this is verified at a cost no guess rate repays.
MAX_DRAFT_TOKENS = 64
# EAGLE's tree: at most this deep, this many guesses per node, this many nodes (the root aside).
MAX_EAGLE_DEPTH = 16
MAX_EAGLE_TOP_K = 16
MAX_EAGLE_NODES = 63


@dataclass
class DecodeSettings:
    method: str = "medusa"
    max_new_tokens: int = 64
    # greedy: lossless argmax decoding. typical: Medusa's fast, approximate sampling.
    # sample: speculative (rejection) sampling over the tree, exactly the base distribution.
    acceptance: str = "greedy"
    temperature: float = 1.0  # used by "typical" and "sample" only
    top_p: float = 1.0
    epsilon: float = 0.09  # typical acceptance: hard probability threshold
    delta: float = 0.3  # typical acceptance: entropy-scaled threshold
    seed: int | None = None
    # "auto" for the tree that is fastest on this machine (see tree_choice.py), a preset name
    # (see TREE_PRESETS, or one shipped with the heads), "default" for the one shipped with the
    # heads, or a Medusa choices list such as [[0], [0, 0], [1]].
    tree: str | list[list[int]] = "auto"
    num_heads: int | None = None  # use only the first n heads (cuts the tree to depth n)
    draft_tokens: int = 4  # draft-model: tokens the draft model writes ahead each round
    draft_top_k: int = 1  # draft-model: guesses per step in the tree (the greedy one, and runners-up as leaves)
    lookup_tokens: int = 10  # prompt-lookup: tokens copied at most each round (transformers' default)
    lookup_ngram: int = 2  # prompt-lookup: the longest n-gram matched (transformers' default)
    eagle_depth: int = 6  # eagle: levels the draft grows its tree to (EAGLE-2's default)
    eagle_top_k: int = 8  # eagle: nodes expanded per level, and guesses per expanded node
    # eagle: guesses verified per round; None: as many as this machine's cost curve says pay
    # (up to MAX_EAGLE_NODES), chosen each round from the draft's confidence (see dynamic_tree.py).
    eagle_nodes: int | None = None
    detailed_trace: bool = True
    # Seconds of decoding after which the run stops where it is (stop reason "time_limit"); None:
    # no limit. A shared page sets one so that no run holds the model for everyone else.
    time_limit: float | None = None

    def validate(self) -> None:
        """Raise DecodingError with a message a user can act on.

        Numbers of any numeric type are taken (a numpy integer, an int where a float is meant)
        and stored back as plain ints and floats, so the trace's JSON holds plain values.
        """
        if self.method not in METHODS:
            raise DecodingError(f"method must be one of {METHODS}, not {self.method!r}")
        if self.acceptance not in ACCEPTANCE_SCHEMES:
            raise DecodingError(
                f"acceptance must be one of {ACCEPTANCE_SCHEMES}, not {self.acceptance!r}"
            )
        self.max_new_tokens = _whole_number("max_new_tokens", self.max_new_tokens)
        for name in ("temperature", "top_p", "epsilon", "delta"):
            setattr(self, name, _real_number(name, getattr(self, name)))
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise DecodingError(
                f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, "
                f"not {self.max_new_tokens}"
            )
        if self.acceptance != "greedy" and not 0.0 < self.temperature <= 10.0:
            raise DecodingError(f"temperature must be in (0, 10], not {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise DecodingError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise DecodingError(f"epsilon must be in [0, 1], not {self.epsilon}")
        if not 0.0 <= self.delta <= 1.0:
            raise DecodingError(f"delta must be in [0, 1], not {self.delta}")
        if self.num_heads is not None:
            self.num_heads = _whole_number("num_heads", self.num_heads)
            if self.num_heads < 1:
                raise DecodingError(f"num_heads must be at least 1, not {self.num_heads}")
        for name in ("draft_tokens", "draft_top_k", "lookup_tokens", "lookup_ngram"):
            value = _whole_number(name, getattr(self, name))
            if not 1 <= value <= MAX_DRAFT_TOKENS:
                raise DecodingError(f"{name} must be a whole number from 1 to {MAX_DRAFT_TOKENS}, not {value!r}")
            setattr(self, name, value)
        for name, limit in (("eagle_depth", MAX_EAGLE_DEPTH), ("eagle_top_k", MAX_EAGLE_TOP_K)):
            value = _whole_number(name, getattr(self, name))
            if not 1 <= value <= limit:
                raise DecodingError(f"{name} must be a whole number from 1 to {limit}, not {value!r}")
            setattr(self, name, value)
        if self.eagle_nodes is not None:
            self.eagle_nodes = _whole_number("eagle_nodes", self.eagle_nodes)
            if not 1 <= self.eagle_nodes <= MAX_EAGLE_NODES:
                raise DecodingError(f"eagle_nodes must be a whole number from 1 to {MAX_EAGLE_NODES} "
                                    f"(or None: as many as pay), not {self.eagle_nodes!r}")
        if self.time_limit is not None:
            self.time_limit = _real_number("time_limit", self.time_limit)
            if not self.time_limit > 0:
                raise DecodingError(f"time_limit must be a positive number of seconds, not {self.time_limit}")
        if self.seed is not None:
            self.seed = _whole_number("seed", self.seed)
            if not 0 <= self.seed < 2**64:  # what torch's generator takes
                raise DecodingError(f"seed must be a whole number from 0 to 2**64 - 1, not {self.seed}")


def _whole_number(name: str, value: object) -> int:
    """`value` as a plain int, or a DecodingError. A bool is not a number here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DecodingError(f"{name} must be a whole number, not {value!r}")
    return int(value)


def _real_number(name: str, value: object) -> float:
    """`value` as a plain float, or a DecodingError naming what was passed instead."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DecodingError(f"{name} must be a number, not {value!r}")
    return float(value)
