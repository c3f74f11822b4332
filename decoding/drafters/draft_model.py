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

from pathlib import Path

import torch

from ..errors import DecodingError
from ..kv_cache import new_cache
from ..model import LoadedModel
from ..model_files import context_length, load_causal_lm, local_or_hub
from ..packed_linear import pack_linear_layers
from ..passes import run_model
from ..settings import DecodeSettings, Setting
from ..trace import DrafterInfo
from ..tree import Tree
from .base import MAX_CHAIN, Drafter, ModelFiles, Proposal, chain_tree, root_only
from .registry import register

NAME = "draft-model"
DRAFT_DIR = "draft"  # a model directory's draft model
DRAFT_KEY = "draft_model"  # or the heads config names one, relative to the heads directory


def draft_tree(length: int, top_k: int) -> Tree:
    """The greedy chain, with each step's next `top_k - 1` guesses as leaves beside it."""
    if top_k == 1:
        return chain_tree(length)
    choices = [[0] * depth + [rank] for depth in range(length) for rank in range(top_k)]
    return Tree.from_choices(choices, length, name=f"chain-{length}-top-{top_k}")


@register
class DraftModelDrafter(Drafter):
    name = NAME
    label = "Draft model"
    description = "draft model (a second, smaller model)"
    in_sentence = who_guessed = "the draft model"
    drafts_with = "a second network, with a KV cache of its own"
    guess_name = "draft"
    colour = "#C2410C"
    settings = (Setting("draft_tokens", 4, 1, MAX_CHAIN, "tokens the draft model writes ahead each round",
                        label="Draft length (tokens the draft model writes a round)", page_high=10),
                Setting("draft_top_k", 1, 1, MAX_CHAIN,
                        "guesses per step; the runners-up join the tree as leaves beside the greedy one"))
    source_help = ("directory or hub id of a small causal LM over the same tokenizer, for the draft-model "
                   "drafter (default: the one shipped or registered with the model)")
    library_name = "assisted generation (assistant_model=, same draft model and length)"

    @classmethod
    def available(cls, lm: LoadedModel) -> bool:
        return NAME in lm.parts

    @classmethod
    def missing(cls, lm: LoadedModel) -> str:
        return (f"{lm.name} has no draft model: pass --draft-model with a small causal LM that "
                "shares its tokenizer (a directory or hub id)")

    @classmethod
    def shipped(cls, files: ModelFiles) -> str | Path | None:
        """`draft/` beside the heads, the one the heads config names, or the registry's."""
        if (files.heads_dir / DRAFT_DIR).is_dir():
            return files.heads_dir / DRAFT_DIR
        if files.meta.get(DRAFT_KEY):
            return (files.heads_dir / files.meta[DRAFT_KEY]).resolve()
        return files.registered.draft if files.registered else None

    @classmethod
    def load(cls, lm: LoadedModel, source: str | Path, files: ModelFiles) -> None:
        lm.parts[NAME] = load_draft_model(lm, source, files.pack_linear)

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> DraftModelDrafter:
        return cls(lm.parts[NAME], settings.draft_tokens, settings.draft_top_k)

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        return f"{settings.draft_tokens} tokens a round"

    @classmethod
    def library_options(cls, lm: LoadedModel, settings: DecodeSettings) -> dict | None:
        """The same draft length as ours, held constant: the library's default grows and shrinks
        it, and stops drafting where the draft model is unsure, so the two would differ in more
        than their implementation. The library reads those settings from the *assistant's*
        generation config. A draft tree (top-k above 1) it does not have."""
        if settings.draft_top_k != 1:
            return None
        return {"assistant_model": lm.parts[NAME].model,
                "assistant": {"num_assistant_tokens": settings.draft_tokens,
                              "num_assistant_tokens_schedule": "constant",
                              "assistant_confidence_threshold": 0.0}}

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


def load_draft_model(base: LoadedModel, source: str | Path, pack_linear: bool = True) -> LoadedModel:
    """A small causal LM that drafts for `base`: a directory or hub id. It must share the base's
    tokenizer; it is used with that tokenizer, on the base's device and dtype."""
    path = local_or_hub(source, "draft model")
    model = load_causal_lm(path, base.device, base.dtype)
    draft_vocab, base_vocab = model.config.get_text_config().vocab_size, base.model.config.get_text_config().vocab_size
    if draft_vocab != base_vocab:
        raise DecodingError(
            f"draft model {source!s} has a vocabulary of {draft_vocab} tokens but {base.name} has "
            f"{base_vocab}: a draft model must share the base model's tokenizer")
    if pack_linear:
        pack_linear_layers(model)
    return LoadedModel(
        name=f"{base.name} draft" if path.name == DRAFT_DIR else str(source), model=model,
        tokenizer=base.tokenizer, device=base.device, dtype=base.dtype,
        context_length=context_length(model.config), trees={}, default_tree="",
        eos_token_ids=base.eos_token_ids)
