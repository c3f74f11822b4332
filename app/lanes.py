"""How the page names each decoding method, its colour, and who made each guess. No Gradio here.

A method is plain decoding ("ar") or a drafter's name; each drafter declares its own names and
colour (decoding.drafters), so every view that says who proposed a token reads them from there.
An unknown name is refused, never drawn as some other drafter.
"""

from __future__ import annotations

from decoding.drafters import Drafter, drafter_class
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.drafters.eagle import NAME as EAGLE
from decoding.drafters.medusa_heads import MedusaHeadsDrafter
from decoding.drafters.mtp import NAME as MTP
from decoding.drafters.prompt_lookup import NAME as PROMPT_LOOKUP
from decoding.settings import PLAIN

from .palette import AR

MEDUSA = MedusaHeadsDrafter.name
# The drafters some views tell about in their own words (each view asks for its own by name).
__all__ = ["DRAFT_MODEL", "EAGLE", "MEDUSA", "MTP", "PLAIN", "PROMPT_LOOKUP"]


def _drafter(method: str) -> type[Drafter]:
    return drafter_class(method)


def title(method: str) -> str:
    return "Plain decoding" if method == PLAIN else _drafter(method).label


def in_sentence(method: str) -> str:
    """The method's name inside a sentence: "the draft model", "prompt lookup", "Medusa"."""
    if method == PLAIN:
        return "plain decoding"
    return _drafter(method).in_sentence or title(method)


def passes_of(method: str) -> str:
    """What runs the drafter's passes of its own, in a sentence: "the draft model", "EAGLE's draft layer"."""
    return _drafter(method).passes_of or in_sentence(method)


def colour(method: str) -> str:
    return AR if method == PLAIN else _drafter(method).colour


def idle_hint(method: str) -> str:
    """What to try where the drafter proposed nothing most rounds ("" for plain decoding)."""
    return "" if method == PLAIN else _drafter(method).idle_hint


def drafts_with(method: str) -> str:
    """What the drafter drafts with, in a sentence's words: "a second network, with its own KV cache"."""
    return _drafter(method).drafts_with


def guess_noun(method: str) -> str:
    """What the drafter's d-th guess is called: "head" (Medusa), "step" (EAGLE), "draft", "copy"."""
    return "guess" if method == PLAIN else _drafter(method).guess_name


def guess_name(method: str, depth: int, short: bool = False) -> str:
    """Who guessed the token `depth` places after the root: "head 2", "step 2" (EAGLE), "draft 2",
    "copy 2" ("h2", "s2", "d2", "c2" where space is short)."""
    name = guess_noun(method)
    return f"{name[0]}{depth}" if short else f"{name} {depth}"


def who_guessed(method: str) -> str:
    """The drafter as the source of accepted tokens: "heads", "EAGLE", "the draft model", "copies"."""
    if method == PLAIN:
        return "the base model"
    cls = _drafter(method)
    return cls.who_guessed or cls.in_sentence or cls.label


def choices(drafters: list[str], short: bool = False) -> list[tuple[str, str]]:
    """(label, name) pairs for a radio or checkbox group of the drafters a model offers
    (`short`: the names alone, where the group sits in a row)."""
    return [(_drafter(name).description.split(" (")[0] if short else _drafter(name).description, name)
            for name in drafters]
