"""`LoadedModel`: a model with its tokenizer and what drafts for it (Medusa heads, an EAGLE head,
a draft model...: each drafter loads its own into `parts`, see drafters/), ready to decode.

A plain data type: it reads no files and fetches nothing (`loading.py` builds one). The passes,
the round loops and the load-time self-test all take it, so it lives apart from the module that
does file and hub I/O.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import GenerationConfig, PreTrainedModel

from .attention import GATHERED
from .kv_cache import attention_layer_types
from .trace import CostCurve


@dataclass
class LoadedModel:
    """A model with its tokenizer and what each of its drafters drafts with, ready to decode.
    The app reads only the fields that describe it (see app/__init__.py); the engine's passes
    and loops use the rest."""

    name: str
    model: PreTrainedModel
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    context_length: int
    trees: dict[str, list[list[int]]]
    default_tree: str
    eos_token_ids: frozenset[int]
    prompt_template: str = "{prompt}"
    # Chat models read a prompt wrapped in their tokenizer's chat template (see encode_prompt).
    use_chat_template: bool = False
    # Why the model runs in `dtype` here, in a sentence; empty when the user named the dtype.
    dtype_reason: str = ""
    # What each drafter drafts with, by the drafter's name, as its own module loaded it (Medusa's
    # heads, EAGLE's head, the draft model...); a drafter without its part here is not offered.
    parts: dict[str, object] = field(default_factory=dict)
    # What a T-token pass costs here, once measured (see cost_curve.py).
    cost_curve: CostCurve | None = None
    # The same model in the other plain-decoding variants of its device, once loaded (baseline.py).
    plain_rivals: dict[str, LoadedModel] | None = None
    _token_texts: dict[int, str] = field(default_factory=dict, repr=False)

    def with_part(self, drafter: str, part: object | None) -> LoadedModel:
        """A copy of this model whose `drafter` drafts with `part` (None: a copy without it); this
        model and its parts are left as they are."""
        parts = {name: kept for name, kept in self.parts.items() if name != drafter}
        if part is not None:
            parts[drafter] = part
        return dataclasses.replace(self, parts=parts)

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
