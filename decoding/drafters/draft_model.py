"""The `draft-model` drafter: classic speculative decoding with a second, smaller model.

The draft model writes `length` tokens ahead, one pass each, greedily; the base model verifies
them all in one pass. The draft keeps its own KV cache in step with the text: after each round it
drops the rows of the guesses the base model rejected, and next round feeds what it has not yet
seen (the new root, and any accepted token it never ran on). Its cost is what Medusa avoids:
a second model in memory, and `length` small passes a round.

Drafts are the draft model's argmax, under sampling too: a deterministic proposal is what lets
the loop's acceptance keep the base model's distribution exactly (see acceptance.py).
"""

from __future__ import annotations

import torch

from ..kv_cache import new_cache
from ..model import MedusaModel
from ..passes import run_model
from ..trace import DrafterInfo
from .base import Drafter, Proposal, chain_proposal, chain_tree, root_only


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, draft: MedusaModel, length: int) -> None:
        self.draft, self.length = draft, length
        self.tree = chain_tree(length)
        self.written: list[int] = []
        self.cache = new_cache(draft.model.config)

    def begin(self, prompt_ids: list[int]) -> None:
        self.written = list(prompt_ids)
        self.cache = new_cache(self.draft.model.config)
        if len(prompt_ids) < self.draft.context_length:
            run_model(self.draft, prompt_ids, self.cache, last_only=True)

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        # The draft model may read fewer positions than the base: past them it proposes nothing.
        room = self.draft.context_length - len(self.written) - 1
        length = min(self.length, max_depth, room)
        if length < 1:
            return root_only(self.tree, root, self.draft.device)
        pending = self.written[self.cache.get_seq_length():] + [root]
        guesses, probs = [], []
        for _ in range(length):
            logits, _ = run_model(self.draft, pending, self.cache, last_only=True)
            token = int(logits[-1].argmax())
            guesses.append(token)
            if with_probs:
                probs.append(float(torch.softmax(logits[-1].float(), dim=-1)[token]))
            pending = [token]
        proposal = chain_proposal(self.tree, root, guesses, self.draft.device)
        proposal.guess_probs = torch.tensor(probs)[:, None] if with_probs else None
        proposal.draft_passes = length
        return proposal

    def advance(self, written: list[int]) -> None:
        # The cache ran on the root and all guesses but the last; the rows past the accepted
        # ones belong to rejected guesses.
        self.written += written
        surplus = self.cache.get_seq_length() - len(self.written)
        if surplus > 0:
            self.cache.crop(-surplus)

    def info(self) -> DrafterInfo:
        parameters = list(self.draft.model.parameters())
        cache_bytes = sum(t.numel() * t.element_size() for layer in self.cache.layers
                          if layer.is_initialized for t in (layer.keys, layer.values))
        return DrafterInfo(self.name, f"{self.draft.name}, {self.length} tokens a round",
                           sum(p.numel() for p in parameters),
                           sum(p.numel() * p.element_size() for p in parameters), cache_bytes)
