"""Medusa head training on a tiny random Llama: the loss falls, accuracy rises, files round-trip."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from decoding import DecodeSettings, generate, load_model
from decoding.checkpoints import save_v01
from decoding.medusa_modules import MedusaHeads
from decoding.training import fit, training_cli
from decoding.training import train_heads as th
from decoding.training.batches import IGNORE_INDEX, check_lm_head_reads, head_targets, pad_batch
from decoding.training.data import DataSettings, self_distill
from decoding.training.evaluate import evaluate_heads
from decoding.training.fit import FitSettings, fit_heads, new_heads
from decoding.tree import Tree

EOS = "<|endoftext|>"
SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings of existence.",
    "The family of Dashwood had long been settled in Sussex.",
    "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be a heroine.",
    "Sir Walter Elliot, of Kellynch Hall, never took up any book but the Baronetage.",
    "About thirty years ago Miss Maria Ward had the good luck to captivate Sir Thomas Bertram.",
]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A ~100-token BPE trained in milliseconds; EOS doubles as BOS and padding, as in train-base."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder()
    tok.train_from_iterator(
        SENTENCES, trainers.BpeTrainer(vocab_size=100, special_tokens=[EOS, "<unk>"], show_progress=False)
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", special_tokens=[(EOS, tok.token_to_id(EOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS, unk_token="<unk>"
    )


def tiny_llama(vocab_size: int, eos_id: int) -> LlamaForCausalLM:
    # A wide init gives peaked next-token distributions, so greedy choices are not near-ties and
    # the tests do not hinge on rounding.
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        initializer_range=0.3, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The models here are tiny: a second thread buys nothing and, when another job holds the
    cores, thread contention makes each small op ~100x slower (measured: 16 s vs 0.15 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    return tiny_llama(len(tokenizer), tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def sequences(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> list[list[int]]:
    prompts = [" ".join(s.split()[:4]) for s in SENTENCES] + [s.split()[-1] for s in SENTENCES]
    return self_distill(model, tokenizer, prompts, DataSettings(max_new_tokens=32, gen_batch_size=16),
                        progress=False).sequences


def test_lm_head_reads_the_last_hidden_state_on_common_architectures() -> None:
    torch.manual_seed(0)
    small = dict(vocab_size=64, num_hidden_layers=2, num_attention_heads=4)
    for model in (
        LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, **small)),
        Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **small)),
        GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)),
    ):
        ids = torch.randint(0, 64, (2, 9))
        check_lm_head_reads(model.eval(), ids, torch.ones_like(ids))


def test_head_targets_look_k_plus_one_ahead() -> None:
    ids, mask = pad_batch([[10, 11, 12, 13, 14], [20, 21, 22]], pad_id=0)
    ignore = IGNORE_INDEX
    # head 1 at position t predicts token t+2
    assert head_targets(ids, mask, 1).tolist() == [
        [12, 13, 14, ignore, ignore],
        [22, ignore, ignore, ignore, ignore],
    ]
    assert head_targets(ids, mask, 3).tolist() == [[14] + [ignore] * 4, [ignore] * 5]


def test_greedy_self_distillation_follows_the_plain_argmax(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast
) -> None:
    # A saved repetition penalty must not leak into self-distillation: Medusa's lossless greedy
    # decoding reproduces the plain argmax, so that is what the heads must learn.
    model.generation_config.repetition_penalty = 3.0
    try:
        prompts = ["It is a truth", "Emma Woodhouse", "The"]
        greedy = self_distill(model, tokenizer, prompts, DataSettings(max_new_tokens=12, sampled=False),
                              progress=False)
    finally:
        model.generation_config.repetition_penalty = None
    for prompt, seq, start in zip(prompts, greedy.sequences, greedy.starts, strict=True):
        assert start == len(tokenizer(prompt)["input_ids"])
        with torch.no_grad():
            argmax = model(torch.tensor([seq])).logits[0].argmax(-1).tolist()
        assert seq[start:] == argmax[start - 1 : len(seq) - 1]


def test_training_lowers_the_loss_and_raises_accuracy(
    model: LlamaForCausalLM, sequences: list[list[int]]
) -> None:
    untrained = evaluate_heads(model, new_heads(model, num_heads=3), sequences, top_k=5).accuracy
    run = fit_heads(model, sequences, FitSettings(num_heads=3, steps=40, batch_size=8, lr=1e-2), progress=False)
    trained = evaluate_heads(model, run.heads, sequences, top_k=5).accuracy

    assert sum(run.losses[-5:]) < 0.8 * sum(run.losses[:5])
    assert len(trained) == 3 and all(len(row) == 5 for row in trained)
    for before, after in zip(untrained, trained, strict=True):
        assert after[0] > before[0] + 0.1  # top-1 accuracy of every head rises clearly
        assert sum(after) <= 1.0 + 1e-9  # ranks are exclusive
    assert run.steps == 40 and run.tokens > 40 * 8


def test_joint_paths_are_counted_where_decoding_meets_them(
    model: LlamaForCausalLM, sequences: list[list[int]]
) -> None:
    """Joint counts use positions t where every head has a target and t >= start - 1."""
    heads = new_heads(model, num_heads=2)
    sequences = sequences[:10]
    everywhere = evaluate_heads(model, heads, sequences, top_k=5, batch_size=4)
    # Every head has a target at t <= len - 2 - K (K = 2): len - 3 positions per sequence.
    assert everywhere.joint_positions == sum(len(s) - 3 for s in sequences)
    assert sum(everywhere.path_counts[(r,)] for r in range(5)) <= everywhere.joint_positions
    starts = [len(s) // 2 for s in sequences]
    late = evaluate_heads(model, heads, sequences, top_k=5, batch_size=4, starts=starts)
    assert late.joint_positions == sum(len(s) - 2 - 2 - (start - 1) + 1
                                       for s, start in zip(sequences, starts, strict=True))
    assert late.accuracy == everywhere.accuracy  # per-head accuracies still use every position
    assert evaluate_heads(model, heads, sequences, top_k=5, starts=[len(s) for s in sequences]).joint_positions == 0


def test_shared_lm_head_heads_train_and_stay_small(
    model: LlamaForCausalLM, sequences: list[list[int]]
) -> None:
    """The "version 2" heads: only ResBlocks are trained; the frozen base lm_head projects."""
    untrained = evaluate_heads(model, new_heads(model, 2, shared_lm_head=True), sequences).accuracy
    settings = FitSettings(num_heads=2, num_layers=2, shared_lm_head=True, steps=40, batch_size=8, lr=1e-2)
    run = fit_heads(model, sequences, settings, progress=False)
    trained = evaluate_heads(model, run.heads, sequences).accuracy
    assert sum(run.losses[-5:]) < 0.9 * sum(run.losses[:5])
    assert all(after[0] > before[0] for before, after in zip(untrained, trained, strict=True))
    hidden = model.config.hidden_size
    assert sum(p.numel() for p in run.heads.parameters()) == 2 * 2 * (hidden * hidden + hidden)
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_resume_continues_exactly(
    model: LlamaForCausalLM, sequences: list[list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = FitSettings(num_heads=2, steps=12, batch_size=8, lr=3e-3, seed=3, save_every=5)
    straight = fit_heads(model, sequences, settings, progress=False).heads

    save_state = fit.save_state

    def killed_after_saving(path: Path, state: dict) -> None:  # the process dies at step 5
        save_state(path, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(fit, "save_state", killed_after_saving)
    with pytest.raises(KeyboardInterrupt):
        fit_heads(model, sequences, settings, checkpoint=tmp_path / "state.pt", progress=False)
    monkeypatch.setattr(fit, "save_state", save_state)
    resumed = fit_heads(model, sequences, settings, checkpoint=tmp_path / "state.pt", resume=True, progress=False)

    assert resumed.steps == 12 and len(resumed.losses) == 12
    for key, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.heads.state_dict()[key], value)

    # A run killed before its first save has nothing to resume from: it starts afresh.
    afresh = fit_heads(model, sequences, settings, checkpoint=tmp_path / "none.pt", resume=True, progress=False)
    for key, value in straight.state_dict().items():
        torch.testing.assert_close(afresh.heads.state_dict()[key], value)


def test_saved_heads_reload_identically_and_v01_layout(model: LlamaForCausalLM, tmp_path: Path) -> None:
    heads = new_heads(model, num_heads=3)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()  # non-trivial values, so a mix-up of keys would show
    heads.save(tmp_path, extra={"base_model": "tiny"})
    loaded, meta = MedusaHeads.load(tmp_path)
    assert meta["base_model"] == "tiny"
    for key, value in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)

    save_v01(heads, tmp_path / "v01", base_model="tiny")
    state = load_file(str(tmp_path / "v01" / "medusa_lm_head.safetensors"))
    expected = {f"{i}.{name}" for i in range(3) for name in ("0.linear.weight", "0.linear.bias", "1.weight")}
    assert set(state) == expected
    assert torch.equal(state["2.1.weight"], heads.heads[2][1].weight)
    config = json.loads((tmp_path / "v01" / "config.json").read_text())
    assert config == {"medusa_num_heads": 3, "medusa_num_layers": 1, "base_model_name_or_path": "tiny"}


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    training_cli.add_train_heads_arguments(parser)
    return parser


@pytest.fixture(scope="module")
def cli_run(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[str]]:
    """`train-heads --self-distill` on a saved tiny model: (model dir, heads dir, argv)."""
    root = tmp_path_factory.mktemp("cli")
    model_dir, out = root / "tiny-llama", root / "heads"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (root / "text.txt").write_text("\n".join(SENTENCES * 3))
    argv = [
        "--model", str(model_dir), "--out", str(out), "--data", str(root / "text.txt"),
        "--self-distill", "--prompt-tokens", "4", "--seq-len", "16", "--max-new-tokens", "24",
        "--num-heads", "3", "--steps", "30", "--lr", "1e-2", "--batch-size", "8",
        "--heldout-fraction", "0.2", "--tree-nodes", "4", "8", "--also-v01",
    ]
    assert training_cli.run_train_heads(cli_parser().parse_args(argv)) == 0
    return model_dir, out, argv


def test_cli_trains_and_saves_heads_trees_and_stats(
    cli_run: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir, out, _ = cli_run
    heads, meta = MedusaHeads.load(out)
    assert heads.num_heads == 3 and meta["base_model"] == str(model_dir)
    assert set(meta["trees"]) == {"optimal-4", "optimal-8", "joint-4", "joint-8"}
    assert meta["default_tree"] == "optimal-8"
    for name, choices in meta["trees"].items():
        Tree.from_choices(choices, num_heads=3, name=name)
        assert meta["heldout_tokens_per_pass"][name] >= 1.0
    for n in (4, 8):
        assert meta["expected_tokens_per_pass"][f"optimal-{n}"] >= 1.0
        # The joint tree is the best n-node tree for the held-out positions it was grown on.
        measured = meta["heldout_tokens_per_pass"]
        assert measured[f"joint-{n}"] >= measured[f"optimal-{n}"]
    assert len(meta["accuracy"]) == 3 and len(meta["accuracy"][0]) == 10
    training = meta["training"]
    assert training["steps"] == 30 and training["data"]["kind"] == "self-distill"
    assert training["heldout_loss"] < training["heldout_loss_untrained"]
    assert len(training["heldout_top1"]) == 3 and "train-heads" in training["command"]
    v01 = out / "v0.1"
    assert (v01 / "medusa_lm_head.safetensors").exists()
    assert json.loads((v01 / "config.json").read_text())["medusa_num_heads"] == 3


def test_cli_resume_reuses_data_and_checkpoint(cli_run: tuple[Path, Path, list[str]]) -> None:
    _, out, argv = cli_run
    heads, _ = MedusaHeads.load(out)
    # The finished checkpoint is at its last step: nothing left to train, same heads saved again.
    assert training_cli.run_train_heads(cli_parser().parse_args([*argv, "--resume"])) == 0
    resumed, _ = MedusaHeads.load(out)
    for key, value in heads.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value)


def test_trained_heads_decode_losslessly_with_their_default_tree(
    cli_run: tuple[Path, Path, list[str]]
) -> None:
    model_dir, out, _ = cli_run
    lm = load_model(str(model_dir), heads=str(out), device="cpu", dtype="float32")
    assert lm.default_tree == "optimal-8"
    for prompt in ("It is a truth", "Emma Woodhouse, handsome"):
        medusa = generate(lm, prompt, DecodeSettings(max_new_tokens=24))
        plain = generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=24))
        assert medusa.tokens == plain.tokens
        assert medusa.forward_passes <= plain.forward_passes


def test_zero_steps_measures_existing_heads_and_rebuilds_their_trees(
    cli_run: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """--steps 0 --init-heads: same heads, trees grown from a fresh evaluation on the given data."""
    _, trained, argv = cli_run
    heads, meta = MedusaHeads.load(trained)
    out = tmp_path / "measured"
    (out / th.CHECKPOINT_DIR).mkdir(parents=True)
    shutil.copy(trained / th.CHECKPOINT_DIR / th.DATA_FILE, out / th.CHECKPOINT_DIR / th.DATA_FILE)
    argv = [*argv, "--out", str(out), "--resume", "--init-heads", str(trained), "--steps", "0",
            "--tree-nodes", "4", "8", "12", "--default-tree-nodes", "12", "--default-tree-family", "joint"]
    assert training_cli.run_train_heads(cli_parser().parse_args(argv)) == 0
    measured, new_meta = MedusaHeads.load(out)
    for key, value in heads.state_dict().items():
        assert torch.equal(measured.state_dict()[key], value)
    assert new_meta["training"]["steps"] == 0 and new_meta["default_tree"] == "joint-12"
    for row, expected in zip(new_meta["accuracy"], meta["accuracy"], strict=True):
        assert row == pytest.approx(expected)
    for name in ("optimal-8", "joint-8"):
        assert new_meta["trees"][name] == meta["trees"][name]
        assert new_meta["heldout_tokens_per_pass"][name] == pytest.approx(meta["heldout_tokens_per_pass"][name])


def test_zero_steps_needs_heads_to_measure(
    cli_run: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, argv = cli_run
    assert training_cli.run_train_heads(cli_parser().parse_args([*argv, "--steps", "0"])) == 2
    assert "--init-heads" in capsys.readouterr().err


def test_cli_refuses_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli_parser().parse_args(["--model", "x", "--out", str(tmp_path)])
    assert training_cli.run_train_heads(args) == 2
    assert "--data" in capsys.readouterr().err


def test_v01_output_of_shared_lm_head_heads_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "text.txt").write_text("some text")
    args = cli_parser().parse_args(["--model", "x", "--out", str(tmp_path / "out"),
                                    "--data", str(tmp_path / "text.txt"), "--shared-lm-head", "--also-v01"])
    assert training_cli.run_train_heads(args) == 2  # before the model "x" is even looked for
    assert "--also-v01" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_medusa2_tunes_the_base_with_the_heads_and_decodes_losslessly(
    cli_run: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """--joint-lr trains base and heads together from the Medusa-1 heads; the tuned base is saved."""
    model_dir, medusa1, argv = cli_run
    out = tmp_path / "medusa2"
    (out / th.CHECKPOINT_DIR).mkdir(parents=True)
    shutil.copy(medusa1 / th.CHECKPOINT_DIR / th.DATA_FILE, out / th.CHECKPOINT_DIR)  # same data
    joint = list(argv)  # --also-v01 included: its config must name the tuned base
    joint[joint.index("--out") + 1] = str(out)
    joint += ["--resume", "--init-heads", str(medusa1), "--joint-lr", "1e-3", "--save-dtype", "bfloat16"]
    assert training_cli.run_train_heads(cli_parser().parse_args(joint)) == 0

    heads, meta = MedusaHeads.load(out)
    tuned = out / th.TUNED_BASE_DIR
    assert meta["base_model"] == str(tuned)
    assert json.loads((out / th.V01_DIR / "config.json").read_text())["base_model_name_or_path"] == str(tuned)
    losses = meta["training"]["base_next_token_loss"]
    assert losses["after"] < losses["before"]  # on its own continuations it only gets surer
    assert meta["training"]["heldout_loss"] < MedusaHeads.load(medusa1)[1]["training"]["heldout_loss"]
    original, weights = load_file(str(model_dir / "model.safetensors")), load_file(str(tuned / "model.safetensors"))
    assert weights["model.norm.weight"].dtype == torch.bfloat16
    assert not torch.equal(weights["model.norm.weight"].float(), original["model.norm.weight"].float())

    lm = load_model(str(tuned), heads=str(out), device="cpu", dtype="float32")
    for prompt in ("It is a truth", "Emma Woodhouse, handsome"):
        medusa = generate(lm, prompt, DecodeSettings(max_new_tokens=24))
        plain = generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=24))
        assert medusa.tokens == plain.tokens
