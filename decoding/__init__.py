"""Medusa decoding, instrumented: every round of every run is traced for the UI, CLI and tests.

    from decoding import load_model, DecodeSettings, generate
    lm = load_model()                      # SmolLM2 where fetched, else the embedded austen
    trace = generate(lm, "Why is the sky blue?", DecodeSettings(max_new_tokens=64))
    print(trace.text, trace.mean_accepted)

The names below are imported on first use, not with the package: `python -m decoding --help`
then answers at once instead of after the seconds it takes to import torch and transformers.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "DecodingError": "errors",
    "autoregressive_decode": "loops", "generate": "loops", "speculative_decode": "loops", "stream": "loops",
    "LoadedModel": "model", "available_models": "loading", "embedded_model_title": "loading",
    "embedded_models": "loading", "load_model": "loading",
    "MODEL_REGISTRY": "published", "RegistryEntry": "published",
    "DecodeSettings": "settings", "DRAFTERS": "drafters", "available_drafters": "drafters",
    "check_settings": "drafters", "register": "drafters",
    "RoundTrace": "trace", "RunSettings": "trace", "RunTrace": "trace", "TreeTrace": "trace",
    "TREE_PRESETS": "tree", "Tree": "tree",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
