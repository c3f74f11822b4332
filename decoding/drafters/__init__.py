"""Drafters: where a round's guesses come from. One loop verifies them all (see base.py)."""

from __future__ import annotations

from ..errors import DecodingError
from ..model import LoadedModel
from ..settings import DecodeSettings
from .base import Drafter, Proposal
from .draft_model import DraftModelDrafter
from .eagle import EagleDrafter, eagle_drafter
from .medusa_heads import MedusaHeadsDrafter, adopt_auto_tree, resolve_tree
from .prompt_lookup import PromptLookupDrafter, find_continuation

__all__ = ["Drafter", "DraftModelDrafter", "EagleDrafter", "MedusaHeadsDrafter", "PromptLookupDrafter", "Proposal",
           "adopt_auto_tree", "available_drafters", "find_continuation", "make_drafter", "resolve_tree"]


def available_drafters(lm: LoadedModel) -> list[str]:
    """The drafters `lm` can run: heads and a draft model only where it has them."""
    return [name for name, present in (("medusa", lm.heads is not None), ("eagle", lm.eagle is not None),
                                       ("draft-model", lm.draft is not None), ("prompt-lookup", True)) if present]


def make_drafter(lm: LoadedModel, settings: DecodeSettings) -> Drafter:
    """The drafter a run's method names, set up for `lm`."""
    if settings.method == "medusa":
        return MedusaHeadsDrafter(lm, resolve_tree(lm, settings))
    if settings.method == "eagle":
        if lm.eagle is None:
            raise DecodingError(
                f"{lm.name} has no EAGLE draft head: train one with `python -m decoding train-eagle`, "
                "or pass --eagle with a directory or hub id of a published EAGLE checkpoint for this model")
        return eagle_drafter(lm, settings.eagle_depth, settings.eagle_top_k, settings.eagle_nodes)
    if settings.method == "draft-model":
        if lm.draft is None:
            raise DecodingError(
                f"{lm.name} has no draft model: pass --draft-model with a small causal LM that "
                "shares its tokenizer (a directory or hub id)")
        return DraftModelDrafter(lm.draft, settings.draft_tokens, settings.draft_top_k)
    if settings.method == "prompt-lookup":
        return PromptLookupDrafter(lm.device, settings.lookup_tokens, settings.lookup_ngram, lm.eos_token_ids)
    raise DecodingError(f"method {settings.method!r} has no drafter")
