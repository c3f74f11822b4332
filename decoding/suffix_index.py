"""Finding where a text's end occurred before, and what followed: the lookups a retrieval
drafter makes each round (drafters/retrieval.py), with no model.

Two kinds of text are searched. A large, fixed corpus (a model's recorded answers) is indexed
once by a suffix array of it read backwards (`SuffixIndex`): one bisection, token by token, finds
the longest suffix of the text that occurs in it. The text so far, short and growing, is searched
directly (`TextSoFar`). Both answer the same question (`Source.longest_match`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

MAX_MATCH = 16  # a longer match rarely changes what follows it
MAX_DEPTH = 32  # the most tokens read on past a match: the deepest continuation
SEPARATOR = -1  # between answers: no token is -1, so no match runs from one answer into the next
NOTHING = np.empty(0, dtype=np.int64)
SMALL_BLOCK = 64  # occurrences few enough to check one by one, cheaper than bisecting among them


class Source(Protocol):
    """Text to find continuations in: its tokens (with separators past both ends, so that a match
    or a continuation can be read on without a bounds check) and where it is, in words."""

    tokens: np.ndarray
    where: str

    def longest_match(self, context: Sequence[int]) -> tuple[int, np.ndarray]:
        """The longest suffix of `context` (MAX_MATCH tokens at most) that occurs here: its
        length, and the position just after each occurrence."""


# ----- the recorded answers: a suffix array of them read backwards, built once per model -----
def suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Every position of `tokens`, sorted by the `depth` tokens from there on (at least).

    Prefix doubling (Manber and Myers): rank the suffixes by their first token, then by their
    first 2, 4, 8... each time sorting by the ranks of the two halves, which the last round gave.
    Suffixes still equal when `depth` tokens are reached keep the order of their positions."""
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64)
    length = 1
    while length < depth and rank.max() < len(tokens) - 1:
        second = np.full_like(rank, -1)  # past the end sorts first
        second[:-length] = rank[length:]
        order = np.lexsort((second, rank))
        first_sorted, second_sorted = rank[order], second[order]
        new_group = np.ones(len(order), dtype=bool)
        new_group[1:] = (first_sorted[1:] != first_sorted[:-1]) | (second_sorted[1:] != second_sorted[:-1])
        rank[order] = np.cumsum(new_group) - 1
        length *= 2
    return np.argsort(rank, kind="stable")


class SuffixIndex:
    """Answers laid end to end between separators, and the suffix array of that text read
    backwards. Backwards, the text's suffixes of every length are the prefixes of one pattern, the
    text read from its end: their occurrences are nested blocks of the array, so one bisection
    token by token finds the longest, with no search per length."""

    where = "past answers"

    def __init__(self, answers: Sequence[Sequence[int]]) -> None:
        joined = [token for answer in answers for token in (*answer, SEPARATOR)]
        self.tokens = np.array([SEPARATOR] * MAX_MATCH + joined + [SEPARATOR] * MAX_DEPTH, dtype=np.int32)
        self.backwards = np.ascontiguousarray(self.tokens[::-1])
        self.order = suffix_array(self.backwards, MAX_MATCH).astype(np.int32)
        self.first = self.backwards[self.order]  # the first token of each sorted suffix, for the first bisection
        self.size = len(joined) - len(answers)  # tokens, separators not counted

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.backwards.nbytes + self.order.nbytes + self.first.nbytes

    def longest_match(self, context: Sequence[int]) -> tuple[int, np.ndarray]:
        lo, hi, length, block = 0, len(self.order), 0, None
        for offset, token in enumerate(reversed(context[-MAX_MATCH:])):
            if block is None:
                # The suffixes in [lo, hi) agree on their first `offset` tokens, so they are sorted by the next.
                keys = self.first[lo:hi] if offset == 0 else self.backwards[self.order[lo:hi] + offset]
                token = keys.dtype.type(token)  # of the keys' own type: a Python int would copy them all to int64
                new_lo, new_hi = lo + np.searchsorted(keys, token, "left"), lo + np.searchsorted(keys, token, "right")
                if new_lo == new_hi:
                    break
                lo, hi = new_lo, new_hi
                if hi - lo <= SMALL_BLOCK:  # few enough to check each one directly from here on
                    block = self.order[lo:hi]
            else:
                agree = block[self.backwards[block + offset] == token]
                if not len(agree):
                    break
                block = agree
            length = offset + 1
        if length == 0:
            return 0, NOTHING
        starts = (block if block is not None else self.order[lo:hi]).astype(np.int64)
        # A match read backwards from position q ends, read forwards, just before len - q.
        return length, len(self.tokens) - starts


# ----- the text so far: short, so searched directly -----
class TextSoFar:
    """The prompt and answer so far, ending with the root: its earlier occurrences of its own end."""

    where = "earlier in this text"

    def __init__(self, context: Sequence[int]) -> None:
        self.length = len(context)
        self.tokens = np.array([*[SEPARATOR] * MAX_MATCH, *context, *[SEPARATOR] * (MAX_DEPTH + 1)], dtype=np.int64)

    def longest_match(self, context: Sequence[int]) -> tuple[int, np.ndarray]:
        # Where the text's last token occurs before its end (the end itself has nothing after it),
        # then, going back, the occurrences the next token back still agrees with.
        end = MAX_MATCH + self.length - 1
        ends = np.flatnonzero(self.tokens[MAX_MATCH:end] == context[-1]) + MAX_MATCH
        if not len(ends):
            return 0, NOTHING
        length = 1
        while length < min(MAX_MATCH, len(context)):
            agree = ends[self.tokens[ends - length] == context[-1 - length]]
            if not len(agree):
                break
            ends, length = agree, length + 1
        return length, ends + 1
