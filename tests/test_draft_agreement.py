"""scripts/draft_agreement.py: the speculative-decoding replay, and the measurement on tiny models."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from decoding.tiny import tiny_config, tiny_tokenizer
from scripts import draft_agreement
from scripts.draft_agreement import Tally

VOCAB = 300


def test_replay_accepts_drafts_up_to_the_first_disagreement() -> None:
    tally = Tally(sequences=[[True, True, False, True, False, False]])
    # chain 2: [T T]+1 -> 3 tokens; [T F]: 1 draft + 1 -> 2; [F] -> 1: 6 tokens in 3 passes
    assert tally.tokens_per_pass(2) == 2.0
    assert tally.tokens_per_pass(1) == 6 / 4  # [T]+1, [F], [T]+1, [F]... = 2, 1, 2, 1
    assert Tally(sequences=[[False] * 5]).tokens_per_pass(4) == 1.0  # nothing accepted: plain decoding
    assert Tally(sequences=[[True] * 9]).tokens_per_pass(8) == 9.0  # one pass for the whole run


def save_model(folder: Path, seed: int) -> Path:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(tiny_config("llama", VOCAB, hidden=32)).save_pretrained(folder)
    tiny_tokenizer(VOCAB).save_pretrained(folder)
    return folder


def run(tmp_path: Path, draft: Path, corpus: str) -> dict:
    out = tmp_path / "result.json"
    draft_agreement.main(["--target", str(tmp_path / "target"), "--draft", str(draft), "--corpus", corpus,
                          "--seq-len", "32", "--continuations", "4", "--prompt-tokens", "8", "--new-tokens", "8",
                          "--time-tokens", "2", "--json", str(out)])
    return json.loads(out.read_text())


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    return save_model(tmp_path / "target", seed=0), save_model(tmp_path / "other", seed=1)


def test_on_records_only_answer_positions_count(tmp_path: Path, models: tuple[Path, Path]) -> None:
    rng = random.Random(0)
    records = tmp_path / "records"
    records.mkdir()
    prompts = [[rng.randrange(1, VOCAB) for _ in range(5)] for _ in range(300)]
    answers = [[rng.randrange(1, VOCAB) for _ in range(7)] for _ in range(300)]
    (records / "shard-00000.json").write_text(json.dumps({"instructions": [""] * 300, "prompts": prompts,
                                                          "answers": answers}))
    target, other = models
    itself = run(tmp_path, target, str(records))["heldout_answers"]
    assert itself["top1_agreement"] == 1.0 and itself["positions"] % 7 == 0 and itself["positions"] > 0
    assert itself["tokens_per_pass_chain4"] > 1.0
    assert run(tmp_path, other, str(records))["heldout_answers"]["top1_agreement"] < 0.5


def test_on_text_windows_and_the_targets_continuations(tmp_path: Path, models: tuple[Path, Path]) -> None:
    words = ["the quick brown fox", "a single man", "good fortune", "in want of a wife", "heads guess"]
    rng = random.Random(1)
    book = "\n\n".join(" ".join(rng.choice(words) for _ in range(30)) for _ in range(200))
    (tmp_path / "book.txt").write_text(book)
    target, other = models
    itself = run(tmp_path, target, str(tmp_path / "book.txt"))
    assert itself["heldout_windows"]["top1_agreement"] == 1.0
    assert itself["greedy_continuations"]["positions"] == 4 * 8
    assert itself["greedy_continuations"]["tokens_per_pass_chain8"] == 8.0  # each 8-token continuation in one pass
    assert itself["step_ms"]["draft"] > 0
    assert run(tmp_path, other, str(tmp_path / "book.txt"))["heldout_windows"]["top1_agreement"] < 0.5
