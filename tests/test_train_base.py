"""train-base on a tiny synthetic corpus, and the corpus splitting rules."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from decoding.errors import DecodingError
from decoding.training import cli as training_cli
from decoding.training import train_base
from decoding.training.corpus import (
    DOC_SEPARATOR,
    STDLIB_HELDOUT_EVERY,
    book_to_documents,
    build_corpus,
    build_stdlib_corpus,
    split_documents,
    stdlib_modules,
)

NAMES = ["Emma", "Harriet", "Mr. Knightley", "Elinor", "Marianne", "Anne"]
VERBS = ["walked to", "spoke of", "thought of", "wrote to", "smiled at", "called on"]
OBJECTS = ["the house", "her sister", "the village", "his friend", "the letter", "the garden"]


def fake_book(chapters: int = 6, paragraphs: int = 8, seed: int = 0) -> str:
    """A small hard-wrapped 'novel' with front matter and chapter headings."""
    rng = random.Random(seed)
    lines = ["A TINY NOVEL", "", "By Nobody", ""]
    for c in range(1, chapters + 1):
        lines += [f"CHAPTER {c}", ""]
        for _ in range(paragraphs):
            sentences = [f"{rng.choice(NAMES)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."
                         for _ in range(4)]
            text = " ".join(sentences)
            lines += [text[:40], "_" + text[40:] + "_", ""]  # hard wrap + italics markup
    return "\n".join(lines)


def test_book_to_documents_drops_front_matter_headings_and_markup() -> None:
    docs = book_to_documents(fake_book(chapters=3, paragraphs=2).splitlines())
    assert len(docs) == 3
    text = "\n".join(p for doc in docs for p in doc)
    assert "TINY NOVEL" not in text and "CHAPTER" not in text and "_" not in text
    assert all("\n" not in p and "  " not in p for doc in docs for p in doc)


def test_split_documents_holds_out_the_tail() -> None:
    docs = [[f"d{d}p{p} " + "x" * 50 for p in range(10)] for d in range(5)]
    train, heldout = split_documents(docs, heldout_fraction=0.25)
    flat_train = [p for doc in train for p in doc]
    flat_heldout = [p for doc in heldout for p in doc]
    assert flat_train + flat_heldout == [p for doc in docs for p in doc]  # order kept, no overlap
    assert len(flat_heldout) == pytest.approx(0.25 * 50, abs=1)
    assert flat_heldout[-1].startswith("d4p9")


def test_build_corpus_from_folder(tmp_path: Path) -> None:
    for i in range(2):
        (tmp_path / f"book{i}.txt").write_text(fake_book(seed=i), encoding="utf-8")
    train, heldout = build_corpus(str(tmp_path), heldout_fraction=0.1)
    assert train.count(DOC_SEPARATOR) >= 10  # chapters are separate documents
    assert heldout and heldout.split("\n\n")[0] not in train
    assert 0.05 < len(heldout) / (len(train) + len(heldout)) < 0.15


def tiny_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(fake_book(chapters=12, paragraphs=10), encoding="utf-8")
    parser = argparse.ArgumentParser()
    training_cli.add_train_base_arguments(parser)
    return parser.parse_args([
        "--corpus", str(corpus), "--out", str(tmp_path / "model"),
        "--vocab-size", "300", "--hidden-size", "32", "--layers", "2", "--heads", "2",
        "--intermediate-size", "64", "--seq-len", "32", "--batch-size", "8",
        "--lr", "1e-2", "--warmup-steps", "5", "--eval-every", "10", "--eval-batches", "2",
        "--log-every", "5", "--threads", "1", *extra,
    ])


def test_stdlib_corpus_keeps_code_verbatim_and_holds_out_whole_modules(tmp_path: Path) -> None:
    root = tmp_path / "lib"
    for i in range(2 * STDLIB_HELDOUT_EVERY):
        (root / "pkg").mkdir(parents=True, exist_ok=True)
        (root / "pkg" / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x + {i}   \n")
    for skipped in ("test/test_x.py", "encodings/cp1252.py", "_sysconfigdata__linux.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("SKIPPED = 1\n")
    assert len(stdlib_modules(root)) == 2 * STDLIB_HELDOUT_EVERY
    train, heldout = build_stdlib_corpus(root)
    held = heldout.split(DOC_SEPARATOR)
    assert len(held) == 2 and len(train.split(DOC_SEPARATOR)) == 2 * STDLIB_HELDOUT_EVERY - 2
    assert held[0] == f"def f{STDLIB_HELDOUT_EVERY - 1}(x):\n    return x + {STDLIB_HELDOUT_EVERY - 1}\n"
    assert "SKIPPED" not in train + heldout
    assert not set(held) & set(train.split(DOC_SEPARATOR))


def test_the_running_pythons_stdlib_is_a_corpus() -> None:
    names = {path.name for path in stdlib_modules()}
    assert {"argparse.py", "random.py", "dataclasses.py"} <= names and "cp1252.py" not in names


def test_train_save_reload_generate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert training_cli.run_train_base(tiny_args(tmp_path, "--max-steps", "40", "--save-every", "20")) == 0
    out = tmp_path / "model"
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 40 and log["tokens_seen"] == 40 * 8 * 32
    assert log["train_curve"][-1]["loss"] < log["train_curve"][0]["loss"] - 1.0
    assert log["heldout_curve"][-1]["loss"] < log["heldout_curve"][0]["loss"]
    assert log["command"].startswith("python -m decoding train-base ")
    assert (out / "loss_curve.png").stat().st_size > 0

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.tie_word_embeddings and model.config.max_position_embeddings >= 1024
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.eos_token_id
    prompt = "Emma walked to the house."
    inputs = tokenizer(prompt, return_tensors="pt")
    assert inputs.input_ids[0, 0] == tokenizer.bos_token_id
    assert tokenizer.decode(inputs.input_ids[0], skip_special_tokens=True) == prompt
    generated = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > inputs.input_ids.shape[1]


def test_resume_continues_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    straight = tmp_path / "straight"
    straight.mkdir()
    assert training_cli.run_train_base(tiny_args(straight, "--max-steps", "20", "--save-every", "10")) == 0

    # Simulate a kill right after the step-10 checkpoint, then resume with the same flags.
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    real_save = train_base.save_state

    def save_then_die(path: Path, state: dict) -> None:
        real_save(path, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_base, "save_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        training_cli.run_train_base(tiny_args(interrupted, "--max-steps", "20", "--save-every", "10"))
    monkeypatch.setattr(train_base, "save_state", real_save)
    state = torch.load(interrupted / "model" / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == 10

    assert training_cli.run_train_base(
        tiny_args(interrupted, "--max-steps", "20", "--save-every", "10", "--resume")) == 0
    log = json.loads((interrupted / "model" / "training_log.json").read_text())
    assert log["steps"] == 20 and log["resumed_from_steps"] == [10]
    from safetensors.torch import load_file

    a = load_file(straight / "model" / "model.safetensors")
    b = load_file(interrupted / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


def test_user_errors_are_reported(tmp_path: Path) -> None:
    with pytest.raises(DecodingError, match="no checkpoint"):
        training_cli.run_train_base(tiny_args(tmp_path, "--max-steps", "5", "--resume"))
    with pytest.raises(DecodingError, match="--corpus"):
        build_corpus(str(tmp_path / "missing.txt"))


def test_best_heldout_weights_are_kept_and_bf16_saving_leaves_training_in_fp32(tmp_path: Path) -> None:
    args = tiny_args(tmp_path, "--max-steps", "30", "--eval-every", "5", "--save-dtype", "bfloat16")
    assert training_cli.run_train_base(args) == 0
    out = tmp_path / "model"
    log = json.loads((out / "training_log.json").read_text())
    best = min(log["heldout_curve"], key=lambda point: point["loss"])
    assert log["best"]["step"] == best["step"] and log["best"]["heldout_loss"] == best["loss"]

    final = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in final.values()} == {torch.bfloat16}
    assert "lm_head.weight" not in final  # tied to the input embeddings: stored once
    assert {t.dtype for t in load_file(str(out / "best" / "model.safetensors")).values()} == {torch.bfloat16}
    trained = torch.load(out / "checkpoint" / "state.pt", weights_only=True)["model"]
    name = "model.layers.0.mlp.down_proj.weight"
    assert trained[name].dtype == torch.float32
    assert not torch.equal(trained[name], trained[name].to(torch.bfloat16).float())  # never rounded
    assert torch.equal(final[name], trained[name].to(torch.bfloat16))
