"""Heads trained on the spot (the page's Train tab): they learn, they are the visitor's own, they
decode losslessly, and every bad request is refused in one line."""

from __future__ import annotations

import json
import random

import pytest
import torch

from decoding import DecodeSettings, generate
from decoding.cli import main
from decoding.errors import DecodingError
from decoding.limits import PAGE_LIMITS, training_problem
from decoding.medusa_modules import medusa_part
from decoding.training.quick_heads import TrainedHeads, TrainingTrace, train_heads_live, with_trained_heads
from tests.test_lossless import reference_greedy

ANSWERS = 48
NEW_TOKENS = 32
CYCLE = 24  # tokens the answers go round


def write_cycle_recording(folder, tokenizer, vocab_size: int, model: str):
    """A recording in the layout `record` writes, whose answers go round one cycle of tokens: what
    comes two tokens on is learnable, and the same on held-out answers. (An untrained tiny model's
    own answers have no rule to learn.)"""
    rng = random.Random(0)
    cycle = rng.sample(range(1, vocab_size), CYCLE)  # never 0, the end token
    prompts, answers = [], []
    for _ in range(ANSWERS):
        start = rng.randrange(CYCLE)
        prompts.append(tokenizer("a question").input_ids + [cycle[start]])
        answers.append([cycle[(start + 1 + i) % CYCLE] for i in range(NEW_TOKENS)])
    (folder / "recording.json").write_text(json.dumps({"model": model}))
    (folder / "shard-00000.json").write_text(json.dumps(
        {"feature_layers": [-1], "questions": list(range(ANSWERS)), "prompts": prompts, "answers": answers}))
    return folder


@pytest.fixture(scope="module")
def recording(tiny_llama, tmp_path_factory):
    return write_cycle_recording(tmp_path_factory.mktemp("recording"), tiny_llama.tokenizer,
                                 medusa_part(tiny_llama).heads.config.vocab_size, tiny_llama.name)


def train(lm, recording, heads=(1,), seconds=3.0) -> tuple[list[TrainingTrace], TrainedHeads]:
    updates = list(train_heads_live(lm, heads, seconds, recording=recording))
    *traces, trained = updates
    assert isinstance(trained, TrainedHeads)
    return traces, trained


def test_a_trained_head_beats_its_fresh_start_and_leaves_the_shipped_heads_alone(tiny_llama, recording):
    shipped = {name: p.clone() for name, p in medusa_part(tiny_llama).heads.state_dict().items()}
    traces, trained = train(tiny_llama, recording)
    trace = trained.trace
    assert [t.phase for t in traces][0] == "reading" and trace.phase == "done"
    assert trace.train_answers + trace.heldout_answers == ANSWERS and trace.heldout_answers > 0
    assert trace.steps > 0 and trace.stop_reason == "time_limit"
    assert trace.latest.top1[0] > trace.untrained.top1[0] + 0.1  # head 1 learned
    assert trace.latest.top1[1] == trace.untrained.top1[1]  # head 2 was not asked to learn
    assert trained.heads is not medusa_part(tiny_llama).heads
    for name, p in medusa_part(tiny_llama).heads.state_dict().items():
        assert torch.equal(p, shipped[name]), name
    assert json.loads(json.dumps(trace.to_dict()))["trained_heads"] == [1]


def test_the_answers_are_read_once(tiny_llama, recording):
    first, _ = train(tiny_llama, recording, seconds=1.0)
    again, trained = train(tiny_llama, recording, seconds=1.0)
    assert trained.trace.read_now is False


def test_decoding_with_trained_heads_is_lossless_and_says_whose_heads(tiny_llama, recording):
    _, trained = train(tiny_llama, recording, heads=(1, 2), seconds=2.0)
    visitor = with_trained_heads(tiny_llama, trained)
    assert medusa_part(visitor).heads is trained.heads and medusa_part(tiny_llama).heads is not trained.heads
    prompt = "the quick brown fox"
    run = generate(visitor, prompt, DecodeSettings(method="medusa", max_new_tokens=24, tree="auto"))
    assert run.tokens == reference_greedy(tiny_llama, prompt, 24)[: len(run.tokens)]
    assert "trained on this page" in run.drafter.origin
    shipped_run = generate(tiny_llama, prompt, DecodeSettings(method="medusa", max_new_tokens=8))
    assert shipped_run.drafter.origin == ""


@pytest.mark.parametrize("heads, seconds, words", [
    ((), 2.0, "at least one head"),
    ((0,), 2.0, "heads 1 to"),
    ((99,), 2.0, "heads 1 to"),
    ((1,), 0.0, "1 to 60 seconds"),
    ((1,), 10_000.0, "1 to 60 seconds"),
    ((1,), float("nan"), "1 to 60 seconds"),
])
def test_bad_requests_are_refused_in_one_line(tiny_llama, recording, heads, seconds, words):
    with pytest.raises(DecodingError, match=words):
        next(iter(train_heads_live(tiny_llama, heads, seconds, recording=recording)))


def test_a_model_without_a_recording_is_refused(tiny_llama):
    with pytest.raises(DecodingError, match="no recorded answers"):
        next(iter(train_heads_live(tiny_llama, (1,), 2.0)))


def test_heads_trained_on_one_model_do_not_decode_another(tiny_models, recording):
    _, trained = train(tiny_models["llama"], recording, seconds=1.0)
    with pytest.raises(DecodingError, match="trained on"):
        with_trained_heads(tiny_models["qwen2"], trained)


def test_training_seconds_limit_is_the_pages():
    assert training_problem(PAGE_LIMITS.train_seconds) is None
    assert training_problem(True) is not None and training_problem("60") is not None


def test_quick_train_command(tiny_dirs, recording, capsys, monkeypatch):
    # The command names the model by its folder; the recording's manifest names the fixture's model.
    monkeypatch.setattr("decoding.training.quick_heads.recordings_of", lambda name: [recording])
    assert main(["quick-train", "--model", str(tiny_dirs["llama"]), "--seconds", "1", "--learn", "all"]) == 0
    out = capsys.readouterr().out
    assert "held-out top-1: untrained -> trained" in out and "steps in" in out
    assert main(["quick-train", "--model", str(tiny_dirs["llama"]), "--learn", "one"]) == 2
