"""The `eagle` drafter: a one-layer draft over the base model's features, growing EAGLE-2's tree.

Each round, starting from the base model's feature that chose the root (see eagle.py):

    catch up:  run the draft layer over the pairs (feature, next token) it has not yet read: the
               root's, and those of the tokens the last round accepted, with the features the
               verify pass computed for them. Its output guesses the feature after the root.
    grow:      depth by depth, turn guessed features into the draft's top-k next tokens; expand
               only the `beam` most confident nodes of each depth, by feeding each its own
               guessed feature and token (tree attention over the draft's cache: each node sees
               the text and its own ancestors); stop where no guess is confident enough to pay
               for drafting another level here
    rerank:    keep the most confident nodes, as many as this machine's cost curve says pay
               (see dynamic_tree.py); that is the tree the base model verifies

Between rounds the draft's cache holds exactly the rows of the text: the guessed rows of the
tree are cropped as soon as the tree is drafted, and the accepted tokens are read again next
round with the base model's true features (a guessed feature is only ever a guess).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from ..cost_curve import model_cost_curve
from ..dynamic_tree import DRAFT_COST_SMOOTHING, DYNAMIC_TREE, DraftTree, drafted_trace, rerank, verified_tree
from ..eagle_layer import EAGLE_CONFIG, EAGLE_DIR, EagleHead, find_eagle
from ..errors import DecodingError
from ..kv_cache import new_cache
from ..medusa_modules import few_rows_projection, vocabulary_rows
from ..model import LoadedModel
from ..model_files import local_or_hub
from ..packed_linear import pack_linear_layers
from ..passes import additive_mask
from ..settings import DecodeSettings, Setting
from ..trace import DrafterInfo
from ..tree import Tree
from .base import Drafter, ModelFiles, Proposal
from .registry import register

NAME = "eagle"
# The tree: at most this many nodes a round (the root aside), as the published trees have.
MAX_NODES = 63


@dataclass
class EaglePart:
    """What the eagle drafter drafts with, as `LoadedModel.parts` holds it: the draft head, how
    often its depth-d guess was right on held-out text given the guesses before it (saved with
    it), and the base model's lm_head."""

    head: EagleHead
    accuracy: list[float] | None
    base_lm_head: nn.Module = field(repr=False)

    @cached_property
    def lm_head(self) -> nn.Module:
        """The lm_head rows of the head's draft vocabulary (all rows without one), frozen; on a
        CPU laid out for the few rows a draft multiplies (`few_rows_projection`), on first use."""
        vocab = self.head.draft_vocab
        return few_rows_projection(self.base_lm_head if vocab is None else vocabulary_rows(self.base_lm_head, vocab))


@register
class EagleDrafter(Drafter):
    name = NAME
    label = in_sentence = who_guessed = "EAGLE"
    drafts_with = "one decoder layer over the big model's own features (see *After Medusa*), with a small KV cache"
    description = "EAGLE (one draft layer over the model's features)"
    guess_name = "step"
    passes_of = "EAGLE's draft layer"
    colour = "#BE185D"
    settings = (
        Setting("eagle_depth", 6, 1, 16, "levels the draft tree grows to (EAGLE-2's default)",
                label="EAGLE: depth"),
        Setting("eagle_top_k", 8, 1, 16, "nodes expanded per level, and guesses per expanded node",
                label="EAGLE: top-k"),
        Setting("eagle_nodes", None, 1, MAX_NODES, "guesses verified per round",
                unset="as many as this machine's cost curve says pay", label="EAGLE: guesses verified"),
    )
    source_help = ("directory or hub id of an EAGLE draft head (the project's layout or a published "
                   "EAGLE-1 checkpoint), for the eagle drafter (default: the one shipped or registered)")
    tree: Tree | None = None  # a new tree each round

    def __init__(self, lm: LoadedModel, depth: int, top_k: int, max_nodes: int, fixed_size: bool) -> None:
        part: EaglePart = lm.parts[NAME]
        self.lm, self.head, self.lm_head = lm, part.head, part.lm_head
        self.hidden_layers = part.head.reads_layers
        self.depth, self.top_k, self.max_nodes = depth, top_k, max_nodes
        # Without a fixed size the rerank keeps what this machine's cost curve says pays.
        self.curve = None if fixed_size else model_cost_curve(lm)
        self.draft_cost = 0.0  # drafting, in one-token steps of the base model: measured as it runs
        self.level_cost = 0.0  # drafting one more level, in the same steps
        self.embed = lm.model.get_input_embeddings()
        self.tokens: list[int] = []
        self.pending = torch.empty(0, len(self.hidden_layers) * part.head.config.hidden_size, device=lm.device,
                                   dtype=lm.dtype)
        self.cache = new_cache(self.head.layer_config)

    @property
    def max_tree_nodes(self) -> int:
        return self.max_nodes + 1

    def begin(self, prompt_ids: list[int], states: torch.Tensor | None) -> None:
        self.tokens = list(prompt_ids)
        self.pending = states
        self.cache = new_cache(self.head.layer_config)

    # ----- the draft layer's passes -----
    def _run(self, features: torch.Tensor, tokens: list[int], positions: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:
        """The draft layer over `len(tokens)` inputs; returns their guessed next features (T, H)."""
        ids = torch.tensor(tokens, device=self.lm.device)
        out = self.head(features[None], self.embed(ids)[None], positions[None], self.cache, mask[None, None])
        return out[0]

    def _top_guesses(self, features: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
        """The draft's `top_k` next tokens after each guessed feature, with their log-probabilities."""
        logits = self.lm_head(features).float()
        top_logits, top = logits.topk(self.top_k, dim=-1)
        log_probs = top_logits - logits.logsumexp(dim=-1, keepdim=True)
        return self.head.token_ids(top).tolist(), log_probs.tolist()

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """Additive attention mask from a bool (T, kv) table of what each row may see."""
        return additive_mask(visible.to(self.lm.device), self.lm.dtype)

    def _catch_up(self, root: int) -> torch.Tensor:
        """Read the pairs not yet in the cache (their last token is the root); returns the
        guessed feature after the root."""
        start = self.cache.get_seq_length()
        tokens = self.tokens[start + 1:] + [root]
        count = len(tokens)
        visible = torch.ones(count, start + count, dtype=torch.bool, device=self.lm.device).tril(start)
        positions = torch.arange(start, start + count, device=self.lm.device)
        out = self._run(self.head.text_features(self.pending), tokens, positions, self._mask(visible))
        self.pending = self.pending[:0]
        return out[-1]

    def _grow(self, root_feature: torch.Tensor, depth: int) -> tuple[DraftTree, int]:
        """Draft the tree, `depth` levels; returns it and the number of draft-layer passes."""
        draft = DraftTree()
        tokens, log_probs = self._top_guesses(root_feature[None])
        draft.add_children(-1, tokens[0], log_probs[0])
        # The guessed feature each candidate was chosen from: what it reads when it is expanded.
        chosen_from = [root_feature] * len(draft)
        text_length = self.cache.get_seq_length()
        cache_row: dict[int, int] = {}  # expanded candidate -> its row in the draft's cache
        passes = 1
        for level in range(1, depth):
            if not self._worth_another_level(draft, level):
                break
            level_started = time.perf_counter()
            frontier = draft.frontier(level, self.top_k)
            rows = self.cache.get_seq_length()
            visible = torch.zeros(len(frontier), rows + len(frontier), dtype=torch.bool)
            visible[:, :text_length] = True
            for i, candidate in enumerate(frontier):
                cache_row[candidate] = rows + i
                ancestor = draft.parents[candidate]
                while ancestor >= 0:
                    visible[i, cache_row[ancestor]] = True
                    ancestor = draft.parents[ancestor]
                visible[i, rows + i] = True
            # A depth-d node's input pair sits at position text_length + d - 1 (see eagle.py).
            positions = torch.full((len(frontier),), text_length + level - 1, device=self.lm.device)
            features = torch.stack([chosen_from[c] for c in frontier])
            out = self._run(features, [draft.tokens[c] for c in frontier], positions,
                            self._mask(visible))
            passes += 1
            tokens, log_probs = self._top_guesses(out)
            for i, candidate in enumerate(frontier):
                draft.add_children(candidate, tokens[i], log_probs[i])
                chosen_from += [out[i]] * len(tokens[i])
            if self.curve is not None:
                steps = (time.perf_counter() - level_started) / self.curve.step_seconds
                self.level_cost += DRAFT_COST_SMOOTHING * (steps - self.level_cost)
        guessed_rows = self.cache.get_seq_length() - text_length
        if guessed_rows:
            self.cache.crop(-guessed_rows)  # they go: next round reads the true features instead
        return draft, passes

    def _worth_another_level(self, draft: DraftTree, level: int) -> bool:
        """Whether drafting below `level` may pay for itself: an accepted guess saves a step, and
        no guess below is more confident than the best at `level`, so that best must exceed what
        a level costs to draft here. With a fixed tree size every level is drafted."""
        if self.curve is None:
            return True
        best = max(c for c, d in zip(draft.log_confidences, draft.depths, strict=True) if d == level)
        return math.exp(best) > self.level_cost

    # ----- the drafter's round -----
    def propose(self, root: int, hidden: torch.Tensor | None, max_depth: int, with_probs: bool) -> Proposal:
        started = time.perf_counter()
        root_feature = self._catch_up(root)
        depth = min(self.depth, max_depth)
        if depth < 1:
            return Proposal(Tree((), name=DYNAMIC_TREE), torch.tensor([root], device=self.lm.device))
        draft, passes = self._grow(root_feature, depth)
        kept = rerank(draft, self.curve, self.draft_cost, self.max_nodes)
        tree, node_tokens, node_of = verified_tree(draft, kept, root)
        if self.curve is not None:
            steps = (time.perf_counter() - started) / self.curve.step_seconds
            self.draft_cost += DRAFT_COST_SMOOTHING * (steps - self.draft_cost)
        drafted = drafted_trace(draft, node_of) if with_probs else None
        return Proposal(tree, torch.tensor(node_tokens, device=self.lm.device), draft_passes=passes,
                        drafted=drafted)

    def advance(self, written: list[int], states: torch.Tensor | None) -> None:
        # The verify pass computed the true feature of the root and of every accepted node: the
        # pairs (feature, next token) the draft reads next round, the next root completing the last.
        self.tokens += written
        self.pending = torch.cat([self.pending, states])

    def info(self) -> DrafterInfo:
        parameters = list(self.head.parameters())
        cache_bytes = sum(t.numel() * t.element_size() for layer in self.cache.layers
                          if layer.is_initialized for t in (layer.keys, layer.values))
        size = f"up to {self.max_nodes} nodes, as many as pay here" if self.curve is not None \
            else f"{self.max_nodes} nodes"
        return DrafterInfo(self.name, f"EAGLE draft layer on {self.lm.name}: {self.depth} levels, "
                           f"top {self.top_k} each, {size}",
                           sum(p.numel() for p in parameters),
                           sum(p.numel() * p.element_size() for p in parameters), cache_bytes)


    # ----- what it needs, and where that comes from -----
    @classmethod
    def available(cls, lm: LoadedModel) -> bool:
        return NAME in lm.parts

    @classmethod
    def missing(cls, lm: LoadedModel) -> str:
        return (f"{lm.name} has no EAGLE draft head: train one with `python -m decoding train-eagle`, "
                "or pass --eagle with a directory or hub id of a published EAGLE checkpoint for this model")

    @classmethod
    def shipped(cls, files: ModelFiles) -> str | Path | None:
        """`eagle/` beside the heads, else the registry's."""
        if (files.heads_dir / EAGLE_DIR).is_dir():
            return files.heads_dir / EAGLE_DIR
        return files.registered.eagle if files.registered else None

    @classmethod
    def load(cls, lm: LoadedModel, source: str | Path, files: ModelFiles) -> None:
        head, meta = load_eagle_head(lm, source)
        if files.pack_linear:
            pack_linear_layers(head)
        lm.parts[NAME] = EaglePart(head, _accuracy(meta), lm.model.get_output_embeddings())

    @classmethod
    def held_out_accuracy(cls, lm: LoadedModel) -> list[float] | None:
        return lm.parts[NAME].accuracy if NAME in lm.parts else None

    @classmethod
    def create(cls, lm: LoadedModel, settings: DecodeSettings) -> EagleDrafter:
        """`eagle_nodes` guesses a round, or (None) as many as pay here."""
        nodes = settings.eagle_nodes
        return cls(lm, settings.eagle_depth, settings.eagle_top_k, max_nodes=nodes or MAX_NODES,
                   fixed_size=nodes is not None)

    @classmethod
    def shape(cls, settings: DecodeSettings) -> str:
        return f"dynamic tree, {settings.eagle_depth} deep"


def load_eagle_head(lm: LoadedModel, source: str | Path) -> tuple[EagleHead, dict]:
    """An EAGLE draft head for `lm` from a directory or hub id, in either layout (see eagle.py)."""
    path = local_or_hub(source, "EAGLE head")
    head, meta = find_eagle(path, lm.model)
    if head is None:
        raise DecodingError(f"no EAGLE head in {path}: expected {EAGLE_CONFIG} or a published checkpoint")
    return head.to(device=lm.device, dtype=lm.dtype).eval().requires_grad_(False), meta


def _accuracy(meta: dict) -> list[float] | None:
    """EAGLE's measured acceptance per depth, if saved and well formed."""
    rates = meta.get("accuracy")
    if isinstance(rates, list) and rates and all(isinstance(a, int | float) and 0 <= a <= 1 for a in rates):
        return [float(a) for a in rates]
    return None

