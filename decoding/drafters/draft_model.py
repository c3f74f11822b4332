"""The `draft-model` drafter: classic speculative decoding with a second, smaller model.

The draft model writes `length` tokens ahead, one pass each, greedily; the base model verifies
them all in one pass. With `top_k` > 1 the runners-up of each step join the tree as leaves beside
the greedy token: they cost the draft model nothing (the same logits), and where the base model
prefers a runner-up the round still gains a token.

The draft keeps its own KV cache in step with the text: after each round it drops the rows of
the guesses the base model rejected, and next round feeds what it has not yet
seen (the new root, and any accepted token it never ran on). Dropping rows is what a tree cache
allows: a sliding-window layer of a plain cache has already let go of the rows the window would
need again after the rejected ones are gone (see kv_cache.py). Its cost is what Medusa avoids:
a second model in memory, and `length` small passes a round.

Drafts are the draft model's argmax, under sampling too: a deterministic proposal is what lets
the loop's acceptance keep the base model's distribution exactly (see acceptance.py).
"""

from __future__ import annotations

import torch

from ..kv_cache import new_cache
from ..model import LoadedModel
from ..passes import run_model
from ..trace import DrafterInfo
from ..tree import Tree
from .base import Drafter, Proposal, chain_tree, root_only


def draft_tree(length: int, top_k: int) -> Tree:
    """The greedy chain, with each step's next `top_k - 1` guesses as leaves beside it."""
    if top_k == 1:
        return chain_tree(length)
    choices = [[0] * depth + [rank] for depth in range(length) for rank in range(top_k)]
    return Tree.from_choices(choices, length, name=f"chain-{length}-top-{top_k}")


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, draft: LoadedModel, length: int, top_k: int = 1) -> None:
        self.draft, self.length, self.top_k = draft, length, top_k
        self.tree = draft_tree(length, top_k)
        self.written: list[int] = []
        self.chain: list[int] = []  # the greedy guesses of the last round: what the cache ran on
        self.cache = new_cache(draft.model.config, for_trees=True)

    def begin(self, prompt_ids: list[int], states: torch.Tensor | None) -> None:
        self.written = list(prompt_ids)
        self.cache = new_cache(self.draft.model.config, for_trees=True)
        if len(prompt_ids) < self.draft.context_length:
            run_model(self.draft, prompt_ids, self.cache, last_only=True)

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        # The draft model may read fewer positions than the base: past them it proposes nothing.
        room = self.draft.context_length - len(self.written) - 1
        length = min(self.length, max_depth, room)
        if length < 1:
            return root_only(self.tree, root, self.draft.device)
        pending = self.written[self.cache.get_seq_length():] + [root]
        steps = []
        while len(steps) < length:
            logits, _ = run_model(self.draft, pending, self.cache, last_only=True)
            steps.append(logits[-1].float())
            pending = [int(steps[-1].argmax())]  # the greedy guess runs on; runners-up stay leaves
            if pending[0] in self.draft.eos_token_ids:
                break  # past an end of text there is nothing to guess
        tree = self.tree.cut(len(steps))
        step_logits = torch.stack(steps)
        top_logits, guesses = step_logits.topk(self.top_k, dim=-1)
        self.chain = guesses[:, 0].tolist()
        root_tensor = torch.tensor([root], device=self.draft.device)
        tokens = torch.cat([root_tensor, guesses.flatten()[tree.draft_index.to(self.draft.device)]])
        probs = torch.exp(top_logits - step_logits.logsumexp(dim=-1, keepdim=True)) if with_probs else None
        return Proposal(tree, tokens, guesses=guesses, guess_probs=probs, draft_passes=len(steps))

    def advance(self, written: list[int], states: torch.Tensor | None) -> None:
        # The cache ran on the root and the greedy guesses but the last. Its rows are good up to
        # the first guess the base model did not take (a runner-up taken instead is not in it).
        agreed = 0
        while agreed < min(len(written) - 1, len(self.chain)) and written[1 + agreed] == self.chain[agreed]:
            agreed += 1
        valid = len(self.written) + 1 + agreed
        self.written += written
        # crop(0) is not a no-op: it trims a sliding layer back to its window (see kv_cache.py).
        surplus = max(self.cache.get_seq_length() - valid, 0)
        self.cache.crop(-surplus)

    def info(self) -> DrafterInfo:
        parameters = list(self.draft.model.parameters())
        cache_bytes = sum(t.numel() * t.element_size() for layer in self.cache.layers
                          if layer.is_initialized for t in (layer.keys, layer.values))
        return DrafterInfo(self.name, f"{self.draft.name}, {self.length} tokens a round"
                           + (f", top {self.top_k} each" if self.top_k > 1 else ""),
                           sum(p.numel() for p in parameters),
                           sum(p.numel() * p.element_size() for p in parameters), cache_bytes)
