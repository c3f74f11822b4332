"""Which models the app offers, and loading each one once for every visitor.

The engine's `available_models()` lists the embedded models first, then, where a GPU is present,
the registry's published Medusa models. If no embedded model exists yet (a fresh clone before the
heads are trained), the app still starts, on a tiny random model the engine can build in a second:
its text is gibberish, but every view works.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from decoding import (MODEL_REGISTRY, DecodeSettings, DecodingError, MedusaModel, available_models,
                      embedded_model_title, embedded_models, generate, load_model)
from decoding.tiny import make_tiny_model_dir

from .gpu import ON_ZERO_GPU

# Set to a model name or directory to make it the default (the tests point it at a tiny model).
MODEL_ENV = "MEDUSA_PLAYGROUND_MODEL"
TINY = "tiny-random"


def model_choices() -> list[tuple[str, str]]:
    """(label, name) pairs for the model dropdown, default first."""
    names = available_models()
    override = os.environ.get(MODEL_ENV)
    if override:
        names = [override] + [n for n in names if n != override]
    if not names:
        names = [TINY]
    return [(describe(name), name) for name in names]


def describe(name: str) -> str:
    if name == TINY:
        return "tiny random model (no trained model yet: gibberish, but every view works)"
    if name in embedded_models():
        return embedded_model_title(name)
    entry = MODEL_REGISTRY.get(name)
    return f"{name} — {entry.description}" if entry else name


class ModelCache:
    """Loads each model once and hands the same object to every visitor."""

    def __init__(self) -> None:
        self._models: dict[str, MedusaModel] = {}
        self._lock = threading.Lock()
        self._tiny_dir: Path | None = None

    def get(self, name: str) -> MedusaModel:
        """The loaded model, or DecodingError with a message for the page."""
        with self._lock:
            if name not in self._models:
                self._models[name] = self._load(name)
            return self._models[name]

    def _load(self, name: str) -> MedusaModel:
        if name == TINY:
            if self._tiny_dir is None:
                self._tiny_dir = make_tiny_model_dir(Path(tempfile.mkdtemp(prefix="medusa-tiny-")))
            return load_model(str(self._tiny_dir))
        try:
            # The load-time self-test is a forward pass, which ZeroGPU forbids outside a GPU call.
            return load_model(name, self_test=not ON_ZERO_GPU)
        except DecodingError:
            raise
        except Exception as e:  # a broken download or checkpoint must not take the app down
            raise DecodingError(f"could not load model {name!r}: {type(e).__name__}: {e}") from e


def warm_up(model: MedusaModel) -> None:
    """One short run of each decoder, so the first visitor does not pay for lazy initialisation."""
    for method in ("ar", "medusa"):
        generate(model, "It is", DecodeSettings(method=method, max_new_tokens=4))
