"""The trace: what one decoding run did, round by round.

This is the one schema the web app, the CLI's `--json` output and the tests read. It is made of
plain dataclasses holding plain Python values (ints, floats, strings, lists), so `to_dict()` is
JSON-ready and `RunTrace.from_dict(to_dict())` gives back an equal trace.

Vocabulary used throughout:
- a *pass* is one forward pass of the base model;
- a *round* is one pass plus its bookkeeping: with a drafter (Medusa's heads, EAGLE, a draft model,
  prompt lookup), draft -> verify -> accept; for plain autoregressive (AR) decoding, a round is
  one single-token step;
- the *root* of a round is the token the base model chose at the end of the previous round (or
  at prefill). It is already part of the output; the round verifies guesses that follow it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from .errors import DecodingError
from .machine_load import MachineLoad
from .settings import DecodeSettings


@dataclass
class TreeTrace:
    """The shape of a candidate tree: the run's, for a drafter that verifies one tree every round
    (cut near the end of the context), or one round's own (EAGLE grows a new tree each round).

    Node 0 is the root. Node i > 0 holds the drafter's rank-`ranks[i]` guess for the token
    `depths[i]` places after the root (Medusa's head `depths[i]`, a draft model's step, a copy).
    `mask[i][j]` is 1 when node i may attend to node j (j is i or one of its ancestors).
    """

    choices: list[list[int]]
    parents: list[int]
    depths: list[int]
    ranks: list[int]
    mask: list[list[int]]
    name: str = "custom"

    @property
    def size(self) -> int:
        return len(self.parents)

    def first_nodes(self, size: int) -> TreeTrace:
        """The first `size` nodes. Near the context limit a round verifies only the tree levels
        that still fit; nodes are ordered by depth, so those levels are a prefix of the tree."""
        if size >= self.size:
            return self
        paths = self.choices[: size - 1]
        return TreeTrace(choices=paths, parents=self.parents[:size], depths=self.depths[:size],
                         ranks=self.ranks[:size],
                         mask=[row[:size] for row in self.mask[:size]], name=self.name)


@dataclass
class DraftedTree:
    """What EAGLE-2's drafting scored in one round, before the rerank cut it to the verified tree.

    Candidate i is the draft's guess `tokens[i]` at depth `depths[i]` below the root, continuing
    candidate `parents[i]` (-1: the root). `confidences[i]` is the product of the draft's
    probabilities along its path; `expanded[i]` whether its own children were drafted (only the
    most confident few of each depth are); `nodes[i]` its node in the verified tree, -1 if cut.
    """

    parents: list[int]
    tokens: list[int]
    texts: list[str]
    confidences: list[float]
    depths: list[int]
    expanded: list[bool]
    nodes: list[int]


@dataclass
class DrafterInfo:
    """Where a run's guesses came from, and what that costs in memory (see drafters/)."""

    name: str  # the drafter's name (see drafters/)
    description: str
    parameters: int  # the drafter's trained parameters: heads, or a whole second model; 0 for lookup
    weight_bytes: int
    # The draft model's own KV cache at the end of the run (bytes): memory Medusa does not need.
    cache_bytes: int = 0
    # Where the drafter's weights come from when not from the model's own files ("heads trained on
    # this page for 30 s"); empty otherwise.
    origin: str = ""


@dataclass
class CostCurve:
    """What a forward pass over T tokens costs on this machine, in one-token steps.

    Measured on the loaded model (see `cost_curve.py`): `costs[i]` is the median time of a
    `sizes[i]`-token pass over the median time of a one-token step, both after the same cached
    prefix. Flat (about 1) is the regime Medusa is built for: checking many guesses costs about
    one pass. Steep means each extra guess costs real time here, so small trees win.
    """

    sizes: list[int]
    costs: list[float]
    step_seconds: float  # the median one-token step, in seconds
    device: str
    dtype: str
    threads: int
    past: int  # cached tokens before each timed pass
    measured_at: str  # ISO 8601, when the measurement was taken (it may come from the cache)
    # What the Medusa heads' guessing costs per round, in one-token steps (0 without heads).
    draft_cost: float = 0.0
    # How far most repeats of one size disagreed, at worst (cost_curve.disagreement): a quiet
    # machine gives a few percent; another job running alongside, far more.
    spread: float = 0.0
    # Cores other programs kept busy while it was measured (machine_load); None: not known.
    other_cores: float | None = None

    def cost(self, size: int) -> float:
        """The cost of a `size`-token pass, linearly interpolated between measured sizes."""
        if size <= self.sizes[0]:
            return self.costs[0]
        for (a, ca), (b, cb) in pairwise(zip(self.sizes, self.costs, strict=True)):
            if size <= b:
                return ca + (cb - ca) * (size - a) / (b - a)
        return self.costs[-1]


@dataclass
class RoundTrace:
    """One round. For AR runs the tree fields are empty and `emitted_tokens` holds one token."""

    index: int
    # Position in the sequence (prompt + output so far) at which this round's root sits.
    position: int
    # Tokens this round added to the output, in order: accepted guesses, then the base model's
    # own next token ("bonus"). `emitted_from_drafter` says which of them were the drafter's
    # guesses (Medusa's heads, EAGLE's, a draft model's or prompt lookup's).
    emitted_tokens: list[int]
    emitted_texts: list[str]
    emitted_from_drafter: list[bool]
    # Seconds spent in each phase and the moment (seconds since the run's start, prefill
    # included) this round's tokens were ready: the race replays runs on this clock.
    time_draft: float
    time_verify: float
    time_accept: float
    t_end: float
    # Seconds spent recording this round's details for the UI (0 when tracing is off): the
    # price of watching, kept apart so it can be reported.
    time_trace: float = 0.0
    # Forward passes of a draft model this round (draft-model runs); `time_draft` is their cost.
    draft_passes: int = 0
    # --- speculative runs only (empty for AR runs or when detailed tracing is off) ---
    root_token: int | None = None
    # guesses[d][r]: the drafter's rank-r guess for the token d+1 places after the root, as deep
    # as the tree reads, and guess_probs its probability of each: for Medusa, head d+1's top
    # tokens and softmax; for a draft model, its guesses d+1 steps ahead; for prompt lookup the
    # copied tokens, with no probability (empty).
    guesses: list[list[int]] = field(default_factory=list)
    guess_probs: list[list[float]] = field(default_factory=list)
    # Per tree node: its token, that token's text, the base model's probability of that token
    # given the node's parent (None for the root), and the base model's own top choice *after*
    # the node (argmax of the verify logits at that node) with its probability.
    node_tokens: list[int] = field(default_factory=list)
    # Who proposed each node: "base" for the root (the base model's own token), else the drafter.
    node_sources: list[str] = field(default_factory=list)
    # Where the drafter found each node's guess, in a few words, where it can say ("seen 12 of 40
    # times after ..."; the root's: the base model); empty for a drafter that does not say.
    node_origins: list[str] = field(default_factory=list)
    # What the drafter did this round, in its own few words, where it says ("" otherwise).
    drafting_note: str = ""
    node_texts: list[str] = field(default_factory=list)
    node_base_probs: list[float | None] = field(default_factory=list)
    base_argmax_tokens: list[int] = field(default_factory=list)
    base_argmax_texts: list[str] = field(default_factory=list)
    base_argmax_probs: list[float] = field(default_factory=list)
    # The accepted path as node indices, root first; its length minus one is how many head
    # guesses were accepted.
    accepted_nodes: list[int] = field(default_factory=list)
    # The token the round chose after its accepted path: the next round's root (speculative runs).
    # Greedy: the base model's argmax at the last accepted node; typical and sampling: drawn
    # from the base model's distribution there, so it may differ from `base_argmax_tokens`.
    # Recorded even when the token budget cut it from `emitted_tokens`.
    next_token: int | None = None
    next_text: str = ""
    # The tree this round verified, when the drafter grows a new one every round (EAGLE-2); None
    # when it is the run's tree (`RunTrace.tree`). And, for EAGLE, every candidate it drafted.
    tree: TreeTrace | None = None
    drafted: DraftedTree | None = None

    @property
    def accepted_length(self) -> int:
        """Tokens this round added: accepted guesses plus the base model's bonus token."""
        return len(self.emitted_tokens)

    @property
    def tree_size(self) -> int:
        return len(self.node_tokens)


# Round fields saved under an older name (when Medusa was the only drafter): old -> new.
RENAMED_ROUND_FIELDS = {"emitted_from_heads": "emitted_from_drafter", "heads_topk_tokens": "guesses",
                        "heads_topk_probs": "guess_probs"}


def _tree_from_dict(data: dict[str, Any]) -> TreeTrace:
    """A tree as `to_dict` wrote it; one saved with `heads` (the same numbers as the depths) reads too."""
    return TreeTrace(**{key: value for key, value in data.items() if key != "heads"})


def _renamed(data: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    return {renamed.get(key, key): value for key, value in data.items()}


# Round fields older traces carry that are now said otherwise: prompt lookup's `copied_from` is in
# its round's `drafting_note` and `node_origins`.
RETIRED_ROUND_FIELDS = frozenset({"copied_from"})


def _round_from_dict(data: dict[str, Any]) -> RoundTrace:
    data = {key: value for key, value in data.items() if key not in RETIRED_ROUND_FIELDS}
    if data.get("tree") is not None:
        data["tree"] = _tree_from_dict(data["tree"])
    if data.get("drafted") is not None:
        data["drafted"] = DraftedTree(**data["drafted"])
    return RoundTrace(**data)


# The settings a run was asked for, as its trace records them: the same type, with the tree it
# verified and its drafter's own options filled in (see loops.py).
RunSettings = DecodeSettings


@dataclass
class RunTrace:
    """A whole run: settings, the prompt, every round and the totals the UI and CLI report."""

    model: str
    device: str
    dtype: str
    settings: RunSettings
    prompt: str
    prompt_tokens: list[int]
    tree: TreeTrace | None = None
    drafter: DrafterInfo | None = None
    rounds: list[RoundTrace] = field(default_factory=list)
    # The first token comes out of the prefill pass (before any round).
    prefill_token: int | None = None
    prefill_text: str = ""
    time_prefill: float = 0.0
    stop_reason: str = ""  # "max_new_tokens", "eos", "context_limit" or "time_limit"
    total_time: float = 0.0
    detailed: bool = True
    # Why the run is in `dtype` on this device, in a sentence ("bfloat16: the CPU's matrix units
    # make it 1.4x faster than float32 here"); empty when the user named the dtype.
    dtype_reason: str = ""
    # The measured cost of a T-token pass on this machine, when the model's curve was measured.
    cost_curve: CostCurve | None = None
    # The machine's load looked at just before the run, with the torch threads the run then used
    # (measure.stream_on_free_cores), and the process's own thread count; None: not looked at.
    load: MachineLoad | None = None
    threads_before: int | None = None

    # ----- totals, derived from the rounds so they can never disagree with them -----
    @property
    def tokens(self) -> list[int]:
        """Every generated token, prefill token first."""
        out = [] if self.prefill_token is None else [self.prefill_token]
        for r in self.rounds:
            out.extend(r.emitted_tokens)
        return out

    @property
    def texts(self) -> list[str]:
        out = [] if self.prefill_token is None else [self.prefill_text]
        for r in self.rounds:
            out.extend(r.emitted_texts)
        return out

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def forward_passes(self) -> int:
        """Prefill plus one pass per round."""
        return (1 if self.prefill_token is not None else 0) + len(self.rounds)

    @property
    def mean_accepted(self) -> float:
        """Mean tokens added per decoding pass (prefill excluded): 1.0 for AR by construction."""
        if not self.rounds:
            return 0.0
        return sum(r.accepted_length for r in self.rounds) / len(self.rounds)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.total_time if self.total_time > 0 else 0.0

    def round_tree(self, round_trace: RoundTrace) -> TreeTrace | None:
        """The tree a round verified: its own when the drafter grows one per round, else the
        run's tree, cut where the round ran out of context."""
        if round_trace.tree is not None:
            return round_trace.tree
        if self.tree is None or not round_trace.tree_size:
            return self.tree
        return self.tree.first_nodes(round_trace.tree_size)

    # ----- JSON -----
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(
            tokens=self.tokens,
            text=self.text,
            forward_passes=self.forward_passes,
            mean_accepted=self.mean_accepted,
            tokens_per_second=self.tokens_per_second,
        )
        return data

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunTrace:
        """The trace `to_dict` wrote; one saved before a field was renamed reads too."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict):
            raise DecodingError(f"a trace is a JSON object, not {type(data).__name__}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in data]
        if missing:
            raise DecodingError(f"not a trace: it has no {', '.join(missing)}")
        fields = {k: v for k, v in data.items() if k in names}
        try:
            fields["settings"] = DecodeSettings(**fields["settings"])
            if fields.get("tree") is not None:
                fields["tree"] = _tree_from_dict(fields["tree"])
            if fields.get("drafter") is not None:
                fields["drafter"] = DrafterInfo(**fields["drafter"])
            if fields.get("cost_curve") is not None:
                fields["cost_curve"] = CostCurve(**fields["cost_curve"])
            if fields.get("load") is not None:
                fields["load"] = MachineLoad(**{k: v for k, v in fields["load"].items() if k != "busy"})
            fields["rounds"] = [_round_from_dict(_renamed(r, RENAMED_ROUND_FIELDS)) for r in fields.get("rounds", [])]
            return cls(**fields)
        except (TypeError, AttributeError) as e:  # a part that is not an object of that part's fields
            raise DecodingError(f"not a trace: {e}") from e

    @classmethod
    def from_json(cls, text: str) -> RunTrace:
        """The trace `to_json` wrote, or a DecodingError saying why `text` is not one."""
        if not isinstance(text, str):
            raise DecodingError(f"a trace is JSON text (a str), not {type(text).__name__}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DecodingError(f"not a trace: the JSON is malformed: {e.msg} at line {e.lineno}") from e
        except RecursionError:
            raise DecodingError("not a trace: the JSON is nested too deeply") from None
        except ValueError:  # what is left: a number too long for Python to turn into an int
            raise DecodingError(f"not a trace: it holds a number of more than {sys.get_int_max_str_digits()} "
                                "digits") from None
        return cls.from_dict(data)
