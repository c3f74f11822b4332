"""The recorder: every row is its question's own greedy answer; recordings resume without loss."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import GenerationConfig

from decoding.drafters.eagle import NAME as EAGLE
from decoding.errors import DecodingError
from decoding.tiny import tiny_model
from decoding.training import recording
from decoding.training.answer_batcher import TOP_K_LOGITS, ContinuousBatcher, feature_layers
from decoding.training.recording import (
    RecordingSettings,
    features_folder,
    finished_shards,
    load_shard,
    rebuild_missing_features,
    record,
)

STOP = frozenset([5, 7])  # a tiny random model writes one of these now and then: answers end at many lengths
MAX_NEW = 24


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab_size=320, layers=4)


def _questions(count: int, seed: int = 1) -> list[tuple[int, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 24, (count,), generator=g).tolist()
    return [(i, torch.randint(8, 320, (n,), generator=g).tolist()) for i, n in enumerate(lengths)]


def _generate_alone(model, prompt: list[int]) -> list[int]:
    config = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=sorted(STOP), pad_token_id=0)
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         generation_config=config)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_each_answer_is_generate_alone_rows_refilled_included(model, batch_size):
    questions = _questions(30)
    batcher = ContinuousBatcher(model, STOP, 0, MAX_NEW, batch_size)
    got = {r.question: r for r in batcher.answers(questions)}
    assert sorted(got) == [i for i, _ in questions]
    lengths = {len(r.answer) for r in got.values()}
    assert len(lengths) > 3, "answers of many lengths, so rows were refilled mid-batch"
    for i, prompt in questions:
        assert got[i].answer == _generate_alone(model, prompt), f"question {i}"


def test_features_and_top_k_are_the_models_own(model):
    """Each kept feature is the state a plain pass over prompt + answer has there; top-k its logits'."""
    (question,) = _questions(1, seed=3)
    (recorded,) = ContinuousBatcher(model, STOP, 0, MAX_NEW, 4).answers([question])
    tokens = torch.tensor([recorded.prompt + recorded.answer])
    with torch.inference_mode():
        out = model(input_ids=tokens, output_hidden_states=True)
    layers = feature_layers(model.config.num_hidden_layers)
    expected = torch.stack([out.hidden_states[i][0, :-1] for i in layers], dim=1)
    assert recorded.features.shape == (tokens.shape[1] - 1, len(layers), model.config.hidden_size)
    assert recorded.features.dtype == torch.float16
    torch.testing.assert_close(recorded.features.float(), expected, atol=2e-2, rtol=1e-2)
    answer_logits = out.logits[0, len(recorded.prompt) - 1: -1]
    assert recorded.top_ids.shape == (len(recorded.answer), TOP_K_LOGITS)
    assert recorded.top_ids[:, 0].tolist() == recorded.answer
    assert torch.equal(recorded.top_ids.long(), answer_logits.topk(TOP_K_LOGITS).indices)


def test_feature_layers_follow_eagle3():
    assert feature_layers(30) == (2, 15, 27, 30)
    assert feature_layers(2) == (1, 1, 0, 2)


class _Tokenizer:
    """A chat template that just frames the question's character codes."""

    def apply_chat_template(self, messages, **_):
        return {"input_ids": [3] + [8 + ord(c) % 300 for c in messages[0]["content"]] + [4]}

    pad_token_id = 0


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Recordings keep their features in the cache folder: a test's own."""
    monkeypatch.setenv("MEDUSA_PLAYGROUND_CACHE", str(tmp_path / "cache"))


def _record(model, out, questions):
    model.generation_config.eos_token_id = sorted(STOP)
    settings = RecordingSettings(max_new_tokens=MAX_NEW, batch_size=4, shard_size=5)
    return record(model, _Tokenizer(), questions, out, settings, {"model": "tiny"})


TEXTS = [f"question number {i} about {'x' * (i % 7)}" for i in range(17)]


def test_resume_skips_finished_shards_and_loses_nothing_when_killed(model, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    _record(model, clean, TEXTS)
    assert [p.name for p in finished_shards(clean)] == [f"shard-0000{i}" for i in range(4)]

    killed = tmp_path / "killed"
    real = recording.save_shard
    saved = []

    def save_then_die(path, *rest):
        real(path, *rest)
        saved.append(path)
        if len(saved) == 2:
            raise KeyboardInterrupt  # killed between shards, with answers of others in flight

    monkeypatch.setattr(recording, "save_shard", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        _record(model, killed, TEXTS)
    monkeypatch.setattr(recording, "save_shard", real)
    done = finished_shards(killed)
    assert len(done) == 2
    stamps = {p: p.with_suffix(".json").stat().st_mtime_ns for p in done}
    _record(model, killed, TEXTS)
    assert all(p.with_suffix(".json").stat().st_mtime_ns == t for p, t in stamps.items())
    for a, b in zip(finished_shards(clean), finished_shards(killed), strict=True):
        assert json.loads(a.with_suffix(".json").read_text()) == json.loads(b.with_suffix(".json").read_text())
        for x, y in zip(load_shard(a), load_shard(b), strict=True):
            # Another batch sums in another order: the same states, to rounding.
            torch.testing.assert_close(x.features.float(), y.features.float(), atol=2e-2, rtol=1e-2)
            assert torch.equal(x.top_ids[:, 0], y.top_ids[:, 0])


def test_a_partly_written_shard_is_not_finished(model, tmp_path):
    answers = tmp_path / "answers"
    _record(model, answers, TEXTS[:5])
    (shard,) = finished_shards(answers)
    shard.with_suffix(".json").unlink()  # as if killed between its features and its answers
    assert finished_shards(answers) == []
    _record(model, answers, TEXTS[:5])
    assert len(finished_shards(answers)) == 1


def test_answers_live_apart_from_features_which_are_rebuilt_from_them(model, tmp_path):
    """A new machine has the answers (token ids, in the repository) but not the features (cache)."""
    answers = tmp_path / "answers"
    _record(model, answers, TEXTS[:10])
    assert not list(answers.glob("*.safetensors"))
    written = {p: load_shard(p) for p in finished_shards(answers)}
    for stored in features_folder(answers).glob("*.safetensors"):
        stored.unlink()
    with pytest.raises(DecodingError, match="rebuild"):
        load_shard(next(iter(written)))
    assert rebuild_missing_features(model, answers) == 2
    for path, before in written.items():
        for x, y in zip(before, load_shard(path), strict=True):
            assert x.answer == y.answer
            torch.testing.assert_close(x.features.float(), y.features.float(), atol=2e-2, rtol=1e-2)
            assert torch.equal(x.top_ids[:, 0], y.top_ids[:, 0])


def test_a_folder_refuses_another_recordings_settings(model, tmp_path):
    _record(model, tmp_path, TEXTS[:5])
    with pytest.raises(DecodingError, match="other model"):
        record(model, _Tokenizer(), TEXTS[:5], tmp_path, RecordingSettings(MAX_NEW, 4, 5), {"model": "other"})


def test_a_recording_trains_a_fused_eagle_head_that_decodes_losslessly(tiny_dirs, tmp_path, capsys):
    """record -> train-eagle -> the saved EAGLE-3 head loads beside the model and writes plain decoding's text."""
    from decoding import DecodeSettings, generate, load_model
    from decoding.cli import main

    folder = tiny_dirs["llama"]
    base = load_model(folder, device="cpu", dtype="float32", drafters=(), self_test=False)
    texts = [f"the quick brown fox number {i} jumps over {'the lazy dog ' * (i % 3)}" for i in range(20)]
    settings = RecordingSettings(max_new_tokens=MAX_NEW, batch_size=6, shard_size=5)
    record(base.model, _Tokenizer(), texts, tmp_path / "recording", settings, {"model": "tiny"})
    out = tmp_path / "eagle"
    assert main(["train-eagle", "--model", str(folder), "--recorded", str(tmp_path / "recording"), "--out", str(out),
                 "--heldout-shards", "1", "--validation-shards", "1", "--epochs", "2", "--unroll", "2",
                 "--draft-vocab-size", "64", "--threads", "1", "--fused",
                 "--compare-eagle", str(folder / "eagle")]) == 0
    printed = capsys.readouterr().out
    assert "held out" in printed and "on the same held-out answers" in printed
    saved = json.loads((out / "eagle_config.json").read_text())
    assert saved["feature_layers"] == list(feature_layers(2))  # EAGLE-3's three layers and the final state
    assert saved["training"]["answer_tokens"]["train"] > 0 and len(saved["heldout"]["top1"]) == 6
    compared = saved["training"]["compared_on_same_heldout"][str(folder / "eagle")]
    assert compared["positions"] == saved["heldout"]["positions"]
    lm = load_model(folder, device="cpu", dtype="float32", drafters=("eagle",), sources={"eagle": str(out)})
    assert lm.parts[EAGLE].head.fuse is not None
    prompt = "It is a truth universally"
    eagle = generate(lm, prompt, DecodeSettings(method="eagle", max_new_tokens=24, eagle_nodes=8))
    assert eagle.tokens == generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=24)).tokens

    # --init-eagle: a run at learning rate 0 that starts from the saved head ends with its weights.
    again = tmp_path / "again"
    args = ["train-eagle", "--model", str(folder), "--recorded", str(tmp_path / "recording"), "--out", str(again),
            "--heldout-shards", "1", "--validation-shards", "1", "--epochs", "1", "--lr", "0", "--unroll", "2",
            "--threads", "1", "--init-eagle", str(out)]
    assert main([*args, "--fused"]) == 0
    first, second = (load_file(str(folder / "eagle.safetensors")) for folder in (out, again))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert json.loads((again / "eagle_config.json").read_text())["training"]["init_eagle"] == str(out)
    capsys.readouterr()
    assert main([*args, "--no-fused"]) == 2
    assert "--init-eagle" in capsys.readouterr().err
