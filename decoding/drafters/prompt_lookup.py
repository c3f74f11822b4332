"""The `prompt-lookup` drafter: copy what followed the same words earlier in the text.

Find the last few tokens (an n-gram, longest first) earlier in the prompt or the answer so far,
and guess that what followed them then follows them now. No model and no training: it pays when
the answer repeats its input (summaries, edits, code), and costs a longer verify pass when it
does not. The matching rule is transformers' prompt lookup decoding: the longest n-gram up to
`max_ngram`, its first occurrence that has a continuation, cut before any stop token (a chat
prompt is full of end-of-turn tokens; a guess after one could only end the answer).
"""

from __future__ import annotations

import torch

from ..model import LoadedModel
from ..settings import DecodeSettings, Setting
from ..trace import DrafterInfo
from .base import MAX_CHAIN, Drafter, Proposal, chain_proposal, chain_tree, root_only
from .registry import register

NAME = "prompt-lookup"

def find_continuation(sequence: list[int], max_ngram: int, length: int,
                      stop_ids: frozenset[int] = frozenset()) -> tuple[list[int], int | None]:
    """Up to `length` tokens that followed an earlier occurrence of the sequence's last n-gram,
    cut before the first of `stop_ids`, and where they start; ([], None) when no n-gram from
    `max_ngram` down to 1 recurs, or the first one found is followed by a stop token."""
    end = len(sequence)
    for n in range(min(max_ngram, end - 1), 0, -1):
        tail = sequence[-n:]
        for start in range(end - n):  # the tail itself (start = end - n) has no continuation
            if sequence[start:start + n] == tail:
                follow = start + n
                copied = sequence[follow:min(follow + length, end)]
                stop = next((i for i, token in enumerate(copied) if token in stop_ids), len(copied))
                return (copied[:stop], follow) if stop else ([], None)
    return [], None


NOTHING_TO_COPY = "no earlier words matched the last ones: nothing to copy"


def copy_note(start: int, copied: int, prompt_length: int) -> str:
    """What a round copied, for a page: how many tokens, from where in the text."""
    where = "the prompt" if start < prompt_length else "the answer so far"
    return f"copied {copied} {'token' if copied == 1 else 'tokens'} from position {start} (in {where})"


def copy_origins(start: int, copied: int) -> list[str]:
    """Where each node of a copied chain came from, the root first."""
    return ["the base model"] + [f"copied from position {start + i} of the text (prompt + answer so far)"
                                 for i in range(copied)]


@register
class PromptLookupDrafter(Drafter):
    name = NAME
    label = "Prompt lookup"
    description = "prompt lookup (copy earlier text)"
    in_sentence = "prompt lookup"
    who_guessed = "copies"
    drafts_with = "no weights at all: it copies earlier text"
    guess_name = "copy"
    colour = "#0891B2"
    idle_hint = ("it copies only what the text already holds: try a prompt that asks to repeat, correct or rewrite "
                 "a passage (the examples' \"Repeat this paragraph exactly…\")")
    # transformers' defaults for both
    settings = (Setting("lookup_tokens", 10, 1, MAX_CHAIN, "tokens copied at most each round",
                        label="Lookup length (most tokens copied a round)", page_high=20),
                Setting("lookup_ngram", 2, 1, MAX_CHAIN, "the longest n-gram matched against the text so far"))
    library_name = "prompt lookup decoding (prompt_lookup_num_tokens=, same lengths)"

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> PromptLookupDrafter:
        return cls(lm.device, settings.lookup_tokens, settings.lookup_ngram, lm.eos_token_ids)

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        return f"copies up to {settings.lookup_tokens} tokens"

    @classmethod
    def library_options(cls, lm: LoadedModel, settings: DecodeSettings) -> dict | None:
        return {"generation": {"prompt_lookup_num_tokens": settings.lookup_tokens,
                               "max_matching_ngram_size": settings.lookup_ngram}}

    def __init__(self, device: torch.device, length: int, max_ngram: int,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        self.device, self.length, self.max_ngram, self.stop_ids = device, length, max_ngram, stop_ids
        self.tree = chain_tree(length)
        self.written: list[int] = []
        self.prompt_length = 0

    def begin(self, prompt_ids: list[int], states: torch.Tensor | None) -> None:
        self.written, self.prompt_length = list(prompt_ids), len(prompt_ids)

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        copied, start = find_continuation(self.written + [root], self.max_ngram, min(self.length, max_depth),
                                          self.stop_ids)
        if not copied:
            proposal = root_only(self.tree, root, self.device)
            proposal.note = NOTHING_TO_COPY if with_probs else ""
            return proposal
        proposal = chain_proposal(self.tree, root, copied, self.device)
        if with_probs:
            proposal.origins = copy_origins(start, len(copied))
            proposal.note = copy_note(start, len(copied), self.prompt_length)
        return proposal

    def advance(self, written: list[int], states: torch.Tensor | None) -> None:
        self.written += written

    def info(self) -> DrafterInfo:
        return DrafterInfo(self.name, f"copies up to {self.length} tokens after a repeated "
                           f"{self.max_ngram}-gram (or shorter) of the text so far", 0, 0)
