"""What every drafter does: propose a tree of guesses for the next round, and keep in step.

Speculative decoding, Medusa and prompt lookup share one loop (`loops.speculative_decode`):
guess some tokens ahead, verify all of them in ONE pass of the base model, keep the longest
prefix the base model agrees with. They differ only in where the guesses come from:

    medusa         extra heads on the base model read its last hidden state   (no extra pass)
    eagle          one draft layer guesses the next feature, step by step     (small passes, a tree grown each round)
    draft-model    a second, smaller model writes a few tokens ahead          (its own passes, its own cache)
    prompt-lookup  copy what followed the last few tokens earlier in the text (no model at all)

A drafter proposes a tree (a chain is a tree with one branch); verification, acceptance, cache
compaction and tracing are the loop's, the same for all. Because every acceptance rule treats a
proposal as given, whatever the drafter guessed, greedy output equals plain decoding and
speculative sampling keeps the base model's distribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..trace import DraftedTree, DrafterInfo
from ..tree import Tree, chain_choices


@dataclass
class Proposal:
    """One round's guesses: the tree to verify and a token per node, the root first.

    `guesses[d][r]` is the drafter's rank-r guess for the token d+1 places after the root (what
    the tree's nodes were picked from) and `guess_probs` the drafter's probability of each, when
    it has one; both only for showing. `copied_from` is where prompt lookup found its guesses.
    """

    tree: Tree
    tokens: torch.Tensor  # (tree.size,) long
    guesses: torch.Tensor | None = None  # (depth, k) long
    guess_probs: torch.Tensor | None = None  # (depth, k) float
    copied_from: int | None = None
    draft_passes: int = 0
    drafted: DraftedTree | None = None  # EAGLE: every candidate drafted, before the rerank


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


class Drafter(ABC):
    """Proposes the guesses of each round; told what was written so it can keep in step."""

    name: str
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
