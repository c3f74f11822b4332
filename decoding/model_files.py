"""Reading model files: a directory or a hub id, a causal LM, its tokenizer. No drafter here.

The base model (loading.py) and what a drafter drafts with (a draft model, an EAGLE head: see
drafters/) are found and read the same way, so each says only what is its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .errors import DecodingError
from .kv_cache import attention_layer_types


def download(repo_id: str) -> Path:
    """Fetch a hub repository (or find it in the local cache) the ordinary way."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id))
    except Exception as e:  # the hub client raises many types: offline, 404, gated, auth...
        raise DecodingError(
            f"could not fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Check the name and your internet connection, or pass a local directory."
        ) from e


def is_hub_id(name: str) -> bool:
    """`owner/name` as the hub spells it; a path like `/data/x` or `./x/y` is not one."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) is not None and not Path(name).exists()

def local_or_hub(source: str | Path, what: str) -> Path:
    """`source` as a directory: itself, or a hub repository fetched into the local cache.
    `what` names it in the error ("draft model", "EAGLE head")."""
    if not isinstance(source, str | Path):
        raise DecodingError(f"{what}: a directory or a hub id (owner/name), not {source!r}")
    path = Path(source)
    if path.is_dir():
        return path
    if not is_hub_id(str(source)):
        raise DecodingError(f"{what} {source!s}: not a directory and not a hub id (owner/name)")
    return download(str(source))


def context_length(config) -> int:
    """The positions the model was built for. A sliding window does not shorten it: the window
    only limits how far back each position looks, and the tree mask applies it."""
    text = config.get_text_config()
    length = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return int(length or 2048)


def load_causal_lm(source: str | Path, device: torch.device, dtype: torch.dtype | None) -> PreTrainedModel:
    """The base model in `dtype`; None loads float32, for `choose_cpu_dtype` to decide."""
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as e:
        raise DecodingError(f"could not read a model config from {source!s}: {e}") from e
    if getattr(config, "is_encoder_decoder", False):
        raise DecodingError(f"{source!s} is an encoder-decoder model; Medusa needs a decoder-only LM")
    if getattr(config, "alibi", False) or config.model_type in ("bloom", "mpt"):
        raise DecodingError(
            f"{config.model_type} uses ALiBi attention biases, which ignore position ids: a tree "
            "of candidates cannot be verified in one pass on it"
        )
    attention_layer_types(config)  # refuses recurrent layers (Mamba...) before loading any weights
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype or torch.float32, device_map=str(device) if device.type == "cuda" else None
        )
    except Exception as e:
        raise DecodingError(f"could not load {source!s} as a causal LM: {e}") from e
    return model.to(device).eval().requires_grad_(False)


def load_tokenizer(source: str | Path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as e:  # missing files, or files it cannot read
        raise DecodingError(f"could not load a tokenizer from {source!s} (a model directory needs its "
                            f"tokenizer files, such as tokenizer.json): {e}") from e
