"""Which models the page offers, and a small cache that loads each one once for every visitor.

The engine's `available_models()` lists the models that can load here: the embedded ones (a
wheel model such as SmolLM2 once it is fetched) and, where a GPU is present, the registry's
published Medusa models. The page offers exactly those, and refuses any other name, from the
menu or from the API: on a public server a visitor must not make it download or read other
models. A wheel model that is not fetched yet is named in the menu with the command that gets it.
If no embedded model exists (a fresh clone before the heads are trained), the page still starts
on a tiny random model the engine builds in a second: gibberish, but every view works.
"""

from __future__ import annotations

import gc
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from decoding import available_drafters
from decoding.assets import EMBEDDED_MODELS_DIR, HEADS_CONFIG, read_heads_config
from decoding.cost_curve import model_cost_curve
from decoding.errors import DecodingError
from decoding.fetch import WHEEL_MODELS, is_fetched, not_fetched_message
from decoding.loading import available_models, embedded_model_title, embedded_models, load_model
from decoding.loops import generate
from decoding.model import LoadedModel
from decoding.published import MODEL_REGISTRY
from decoding.settings import WARM_UP_TOKENS, DecodeSettings
from decoding.tiny import make_tiny_model_dir

from . import MODEL_ENV
from .gpu import ON_ZERO_GPU
from .model_thread import on_model_thread

TINY = "tiny-random"
KEEP_MODELS = 2  # loaded models kept in memory on a CPU; the least recently used one goes first
KEEP_MODELS_ON_GPU = 1  # two 7B models (28-30 GB in float16) do not fit a 24 GB GPU


def _wheel_models() -> dict[str, str]:
    """Wheel models and why each is missing, for those not fetched yet."""
    return {name: not_fetched_message(name) for name in WHEEL_MODELS if not is_fetched(name)}


def offered_models() -> list[str]:
    """The names the page offers and will load, default first."""
    names = available_models()
    override = os.environ.get(MODEL_ENV)
    if override:
        return [override] + [n for n in names if n != override]
    return names or [TINY]


def missing_models() -> dict[str, str]:
    """Models the page would offer once fetched, each with the command that fetches it."""
    offered = set(offered_models())
    return {name: why for name, why in _wheel_models().items() if name not in offered}


def model_note() -> str | None:
    """Under the model menu: which model is missing and the command that adds it (None if none)."""
    missing = missing_models()
    if not missing:
        return None
    return " ".join(f"Not here yet: {name} (run `python -m decoding fetch {name}` once, online)."
                    for name in missing)


def model_choices() -> list[tuple[str, str]]:
    """(label, name) pairs for the model menu, default first."""
    return [(describe(name), name) for name in offered_models()]


def describe(name: str) -> str:
    if name == TINY:
        return "tiny random model (no trained model yet: gibberish, but every view works)"
    if name in embedded_models():
        return embedded_model_title(name)
    entry = MODEL_REGISTRY.get(name)
    return f"{name} — {entry.description}" if entry else name


def require_offered(name: str) -> str:
    """`name` if the page offers it; else a DecodingError naming what it does offer."""
    offered = offered_models()
    if name in offered:
        return name
    why = missing_models().get(name)
    if why:
        raise DecodingError(why)
    raise DecodingError(f"model {name!r} is not offered here; choose one of: {', '.join(offered)}")


def heads_recipe(name: str) -> str | None:
    """"medusa-2" if an embedded model's base was tuned with its heads, "medusa-1" if it stayed
    frozen ("medusa-1-root" if its heads also read the root token), None if the model's heads
    config does not say (published models, directories)."""
    directory = EMBEDDED_MODELS_DIR / name
    if not (directory / HEADS_CONFIG).is_file():
        return None
    meta = read_heads_config(directory)
    training = meta.get("training")
    if not isinstance(training, dict):
        return None
    if "base_next_token_loss" in training or "--joint-lr" in str(training.get("command", "")):
        return "medusa-2"
    return "medusa-1-root" if meta.get("reads_root") else "medusa-1"


def models_to_keep() -> int:
    """How many loaded models fit in memory here: one on a GPU, KEEP_MODELS on a CPU."""
    return KEEP_MODELS_ON_GPU if torch.cuda.is_available() else KEEP_MODELS


class ModelCache:
    """Loads each model once and hands the same object to every visitor; keeps the last `keep`.

    Loading takes seconds to minutes, so it happens outside the cache's lock: a visitor asking for
    a loaded model never waits for another visitor's load. Two visitors asking for the same new
    model wait for one load (a lock per name). When the cache is full, the least recently used
    model is dropped *before* the new one loads, so the old and the new are never in memory
    together: on a GPU that holds one model, switching models would otherwise run out of memory.
    """

    def __init__(self, keep: int | None = None) -> None:
        self.keep = models_to_keep() if keep is None else keep
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}
        self._tiny_dir: Path | None = None

    def get(self, name: str) -> LoadedModel:
        """The loaded model, or DecodingError with a message for the page."""
        with self._lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
            name_lock = self._loading.setdefault(name, threading.Lock())
        with name_lock:
            with self._lock:
                if name in self._models:  # loaded by the visitor we waited for
                    return self._models[name]
                dropped = self._drop_least_recent(keep=self.keep - 1)
            if dropped:
                gc.collect()  # free the dropped model's memory now, not whenever the collector runs
            model = self._load(name)
            with self._lock:
                self._models[name] = model
                self._drop_least_recent(keep=self.keep)  # another visitor's model may have arrived
                self._loading.pop(name, None)
            return model

    def _drop_least_recent(self, keep: int) -> bool:
        """Forget models, least recently used first, until `keep` are left; True if any went.
        The caller holds the lock."""
        dropped = False
        while len(self._models) > max(keep, 0):
            self._models.popitem(last=False)
            dropped = True
        return dropped

    def loaded_model(self, name: str) -> LoadedModel | None:
        """The model in memory whose `LoadedModel.name` is `name` (as its traces record it), or
        None; never loads one."""
        with self._lock:
            return next((model for model in self._models.values() if model.name == name), None)

    def loaded(self) -> list[str]:
        """Names in memory, least recently used first."""
        with self._lock:
            return list(self._models)

    @on_model_thread
    def _load(self, name: str) -> LoadedModel:
        if name == TINY:
            if self._tiny_dir is None:
                self._tiny_dir = make_tiny_model_dir(Path(tempfile.mkdtemp(prefix="medusa-tiny-")))
            model = load_model(str(self._tiny_dir))
            model_cost_curve(model)
            return model
        try:
            # The load-time self-test is a forward pass, which ZeroGPU forbids outside a GPU call;
            # so is timing this machine's passes, which the trees chosen here are chosen by (there,
            # they are the heads' default tree). Timed once at load, so no run waits for it.
            model = load_model(name, self_test=not ON_ZERO_GPU)
            if not ON_ZERO_GPU:
                model_cost_curve(model)
            return model
        except DecodingError:
            raise
        except Exception as e:  # a broken download or checkpoint must not take the app down
            raise DecodingError(f"could not load model {name!r}: {type(e).__name__}: {e}") from e


@on_model_thread
def warm_up(model: LoadedModel) -> None:
    """One short run of each decoder, so the first visitor does not pay for lazy initialisation."""
    for method in ("ar", *available_drafters(model)):
        generate(model, "It is", DecodeSettings(method=method, max_new_tokens=WARM_UP_TOKENS))
