"""What every drafter does: propose a tree of guesses for the next round, and keep in step.

Every drafter shares one loop (`loops.speculative_decode`):
guess some tokens ahead, verify all of them in ONE pass of the base model, keep the longest
prefix the base model agrees with. They differ only in where the guesses come from:

    medusa         extra heads on the base model read its last hidden state   (no extra pass)
    eagle          one draft layer guesses the next feature, step by step     (small passes, a tree grown each round)
    draft-model    a second, smaller model writes a few tokens ahead          (its own passes, its own cache)
    prompt-lookup  copy what followed the last few tokens earlier in the text (no model at all)
    retrieval      the most frequent continuations of the text in the model's own past answers (a suffix index)

A drafter proposes a tree (a chain is a tree with one branch); verification, acceptance, cache
compaction and tracing are the loop's, the same for all. Because every acceptance rule treats a
proposal as given, whatever the drafter guessed, greedy output equals plain decoding and
speculative sampling keeps the base model's distribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from ..settings import DecodeSettings, Setting
from ..trace import DraftedTree, DrafterInfo
from ..tree import Tree, chain_choices

if TYPE_CHECKING:
    from ..model import LoadedModel
    from ..published import RegistryEntry

# A chain longer than this is verified at a cost no guess rate repays.
MAX_CHAIN = 64


@dataclass
class Proposal:
    """One round's guesses: the tree to verify and a token per node, the root first.

    `guesses[d][r]` is the drafter's rank-r guess for the token d+1 places after the root (what
    the tree's nodes were picked from) and `guess_probs` the drafter's probability of each, when
    it has one; both only for showing.
    `origins`, where a drafter can say it, is where each node's guess was found, the root first,
    and `note` what it did this round, in a few words for a page to show (the trace's
    `node_origins` and `drafting_note`).
    """

    tree: Tree
    tokens: torch.Tensor  # (tree.size,) long
    guesses: torch.Tensor | None = None  # (depth, k) long
    guess_probs: torch.Tensor | None = None  # (depth, k) float
    draft_passes: int = 0
    drafted: DraftedTree | None = None  # EAGLE: every candidate drafted, before the rerank
    origins: list[str] | None = None  # (tree.size,) text, when the round is traced in detail
    note: str = ""  # what the drafter did this round in a few words, when traced in detail


def chain_tree(length: int) -> Tree:
    """A chain of `length` guesses: what a draft model or prompt lookup proposes."""
    return Tree.from_choices(chain_choices(length), length, name=f"chain-{length}")


def root_only(tree: Tree, root: int, device: torch.device) -> Proposal:
    """A proposal with no guesses: the round is then a plain decoding step."""
    return Proposal(tree.cut(0), torch.tensor([root], device=device))


def chain_proposal(tree: Tree, root: int, guesses: list[int], device: torch.device) -> Proposal:
    """The first len(guesses) nodes of a chain: a chain's prefix is a chain."""
    tokens = torch.tensor([root, *guesses], device=device)
    return Proposal(tree.cut(len(guesses)), tokens, guesses=tokens[1:, None])


@dataclass
class ModelFiles:
    """Where a model's files came from: what a drafter reads to find what ships with the model."""

    heads_dir: Path  # the model's heads directory (its own directory when the heads are inside)
    meta: dict = field(default_factory=dict)  # the heads' config, when heads were loaded
    registered: RegistryEntry | None = None  # the model's registry entry, for a published model
    pack_linear: bool = True  # pack the linear layers of what is loaded (see packed_linear.py)


class Drafter(ABC):
    """Proposes the guesses of each round; told what was written so it can keep in step.

    A subclass declares what it is in its class attributes, and registers itself with
    `drafters.register`: the loop, the trace, bench, the command line and the page read it from
    there. Adding a drafter is one module (see prompt_lookup.py for the smallest).
    """

    # ----- what the drafter is: one place for each -----
    name: ClassVar[str]  # the method's name: `--method NAME`, the trace's `settings.method`
    label: ClassVar[str]  # its title on the page and in tables: "Prompt lookup"
    description: ClassVar[str]  # what it is in a few words, for pickers: "prompt lookup (copy earlier text)"
    in_sentence: ClassVar[str] = ""  # its name inside a sentence ("the draft model"); the label where empty
    who_guessed: ClassVar[str] = ""  # the source of accepted tokens ("copies"); in_sentence where empty
    drafts_with: ClassVar[str] = ""  # what it drafts with, in a sentence: "no weights at all: it copies earlier text"
    guess_name: ClassVar[str] = "guess"  # what its d-th guess is called: "head" (head 2), "copy" (copy 2)
    # What runs its passes of its own, in a sentence ("EAGLE's draft layer"); in_sentence where empty.
    passes_of: ClassVar[str] = ""
    colour: ClassVar[str] = "#6B7280"  # its lane's colour on every figure
    settings: ClassVar[tuple[Setting, ...]] = ()  # the settings it owns, with defaults and limits
    takes_tree: ClassVar[bool] = False  # whether the run's `tree` setting chooses its tree (Medusa's)
    # Whether `--dtype auto` weighs what it drafts with (precision.py): its part is then loaded onto
    # the model in each dtype measured, before the choice; the others' once the dtype is chosen.
    weighs_in_dtype_choice: ClassVar[bool] = False
    # Where it proposed nothing in most rounds, what to try instead, for a page to say ("" : nothing).
    idle_hint: ClassVar[str] = ""
    # `--NAME SOURCE` on the command line: where what it drafts with comes from (empty: no such flag).
    source_help: ClassVar[str] = ""
    # transformers' own decoder doing the same, for bench's comparison (empty: none).
    library_name: ClassVar[str] = ""

    # ----- what one run of it is -----
    # The largest tree the drafter proposes; a round may verify a prefix of it (fewer levels).
    # None for a drafter that grows a new tree each round (EAGLE-2).
    tree: Tree | None
    # Which of the base model's hidden states the drafter reads (see passes.FINAL_STATE): the
    # passes keep those, side by side; none for a drafter that reads only tokens.
    hidden_layers: tuple[int, ...] = ()

    @property
    def max_tree_nodes(self) -> int:
        """The most nodes one round verifies: what the memory check counts."""
        return self.tree.size

    def begin(self, prompt_ids: list[int], states: torch.Tensor | None) -> None:  # noqa: B027 - most keep no state
        """Called once, after the base model's prefill, with the prompt's tokens (and, for a
        drafter that reads them, the prefill's hidden state at every prompt position)."""

    @abstractmethod
    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        """Guesses for the tokens after `root` (the token the base model just chose), at most
        `max_depth` deep; `hidden` is the base model's state that chose the root, when asked for."""

    def advance(self, written: list[int], states: torch.Tensor | None) -> None:  # noqa: B027 - most keep no state
        """The round wrote `written`: the root, then the guesses the base model accepted; for a
        drafter that reads them, `states` are the verify pass's hidden states at those nodes."""

    @abstractmethod
    def info(self) -> DrafterInfo:
        """What the drafter is and what it costs in memory, for the trace."""

    # ----- what it needs from a model, and how it is made for a run -----
    @classmethod
    def available(cls, lm: LoadedModel) -> bool:
        """Whether `lm` has what this drafter drafts with."""
        return True

    @classmethod
    def missing(cls, lm: LoadedModel) -> str:
        """Why `lm` cannot run this drafter, and how to give it what it needs."""
        return f"{lm.name} cannot run the {cls.name} drafter"

    @classmethod
    def model_limit(cls, lm: LoadedModel, setting: Setting) -> int | float:
        """The highest value one of its `model_bound` settings takes on `lm` (Medusa: its heads)."""
        return setting.high

    @classmethod
    def held_out_accuracy(cls, lm: LoadedModel) -> list[float] | None:
        """How often its guess at each depth was right on held-out text, given the text before, as
        saved with what it drafts with; None where nothing was measured."""
        return None

    @classmethod
    def shipped(cls, files: ModelFiles) -> str | Path | None:
        """What this drafter drafts with, as shipped or registered with the model (None: nothing)."""
        return None

    @classmethod  # noqa: B027 - most drafters load nothing
    def load(cls, lm: LoadedModel, source: str | Path, files: ModelFiles) -> None:
        """Load what it drafts with from `source` onto `lm` (`load_model` calls it)."""

    @classmethod
    @abstractmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> Drafter:
        """The drafter for one run on `lm`, with its options in `settings` checked and filled."""

    def recorded_options(self, settings: DecodeSettings) -> dict[str, int | float | None]:
        """Its options as the run's trace records them: each one's value, unset ones resolved
        where the run resolved them."""
        return {s.name: settings.options.get(s.name, s.default) for s in self.settings}

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        """Its tree or chain in a few words, from its settings ("4 tokens a round")."""
        return ""

    @classmethod
    def library_options(cls, lm: LoadedModel, settings: DecodeSettings) -> dict | None:
        """The keywords that make transformers' `generate` do the same (see bench.py), or None."""
        return None

