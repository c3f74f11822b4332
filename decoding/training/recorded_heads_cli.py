"""The command line of `train-heads --recorded`: Medusa heads for a chat model from a recording.

    python -m decoding record --model smollm2
    python -m decoding train-heads --model smollm2 --recorded assets/recordings/smollm2-chat \\
        --out heads/

`record` (record_cli.py) writes shards of the model's own greedy answers with the states and top
guesses recorded on the way. This trains shared-lm_head heads over a draft vocabulary on them (`recorded_heads.py`),
holds the last shards out to measure them, grows the paper's optimal trees and the joint trees
from the measurement, and saves the heads with everything measured.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import DecodingError
from ..medusa_modules import MedusaHeads
from .answers import concat_answers, drop_prompts, load_answers, read_shards
from .base_model import load_base
from .recorded_heads import (
    RecordedData,
    RecordedEvaluation,
    RecordedTrainingSettings,
    choose_draft_vocab,
    evaluate_recorded_heads,
    fit_recorded_heads,
    new_recorded_heads,
)
from .trees import expected_tokens_per_pass, joint_optimal_choices, measured_tokens_per_pass, optimal_choices

DEFAULT_TREE_NODES = [2, 4, 6, 8, 12, 16]


# ----- train-heads --recorded --------------------------------------------------------------------


def add_recorded_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("a recording of the model's own answers (chat models; see `record`)")
    group.add_argument("--recorded", type=Path, nargs="+", default=None,
                       help="train on the shards `record` wrote in these folders (the last "
                            "--heldout-shards are held out); the base model is never run")
    group.add_argument("--draft-vocab-size", type=int, default=8192,
                       help="with --recorded: the heads guess among this many most-written tokens")
    group.add_argument("--hard-weight", type=float, default=0.5,
                       help="with --recorded: 0 = pure KL to the base model's distribution, 1 = pure "
                            "cross-entropy on the token it wrote")
    group.add_argument("--heldout-shards", type=int, default=2, help="with --recorded: shards kept out")
    group.add_argument("--positions-per-step", type=int, default=512, help="with --recorded: batch size")
    group.add_argument("--reads-root", action=argparse.BooleanOptionalAction, default=True,
                       help="with --recorded: each head also reads the root token's embedding")
    group.add_argument("--validation-shards", type=int, default=0,
                       help="with --recorded: shards before the held-out ones, also kept out of training, "
                            "measured after every epoch; training stops once their tokens per pass stop "
                            "rising (see --patience) and the best epoch's heads are kept. --epochs is then "
                            "the most epochs")
    group.add_argument("--patience", type=int, default=1,
                       help="with --validation-shards: epochs without a gain before training stops")
    group.add_argument("--compare-heads", type=Path, nargs="+", default=[],
                       help="with --recorded: also measure these saved heads on the same held-out answers")


@dataclass
class _Split:
    train: RecordedData
    validation: RecordedData | None
    heldout: RecordedData


def _split(shards: list[Path], heldout_shards: int, validation_shards: int = 0) -> _Split:
    """Training, validation and held-out data, from the front, the shards before the held-out
    ones, and the last shards; an answer to a kept-out question never lands in training."""
    cut = len(shards) - heldout_shards
    heldout = concat_answers([load_answers(p) for p in shards[cut:]])
    kept_out = {tuple(p) for p in heldout.prompts}
    validation = None
    if validation_shards:
        validation = concat_answers([load_answers(p) for p in shards[cut - validation_shards : cut]])
        kept_out |= {tuple(p) for p in validation.prompts}
    train = drop_prompts(concat_answers([load_answers(p) for p in shards[: cut - validation_shards]]), kept_out)
    return _Split(RecordedData.from_answers(train), validation and RecordedData.from_answers(validation),
                  RecordedData.from_answers(heldout))


def _trees(evaluation: RecordedEvaluation, budgets: list[int]) -> tuple[dict, dict, dict]:
    acc = evaluation.accuracy
    trees = {f"optimal-{n}": optimal_choices(acc, n) for n in budgets}
    trees |= {f"joint-{n}": joint_optimal_choices(acc, evaluation.path_counts, n) for n in budgets}
    chain = min(3, len(acc))
    trees[f"chain-{chain}"] = [[0] * d for d in range(1, chain + 1)]
    expected = {name: round(expected_tokens_per_pass(acc, c), 4) for name, c in trees.items()}
    measured = {name: round(measured_tokens_per_pass(evaluation.path_counts, evaluation.joint_positions, c), 4)
                for name, c in trees.items()}
    return trees, expected, measured


def _init_heads(path: Path, settings: RecordedTrainingSettings) -> MedusaHeads:
    """Saved heads to train further, with their draft vocabulary, checked against the flags.

    Their draft vocabulary stays: it was counted on the data they learned from, and a new one
    would leave their guesses pointing at other rows.
    """
    heads, _ = MedusaHeads.load(path)
    c = heads.config
    found = (c.num_heads, c.num_layers, c.shared_lm_head, c.draft_vocab_size, c.reads_root)
    wanted = (settings.num_heads, settings.num_layers, True, settings.draft_vocab_size, settings.reads_root)
    if found != wanted:
        raise DecodingError(f"--init-heads {path}: heads/layers/shared/draft vocabulary/reads root are {found}, "
                            f"the flags say {wanted}")
    return heads


class _EarlyStop:
    """Measures the heads on validation answers after each epoch and keeps the best epoch's state.

    The score is what decoding gets: the measured tokens per pass of the optimal tree of
    `nodes` grown from that epoch's accuracies. Training stops after `patience` epochs without a gain.
    """

    def __init__(self, heads: MedusaHeads, measure: Callable[[], RecordedEvaluation], nodes: int,
                 patience: int) -> None:
        self.heads, self.measure, self.nodes, self.patience = heads, measure, nodes, patience
        self.curve: list[float] = []
        self.best_epoch = 0
        self.best_state: dict[str, torch.Tensor] | None = None

    def __call__(self, epoch: int) -> bool:
        evaluation = self.measure()
        score = measured_tokens_per_pass(evaluation.path_counts, evaluation.joint_positions,
                                         optimal_choices(evaluation.accuracy, self.nodes))
        self.curve.append(round(score, 4))
        print(f"epoch {epoch}: validation tokens per pass with optimal-{self.nodes} {score:.3f}, "
              f"top-1 {' '.join(f'{a:.3f}' for a in evaluation.top1)}")
        if score > max(self.curve[:-1], default=0.0):
            self.best_epoch, self.best_state = epoch, copy.deepcopy(self.heads.state_dict())
        return epoch - self.best_epoch >= self.patience

    def restore_best(self) -> None:
        if self.best_state is not None:
            self.heads.load_state_dict(self.best_state)


def _compare(paths: list[Path], lm_head: torch.nn.Linear, embedding: torch.nn.Embedding, heldout: RecordedData,
             top_k: int, budgets: list[int]) -> dict[str, dict]:
    """Saved heads measured on the same held-out answers, their trees grown the same way."""
    out = {}
    for path in paths:
        other, _ = MedusaHeads.load(path)
        evaluation = evaluate_recorded_heads(other, lm_head, embedding, heldout, top_k)
        _, expected, measured = _trees(evaluation, budgets)
        out[str(path)] = {"heldout_top1": [round(a, 4) for a in evaluation.top1],
                          "heldout_top5": [round(a, 4) for a in evaluation.top5],
                          "heldout_tokens_per_pass": measured, "expected_tokens_per_pass": expected,
                          "joint_positions": evaluation.joint_positions}
    return out


def run_recorded(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    shards = read_shards(*args.recorded)
    if len(shards) <= args.heldout_shards + args.validation_shards:
        raise DecodingError(f"{' '.join(map(str, args.recorded))} hold {len(shards)} finished shards; need more than "
                            f"--heldout-shards {args.heldout_shards} + --validation-shards {args.validation_shards}")
    _, model = load_base(args.model, args.threads)
    lm_head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    split = _split(shards, args.heldout_shards, args.validation_shards)
    train, heldout = split.train, split.heldout
    settings = RecordedTrainingSettings(
        num_heads=args.num_heads, num_layers=args.num_layers, draft_vocab_size=args.draft_vocab_size,
        epochs=args.epochs, batch_size=args.positions_per_step, lr=args.lr, loss_decay=args.loss_decay,
        hard_weight=args.hard_weight, bf16=args.bf16 is not False, seed=args.seed, reads_root=args.reads_root,
    )
    if args.init_heads is not None:
        heads = _init_heads(args.init_heads, settings)
        draft_vocab = heads.draft_vocab
    else:
        draft_vocab = choose_draft_vocab(train.tokens, settings.draft_vocab_size, lm_head.out_features)
        heads = new_recorded_heads(lm_head, draft_vocab, settings)
    before = evaluate_recorded_heads(new_recorded_heads(lm_head, draft_vocab, settings), lm_head, embedding, heldout,
                                     args.top_k)
    print(f"{len(train):,} training, {len(split.validation or []):,} validation and {len(heldout):,} held-out "
          f"answer tokens; draft vocabulary {len(draft_vocab)} covers {before.vocab_coverage:.1%} of held-out tokens")
    budget = args.default_tree_nodes or max(args.tree_nodes)
    stop = None
    if split.validation is not None:
        validation = split.validation
        stop = _EarlyStop(heads, lambda: evaluate_recorded_heads(heads, lm_head, embedding, validation, args.top_k),
                          budget, args.patience)
    run = fit_recorded_heads(heads, lm_head, embedding, train, settings, after_epoch=stop)
    if stop is not None:
        stop.restore_best()
    after = evaluate_recorded_heads(heads, lm_head, embedding, heldout, args.top_k)
    budgets = sorted(set(args.tree_nodes))
    trees, expected, measured = _trees(after, budgets)
    compared = _compare(args.compare_heads, lm_head, embedding, heldout, args.top_k, budgets)
    default = f"{args.default_tree_family}-{budget}"
    extra = {
        "base_model": args.model,
        "accuracy": after.accuracy,
        "trees": trees,
        "expected_tokens_per_pass": expected,
        "heldout_tokens_per_pass": measured,
        "default_tree": default,
        "training": {
            "recipe": "Medusa-1 (frozen base) on a recording of its own answers",
            "settings": dataclasses.asdict(settings),
            "steps": run.steps,
            "train_positions": run.positions,
            "heldout_positions": len(heldout),
            "shards": len(shards),
            "heldout_shards": args.heldout_shards,
            "draft_vocab_coverage_heldout": round(after.vocab_coverage, 4),
            "final_train_loss": round(sum(run.losses[-20:]) / len(run.losses[-20:]), 4),
            "heldout_top1": [round(a, 4) for a in after.top1],
            "heldout_top5": [round(a, 4) for a in after.top5],
            "init_heads": None if args.init_heads is None else str(args.init_heads),
            "heldout_top1_untrained": [round(a, 4) for a in before.top1],
            "heldout_top5_untrained": [round(a, 4) for a in before.top5],
            "training_wall_time_s": round(run.wall_time_s, 1),
            "wall_time_s": round(time.perf_counter() - started, 1),
            "command": shlex.join(["python", "-m", "decoding", *sys.argv[1:]]),
        },
    }
    if stop is not None:
        extra["training"] |= {"validation_shards": args.validation_shards, "validation_positions": len(validation),
                              f"validation_tokens_per_pass_optimal_{budget}_by_epoch": stop.curve,
                              "kept_epoch": stop.best_epoch}
    if compared:
        extra["training"]["compared_on_same_heldout"] = compared
    heads.save(args.out, extra=extra)
    _print_report(heads, before, after, trees, expected, measured, compared)
    kept = f", kept epoch {stop.best_epoch} of {len(stop.curve)}" if stop is not None else ""
    print(f"saved heads to {args.out} (default tree {default}); {run.steps} steps in {run.wall_time_s:.0f} s{kept}")
    return 0


def _print_report(heads: MedusaHeads, before: RecordedEvaluation, after: RecordedEvaluation, trees: dict,
                  expected: dict, measured: dict, compared: dict[str, dict]) -> None:
    print("head  top-1 (untrained -> trained)   top-5 (untrained -> trained)")
    for h in range(heads.num_heads):
        print(f"{h + 1:>4}  {before.top1[h]:.3f} -> {after.top1[h]:.3f}"
              f"                 {before.top5[h]:.3f} -> {after.top5[h]:.3f}")
    print(f"tokens per pass on {after.joint_positions:,} held-out positions: product rule / measured")
    for name in trees:
        print(f"{name:>12}  {expected[name]:.3f}  {measured[name]:.3f}")
    for path, other in compared.items():
        print(f"{path} on the same held-out answers: top-1 {' '.join(f'{a:.3f}' for a in other['heldout_top1'])}, "
              f"top-5 {' '.join(f'{a:.3f}' for a in other['heldout_top5'])}")
        print("  measured tokens per pass: " + ", ".join(
            f"{name} {value:.3f}" for name, value in other["heldout_tokens_per_pass"].items()))
