"""Medusa decoding, instrumented: every round of every run is traced for the UI, CLI and tests.

    from decoding import load_model, DecodeSettings, generate
    mm = load_model()                      # the embedded model, offline, on the CPU
    trace = generate(mm, "It was a fine morning", DecodeSettings(max_new_tokens=64))
    print(trace.text, trace.mean_accepted)
"""

from .errors import DecodingError
from .generate import autoregressive_decode, generate, medusa_decode, stream
from .loading import MedusaModel, available_models, embedded_model_title, embedded_models, load_model
from .registry import MODEL_REGISTRY, RegistryEntry
from .settings import DecodeSettings
from .trace import RoundTrace, RunSettings, RunTrace, TreeTrace
from .tree import TREE_PRESETS, Tree

__all__ = [
    "DecodingError", "DecodeSettings", "MedusaModel", "MODEL_REGISTRY", "RegistryEntry",
    "RoundTrace", "RunSettings", "RunTrace", "TREE_PRESETS", "Tree", "TreeTrace",
    "autoregressive_decode", "available_models", "embedded_model_title", "embedded_models", "generate",
    "load_model", "medusa_decode", "stream",
]
