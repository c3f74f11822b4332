"""The `retrieval` drafter: guess that the model goes on as it went on before (REST, SuffixDecoding).

A chat model repeats itself: the same openings, the same turns of phrase, the same lists. So
look the text up in what the model wrote before. Each round:

    match:  the longest suffix of the text (prompt, answer so far, the root) that occurs in the
            corpus, up to MAX_MATCH tokens: the model's recorded answers (assets/recordings, for a
            model that has some) and the text so far itself
    grow:   the continuations that followed its occurrences, as a trie: a node's score is how
            often its path followed the match; the best nodes are taken first, so a parent
            always comes before its children and every prefix is a tree
    cut:    as many as `retrieval_nodes`, or by default as many as this machine's cost curve
            says pay, weighing each score by how far the base model has borne such scores out
            in this run (`Trust`): a frequency in someone else's answer promises more than the
            base model keeps (on SmolLM2's recorded answers about three times more), one in the
            text so far about what it keeps

No model and no training. The recorded answers are indexed once per model by a suffix array and
kept in memory; the text so far, short and growing, is searched directly. A continuation ends
at a stop token, as prompt lookup's copy does.
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from ..assets import RECORDINGS_DIR, recordings_of
from ..cost_curve import model_cost_curve
from ..dynamic_tree import DRAFT_COST_SMOOTHING, DYNAMIC_TREE, best_prefix, least_added_costs
from ..model import LoadedModel
from ..settings import DecodeSettings, Setting
from ..suffix_index import MAX_DEPTH, SEPARATOR, Source, SuffixIndex, TextSoFar
from ..trace import DrafterInfo
from ..tree import Tree
from ..tree_choice import MAX_AUTO_NODES
from .base import Drafter, Proposal
from .registry import register

NAME = "retrieval"
MAX_NODES = MAX_AUTO_NODES - 1  # the cost curve measures passes up to 64 tokens: the root and 63 guesses
# The last tokens of each recorded prompt, kept before its answer: the chat template's cue to
# answer (SmolLM2's "<|im_start|>assistant\n"), so the first round finds how answers begin.
ANSWER_CUE = 4
# A match found more often is read from an even sample of its places: what follows it is as well
# estimated from a thousand, and each place read costs (a one-token match occurs up to 11,000
# times in SmolLM2's answers, each node of its trie then thousands more).
MAX_OCCURRENCES = 1024
SMALL_COUNT = 256  # occurrences few enough to count in Python, cheaper than numpy's sorting


def recorded_answers(model: str, folder: Path = RECORDINGS_DIR) -> list[list[int]]:
    """The answers recorded of `model` (a recording's manifest names its model: see
    training/recording.py), each led by its prompt's cue to answer; token ids only."""
    answers: list[list[int]] = []
    for recording in recordings_of(model, folder):
        for shard in sorted(recording.glob("shard-*.json")):
            data = json.loads(shard.read_text(encoding="utf-8"))
            answers += [prompt[-ANSWER_CUE:] + answer for prompt, answer in zip(data["prompts"], data["answers"],
                                                                                strict=True)]
    return answers


@cache
def recorded_index(model: str) -> SuffixIndex | None:
    """The index of `model`'s recorded answers, built on first use; None where it has none."""
    answers = recorded_answers(model)
    return SuffixIndex(answers) if answers else None


# ----- the trie of continuations -----
Found = list[tuple[Source, np.ndarray]]  # in each source, the position after each occurrence of a path


@dataclass
class Node:
    """A guess: its path of tokens from the root, its ranks among its siblings down that path (its
    place in the tree), where the path followed the match, and its score (see `score_of`)."""

    tokens: tuple[int, ...]
    path: tuple[int, ...]
    found: Found
    score: float = 1.0

    @property
    def count(self) -> int:
        return sum(len(positions) for _, positions in self.found)


def score_of(parent: Node, count: int) -> float:
    """The chance that a child seen `count` times after its parent is accepted once its parent is:
    its frequency there, count / (the parent's count + 1), by Laplace's rule of succession. The
    frequencies multiplied down a path are its count over the match's count, less sure where
    less was seen: a path that followed the match its one time is no certainty (the base model
    took such a guess 45% of the time, over 152 of them on SmolLM2's answers), and one seen 30
    times of 30 nearly is. Each factor is below 1, so a child scores below its parent."""
    return parent.score * count / (parent.count + 1)


def continuations(found: Found, stop_ids: frozenset[int], limit: int) -> list[tuple[int, Found]]:
    """The tokens that came next, most frequent first (at most `limit`; ties by token id), each
    with where it did; a separator or a stop token ends a continuation."""
    if sum(len(positions) for _, positions in found) > SMALL_COUNT:
        return _most_frequent_next(found, stop_ids, limit)
    after: dict[int, Found] = defaultdict(list)
    for source, positions in found:
        groups: dict[int, list[int]] = defaultdict(list)
        for token, position in zip(source.tokens[positions].tolist(), positions.tolist(), strict=True):
            groups[token].append(position + 1)
        for token, where in groups.items():
            if token != SEPARATOR and token not in stop_ids:
                after[token].append((source, np.array(where)))
    ranked = sorted(after.items(), key=lambda item: (-sum(len(p) for _, p in item[1]), item[0]))
    return ranked[:limit]


def _most_frequent_next(found: Found, stop_ids: frozenset[int], limit: int) -> list[tuple[int, Found]]:
    """`continuations` for many occurrences. A match of one common token occurs thousands of times,
    followed by hundreds of different tokens: sort each source's occurrences by the token after
    them once, count, and gather the positions of the `limit` most frequent alone."""
    grouped = []  # per source: its positions moved on by one, sorted by the next token; the tokens; their runs
    for source, positions in found:
        following = source.tokens[positions]
        order = np.argsort(following, kind="stable")
        tokens, starts, counts = np.unique(following[order], return_index=True, return_counts=True)
        grouped.append((source, positions[order] + 1, tokens, starts, counts))
    every = np.concatenate([tokens for _, _, tokens, _, _ in grouped])
    tokens, which = np.unique(every, return_inverse=True)
    totals = np.bincount(which, weights=np.concatenate([counts for *_, counts in grouped]))
    allowed = (tokens != SEPARATOR) & ~np.isin(tokens, np.fromiter(stop_ids, dtype=np.int64, count=len(stop_ids)))
    tokens, totals = tokens[allowed], totals[allowed]
    best = tokens[np.lexsort((tokens, -totals))[:limit]]  # most frequent first, ties by token id
    ranked: list[tuple[int, Found]] = [(token, []) for token in best.tolist()]
    for source, after, seen, starts, counts in grouped:
        at = np.minimum(np.searchsorted(seen, best), len(seen) - 1)
        for (_, where), i, present in zip(ranked, at.tolist(), (seen[at] == best).tolist(), strict=True):
            if present:
                where.append((source, after[starts[i]:starts[i] + counts[i]]))
    return ranked


def grow(found: Found, depth: int, budget: int, stop_ids: frozenset[int]) -> Iterator[Node]:
    """The `budget` best-scored continuations of the match, at most `depth` deep, best first. A
    child scores below its parent and comes into view only once its parent is taken, so every
    prefix of them is a tree. A node's children are looked up only when the next node is asked
    for: a reader that stops early (`best_prefix`) spares the lookups it would not use."""
    frontier: list[tuple[float, int, Node]] = []  # (-score, order of arrival, node): a heap
    arrivals = itertools.count()

    def offer_children(parent: Node, taken: int) -> None:
        for rank, (token, where) in enumerate(continuations(parent.found, stop_ids, budget - taken)):
            child = Node(parent.tokens + (token,), parent.path + (rank,), where)
            child.score = score_of(parent, child.count)
            heapq.heappush(frontier, (-child.score, next(arrivals), child))

    offer_children(Node((), (), found), 0)
    for taken in range(1, budget + 1):
        if not frontier:
            return
        node = heapq.heappop(frontier)[-1]
        yield node
        if len(node.path) < depth and taken < budget:
            offer_children(node, taken)


def tree_of(nodes: list[Node], root: int) -> tuple[Tree, list[int], list[Node]]:
    """The tree of `nodes`, its node tokens (the root first), and the nodes in the tree's order."""
    by_path = {node.path: node for node in nodes}
    tree = Tree.from_choices(list(by_path), max(len(path) for path in by_path), name=DYNAMIC_TREE)
    ordered = [by_path[path] for path in tree.paths]
    return tree, [root] + [node.tokens[-1] for node in ordered], ordered


class Trust:
    """How far the base model bears out the scores, per source, measured as the run goes: the
    guesses it accepted over the scores they had, (accepted + 1) / (scored + 1), so a run starts
    by taking the scores at their word. A guess counts for the first source it was found in."""

    def __init__(self) -> None:
        self.accepted: dict[str, float] = defaultdict(float)
        self.scored: dict[str, float] = defaultdict(float)

    def expected(self, node: Node) -> float:
        """The chance that the base model accepts `node`, as this run has measured such scores."""
        return min(1.0, node.score * self._borne_out(node.found[0][0].where))

    def most_expected(self, score: float, found: Found) -> float:
        """The most that any guess scored `score` or less, found in `found`'s sources, is expected to be."""
        return min(1.0, score * max(self._borne_out(source.where) for source, _ in found))

    def _borne_out(self, where: str) -> float:
        return (self.accepted[where] + 1) / (self.scored[where] + 1)

    def learn(self, verified: list[Node], accepted: tuple[int, ...]) -> None:
        for node in verified:
            where = node.found[0][0].where
            self.accepted[where] += accepted[:len(node.tokens)] == node.tokens
            self.scored[where] += node.score


# ----- the drafter -----
@register
class RetrievalDrafter(Drafter):
    name = NAME
    label = "Retrieval"
    description = "retrieval (continuations of the model's past answers)"
    in_sentence = "retrieval"
    drafts_with = "no weights: it looks the text up in the model's past answers and in the text so far"
    guess_name = "recall"
    colour = "#9333EA"
    idle_hint = ("it finds only what was written before: ask an everyday chat question (the kind the model's "
                 "recorded answers cover), or a prompt that repeats itself")
    settings = (
        Setting("retrieval_depth", 8, 1, MAX_DEPTH, "tokens a retrieved continuation runs to at most",
                label="Retrieval: depth"),
        Setting("retrieval_nodes", None, 1, MAX_NODES, "retrieved guesses verified per round",
                unset="as many as this machine's cost curve says pay", label="Retrieval: guesses verified"),
    )
    tree: Tree | None = None  # a new tree each round

    def __init__(self, lm: LoadedModel, depth: int, max_nodes: int, fixed_size: bool,
                 recorded: SuffixIndex | None) -> None:
        self.device, self.stop_ids, self.text_of, self.model_name = lm.device, lm.eos_token_ids, lm.token_text, lm.name
        self.depth, self.max_nodes, self.recorded = depth, max_nodes, recorded
        # Without a fixed size the cut keeps what this machine's cost curve says pays.
        self.curve = None if fixed_size else model_cost_curve(lm)
        self.added_costs = least_added_costs(self.curve, max_nodes) if self.curve else None
        self.draft_cost = 0.0  # a round's retrieval, in one-token steps of the base model: measured as it runs
        self.written: list[int] = []
        self.verified: list[Node] = []  # this round's guesses, to learn from what the base model kept
        self.trust = Trust()

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> RetrievalDrafter:
        """`retrieval_nodes` guesses a round, or (None) as many as pay here."""
        nodes = settings.retrieval_nodes
        return cls(lm, settings.retrieval_depth, nodes or MAX_NODES, nodes is not None, recorded_index(lm.name))

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        return f"continuations up to {settings.retrieval_depth} deep"

    @property
    def max_tree_nodes(self) -> int:
        return self.max_nodes + 1

    def begin(self, prompt_ids: list[int], states: torch.Tensor | None) -> None:
        self.written = list(prompt_ids)

    def advance(self, written: list[int], states: torch.Tensor | None) -> None:
        self.written += written
        self.trust.learn(self.verified, tuple(written[1:]))

    def match(self, context: list[int]) -> tuple[int, Found, int]:
        """The longest suffix of `context` found anywhere in the corpus, where (in every source that
        holds it that long: the text so far counts as part of the corpus), and how many times.
        Where it occurs more than MAX_OCCURRENCES times, the places kept are an even sample."""
        sources: list[Source] = [TextSoFar(context), *([self.recorded] if self.recorded else [])]
        matches = [(source, *source.longest_match(context)) for source in sources]
        length = max(length for _, length, _ in matches)
        if length == 0:
            return 0, [], 0
        found = [(source, positions) for source, reach, positions in matches if reach == length]
        occurrences = sum(len(positions) for _, positions in found)
        if occurrences > MAX_OCCURRENCES:  # each source keeps its share of the sample, one place at least
            found = [(source, positions[np.linspace(0, len(positions) - 1, max(1, MAX_OCCURRENCES * len(positions)
                                                                               // occurrences)).astype(np.int64)])
                     for source, positions in found]
        return length, found, occurrences

    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        started = time.perf_counter()
        context = self.written + [root]
        length, found, occurrences = self.match(context)
        depth = min(self.depth, max_depth)
        # Scores only fall as the trie grows, so the nodes are read only as far as one more could pay.
        candidates = grow(found, depth, self.max_nodes, self.stop_ids) if depth >= 1 and length else iter(())
        def ceiling(node: Node) -> float:
            return self.trust.most_expected(node.score, found)

        self.verified = nodes = best_prefix(candidates, self.trust.expected, self.curve, self.draft_cost,
                                            self.max_nodes, ceiling=ceiling, added_costs=self.added_costs)
        if not nodes:
            proposal = Proposal(Tree((), name=DYNAMIC_TREE), torch.tensor([root], device=self.device))
        else:
            tree, tokens, nodes = tree_of(nodes, root)
            proposal = Proposal(tree, torch.tensor(tokens, device=self.device))
        self._measure(started)
        if with_probs:
            matched = self._shown(context[len(context) - length:], lead=True)
            read = sum(len(positions) for _, positions in found)
            proposal.origins = ["base model"] + [self.origin(node, matched, read, read < occurrences)
                                                 for node in nodes]
            places = " and ".join(source.where for source, _ in found)
            sample = f", {read:,} of them read" if read < occurrences else ""
            proposal.note = (f"the text's end '{matched}' (tokens: {length}) found in {places} "
                             f"(times: {occurrences:,}{sample}); "
                             f"continuations verified: {len(nodes)}" if length else
                             "nothing in the past answers or the text so far ends as this text does: no guesses")
        return proposal

    def origin(self, node: Node, matched: str, read: int, sampled: bool) -> str:
        """Where a guess was found, for the tree's hover: how often its path followed the match, in which texts."""
        counts = {source.where: len(positions) for source, positions in node.found}
        where = (f"in {next(iter(counts))}" if len(counts) == 1 else
                 "(" + ", ".join(f"{count} in {place}" for place, count in counts.items()) + ")")
        of = f"the {read:,} places read" if sampled else f"{read:,} times"
        return f"'{self._shown(node.tokens)}' followed '{matched}' {node.count} of {of} {where}"

    def _shown(self, tokens: Sequence[int], lead: bool = False, chars: int = 32) -> str:
        """Tokens as text, cut to `chars` (at the start where `lead`: the end of a match is what matters)."""
        text = "".join(self.text_of(token) for token in tokens)
        if len(text) <= chars:
            return text
        return "…" + text[-chars:] if lead else text[:chars] + "…"

    def _measure(self, started: float) -> None:
        """Fold this round's retrieval time into the estimate the cut weighs (with a cost curve only)."""
        if self.curve is not None:
            steps = (time.perf_counter() - started) / self.curve.step_seconds
            self.draft_cost += DRAFT_COST_SMOOTHING * (steps - self.draft_cost)

    def info(self) -> DrafterInfo:
        corpus = (f"{self.recorded.size:,} tokens of {self.model_name}'s recorded answers and the text so far"
                  if self.recorded else f"the text so far ({self.model_name} has no recorded answers)")
        size = f"up to {self.max_nodes} nodes, as many as pay here" if self.curve is not None \
            else f"{self.max_nodes} nodes"
        return DrafterInfo(self.name, f"continuations of {corpus}, up to {self.depth} deep, {size}", 0,
                           self.recorded.nbytes if self.recorded else 0)
