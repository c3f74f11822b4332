"""The model the project ships in assets/: loads offline, decodes losslessly, heads far above chance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decoding import DecodeSettings, generate, load_model
from decoding.loading import DEFAULT_MODEL, EMBEDDED_MODELS_DIR
from decoding.train_heads import measure_head_accuracy, self_distill

ROOT = Path(__file__).resolve().parent.parent
BENCH_PROMPTS = (ROOT / "assets" / "prompts" / "bench_austen.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def austen():
    return load_model()  # no name: the embedded default


def test_default_is_the_embedded_model(austen):
    assert austen.name == DEFAULT_MODEL
    assert austen.num_heads == 5 and austen.device.type == "cpu"
    assert austen.default_tree in austen.trees


def test_loads_offline_in_a_fresh_process():
    code = "from decoding import load_model; m = load_model(); print(m.name, m.num_heads)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [DEFAULT_MODEL, "5"]


def test_model_data_fits_the_size_budget():
    data = [p for p in (EMBEDDED_MODELS_DIR / DEFAULT_MODEL).iterdir() if p.suffix in (".safetensors", ".json")]
    assert sum(p.stat().st_size for p in data) <= 40 * 2**20


def test_heads_beat_chance_by_a_wide_margin(austen):
    """On the model's own continuations of prompts it never trained on (chance is 1/8192)."""
    sequences = self_distill(austen.model, austen.tokenizer, BENCH_PROMPTS[:6], max_new_tokens=48,
                             greedy_and_sampled=False, progress=False)
    accuracy = measure_head_accuracy(austen.model, austen.heads, sequences, top_k=5)
    top1 = [row[0] for row in accuracy]
    top5 = [sum(row) for row in accuracy]
    assert top1[0] > 0.25 and top5[0] > 0.5
    assert all(t > 0.05 for t in top1)  # even head 5, guessing 6 tokens ahead: 400x chance


def test_greedy_medusa_equals_plain_greedy_on_unseen_prompts(austen):
    for prompt in BENCH_PROMPTS[:3]:
        medusa = generate(austen, prompt, DecodeSettings(max_new_tokens=64))
        plain = generate(austen, prompt, DecodeSettings(method="ar", max_new_tokens=64))
        assert medusa.tokens == plain.tokens
        assert medusa.forward_passes < plain.forward_passes
        assert medusa.mean_accepted > 1.3
