"""`LoadedModel`: a model with its tokenizer and what drafts for it (Medusa heads, an EAGLE head,
a draft model: each drafter loads its own, see drafters/), ready to decode.

A plain data type: it reads no files and fetches nothing (`loading.py` builds one). The passes,
the round loops and the load-time self-test all take it, so it lives apart from the module that
does file and hub I/O.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel

from .attention import GATHERED
from .eagle import EagleHead
from .heads import MedusaHeads, TransposedLinear, vocabulary_rows
from .kv_cache import attention_layer_types
from .packed_linear import PackedLinear, can_pack
from .trace import CostCurve


@dataclass
class LoadedModel:
    """A model with its tokenizer, heads and draft model (each where it has one), ready to
    decode. The app reads only the fields that describe it (see app/__init__.py); the engine's
    passes and loops use the rest."""

    name: str
    model: PreTrainedModel
    tokenizer: object
    heads: MedusaHeads | None  # None when loaded for plain decoding only
    device: torch.device
    dtype: torch.dtype
    context_length: int
    trees: dict[str, list[list[int]]]
    default_tree: str
    eos_token_ids: frozenset[int]
    prompt_template: str = "{prompt}"
    # Chat models read a prompt wrapped in their tokenizer's chat template (see encode_prompt).
    use_chat_template: bool = False
    # A smaller model over the same tokenizer, for the draft-model drafter (itself a LoadedModel,
    # without heads or a draft of its own); None when there is none.
    draft: LoadedModel | None = None
    # A one-layer EAGLE draft over the model's features (see eagle.py), for the eagle drafter.
    eagle: EagleHead | None = None
    # Why the model runs in `dtype` here, in a sentence; empty when the user named the dtype.
    dtype_reason: str = ""
    # acc[h][r]: how often head h+1's rank-r guess was right on held-out text, when the heads
    # were saved with it; `--tree auto` grows its trees from it (see tree_choice.py).
    head_accuracy: list[list[float]] | None = None
    # How often EAGLE's depth-d guess was right on held-out text, given the guesses before it
    # were (its own saved record), when it has one.
    eagle_accuracy: list[float] | None = None
    # What a drafter drafts with, by the drafter's name, for a drafter that keeps it here (the MTP
    # modules); Medusa's heads, EAGLE's head and the draft model still have fields of their own.
    parts: dict[str, object] = field(default_factory=dict)
    # What a T-token pass costs here, once measured (see cost_curve.py).
    cost_curve: CostCurve | None = None
    # The same model in the other plain-decoding variants of its device, once loaded (baseline.py).
    plain_rivals: dict[str, LoadedModel] | None = None
    _token_texts: dict[int, str] = field(default_factory=dict, repr=False)

    @property
    def num_heads(self) -> int:
        return 0 if self.heads is None else self.heads.num_heads

    @cached_property
    def draft_lm_head(self) -> nn.Module:
        """The vocabulary projection shared-lm_head heads draft through: the lm_head's rows for
        the heads' draft vocabulary (all of them when the heads have none).

        On a CPU it is a copy laid out for products of a few rows (see `few_rows_projection`).
        On a GPU there is nothing to gain, and a 7B model's copy would cost hundreds of MB, so
        there it is the lm_head itself. It is computed once, for the heads the model was made
        with: to try other heads, decode with a copy, `dataclasses.replace(lm, heads=other)`,
        which computes its own.
        """
        lm_head = self.model.get_output_embeddings()
        if not self.heads.config.shared_lm_head:
            return lm_head
        return few_rows_projection(self.heads.draft_projection(lm_head))

    @cached_property
    def eagle_lm_head(self) -> nn.Module:
        """The lm_head rows of the EAGLE head's draft vocabulary (all rows without one), frozen;
        on a CPU laid out for the few rows a draft multiplies, like `draft_lm_head`."""
        lm_head = self.model.get_output_embeddings()
        rows = lm_head if self.eagle.draft_vocab is None else vocabulary_rows(lm_head, self.eagle.draft_vocab)
        return few_rows_projection(rows)

    @property
    def gathered_attention(self) -> bool:
        """Whether every step and verify pass runs through `attention.gathered_attention`."""
        return self.model.config._attn_implementation == GATHERED

    @property
    def may_part_from_plain(self) -> bool:
        """Whether greedy drafting may write other tokens than plain decoding: half precision on a
        CPU without gathered attention (see attention.py)."""
        return self.device.type == "cpu" and self.dtype != torch.float32 and not self.gathered_attention

    @cached_property
    def forward_parameters(self) -> frozenset[str]:
        """The names the model's forward takes, read once: model code differs between families."""
        return frozenset(inspect.signature(self.model.forward).parameters)

    @property
    def cache_argument(self) -> str:
        """transformers 5 renamed `past_key_values` to `cache`; older model code has the old name."""
        return "cache" if "cache" in self.forward_parameters else "past_key_values"

    @cached_property
    def layer_types(self) -> list[str]:
        """Each layer's attention, "full_attention" or "sliding_attention": the tree mask differs."""
        return attention_layer_types(self.model.config)

    def token_text(self, token: int) -> str:
        """The text of one token, memoised: tracing reads it for every node of every round."""
        text = self._token_texts.get(token)
        if text is None:
            text = self.tokenizer.decode([token])
            self._token_texts[token] = text
        return text


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


def stop_token_ids(generation_config: GenerationConfig) -> frozenset[int]:
    """The tokens that end a generation: the config's `eos_token_id`, an int, a list or None.

    The generation config's, not the tokenizer's: decoding stops where the model's own
    `generate` would, and a model that declares no stop token is decoded to the length asked.
    """
    eos = generation_config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def padding_id(tokenizer: object, stop_ids: frozenset[int]) -> int:
    """The id to pad a batch with: the tokenizer's, else a stop token, else 0.

    Padded positions are masked out (or come after a stop token), so any id would do; these are
    the ones `generate` is least surprised by.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        return pad
    return min(stop_ids) if stop_ids else 0
