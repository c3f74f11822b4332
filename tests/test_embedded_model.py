"""The models the project ships in assets/: load offline, decode losslessly, heads far above chance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decoding import DecodeSettings, available_drafters, embedded_models, generate, load_model, loading
from decoding.loading import EMBEDDED_MODELS_DIR
from decoding.medusa_modules import heads_count, medusa_part
from decoding.prompts import example_prompts, prompt_set, shipped_prompts
from decoding.training.data import DataSettings, self_distill
from decoding.training.evaluate import evaluate_heads

ROOT = Path(__file__).resolve().parent.parent


def bench_prompts(model: str) -> list[str]:
    """The benchmark prompts shipped for embedded model `model` (what `bench --prompts` is given)."""
    return shipped_prompts(f"bench_{prompt_set(model)}")


@pytest.fixture(scope="module", params=embedded_models())
def embedded(request):
    return load_model(request.param)


def test_offline_the_default_is_the_embedded_austen_model(monkeypatch):
    monkeypatch.setattr(loading, "is_fetched", lambda name: False)  # SmolLM2's base never fetched
    austen = load_model()  # no name: the default
    assert austen.name == "austen" == embedded_models()[0]
    assert heads_count(austen) == 5 and austen.device.type == "cpu"
    assert austen.default_tree in austen.trees


def test_once_fetched_smollm2_is_the_default_everywhere(monkeypatch):
    from app.models import offered_models

    monkeypatch.setattr(loading, "is_fetched", lambda name: name == "smollm2")
    monkeypatch.delenv("MEDUSA_PLAYGROUND_MODEL", raising=False)
    assert loading.default_model() == "smollm2" == embedded_models()[0] == offered_models()[0]
    assert loading._resolve(None, None).name == "smollm2"


def test_every_embedded_model_ships_its_prompts_and_card(embedded):
    assert embedded.default_tree in embedded.trees
    assert len(example_prompts(embedded.name)) >= 3 and len(bench_prompts(embedded.name)) >= 10
    assert (EMBEDDED_MODELS_DIR / embedded.name / "README.md").stat().st_size > 2000


def test_loads_offline_in_a_fresh_process():
    code = ("from decoding import embedded_models, load_model\nfrom decoding.medusa_modules import heads_count\n"
            "for name in embedded_models(): m = load_model(name); print(m.name, heads_count(m))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == embedded_models()


def test_model_data_fits_the_size_budget():
    """Everything the embedded models load (weights, tokenizers, configs, draft models) together:
    at most 80 MB (SmolLM2 ships only its heads and its 13 MB draft model here; its base weights
    are fetched into a cache; stdlib-mtp, the sixth, 6.5 MB)."""
    data = [p for p in EMBEDDED_MODELS_DIR.glob("**/*") if p.suffix in (".safetensors", ".json")]
    assert any(p.parent.name == "draft" for p in data)
    assert sum(p.stat().st_size for p in data) <= 80 * 2**20


def test_heads_beat_chance_by_a_wide_margin(embedded):
    """On the model's own continuations of prompts it never trained on (chance is 1/vocabulary)."""
    if medusa_part(embedded).heads.config.reads_root:
        pytest.skip("heads that read the root are measured on held-out recorded answers by "
                    "train-heads --recorded, and decoded against chance in test_smollm2.py")
    prompts = bench_prompts(embedded.name)[:6]
    greedy = DataSettings(max_new_tokens=48, sampled=False, gen_batch_size=16)
    sequences = self_distill(embedded.model, embedded.tokenizer, prompts, greedy, progress=False).sequences
    accuracy = evaluate_heads(embedded.model, medusa_part(embedded).heads, sequences, top_k=5).accuracy
    top1 = [row[0] for row in accuracy]
    top5 = [sum(row) for row in accuracy]
    assert top1[0] > 0.25 and top5[0] > 0.5
    assert all(t > 0.05 for t in top1)  # even the last head, guessing furthest ahead: 200x chance


def test_greedy_medusa_equals_plain_greedy_on_unseen_prompts(embedded):
    medusa_passes = plain_passes = tokens = 0
    for prompt in bench_prompts(embedded.name)[:3]:
        # The heads' shipped tree, not auto: this measures the heads, not this machine's costs.
        medusa = generate(embedded, prompt, DecodeSettings(max_new_tokens=64, tree="default"))
        plain = generate(embedded, prompt, DecodeSettings(method="ar", max_new_tokens=64))
        assert medusa.tokens == plain.tokens
        medusa_passes += medusa.forward_passes
        plain_passes += plain.forward_passes
        tokens += len(medusa.tokens)
    # Summed over the prompts: a continuation that ends after a few tokens has little to save.
    assert medusa_passes < plain_passes
    assert tokens / medusa_passes > 1.3


@pytest.mark.parametrize("method", ["draft-model", "prompt-lookup"])
def test_every_drafter_writes_plain_greedy_text_on_the_examples(embedded, method):
    """Each shipped model carries a draft model; every drafter writes what plain decoding writes."""
    assert method in available_drafters(embedded)
    for prompt in example_prompts(embedded.name)[:3]:
        drafted = generate(embedded, prompt, DecodeSettings(method=method, max_new_tokens=48))
        plain = generate(embedded, prompt, DecodeSettings(method="ar", max_new_tokens=48))
        assert drafted.tokens == plain.tokens, prompt


def test_a_model_can_share_another_models_prompts():
    """`prompt_set` in a heads config points at another model's prompt files; others read their own."""
    for name in embedded_models():
        shared = prompt_set(name)
        assert example_prompts(name) == shipped_prompts(shared)
        assert len(shipped_prompts(f"bench_{shared}")) >= 10
    assert prompt_set("no-such-model") == "no-such-model"
