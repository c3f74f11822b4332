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
from ..tree_choice import AUTO_TREE, choose_tree
from .base import Drafter, Proposal, root_only
from .registry import register

# More heads than any published checkpoint has; a model's own count is checked when it runs.
MAX_HEADS = 16


def resolve_tree(lm: LoadedModel, settings: DecodeSettings) -> Tree:
    """The tree to verify each round: a preset or shipped tree by name, or a custom choices list."""
    if lm.heads is None:
        raise DecodingError(MedusaHeadsDrafter.missing(lm))
    num_heads = settings.options.get("num_heads") or lm.num_heads
    if num_heads > lm.num_heads:
        raise DecodingError(f"{lm.name} has {lm.num_heads} heads; cannot use {num_heads}")
    spec = lm.default_tree if settings.tree == "default" else settings.tree
    if spec == AUTO_TREE:
        return auto_tree(lm, num_heads)
    if isinstance(spec, str):
        tree = Tree.pruned(named_tree(lm, spec), num_heads, spec)
    else:
        tree = Tree.from_choices(spec, num_heads)
    vocab = lm.heads.guess_vocab_size
    if tree.top_k > vocab:
        raise DecodingError(f"the tree reads rank {tree.top_k - 1} but the vocabulary has {vocab} tokens")
    return tree


def named_tree(lm: LoadedModel, name: str) -> list[list[int]]:
    """The choices of one of the model's trees (a preset, or one shipped with its heads), by name."""
    if name not in lm.trees:
        raise DecodingError(f"unknown tree {name!r}; known trees: {', '.join(lm.trees)}")
    return lm.trees[name]


def auto_tree(lm: LoadedModel, num_heads: int) -> Tree:
    """The tree that is fastest here by the heads' accuracies and this machine's cost curve.

    Heads saved without an accuracy table (published checkpoints) keep their default tree.
    """
    if lm.head_accuracy is None:
        return Tree.pruned(lm.trees[lm.default_tree], num_heads, lm.default_tree)
    choice = choose_tree(lm.head_accuracy[:num_heads], model_cost_curve(lm))
    return Tree.from_choices(choice.choices, num_heads, name=choice.name)


def adopt_auto_tree(lm: LoadedModel) -> str:
    """Measure this machine's costs now (or read them back), and make the auto tree one of the
    model's named trees and its default: for a page that lists trees by name. Returns the name.
    The curve is measured whatever the heads: every later trace carries it, for the page to draw."""
    model_cost_curve(lm)
    if lm.heads is None or lm.head_accuracy is None:
        return lm.default_tree
    tree = auto_tree(lm, lm.num_heads)
    lm.trees[tree.name] = [list(path) for path in tree.paths]
    lm.default_tree = tree.name
    return tree.name


@register
class MedusaHeadsDrafter(Drafter):
    name = "medusa"
    label = in_sentence = "Medusa"
    description = "Medusa heads"
    who_guessed = "heads"
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
        return DrafterInfo(self.name, f"{heads.num_heads} Medusa heads on {self.lm.name}",
                           parameters, weight_bytes)
