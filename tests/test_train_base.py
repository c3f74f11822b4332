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
from decoding.training import base_tokens, train_base, training_cli
from decoding.training.corpus import (
    DOC_SEPARATOR,
    STDLIB_HELDOUT_EVERY,
    Record,
    book_to_documents,
    build_corpus,
    build_record_corpus,
    build_stdlib_corpus,
    record_folders,
    split_documents,
    split_records,
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


# ----- a given tokenizer (draft models), and self-distill records as the corpus ----------------
def chat_tokenizer(tmp_path: Path, bos: bool = True, pad: bool = True) -> Path:
    """A small BPE saved like a chat model's: PAD, BOS and EOS are three different tokens (0, 1, 2),
    it adds no BOS itself, and its vocabulary (280) is not train-base's --vocab-size (300)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([fake_book(seed=7)], trainer=trainer)
    special = {"eos_token": "</s>", **({"bos_token": "<s>"} if bos else {}), **({"pad_token": "<pad>"} if pad else {})}
    folder = tmp_path / f"tokenizer-{bos}-{pad}"
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special).save_pretrained(folder)
    return folder


def tokenizer_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*token*") if p.name != "loss_curve.png")


def test_a_given_tokenizer_sets_the_vocabulary_and_special_ids(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = chat_tokenizer(tmp_path)
    given = AutoTokenizer.from_pretrained(folder)
    assert len(given) == 280 and (given.pad_token_id, given.bos_token_id, given.eos_token_id) == (0, 1, 2)
    args = tiny_args(tmp_path, "--tokenizer", str(folder), "--max-steps", "10", "--eval-every", "5")
    assert args.vocab_size == 300  # ignored: the given tokenizer has 280
    assert training_cli.run_train_base(args) == 0
    out = tmp_path / "model"
    model = AutoModelForCausalLM.from_pretrained(out)
    config = model.config
    assert config.vocab_size == len(given) == model.get_input_embeddings().weight.shape[0]
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 0)
    generation = model.generation_config
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (1, 2, 0)
    # No tokenizer was trained, and none is saved: the model is loaded with the given one.
    for place in (out, out / "best", out / "checkpoint"):
        assert tokenizer_files(place) == [], place
    log = json.loads((out / "training_log.json").read_text())
    assert log["tokenizer"] == str(folder) and log["command"].split().count("--tokenizer") == 1

    # The training stream is the given tokenizer's ids, every document starting with BOS
    # (this tokenizer adds none itself, so train-base puts it there).
    training = train_base.BaseTraining(training_cli.settings_from(train_base.BaseTrainingSettings, args), "")
    train_text, _ = build_corpus(args.corpus)
    first = [d for d in train_text.split(DOC_SEPARATOR) if d.strip()][0]
    expected = [1, *given(first, add_special_tokens=True).input_ids]
    assert training.train_ids[: len(expected)].tolist() == expected
    assert int(training.train_ids.max()) < len(given)


def test_special_ids_fall_back_to_eos(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(chat_tokenizer(tmp_path, bos=False, pad=False))
    assert bare.bos_token_id is None and bare.pad_token_id is None
    assert base_tokens.special_ids(bare) == (2, 2, 2)
    full = AutoTokenizer.from_pretrained(chat_tokenizer(tmp_path))
    assert base_tokens.special_ids(full) == (1, 2, 0)
    full.eos_token = None
    with pytest.raises(DecodingError, match="no EOS"):
        base_tokens.special_ids(full)


def write_records(folder: Path, shards: int, per_shard: int, seed: int, vocab: int = 280) -> list[Record]:
    """Fake `self-distill` shards: prompts start with BOS (1), answers end with EOS (2)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for number in range(shards):
        prompts = [[1, *(rng.randrange(3, vocab) for _ in range(rng.randint(4, 12)))] for _ in range(per_shard)]
        answers = [[*(rng.randrange(3, vocab) for _ in range(rng.randint(10, 30))), 2] for _ in range(per_shard)]
        meta = {"instructions": [f"q{number}-{i}" for i in range(per_shard)], "prompts": prompts, "answers": answers}
        (folder / f"shard-{number:05d}.json").write_text(json.dumps(meta))
        (folder / f"shard-{number:05d}.safetensors").write_bytes(b"")  # not read
        records += [Record(p, a) for p, a in zip(prompts, answers, strict=True)]
    return records


def test_recorded_answers_are_split_by_prompt(tmp_path: Path) -> None:
    first = write_records(tmp_path / "a", shards=2, per_shard=100, seed=0)
    second = write_records(tmp_path / "b", shards=1, per_shard=50, seed=1)
    second[0] = Record(first[3].prompt, [5, 6, 2])  # the same prompt answered again, elsewhere
    meta = json.loads((tmp_path / "b" / "shard-00000.json").read_text())
    meta["prompts"][0], meta["answers"][0] = second[0].prompt, second[0].answer
    (tmp_path / "b" / "shard-00000.json").write_text(json.dumps(meta))
    (tmp_path / "notes.txt").write_text("not records")

    source = f"{tmp_path / 'a'},{tmp_path / 'b'}"
    folders = record_folders(source)
    assert folders == [tmp_path / "a", tmp_path / "b"]
    assert record_folders(str(tmp_path / "notes.txt")) is None and record_folders("austen") is None
    with pytest.raises(DecodingError, match="no recorded answers"):
        record_folders(f"{tmp_path / 'a'},{tmp_path / 'notes.txt'}")
    with pytest.raises(DecodingError, match="token ids, not text"):
        build_corpus(source)

    train, heldout = split_records(folders, heldout_fraction=0.2)
    assert split_records(folders, heldout_fraction=0.2) == (train, heldout)  # deterministic
    everything = first + second
    assert sorted(map(repr, train + heldout)) == sorted(map(repr, everything))
    assert [r for r in everything if r in train] == train  # order kept
    assert 0.1 < len(heldout) / len(everything) < 0.3
    assert not {tuple(r.prompt) for r in train} & {tuple(r.prompt) for r in heldout}
    train_docs, heldout_docs = build_record_corpus(folders, heldout_fraction=0.2)
    assert train_docs == [r.prompt + r.answer for r in train]
    assert heldout_docs == [r.prompt + r.answer for r in heldout]


def test_train_on_self_distill_records_uses_their_ids_as_they_are(tmp_path: Path) -> None:
    records = write_records(tmp_path / "records", shards=3, per_shard=80, seed=2)
    folder = chat_tokenizer(tmp_path)
    args = tiny_args(tmp_path, "--corpus", str(tmp_path / "records"), "--tokenizer", str(folder),
                     "--max-steps", "10", "--eval-every", "5")
    settings = training_cli.settings_from(train_base.BaseTrainingSettings, args)
    training = train_base.BaseTraining(settings, "")
    train, heldout = split_records([tmp_path / "records"])
    assert heldout and len(train) + len(heldout) == len(records)
    # Random ids: decoding them to text and encoding again would give other ids.
    assert training.train_ids.tolist() == [i for r in train for i in r.prompt + r.answer]
    assert training.heldout_ids.tolist() == [i for r in heldout for i in r.prompt + r.answer]

    assert training_cli.run_train_base(args) == 0
    out = tmp_path / "model"
    log = json.loads((out / "training_log.json").read_text())
    assert log["train_documents"] == len(train) and log["heldout_documents"] == len(heldout)
    assert log["train_tokens_in_corpus"] == sum(len(r.prompt) + len(r.answer) for r in train)
    assert log["heldout_curve"][-1]["loss"] < log["heldout_curve"][0]["loss"] + 1.0  # finite, measured
    assert tokenizer_files(out) == []

    with pytest.raises(DecodingError, match="give --tokenizer"):
        train_base.BaseTraining(train_base.BaseTrainingSettings(corpus=str(tmp_path / "records"),
                                                                out=tmp_path / "x"), "")
    write_records(tmp_path / "wide", shards=1, per_shard=50, seed=3, vocab=400)
    with pytest.raises(DecodingError, match="beyond the tokenizer"):
        train_base.BaseTraining(train_base.BaseTrainingSettings(
            corpus=str(tmp_path / "wide"), tokenizer=folder, out=tmp_path / "y"), "")
