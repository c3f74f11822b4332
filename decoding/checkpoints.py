"""Medusa heads on disk: reading the three layouts in use, and writing the published v0.1 one.

The layouts:
- the project's own: `medusa_heads.safetensors` + `medusa_config.json` (what `train-heads`
  writes, read and written by `MedusaHeads.load`/`save`), inside the model's directory or apart;
- Medusa v0.1 (e.g. FasterDecoding/medusa-vicuna-7b-v1.3): a directory holding `config.json`
  (with `base_model_name_or_path`) and `medusa_lm_head.safetensors` or `medusa_lm_head.pt`,
  keys `{i}.{j}.linear.weight/bias` for the ResBlocks and `{i}.{L}.weight` for the projection;
- Medusa v1.0 (e.g. FasterDecoding/medusa-1.0-zephyr-7b-beta): a whole model whose weights
  hold `medusa_head.{i}...` beside the base weights.
The number of heads is counted from the weights, never trusted from a config: the published
v0.1 config says 2 heads while its weights hold 5. Every layout is checked against the model
(hidden size, vocabulary) before its weights load, and a broken file is reported in one line.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import PreTrainedModel

from .assets import HEADS_CONFIG as OWN_HEADS_CONFIG
from .assets import read_heads_config
from .errors import DecodingError
from .medusa_modules import HeadsConfig, MedusaHeads

V01_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
V01_CONFIG = "config.json"
V10_PREFIX = "medusa_head."
T = TypeVar("T")

# What reading a missing, truncated or garbled file raises: json, safetensors and torch.load
# (a truncated .pt fails as a zip or as a pickle, depending on where it was cut).
_BROKEN_FILE = (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError, SafetensorError)


def _one_line(error: BaseException, limit: int = 200) -> str:
    """The error's message on one line, cut short: library messages can run to paragraphs."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _read(path: Path, read: Callable[[Path], T]) -> T:
    """`read(path)`, with a broken file reported in one line instead of a traceback."""
    try:
        return read(path)
    except DecodingError:
        raise
    except _BROKEN_FILE as e:
        raise DecodingError(f"cannot read {path}: {_one_line(e)}") from e


def _read_safetensors(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors in `path` whose names start with `prefix`, the prefix removed."""
    with safe_open(str(path), "pt") as f:
        return {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}


def _read_pickled_state(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise DecodingError(f"{path} holds a {type(state).__name__}, not a state dict of head weights")
    return state


def _check_fits(found: tuple[int, int], model: tuple[int, int], source: Path) -> None:
    """Heads read the model's hidden state and guess from its vocabulary: both sizes must match."""
    if found != model:
        raise DecodingError(
            f"heads in {source} were made for hidden size {found[0]} and vocabulary {found[1]}; "
            f"this model has {model[0]} and {model[1]}"
        )


def _own_heads(directory: Path, model_sizes: tuple[int, int]) -> tuple[MedusaHeads, dict]:
    """Heads in this project's layout; the config is checked against the model before any weights load."""
    config_path = directory / OWN_HEADS_CONFIG
    meta = _read(directory, read_heads_config)
    required = [f.name for f in dataclasses.fields(HeadsConfig) if f.default is dataclasses.MISSING]
    if not isinstance(meta, dict) or not all(type(meta.get(k)) is int and meta[k] >= 0 for k in required):
        raise DecodingError(f"{config_path} is not a heads config: it needs the whole numbers {', '.join(required)}")
    if not isinstance(meta.get("trees", {}), dict) or not isinstance(meta.get("default_tree", ""), str):
        raise DecodingError(f"{config_path}: 'trees' must map names to choices lists, 'default_tree' be a name")
    _check_fits((meta["hidden_size"], meta["vocab_size"]), model_sizes, directory)
    return _read(directory, MedusaHeads.load)


def _published_heads(state: dict[str, torch.Tensor], model_sizes: tuple[int, int], source: Path) -> MedusaHeads:
    """Build MedusaHeads from `{i}.{j}...` keys (v0.1 files; v1.0 keys with the prefix removed).

    Every size is read from the weights, never from a config: the published v0.1 config says 2
    heads while its weights hold 5.
    """
    keys = [k for k, v in state.items() if re.match(r"^\d+\.\d+\.", k) and isinstance(v, torch.Tensor)]
    if not keys:
        raise DecodingError(f"no Medusa head weights found in {source} (expected keys like '0.0.linear.weight')")
    num_heads = 1 + max(int(k.split(".")[0]) for k in keys)
    block_indices = [int(k.split(".")[1]) for k in keys if ".linear." in k]
    num_layers = 1 + max(block_indices) if block_indices else 0
    projection = state.get(f"0.{num_layers}.weight")
    block = state.get("0.0.linear.weight")
    if projection is None and block is None:
        raise DecodingError(f"Medusa head weights in {source} have neither ResBlocks nor a vocabulary projection")
    hidden = (projection if projection is not None else block).shape[-1]
    vocab = model_sizes[1] if projection is None else projection.shape[0]
    _check_fits((hidden, vocab), model_sizes, source)
    heads = MedusaHeads(HeadsConfig(num_heads, num_layers, hidden, vocab, projection is None))
    own_state = {f"heads.{k}": state[k] for k in keys}
    try:
        missing, unexpected = heads.load_state_dict(own_state, strict=True)
    except RuntimeError as e:  # one head shaped unlike the others
        raise DecodingError(f"Medusa head weights in {source} do not fit together: {_one_line(e)}") from e
    if missing or unexpected:
        raise DecodingError(
            f"Medusa head weights in {source} do not fit the expected layout: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    return heads


def _read_v01_state(directory: Path) -> dict[str, torch.Tensor]:
    for name in V01_WEIGHTS:
        path = directory / name
        if path.is_file():
            return _read(path, _read_safetensors if path.suffix == ".safetensors" else _read_pickled_state)
    raise DecodingError(f"{directory} has no {' or '.join(V01_WEIGHTS)}")


def _read_prefixed_state(directory: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors whose names start with `prefix`, from a model's safetensors or .bin shards."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        state.update(_read(path, partial(_read_safetensors, prefix=prefix)))
    if not state:
        for path in sorted(directory.glob("pytorch_model*.bin")):
            shard = _read(path, _read_pickled_state)
            state.update({k[len(prefix):]: v for k, v in shard.items() if k.startswith(prefix)})
    return state


def find_heads(directory: Path, model: PreTrainedModel) -> tuple[MedusaHeads, dict]:
    """Heads stored in `directory` in any supported layout, or a DecodingError naming them all."""
    if not directory.is_dir():
        raise DecodingError(f"heads directory {directory} does not exist")
    model_sizes = (model.config.get_text_config().hidden_size, model.get_output_embeddings().weight.shape[0])
    if (directory / OWN_HEADS_CONFIG).is_file():
        return _own_heads(directory, model_sizes)
    if is_v01_directory(directory):
        return _published_heads(_read_v01_state(directory), model_sizes, directory), {"format": "v0.1"}
    v10 = _read_prefixed_state(directory, V10_PREFIX)
    if v10:
        return _published_heads(v10, model_sizes, directory), {"format": "v1.0"}
    raise DecodingError(
        f"no Medusa heads found in {directory}: expected {OWN_HEADS_CONFIG} (this project), "
        f"{' or '.join(V01_WEIGHTS)} (Medusa v0.1) or '{V10_PREFIX}*' weights (Medusa v1.0)"
    )


def is_v01_directory(directory: Path) -> bool:
    """Whether `directory` holds Medusa v0.1 head weights."""
    return any((directory / name).is_file() for name in V01_WEIGHTS)


def v01_base_model(directory: Path) -> str:
    """The base model a v0.1 heads directory names in its own config.json."""
    config_path = directory / V01_CONFIG
    if not config_path.is_file():
        raise DecodingError(
            f"{directory} holds Medusa v0.1 heads but no config.json naming their base model: "
            "pass the base model with --model and these heads with --heads"
        )
    config = _read(config_path, lambda p: json.loads(p.read_text(encoding="utf-8")))
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise DecodingError(f"{directory} holds Medusa v0.1 heads but its config.json names no base model")
    return base



def save_v01(heads: MedusaHeads, directory: str | Path, base_model: str) -> None:
    """Write `medusa_lm_head.safetensors` + `config.json` as FasterDecoding's v0.1 repos have them.

    Our module path `heads.{i}.{j}` is the published `{i}.{j}` with a prefix, so the keys are
    `{i}.0.linear.weight`, `{i}.0.linear.bias`, `{i}.1.weight` for one ResBlock per head.
    """
    if heads.config.shared_lm_head:
        raise DecodingError("v0.1 heads have their own vocab projection; these reuse the lm_head")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        key.removeprefix("heads."): value.detach().contiguous().cpu()
        for key, value in heads.state_dict().items()
    }
    save_file(state, str(directory / V01_WEIGHTS[0]), metadata={"format": "pt"})
    config = {
        "medusa_num_heads": heads.config.num_heads,
        "medusa_num_layers": heads.config.num_layers,
        "base_model_name_or_path": base_model,
    }
    (directory / V01_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
