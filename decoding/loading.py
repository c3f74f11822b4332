"""Loading a base model, its tokenizer and its Medusa heads, from any of the layouts in use.

Where heads come from:
- the project's own layout: `medusa_heads.safetensors` + `medusa_config.json` (what
  `train-heads` writes), inside the model's directory or given with `heads=`;
- Medusa v0.1 (e.g. FasterDecoding/medusa-vicuna-7b-v1.3): a directory holding `config.json`
  (with `base_model_name_or_path`) and `medusa_lm_head.safetensors` or `medusa_lm_head.pt`,
  keys `{i}.{j}.linear.weight/bias` for the ResBlocks and `{i}.{L}.weight` for the projection;
- Medusa v1.0 (e.g. FasterDecoding/medusa-1.0-zephyr-7b-beta): a whole model whose weights
  hold `medusa_head.{i}...` beside the base weights.
The number of heads is counted from the weights, never trusted from a config: the published
v0.1 config says 2 heads while its weights hold 5.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .errors import DecodingError
from .fetch import WHEEL_MODELS, fetched_dir, is_fetched
from .heads import CONFIG_NAME as OWN_HEADS_CONFIG
from .heads import HeadsConfig, MedusaHeads, TransposedLinear
from .kv_cache import attention_layer_types
from .packed_linear import pack_linear_layers
from .registry import MODEL_REGISTRY
from .selftest import check_tree_attention
from .tree import TREE_PRESETS

EMBEDDED_MODELS_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
DEFAULT_MODEL = "austen"
V01_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
V10_PREFIX = "medusa_head."
T = TypeVar("T")


@dataclass
class MedusaModel:
    """A base model with its heads, ready to decode. The app treats this as opaque."""

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
    _token_texts: dict[int, str] = field(default_factory=dict, repr=False)

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name == "heads":
            self.__dict__.pop("draft_lm_head", None)  # it was chosen for the heads being replaced

    @property
    def num_heads(self) -> int:
        return 0 if self.heads is None else self.heads.num_heads

    @cached_property
    def draft_lm_head(self) -> nn.Module:
        """The vocabulary projection shared-lm_head heads draft through: the lm_head's rows for
        the heads' draft vocabulary (all of them when the heads have none).

        On a CPU it is a transposed copy of the lm_head, which multiplies a few rows faster
        (see TransposedLinear). On a GPU there is nothing to gain, and a 7B model's copy would
        cost hundreds of MB, so there it is the lm_head itself.
        """
        lm_head = self.model.get_output_embeddings()
        if not self.heads.config.shared_lm_head:
            return lm_head
        lm_head = self.heads.draft_projection(lm_head)
        if self.device.type == "cpu" and isinstance(lm_head, nn.Linear):
            return TransposedLinear(lm_head)
        return lm_head

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


def resolve_device(device: str = "auto") -> torch.device:
    if device != "auto":
        try:
            return torch.device(device)
        except RuntimeError as e:
            raise DecodingError(f"unknown device {device!r}: {e}") from e
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 matmuls are slow there); bf16 on GPUs that have it, else fp16."""
    if dtype != "auto":
        named = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype not in named:
            raise DecodingError(f"unknown dtype {dtype!r}; use one of {sorted(named)}")
        return named[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def _loadable(directory: Path) -> bool:
    """An assets/models entry with heads, whose base is here too: a wheel model's must be fetched."""
    has_base = directory.name not in WHEEL_MODELS or is_fetched(directory.name)
    return (directory / OWN_HEADS_CONFIG).is_file() and has_base


def embedded_models() -> list[str]:
    """Names of the models in assets/models that can be loaded now, the default first."""
    if not EMBEDDED_MODELS_DIR.is_dir():
        return []
    names = sorted(p.name for p in EMBEDDED_MODELS_DIR.iterdir() if _loadable(p))
    return sorted(names, key=lambda name: name != DEFAULT_MODEL)


def embedded_model_title(name: str) -> str:
    """The title of an embedded model's card (its first `# ` heading), or the bare name."""
    card = EMBEDDED_MODELS_DIR / name / "README.md"
    if card.is_file():
        for line in card.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return name


def available_models() -> list[str]:
    """Embedded models first; then the registry's published models whose weights fit the GPU."""
    names = embedded_models()
    if torch.cuda.is_available():
        memory_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
        names += [name for name, entry in MODEL_REGISTRY.items() if entry.fits(memory_gb)]
    return names


def _download(repo_id: str) -> Path:
    """Fetch a hub repository (or find it in the local cache) the ordinary way."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id))
    except Exception as e:  # the hub client raises many types: offline, 404, gated, auth...
        raise DecodingError(
            f"could not fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Check the name and your internet connection, or pass a local directory."
        ) from e


# ----- reading heads from each layout -----
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
    meta = _read(config_path, lambda p: json.loads(p.read_text(encoding="utf-8")))
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
        missing, unexpected = heads.load_state_dict(own_state, strict=False)
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
    if any((directory / name).is_file() for name in V01_WEIGHTS):
        return _published_heads(_read_v01_state(directory), model_sizes, directory), {"format": "v0.1"}
    v10 = _read_prefixed_state(directory, V10_PREFIX)
    if v10:
        return _published_heads(v10, model_sizes, directory), {"format": "v1.0"}
    raise DecodingError(
        f"no Medusa heads found in {directory}: expected {OWN_HEADS_CONFIG} (this project), "
        f"{' or '.join(V01_WEIGHTS)} (Medusa v0.1) or '{V10_PREFIX}*' weights (Medusa v1.0)"
    )


# ----- the entry point -----
@dataclass
class _Sources:
    """Where the base model and the heads come from, once a user's name has been resolved."""

    name: str
    model: str | Path
    heads: Path
    prompt_template: str = "{prompt}"
    tree: str | None = None


def _resolve(name_or_path: str | None, heads: str | None) -> _Sources:
    name = name_or_path or DEFAULT_MODEL
    if name in WHEEL_MODELS:
        # The project ships only the heads; the base model is fetched once into the cache.
        return _Sources(name, fetched_dir(name), Path(heads) if heads else EMBEDDED_MODELS_DIR / name)
    if (EMBEDDED_MODELS_DIR / name).is_dir() and "/" not in name:
        path = EMBEDDED_MODELS_DIR / name
        return _Sources(name, path, Path(heads) if heads else path)
    if name in MODEL_REGISTRY:
        entry = MODEL_REGISTRY[name]
        heads_dir = _download(entry.heads)
        base = entry.base if entry.base else heads_dir
        return _Sources(name, base, heads_dir, entry.prompt_template, entry.tree)
    if name_or_path is None:
        raise DecodingError(
            f"the embedded model is missing from {EMBEDDED_MODELS_DIR / DEFAULT_MODEL}; "
            "train it with `python -m decoding train-base` (see README) or pass --model"
        )
    path = Path(name)
    if not path.is_dir():
        if not _is_hub_id(name):
            known = ", ".join(embedded_models() + list(MODEL_REGISTRY))
            raise DecodingError(
                f"unknown model {name!r}: not a directory, not a hub id (owner/name), "
                f"not one of: {known}"
            )
        path = _download(name)
    heads_dir = Path(heads) if heads else path
    if heads and not heads_dir.is_dir():
        if not _is_hub_id(heads):
            raise DecodingError(f"--heads {heads}: no such directory")
        heads_dir = _download(heads)
    if any((heads_dir / w).is_file() for w in V01_WEIGHTS) and heads_dir == path:
        return _Sources(name, _v01_base(path), heads_dir)
    return _Sources(name, path, heads_dir)


def _is_hub_id(name: str) -> bool:
    """`owner/name` as the hub spells it; a path like `/data/x` or `./x/y` is not one."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) is not None and not Path(name).exists()


def _v01_base(directory: Path) -> str:
    """The base model a v0.1 heads directory names in its own config.json."""
    config_path = directory / "config.json"
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


def _context_length(config) -> int:
    """The positions the model was built for. A sliding window does not shorten it: the window
    only limits how far back each position looks, and the tree mask applies it."""
    text = config.get_text_config()
    length = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return int(length or 2048)


def _load_base(source: str | Path, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
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
            source, dtype=dtype, device_map=str(device) if device.type == "cuda" else None
        )
    except Exception as e:
        raise DecodingError(f"could not load {source!s} as a causal LM: {e}") from e
    return model.to(device).eval().requires_grad_(False)


def load_model(
    name_or_path: str | None = None,
    heads: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    self_test: bool = True,
    with_heads: bool = True,
    pack_linear: bool = True,
) -> MedusaModel:
    """Load a model and its heads by embedded name, registry name, local directory or hub id.

    `None` means the embedded default model. With `self_test`, a tree is verified against
    plain linear decoding before the model is handed out (see `selftest.py`). Without
    `with_heads`, the model is loaded for plain decoding alone and no heads are looked for.
    With `pack_linear`, the base model's linear layers multiply by weights packed once for the
    CPU's matrix library where that works (see `packed_linear.py`): plain decoding and Medusa
    alike then run on the fastest path there is.
    """
    sources = _resolve(name_or_path, heads)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    model = _load_base(sources.model, torch_device, torch_dtype)
    medusa_heads, meta = find_heads(sources.heads, model) if with_heads else (None, {})
    if medusa_heads is not None:
        medusa_heads = medusa_heads.to(device=torch_device, dtype=torch_dtype).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(sources.model)
    if pack_linear:
        pack_linear_layers(model)
    trees = {**TREE_PRESETS, **meta.get("trees", {})}
    default_tree = meta.get("default_tree") or sources.tree or (
        "mc_sim_7b_63" if torch_device.type == "cuda" else "cpu-12")
    eos = model.generation_config.eos_token_id
    eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
    loaded = MedusaModel(
        name=sources.name,
        model=model,
        tokenizer=tokenizer,
        heads=medusa_heads,
        device=torch_device,
        dtype=torch_dtype,
        context_length=_context_length(model.config),
        trees=trees,
        default_tree=default_tree,
        eos_token_ids=eos_ids,
        prompt_template=sources.prompt_template,
        use_chat_template=sources.prompt_template == "{prompt}" and bool(getattr(tokenizer, "chat_template", None)),
    )
    if self_test:
        check_tree_attention(loaded)
    return loaded
