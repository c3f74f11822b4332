"""How the page names each decoding method, its colour, and who made each guess. No Gradio here.

A method is "ar" (plain decoding) or a drafter's name (`decoding.available_drafters`): Medusa's
heads, EAGLE's draft layer, a draft model, or prompt lookup. Every view that says who proposed a token asks here.
"""

from __future__ import annotations

from .palette import AR, DRAFT_MODEL, EAGLE, MEDUSA, PROMPT_LOOKUP

TITLES = {"ar": "Plain decoding", "medusa": "Medusa", "eagle": "EAGLE", "draft-model": "Draft model",
          "prompt-lookup": "Prompt lookup"}
COLOURS = {"ar": AR, "medusa": MEDUSA, "eagle": EAGLE, "draft-model": DRAFT_MODEL, "prompt-lookup": PROMPT_LOOKUP}
# What the drafter's guesses are called: a Medusa head, EAGLE's d-th draft step, a draft model's
# step, a copied token.
GUESS_NAMES = {"medusa": "head", "eagle": "step", "draft-model": "draft", "prompt-lookup": "copy"}
# The drafter pickers' labels: what each one is, in a few words.
CHOICE_LABELS = {"medusa": "Medusa heads", "eagle": "EAGLE (one draft layer over the model's features)",
                 "draft-model": "draft model (a second, smaller model)",
                 "prompt-lookup": "prompt lookup (copy earlier text)"}


def title(method: str) -> str:
    return TITLES.get(method, method)


def in_sentence(method: str) -> str:
    """The method's name inside a sentence: "the draft model", "prompt lookup", "Medusa"."""
    return {"ar": "plain decoding", "draft-model": "the draft model", "prompt-lookup": "prompt lookup"}.get(
        method, title(method))


def colour(method: str) -> str:
    return COLOURS.get(method, MEDUSA)


def guess_name(method: str, depth: int, short: bool = False) -> str:
    """Who guessed the token `depth` places after the root: "head 2", "step 2" (EAGLE), "draft 2",
    "copy 2" ("h2", "s2", "d2", "c2" where space is short)."""
    name = GUESS_NAMES.get(method, "head")
    return f"{name[0]}{depth}" if short else f"{name} {depth}"


def who_guessed(method: str) -> str:
    """The drafter as the source of accepted tokens: "heads", "EAGLE", "the draft model", "copies"."""
    return {"medusa": "heads", "eagle": "EAGLE", "draft-model": "the draft model",
            "prompt-lookup": "copies"}.get(method, "heads")


def choices(drafters: list[str], short: bool = False) -> list[tuple[str, str]]:
    """(label, name) pairs for a radio or checkbox group of the drafters a model offers
    (`short`: the names alone, where the group sits in a row)."""
    return [(CHOICE_LABELS.get(name, name).split(" (")[0] if short else CHOICE_LABELS.get(name, name), name)
            for name in drafters]
