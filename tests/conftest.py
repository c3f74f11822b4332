"""Shared fixtures: tiny real-architecture models, built from configs and loaded like any other."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may touch the hub

from decoding import load_model  # noqa: E402
from decoding.tiny import make_tiny_model_dir  # noqa: E402

ARCHITECTURES = ("llama", "qwen2", "gpt2")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """One saved model directory per architecture: config, weights, tokenizer, untrained heads."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_model_dir(root / arch, arch=arch) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    return {arch: load_model(str(path)) for arch, path in tiny_dirs.items()}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]
