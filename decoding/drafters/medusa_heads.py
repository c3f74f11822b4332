"""The `medusa` drafter: the base model's own extra heads guess the next few tokens.

Head k reads the hidden state that chose the root and guesses the token k places after it; the
tree takes each head's top few guesses. No extra pass of any model: the hidden state comes free
with the previous verify pass.
"""

from __future__ import annotations

import torch

from ..cost_curve import model_cost_curve
from ..errors import DecodingError
from ..features import FINAL_STATE
from ..model import LoadedModel
from ..passes import draft
from ..settings import DecodeSettings, Setting
from ..trace import DrafterInfo
from ..tree import Tree
from ..tree_choice import AUTO_TREE, EVERY_HEAD_TREE, choose_tree
from .base import Drafter, Proposal, root_only
from .registry import register

# More heads than any published checkpoint has; a model's own count is checked when it runs.
MAX_HEADS = 16
# The trees chosen on this machine (tree_choice.py), by name, beside the presets, each with what it is.
CHOSEN_TREES = {AUTO_TREE: "the fastest tree here", EVERY_HEAD_TREE: "the fastest tree that uses every head"}


def resolve_tree(lm: LoadedModel, settings: DecodeSettings) -> Tree:
    """The tree to verify each round: one of the model's trees by name, or a custom choices list."""
    if lm.heads is None:
        raise DecodingError(MedusaHeadsDrafter.missing(lm))
    num_heads = settings.options.get("num_heads") or lm.num_heads
    if num_heads > lm.num_heads:
        raise DecodingError(f"{lm.name} has {lm.num_heads} heads; cannot use {num_heads}")
    spec = lm.default_tree if settings.tree == "default" else settings.tree
    tree = named_tree(lm, spec, num_heads) if isinstance(spec, str) else Tree.from_choices(spec, num_heads)
    vocab = lm.heads.guess_vocab_size
    if tree.top_k > vocab:
        raise DecodingError(f"the tree reads rank {tree.top_k - 1} but the vocabulary has {vocab} tokens")
    return tree


def tree_names(lm: LoadedModel) -> list[str]:
    """Every tree a run may name: the two chosen here, then the presets and the heads' own."""
    return [*CHOSEN_TREES, *lm.trees]


def named_tree(lm: LoadedModel, name: str, num_heads: int | None = None) -> Tree:
    """One of the model's trees by name, cut to the first `num_heads` heads (default: all): a tree
    chosen on this machine (CHOSEN_TREES), a preset, or one shipped with the heads."""
    num_heads = num_heads or lm.num_heads
    if name in CHOSEN_TREES:
        return chosen_tree(lm, name, num_heads)
    if name not in lm.trees:
        raise DecodingError(f"unknown tree {name!r}; known trees: {', '.join(tree_names(lm))}")
    return Tree.pruned(lm.trees[name], num_heads, name)


def chosen_tree(lm: LoadedModel, name: str, num_heads: int) -> Tree:
    """The tree `name` (one of CHOSEN_TREES) stands for, by the heads' accuracies and this
    machine's cost curve: the fastest tree, or the fastest that reaches every head in use.

    Heads saved without an accuracy table (published checkpoints) keep their default tree.
    """
    if lm.head_accuracy is None:
        return Tree.pruned(lm.trees[lm.default_tree], num_heads, lm.default_tree)
    reach = num_heads if name == EVERY_HEAD_TREE else 1
    choice = choose_tree(lm.head_accuracy[:num_heads], model_cost_curve(lm), reach=reach)
    return Tree.from_choices(choice.choices, num_heads, name=choice.name)


@register
class MedusaHeadsDrafter(Drafter):
    name = "medusa"
    label = in_sentence = "Medusa"
    description = "Medusa heads"
    who_guessed = "heads"
    drafts_with = "heads on the big model's own last state (next step), with no cache and no pass of their own"
    guess_name = "head"
    colour = "#4F46E5"
    settings = (Setting("num_heads", None, 1, MAX_HEADS, "use only the first n heads (cuts the tree to depth n)",
                        unset="all the model's heads", label="Heads to use"),)
    takes_tree = True
    hidden_layers = FINAL_STATE

    @classmethod
    def available(cls, lm: LoadedModel) -> bool:
        return lm.heads is not None

    @classmethod
    def missing(cls, lm: LoadedModel) -> str:
        return f"{lm.name} was loaded without Medusa heads: only plain decoding (method ar) can run"

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> MedusaHeadsDrafter:
        return cls(lm, resolve_tree(lm, settings))

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        return f"tree {settings.tree}"

    def recorded_options(self, settings: DecodeSettings) -> dict[str, int | float | None]:
        return {"num_heads": settings.options.get("num_heads") or self.lm.num_heads}

    def __init__(self, lm: LoadedModel, tree: Tree) -> None:
        self.lm, self.tree = lm, tree
        self._draft_index = tree.draft_index.to(lm.device)

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        tree, index = self.tree, self._draft_index
        if max_depth < tree.max_depth:  # near the context limit: only the levels that fit
            tree = tree.cut(max_depth)
            index = tree.draft_index.to(self.lm.device)
        if tree.max_depth == 0:
            return root_only(tree, root, self.lm.device)
        top_tokens, top_probs = draft(self.lm, hidden, tree, root, with_probs=with_probs)
        root_tensor = torch.tensor([root], device=self.lm.device)
        tokens = torch.cat([root_tensor, top_tokens.flatten()[index]])
        return Proposal(tree, tokens, guesses=top_tokens, guess_probs=top_probs)

    def info(self) -> DrafterInfo:
        heads = self.lm.heads
        parameters = sum(p.numel() for p in heads.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in heads.parameters())
        origin = f"heads {heads.origin}" if heads.origin else ""
        return DrafterInfo(self.name, f"{heads.num_heads} Medusa heads on {self.lm.name}", parameters, weight_bytes,
                           origin=origin)
