"""Drafters: where a round's guesses come from. One loop verifies them all (see base.py)."""

from __future__ import annotations

from ..errors import DecodingError
from ..model import LoadedModel
from ..settings import DecodeSettings
from .base import Drafter, Proposal
from .draft_model import DraftModelDrafter
from .medusa_heads import MedusaHeadsDrafter, resolve_tree
from .prompt_lookup import PromptLookupDrafter, find_continuation

__all__ = ["Drafter", "DraftModelDrafter", "MedusaHeadsDrafter", "PromptLookupDrafter", "Proposal",
           "available_drafters", "find_continuation", "make_drafter", "resolve_tree"]


def available_drafters(lm: LoadedModel) -> list[str]:
    """The drafters `lm` can run: heads and a draft model only where it has them."""
    return [name for name, present in (("medusa", lm.heads is not None), ("draft-model", lm.draft is not None),
                                       ("prompt-lookup", True)) if present]


def make_drafter(lm: LoadedModel, settings: DecodeSettings) -> Drafter:
    """The drafter a run's method names, set up for `lm`."""
    if settings.method == "medusa":
        return MedusaHeadsDrafter(lm, resolve_tree(lm, settings))
    if settings.method == "draft-model":
        if lm.draft is None:
            raise DecodingError(
                f"{lm.name} has no draft model: pass --draft-model with a small causal LM that "
                "shares its tokenizer (a directory or hub id)")
        return DraftModelDrafter(lm.draft, settings.draft_tokens, settings.draft_top_k)
    if settings.method == "prompt-lookup":
        return PromptLookupDrafter(lm.device, settings.lookup_tokens, settings.lookup_ngram, lm.eos_token_ids)
    raise DecodingError(f"method {settings.method!r} has no drafter")
