"""The `medusa` drafter: the base model's own extra heads guess the next few tokens.

Head k reads the hidden state that chose the root and guesses the token k places after it; the
tree takes each head's top few guesses. No extra pass of any model: the hidden state comes free
with the previous verify pass.
"""

from __future__ import annotations

import torch

from ..errors import DecodingError
from ..model import LoadedModel
from ..passes import draft
from ..settings import DecodeSettings
from ..trace import DrafterInfo
from ..tree import Tree
from .base import Drafter, Proposal, root_only


def resolve_tree(mm: LoadedModel, settings: DecodeSettings) -> Tree:
    """The tree to verify each round: a preset or shipped tree by name, or a custom choices list."""
    if mm.heads is None:
        raise DecodingError(f"{mm.name} was loaded without Medusa heads: only plain decoding (method ar) can run")
    num_heads = settings.num_heads or mm.num_heads
    if num_heads > mm.num_heads:
        raise DecodingError(f"{mm.name} has {mm.num_heads} heads; cannot use {num_heads}")
    spec = mm.default_tree if settings.tree == "default" else settings.tree
    if isinstance(spec, str):
        if spec not in mm.trees:
            raise DecodingError(f"unknown tree {spec!r}; known trees: {', '.join(mm.trees)}")
        tree = Tree.pruned(mm.trees[spec], num_heads, spec)
    else:
        tree = Tree.from_choices(spec, num_heads)
    vocab = mm.heads.guess_vocab_size
    if tree.top_k > vocab:
        raise DecodingError(f"the tree reads rank {tree.top_k - 1} but the vocabulary has {vocab} tokens")
    return tree


class MedusaHeadsDrafter(Drafter):
    name = "medusa"
    reads_hidden = True

    def __init__(self, mm: LoadedModel, tree: Tree) -> None:
        self.mm, self.tree = mm, tree
        self._draft_index = tree.draft_index.to(mm.device)

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        tree, index = self.tree, self._draft_index
        if max_depth < tree.max_depth:  # near the context limit: only the levels that fit
            tree = tree.cut(max_depth)
            index = tree.draft_index.to(self.mm.device)
        if tree.max_depth == 0:
            return root_only(tree, root, self.mm.device)
        top_tokens, top_probs = draft(self.mm, hidden, tree, root, with_probs=with_probs)
        root_tensor = torch.tensor([root], device=self.mm.device)
        tokens = torch.cat([root_tensor, top_tokens.flatten()[index]])
        return Proposal(tree, tokens, guesses=top_tokens, guess_probs=top_probs)

    def info(self) -> DrafterInfo:
        heads = self.mm.heads
        parameters = sum(p.numel() for p in heads.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in heads.parameters())
        return DrafterInfo(self.name, f"{heads.num_heads} Medusa heads on {self.mm.name}",
                           parameters, weight_bytes)
