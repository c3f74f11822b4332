"""The EAGLE draft head: one decoder layer that guesses the base model's *next feature*.

Medusa's head k guesses the token k places ahead from one hidden state, blind to what the heads
before it guessed. EAGLE (Li et al., 2024) drafts one step at a time instead, at the level of
features: the base model's final hidden state f_j at position j chose token t_{j+1}; the draft
layer reads

    x_j = fc([embedding(t_{j+1}); f_j])          (the token just chosen, and the state that chose it)

attends over the x's before it (its own small KV cache), and outputs a guess of f_{j+1}. The
base model's own lm_head turns that guess into the next token's distribution. To look two steps
ahead it feeds its own guessed feature back in with the guessed token, and so on: each guess is
made knowing the guesses before it.

The layer is the base model's own decoder layer class, built with the base model's config (so
its shape, norms and rotary positions are the base's); the embedding and the lm_head are the
base model's, frozen and not stored here. Like Medusa's heads, it may guess only within a draft
vocabulary (the lm_head rows of the tokens the model writes most, see heads.py).

Two layouts are read: the project's own (`eagle_config.json` + `eagle.safetensors`, written by
`save`), and the published EAGLE-1/EAGLE-2 checkpoints (`config.json` + `pytorch_model.bin` or
`model.safetensors`, keys `fc.*` and `layers.0.*`, see `load_published`). Their first layer has
no input norm: `fc`'s output goes straight into attention.
"""

from __future__ import annotations

import copy
import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from .errors import DecodingError
from .features import FINAL_STATE

EAGLE_DIR = "eagle"  # beside a model's Medusa heads: its EAGLE draft head, if it has one
EAGLE_CONFIG = "eagle_config.json"
EAGLE_WEIGHTS = "eagle.safetensors"
PUBLISHED_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass
class EagleConfig:
    hidden_size: int
    vocab_size: int
    # Guess only among these many tokens (their ids are the `draft_vocab` buffer); None: all.
    draft_vocab_size: int | None = None
    # The published checkpoints' layer has no input norm; the project's keeps the base layer's.
    input_norm: bool = True
    fc_bias: bool = True
    # EAGLE-3: the base model's hidden states of these layers (indices into its
    # `output_hidden_states`), side by side, fused into one feature by a linear layer, are what the
    # draft reads for the text; None: the final normed state alone (EAGLE-1).
    feature_layers: list[int] | None = None


# What model code calls the cache argument of a decoder layer: transformers 5's name, then older ones.
LAYER_CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "layer_past")
# The draft layer attends to all it has read: a full-attention layer, whatever the base's mix.
DRAFT_LAYER_TYPE = "full_attention"


def decoder_parts(base: PreTrainedModel) -> tuple[type[nn.Module], nn.Module, str]:
    """The base model's decoder layer class, its rotary embedding module and the name its layers
    give the cache argument, or a DecodingError.

    The draft layer is built from the base's own layer class, which must take rotary position
    embeddings from outside (Llama, Qwen2, Mistral, Gemma, GPT-NeoX, ...): GPT-2's blocks add
    learned positions to the input instead, and an EAGLE layer for them is not built here.
    """
    decoder = base.get_decoder()
    layers, rotary = getattr(decoder, "layers", None), getattr(decoder, "rotary_emb", None)
    layer_class = type(layers[0]) if layers else None
    parameters = inspect.signature(layer_class.forward).parameters if layer_class else {}
    cache_argument = next((name for name in LAYER_CACHE_ARGUMENTS if name in parameters), None)
    if layer_class is None or rotary is None or "position_embeddings" not in parameters or cache_argument is None:
        raise DecodingError(
            f"EAGLE builds its draft layer from the base model's own decoder layer with rotary "
            f"positions; {base.config.model_type}'s layers are not of that kind, so it has no EAGLE drafter here")
    return layer_class, rotary, cache_argument


def layer_config(base_config: PreTrainedConfig) -> PreTrainedConfig:
    """The base's text config for a one-layer draft: layer 0 of this config is the draft layer.

    It is a full-attention layer with no sliding window, whatever the base's layers are (a
    window would make its cache drop rows the tree mask still counts). Its attention is the
    library's SDPA (eager where scores are soft-capped): the draft's output is only ever a
    guess, checked by the base model, so it need not match a step's arithmetic.
    """
    config = copy.deepcopy(base_config.get_text_config(decoder=True))
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = [DRAFT_LAYER_TYPE]
    config.use_sliding_window = False
    if hasattr(config, "sliding_window"):
        config.sliding_window = None
    config._attn_implementation = "eager" if getattr(config, "attn_logit_softcapping", None) else "sdpa"
    config.dtype = _torch_dtype(getattr(config, "dtype", None))
    return config


def _torch_dtype(value: object) -> torch.dtype | None:
    """A config's dtype as a torch.dtype, which layers that make tensors in it need (Apertus'
    xIELU activation): `save_pretrained` leaves the name it wrote ("float32") in the config."""
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else None


def check_base_shape(what: str, hidden_size: int, vocab_size: int, base: PreTrainedModel) -> None:
    """A DecodingError in one line where a drafter's part (`what`: "this EAGLE head is") was made
    for a base model of another hidden size or vocabulary."""
    text = base.config.get_text_config(decoder=True)
    if hidden_size != text.hidden_size or vocab_size != text.vocab_size:
        raise DecodingError(
            f"{what} for a model of hidden size {hidden_size} and {vocab_size} tokens, but "
            f"{text.model_type} has {text.hidden_size} and {text.vocab_size}: it belongs to another base model")


class EagleHead(nn.Module):
    """fc([embedding; feature]) -> one decoder layer -> a guess of the next feature."""

    def __init__(self, config: EagleConfig, base: PreTrainedModel) -> None:
        super().__init__()
        check_base_shape("this EAGLE head is", config.hidden_size, config.vocab_size, base)
        self.config = config
        layer_class, rotary, self.cache_argument = decoder_parts(base)
        self.layer_config = layer_config(base.config)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        layers = config.feature_layers
        self.fuse = nn.Linear(len(layers) * config.hidden_size, config.hidden_size, bias=False) if layers else None
        self.layer = layer_class(self.layer_config, layer_idx=0)
        if not config.input_norm:
            self.layer.input_layernorm = nn.Identity()
        self.rotary = type(rotary)(config=self.layer_config)
        # Models whose rotary depends on the layer type (Gemma 3, OLMo 3) are asked for the draft's.
        self.rotary_layer_type = ({"layer_type": DRAFT_LAYER_TYPE}
                                  if "layer_type" in inspect.signature(self.rotary.forward).parameters else {})
        self.draft_vocab: torch.Tensor | None
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size))
        else:
            self.draft_vocab = None

    @property
    def reads_layers(self) -> tuple[int, ...]:
        """The base model's hidden states this head reads for the text (see passes.FINAL_STATE)."""
        return tuple(self.config.feature_layers) if self.config.feature_layers else FINAL_STATE

    def text_features(self, states: torch.Tensor) -> torch.Tensor:
        """What the draft layer reads for a position of the text, from the base model's states there.

        EAGLE-3 fuses a low, a middle and a high layer into one feature: the low layers still
        hold which token is where, the high ones what comes next. EAGLE-1 reads the final state.
        Guessed positions read the draft's own output instead (it is never fused).
        """
        return states if self.fuse is None else self.fuse(states)

    @property
    def guess_vocab_size(self) -> int:
        return self.config.draft_vocab_size or self.config.vocab_size

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor, positions: torch.Tensor,
                cache: object, attention_mask: torch.Tensor) -> torch.Tensor:
        """Guessed next features (B, T, H) for input features and token embeddings (B, T, H).

        `positions` (B, T) are the positions of the features read; `cache` (a DynamicCache of
        one layer) gains a row per input; `attention_mask` (B, 1, T, past + T) is additive.
        """
        x = self.fc(torch.cat([token_embeddings, features], dim=-1))
        rotary = self.rotary(x, positions, **self.rotary_layer_type)
        return self.layer(x, attention_mask=attention_mask, position_ids=positions, **{self.cache_argument: cache},
                          use_cache=cache is not None, position_embeddings=rotary)

    def token_ids(self, guesses: torch.Tensor) -> torch.Tensor:
        """Map indices into the draft vocabulary to token ids."""
        return guesses if self.draft_vocab is None else self.draft_vocab[guesses]

    # ----- the project's own layout -----
    def save(self, directory: str | Path, extra: dict | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()
                 if not k.startswith("rotary.")}
        save_file(state, str(directory / EAGLE_WEIGHTS))
        meta = {"format": "medusa-playground-eagle", **asdict(self.config), **(extra or {})}
        (directory / EAGLE_CONFIG).write_text(json.dumps(meta, indent=2))


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def _fill(head: EagleHead, state: dict[str, torch.Tensor], source: Path) -> EagleHead:
    """Load `state` into `head`, or a one-line DecodingError naming what does not fit."""
    expected = {k: v.shape for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    missing = sorted(set(expected) - set(state))
    wrong = sorted(k for k in expected.keys() & state.keys() if tuple(state[k].shape) != tuple(expected[k]))
    if missing or wrong:
        detail = f"missing {', '.join(missing[:3])}" if missing else \
            f"{wrong[0]} is {tuple(state[wrong[0]].shape)}, expected {tuple(expected[wrong[0]])}"
        raise DecodingError(f"the EAGLE head in {source} does not fit this base model's layer: {detail}")
    head.load_state_dict({k: state[k] for k in expected}, strict=True)
    return head


def load_own(directory: Path, base: PreTrainedModel) -> tuple[EagleHead, dict]:
    """An EAGLE head saved by `EagleHead.save`, and its whole JSON (accuracies, training record)."""
    try:
        meta = json.loads((directory / EAGLE_CONFIG).read_text(encoding="utf-8"))
        config = EagleConfig(**{k: meta[k] for k in EagleConfig.__dataclass_fields__ if k in meta})
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise DecodingError(f"could not read the EAGLE config in {directory}: {e}") from e
    head = EagleHead(config, base)
    return _fill(head, load_file(str(directory / EAGLE_WEIGHTS)), directory), meta


def load_published(directory: Path, base: PreTrainedModel) -> EagleHead:
    """A published EAGLE-1/EAGLE-2 checkpoint: a Llama-style `config.json` of the base's shape
    and weights `fc.weight`, `fc.bias` and `layers.0.*` (their layer 0 has no input norm); an
    `embed_tokens.weight` copy of the base's embedding is ignored: the base's own is used."""
    weights = next((directory / name for name in PUBLISHED_WEIGHTS if (directory / name).is_file()), None)
    if weights is None:
        raise DecodingError(f"no EAGLE weights in {directory}: expected one of {', '.join(PUBLISHED_WEIGHTS)}")
    state = _load_state(weights)
    if "fc.weight" not in state or not any(k.startswith("layers.0.") for k in state):
        raise DecodingError(f"{weights} is not an EAGLE-1/2 checkpoint: it has no fc.weight and layers.0.* keys")
    if any(k.startswith("layers.1.") for k in state):
        raise DecodingError(f"{weights} has more than one draft layer; this engine builds one-layer EAGLE heads")
    fc = state["fc.weight"]
    text = base.config.get_text_config(decoder=True)
    config = EagleConfig(hidden_size=fc.shape[0], vocab_size=text.vocab_size,
                         input_norm="layers.0.input_layernorm.weight" in state, fc_bias="fc.bias" in state)
    if fc.shape != (text.hidden_size, 2 * text.hidden_size):
        raise DecodingError(f"the EAGLE head in {directory} reads features of size {fc.shape[1] // 2}, "
                            f"but the base model's are {text.hidden_size}: it belongs to another base model")
    head = EagleHead(config, base)
    renamed = {"layer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k: v
               for k, v in state.items()}
    return _fill(head, renamed, directory)


def find_eagle(directory: Path, base: PreTrainedModel) -> tuple[EagleHead | None, dict]:
    """The EAGLE head in `directory` (either layout), or (None, {}) when there is none."""
    if (directory / EAGLE_CONFIG).is_file():
        return load_own(directory, base)
    if any((directory / name).is_file() for name in PUBLISHED_WEIGHTS):
        return load_published(directory, base), {}
    return None, {}
