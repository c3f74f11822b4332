"""Medusa heads: K small networks that read the base model's last hidden state and guess ahead.

The base model's own lm_head turns the hidden state at position t into a guess for token t+1.
Head k (k = 1..K) reads the *same* hidden state and guesses token t+1+k. Each head is the
reference design from the Medusa paper: a stack of residual blocks `x + SiLU(W x + b)` (W starts
at zero, so an untrained block is the identity) followed by a vocabulary-sized linear layer that
starts as a copy of the base lm_head. At initialisation every head therefore predicts what the
base model predicts for t+1 — a sensible starting point that training shifts k tokens further.

*Reading the root* (optional, off in the published heads). When the heads guess, the base
model has already chosen the root: the token right after the hidden state's position. The hidden
state only implies that token; a small head cannot work out the base model's argmax over the
whole vocabulary, so it is told: head k reads `h + P_k e(root)`, with `e` the base model's own
(frozen) input embedding and `P_k` a learned hidden x hidden matrix that starts at zero (an
untrained projection leaves the reference head unchanged). The first step of Hydra's sequential
heads; it costs one embedding lookup per round.

A *draft vocabulary* (optional) limits the heads' guesses to the few thousand tokens a model
actually writes, ranked by how often it wrote them (FR-Spec, Zhao et al. 2025). Projecting a
hidden state onto 8,192 rows instead of 49,152 makes drafting several times cheaper, and the
verify pass still scores the full vocabulary, so the output is unchanged: a token outside the
draft vocabulary can only be missed, never wrongly accepted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .assets import HEADS_CONFIG, read_heads_config
from .packed_linear import PackedLinear, can_pack

if TYPE_CHECKING:
    from .model import LoadedModel

# The medusa drafter's name, and the key of its part in `LoadedModel.parts`.
MEDUSA = "medusa"

WEIGHTS_NAME = "medusa_heads.safetensors"


@dataclass
class HeadsConfig:
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    # Medusa "version 2" checkpoints have no per-head vocab projection: every head reuses the
    # base model's lm_head. Such heads are applied with `lm_head` passed to `forward`.
    shared_lm_head: bool = False
    # Guess only among these many tokens (their ids are the `draft_vocab` buffer); None: all.
    draft_vocab_size: int | None = None
    # Each head also reads the root token (see `MedusaHeads`); off for every published checkpoint.
    reads_root: bool = False


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)), with the linear layer zero-initialised so the block starts as identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class TransposedLinear(nn.Module):
    """A frozen linear layer stored as (in, out), for products of a few rows on a CPU.

    nn.Linear keeps its weight as (out, in). For the handful of rows a draft multiplies by the
    vocabulary matrix, PyTorch's CPU kernels stream the (in, out) layout several times faster
    (measured on this project's CPU: 2 rows x 8192 x 256 in 0.45 ms against 1.7 ms, weights
    not in cache). Same weights, same product. Where oneDNN can pack the weights (float32) the
    packed copy is faster still and is used instead (see `few_rows_projection`).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous(), persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight_t
        return out if self.bias is None else out + self.bias


def few_rows_projection(linear: nn.Module) -> nn.Module:
    """A vocabulary projection laid out for the 1-16 rows a draft multiplies by it, on a CPU.

    Packed once for oneDNN where that works (float32: see packed_linear.py), else stored
    transposed (see TransposedLinear): both multiply a few rows several times faster than
    nn.Linear's own layout. A layer that is not a plain CPU nn.Linear (a GPU's, or one already
    packed) is returned as it is.
    """
    if type(linear) is not nn.Linear or linear.weight.device.type != "cpu":
        return linear
    if can_pack(linear):
        return PackedLinear(linear, one_row_packed=True)
    return TransposedLinear(linear)


def vocabulary_rows(lm_head: nn.Linear, token_ids: torch.Tensor) -> nn.Linear:
    """A frozen copy of the lm_head's rows for `token_ids`: a draft vocabulary's projection."""
    rows = nn.Linear(lm_head.in_features, len(token_ids), bias=lm_head.bias is not None)
    rows.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)
    with torch.no_grad():
        rows.weight.copy_(lm_head.weight[token_ids])
        if lm_head.bias is not None:
            rows.bias.copy_(lm_head.bias[token_ids])
    return rows.requires_grad_(False)


def draft_indices(draft_vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) each token id's index in the draft vocabulary `draft_vocab`, -1 outside it."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_vocab.device)
    index[draft_vocab] = torch.arange(len(draft_vocab), device=draft_vocab.device)
    return index


class MedusaHeads(nn.Module):
    """K heads. `forward(hidden)` returns logits of shape (K, *hidden.shape[:-1], vocab)."""

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
        # Where these heads come from, when not from their checkpoint ("trained on this page for
        # 60 s"): the drafter says it in every trace. Not saved.
        self.origin = ""
        # The module layout `heads.{i}.{j}` mirrors the published checkpoints' `{i}.{j}` keys,
        # where j < num_layers are ResBlocks and j == num_layers is the vocab projection.
        self.heads = nn.ModuleList(self._make_head() for _ in range(config.num_heads))
        if config.reads_root:
            self.root_projections = nn.ModuleList(
                nn.Linear(config.hidden_size, config.hidden_size, bias=False) for _ in range(config.num_heads))
            for projection in self.root_projections:
                nn.init.zeros_(projection.weight)
        self.draft_vocab: torch.Tensor | None
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size))
        else:
            self.draft_vocab = None

    def _make_head(self) -> nn.Sequential:
        c = self.config
        blocks: list[nn.Module] = [ResBlock(c.hidden_size) for _ in range(c.num_layers)]
        if not c.shared_lm_head:
            blocks.append(nn.Linear(c.hidden_size, self.guess_vocab_size, bias=False))
        return nn.Sequential(*blocks)

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def head_parameters(self, head: int) -> list[nn.Parameter]:
        """What head `head` (1-based) learns: its blocks, and its root projection if it reads one."""
        parameters = list(self.heads[head - 1].parameters())
        if self.config.reads_root:
            parameters += list(self.root_projections[head - 1].parameters())
        return parameters

    @property
    def guess_vocab_size(self) -> int:
        """How many tokens a head chooses among: the draft vocabulary, or the whole vocabulary."""
        return self.config.draft_vocab_size or self.config.vocab_size

    def draft_projection(self, lm_head: nn.Linear) -> nn.Linear:
        """The base lm_head cut to the draft vocabulary's rows (a frozen copy), or lm_head itself."""
        return lm_head if self.draft_vocab is None else vocabulary_rows(lm_head, self.draft_vocab)

    def token_ids(self, guesses: torch.Tensor) -> torch.Tensor:
        """Map the heads' output indices (into the draft vocabulary) to token ids."""
        return guesses if self.draft_vocab is None else self.draft_vocab[guesses]

    def init_from_lm_head(self, lm_head: nn.Linear) -> None:
        """Copy the base model's lm_head into every head's projection (the reference init)."""
        if self.config.shared_lm_head:
            return
        with torch.no_grad():
            for head in self.heads:
                head[-1].weight.copy_(self.draft_projection(lm_head).weight)

    def _check_lm_head(self, lm_head: nn.Module | None) -> None:
        if self.config.shared_lm_head and lm_head is None:
            raise ValueError("these heads reuse the base lm_head: pass it in")

    def _head_input(self, index: int, hidden: torch.Tensor, root_embedding: torch.Tensor | None) -> torch.Tensor:
        if not self.config.reads_root:
            return hidden
        if root_embedding is None:
            raise ValueError("these heads read the root token: pass its embedding")
        return hidden + self.root_projections[index](root_embedding)

    def head_logits(self, index: int, hidden: torch.Tensor, lm_head: nn.Module | None = None,
                    root_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of head `index` (0-based) alone: training backpropagates one head at a time."""
        self._check_lm_head(lm_head)
        out = self.heads[index](self._head_input(index, hidden, root_embedding))
        return lm_head(out) if self.config.shared_lm_head else out

    def forward(
        self, hidden: torch.Tensor, lm_head: nn.Module | None = None, num_heads: int | None = None,
        root_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of the first `num_heads` heads (all by default): a tree of depth 2 needs two."""
        self._check_lm_head(lm_head)
        outs = [head(self._head_input(i, hidden, root_embedding))
                for i, head in enumerate(self.heads[: num_heads or self.num_heads])]
        if self.config.shared_lm_head:
            # One (K, H) x (H, V) product reads the vocabulary matrix once for all heads; on a
            # CPU that read, not the arithmetic, is most of a head's cost.
            return lm_head(torch.stack(outs))
        return torch.stack(outs)

    # ----- the project's own layout: safetensors + a small JSON config -----
    def save(self, directory: str | Path, extra: dict | None = None) -> None:
        """Write `medusa_heads.safetensors` and `medusa_config.json` (plus any `extra` fields)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_NAME))
        meta = {"format": "medusa-playground", **asdict(self.config), **(extra or {})}
        (directory / HEADS_CONFIG).write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> tuple[MedusaHeads, dict]:
        """Load heads saved by `save`; also returns the whole JSON (it may hold a tree, accuracies)."""
        directory = Path(directory)
        meta = read_heads_config(directory)
        fields = HeadsConfig.__dataclass_fields__
        heads = cls(HeadsConfig(**{k: meta[k] for k in fields if k in meta}))
        heads.load_state_dict(load_file(str(directory / WEIGHTS_NAME)))
        return heads, meta


@dataclass
class MedusaPart:
    """What the medusa drafter drafts with, as `LoadedModel.parts` holds it: the heads, how often
    each head's rank-r guess was right on held-out text (`accuracy[h][r]`, when saved with them:
    `--tree auto` grows its trees from it, see tree_choice.py), and the base model's lm_head."""

    heads: MedusaHeads
    accuracy: list[list[float]] | None
    base_lm_head: nn.Module = field(repr=False)

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    @cached_property
    def lm_head(self) -> nn.Module:
        """The vocabulary projection shared-lm_head heads draft through: the lm_head's rows for
        the heads' draft vocabulary (all of them when the heads have none).

        On a CPU it is a copy laid out for products of a few rows (see `few_rows_projection`),
        made on the first draft. On a GPU there is nothing to gain, and a 7B model's copy would
        cost hundreds of MB, so there it is the lm_head itself.
        """
        if not self.heads.config.shared_lm_head:
            return self.base_lm_head
        return few_rows_projection(self.heads.draft_projection(self.base_lm_head))


def medusa_part(lm: LoadedModel) -> MedusaPart | None:
    """The model's Medusa heads and what goes with them, or None when it was loaded without."""
    return lm.parts.get(MEDUSA)


def heads_count(lm: LoadedModel) -> int:
    """How many Medusa heads the model has (0 without)."""
    part = medusa_part(lm)
    return 0 if part is None else part.num_heads


def with_heads(lm: LoadedModel, heads: MedusaHeads, accuracy: list[list[float]] | None = None) -> LoadedModel:
    """A copy of `lm` that drafts with other heads (the shipped ones are left as they are)."""
    return lm.with_part(MEDUSA, MedusaPart(heads, accuracy, lm.model.get_output_embeddings()))
