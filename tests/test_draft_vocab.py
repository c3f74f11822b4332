"""Drafting through a truncated vocabulary, and heads trained on recorded self-distillation.

The draft vocabulary only narrows what the heads may guess; the verify pass still scores the full
vocabulary, so greedy output must stay identical to plain decoding whatever the vocabulary holds —
even a vocabulary that leaves out the very tokens the model writes.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from decoding import DecodeSettings, generate
from decoding.cli import main
from decoding.medusa_modules import HeadsConfig, MedusaHeads, medusa_part
from decoding.tiny import tiny_model
from decoding.training.answer_batcher import Recorded
from decoding.training.answers import Answers, answers_from, load_answers
from decoding.training.recorded_heads import (
    RecordedData,
    RecordedTrainingSettings,
    choose_draft_vocab,
    coverage,
    evaluate_recorded_heads,
    fit_recorded_heads,
    new_recorded_heads,
)
from decoding.training.recording import save_shard
from tests.test_lossless import prompts, reference_greedy, trees, with_heads

NEW_TOKENS = 40


def vocab_heads(lm, draft_vocab: torch.Tensor, seed: int, reads_root: bool = False) -> MedusaHeads:
    """Shared-lm_head heads that guess among `draft_vocab` only (and read the root token, if
    asked), perturbed at random."""
    c = medusa_part(lm).heads.config
    heads = MedusaHeads(HeadsConfig(c.num_heads, 1, c.hidden_size, c.vocab_size, shared_lm_head=True,
                                    draft_vocab_size=len(draft_vocab), reads_root=reads_root))
    heads.draft_vocab.copy_(draft_vocab)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return heads.eval()


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, choices=trees(max_nodes=16), seed=st.integers(0, 2**16),
       size=st.sampled_from([8, 64, 200]), arch=st.sampled_from(["llama", "qwen2"]), reads_root=st.booleans())
def test_truncated_vocab_drafting_is_lossless(tiny_models, prompt, choices, seed, size, arch, reads_root):
    lm = tiny_models[arch]
    vocab_size = medusa_part(lm).heads.config.vocab_size
    vocab = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))[:size]
    if max(max(p) for p in choices) >= size:
        choices = [[min(r, size - 1) for r in p] for p in choices]
        choices = [list(p) for p in sorted({tuple(p) for p in choices}, key=lambda p: (len(p), p))]
    trace = generate(with_heads(lm, vocab_heads(lm, vocab, seed, reads_root)), prompt,
                     DecodeSettings(max_new_tokens=NEW_TOKENS, tree=choices))
    assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)
    # Every guess the heads made came from the draft vocabulary.
    guessed = {t for r in trace.rounds for row in r.guesses for t in row}
    assert guessed <= set(vocab.tolist())


def test_draft_vocab_survives_save_and_load(tmp_path, tiny_llama):
    vocab = torch.tensor([5, 3, 99, 7])
    heads = vocab_heads(tiny_llama, vocab, seed=1)
    heads.save(tmp_path)
    loaded, meta = MedusaHeads.load(tmp_path)
    assert loaded.draft_vocab.tolist() == [5, 3, 99, 7]
    assert meta["draft_vocab_size"] == 4 and loaded.guess_vocab_size == 4
    assert loaded.token_ids(torch.tensor([[0, 2]])).tolist() == [[5, 99]]


def test_choose_draft_vocab_ranks_by_frequency():
    tokens = torch.tensor([4, 4, 4, 1, 1, 9, 2, 2, 2, 2])
    vocab = choose_draft_vocab(tokens, 3, vocab_size=12)
    assert vocab.tolist() == [2, 4, 1]  # 4 times, 3 times, twice; 9 (once) is left out
    assert abs(coverage(tokens, vocab) - 0.9) < 1e-6


def _cyclic_answers(lm_head: torch.nn.Linear, cycle: list[int], count: int, length: int) -> Answers:
    """Answers that walk a fixed cycle of tokens, each state a scaled copy of its token's lm_head
    row (so the lm_head reads back exactly that token): head k's target is a fixed function of
    the state, which training must find."""
    generator = torch.Generator().manual_seed(0)
    answers = []
    for _ in range(count):
        offset = int(torch.randint(len(cycle), (1,), generator=generator))
        answers.append([cycle[(offset + j) % len(cycle)] for j in range(length)])
    tokens = torch.tensor([t for a in answers for t in a])
    states = 4.0 * lm_head.weight[tokens].detach()
    top_logits, top_ids = (states @ lm_head.weight.T).detach().topk(8, dim=-1)
    return Answers(prompts=[[1]] * count, answers=answers, states=states.half(), tokens=tokens,
                   teacher_ids=top_ids.int(), teacher_logits=top_logits.half())


@pytest.mark.parametrize("reads_root", [False, True])
def test_recorded_training_learns_what_comes_next(reads_root):
    model = tiny_model("llama", vocab_size=64, seed=3, hidden=64, layers=1)
    lm_head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    cycle = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:20].tolist()
    data = RecordedData.from_answers(_cyclic_answers(lm_head, cycle, count=60, length=16))
    config = RecordedTrainingSettings(num_heads=2, draft_vocab_size=32, epochs=40, batch_size=64, lr=3e-3,
                                      hard_weight=0.5, bf16=False, reads_root=reads_root)
    vocab = choose_draft_vocab(data.tokens, config.draft_vocab_size, lm_head.out_features)
    assert coverage(data.tokens, vocab) == 1.0  # 20 distinct tokens fit in 32
    untrained = evaluate_recorded_heads(new_recorded_heads(lm_head, vocab, config), lm_head, embedding, data)
    heads = new_recorded_heads(lm_head, vocab, config)
    run = fit_recorded_heads(heads, lm_head, embedding, data, config, progress=False)
    trained = evaluate_recorded_heads(heads, lm_head, embedding, data)
    assert run.losses[-1] < 0.5 * run.losses[0]
    # Untrained heads repeat the state's own token, which is never the next one in the cycle.
    # (Heads that read the root start the same: their root projections start at zero.)
    assert untrained.top1 == [0.0, 0.0]
    assert trained.top1[0] > 0.9 and trained.top1[1] > 0.9
    assert trained.joint_positions == 60 * (16 - 2)
    assert trained.path_counts[(0, 0)] > 0.9 * trained.joint_positions


def test_recorded_trees_fit_heads_fewer_than_three():
    from collections import Counter

    from decoding.training.recorded_heads import RecordedEvaluation
    from decoding.training.recorded_heads_cli import _trees

    two_heads = RecordedEvaluation(accuracy=[[0.5, 0.2, 0.1], [0.3, 0.1, 0.05]], positions=[10, 10],
                                   path_counts=Counter({(0,): 5, (0, 0): 3}), joint_positions=10,
                                   vocab_coverage=1.0)
    trees, expected, measured = _trees(two_heads, [2, 3])
    assert trees["chain-2"] == [[0], [0, 0]] and "chain-3" not in trees
    assert measured["chain-2"] == 1.0 + (5 + 3) / 10


def test_training_stops_once_an_epoch_brings_no_gain():
    model = tiny_model("llama", vocab_size=64, seed=3, hidden=64, layers=1)
    lm_head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    cycle = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:20].tolist()
    data = RecordedData.from_answers(_cyclic_answers(lm_head, cycle, count=16, length=16))
    config = RecordedTrainingSettings(num_heads=2, draft_vocab_size=32, epochs=10, batch_size=64, bf16=False)
    heads = new_recorded_heads(lm_head, choose_draft_vocab(data.tokens, 32, 64), config)
    epochs: list[int] = []
    run = fit_recorded_heads(heads, lm_head, embedding, data, config, progress=False,
                             after_epoch=lambda epoch: epochs.append(epoch) or epoch == 3)
    steps_per_epoch = -(-16 * 15 // 64)  # 15 positions of each answer have a next token
    assert epochs == [1, 2, 3] and run.steps == 3 * steps_per_epoch == len(run.losses)


def _as_recorded(answers: Answers) -> list[Recorded]:
    """The recorder's view of these answers: one kept layer, the prompt's earlier states zero."""
    out, row = [], 0
    for i, (prompt, answer) in enumerate(zip(answers.prompts, answers.answers, strict=True)):
        rows = slice(row, row + len(answer))
        states = torch.cat([torch.zeros(len(prompt) - 1, answers.states.shape[1]).half(), answers.states[rows]])
        out.append(Recorded(i, prompt, answer, states[:, None], answers.teacher_ids[rows],
                            answers.teacher_logits[rows]))
        row += len(answer)
    return out


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Recordings keep their features in the cache folder: a test's own."""
    monkeypatch.setenv("MEDUSA_PLAYGROUND_CACHE", str(tmp_path / "cache"))


def _save_cyclic_shards(folder, lm_head, count: int) -> None:
    cycle = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:20].tolist()
    for number in range(count):
        answers = _cyclic_answers(lm_head, cycle, count=12, length=16)
        answers.prompts = [[number, i] for i in range(12)]  # a question of its own for every answer
        save_shard(folder / f"shard-{number:05d}", _as_recorded(answers), layers=(1,))


def test_a_recordings_answers_give_the_heads_the_state_that_chose_each_token(tmp_path):
    lm_head = tiny_model("llama", vocab_size=64, seed=3, hidden=64, layers=1).get_output_embeddings()
    _save_cyclic_shards(tmp_path, lm_head, count=1)
    answers = load_answers(tmp_path / "shard-00000")
    assert answers.tokens.tolist() == [t for a in answers.answers for t in a]
    # The state kept for answer token i is the one whose logits chose it.
    assert (answers.states.float() @ lm_head.weight.T).argmax(-1).tolist() == answers.tokens.tolist()
    assert answers.teacher_ids[:, 0].tolist() == answers.tokens.tolist()
    assert answers_from(_as_recorded(answers)).states.shape == answers.states.shape


def _recorded_base(tmp_path, shards: int) -> None:
    """A tiny base model in tmp_path/base and `shards` shards of its cyclic answers in tmp_path/records."""
    from decoding.tiny import tiny_tokenizer

    model = tiny_model("llama", vocab_size=64, seed=3, hidden=64, layers=1)
    model.save_pretrained(tmp_path / "base")
    tiny_tokenizer(64).save_pretrained(tmp_path / "base")
    _save_cyclic_shards(tmp_path / "records", model.get_output_embeddings(), count=shards)


def test_recorded_cli_keeps_the_best_epoch_and_measures_other_heads_on_the_same_answers(tmp_path, capsys):
    _recorded_base(tmp_path, shards=5)
    common = ["train-heads", "--model", str(tmp_path / "base"), "--recorded", str(tmp_path / "records"),
              "--num-heads", "2", "--draft-vocab-size", "32", "--positions-per-step", "32", "--no-bf16",
              "--tree-nodes", "2", "3", "--heldout-shards", "1", "--threads", "1"]
    assert main([*common, "--out", str(tmp_path / "first"), "--epochs", "1"]) == 0
    assert main([*common, "--out", str(tmp_path / "best"), "--epochs", "30", "--lr", "3e-3",
                 "--validation-shards", "1", "--patience", "2", "--compare-heads", str(tmp_path / "first")]) == 0
    first = json.loads((tmp_path / "first" / "medusa_config.json").read_text())["training"]
    best = json.loads((tmp_path / "best" / "medusa_config.json").read_text())["training"]
    curve = best["validation_tokens_per_pass_optimal_3_by_epoch"]
    # Stopped early: the kept epoch is the best one, and no later epoch within patience beat it.
    assert len(curve) < 30 and curve[best["kept_epoch"] - 1] == max(curve)
    assert len(curve) - best["kept_epoch"] == 2
    # One shard fewer trains the second run (the validation shard), none of it held-out answers.
    assert best["validation_positions"] == 12 * 16 and best["heldout_positions"] == first["heldout_positions"]
    compared = best["compared_on_same_heldout"][str(tmp_path / "first")]
    assert compared["heldout_top1"] == first["heldout_top1"]
    assert best["heldout_top1"][0] > first["heldout_top1"][0]
    assert "on the same held-out answers" in capsys.readouterr().out


def test_recorded_cli_trains_saved_heads_further(tmp_path, capsys):
    _recorded_base(tmp_path, shards=3)
    common = ["train-heads", "--model", str(tmp_path / "base"), "--recorded", str(tmp_path / "records"),
              "--draft-vocab-size", "32", "--positions-per-step", "32", "--no-bf16", "--tree-nodes", "2",
              "--heldout-shards", "1", "--threads", "1", "--epochs", "4", "--lr", "3e-3", "--num-heads"]
    first_dir = str(tmp_path / "first")
    assert main([*common, "2", "--out", first_dir]) == 0
    assert main([*common, "2", "--out", str(tmp_path / "again"), "--init-heads", first_dir]) == 0
    first = json.loads((tmp_path / "first" / "medusa_config.json").read_text())
    again = json.loads((tmp_path / "again" / "medusa_config.json").read_text())
    assert again["training"]["init_heads"] == first_dir
    assert again["training"]["heldout_top1"][0] > first["training"]["heldout_top1"][0]
    # The saved heads' draft vocabulary stays with them.
    assert load_file(str(tmp_path / "again" / "medusa_heads.safetensors"))["draft_vocab"].tolist() == load_file(
        str(tmp_path / "first" / "medusa_heads.safetensors"))["draft_vocab"].tolist()
    assert main([*common, "3", "--out", str(tmp_path / "bad"), "--init-heads", first_dir]) == 2
    assert "--init-heads" in capsys.readouterr().err
