"""The training commands: `train-heads`, `train-base`, `corpus`, `questions`, `record`, `record-bench`
and `train-eagle`.

`decoding/cli.py` lists every command and imports this module only when one of these is named.
Each flag's default is read from the settings it fills (`DataSettings`, `FitSettings`,
`TreeSettings`, `BaseTrainingSettings`), so every default is written once; the flags keep the
settings' field names, and `settings_from` turns parsed flags into settings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import DecodingError
from . import record_cli, recorded_heads_cli, train_eagle_cli
from .commands import command_line, settings_from
from .corpus import CORPUS_HELP, TRAIN_CORPUS_HELP, write_corpus
from .data import DataSettings
from .fit import FitSettings
from .saving import SAVE_DTYPES
from .train_base import BaseTrainingSettings, train_base
from .train_heads import SAVE_DTYPE, HeadsJob, train_heads
from .trees import TREE_FAMILIES, TreeSettings

THREADS_HELP = ("torch CPU threads (default: torch's choice). On a CPU another job keeps busy, use fewer "
                "threads than cores: contention made generation 13x slower here")


# ----- train-heads ------------------------------------------------------------------------------
def add_train_heads_arguments(parser: argparse.ArgumentParser) -> None:
    data, fit, trees = DataSettings(), FitSettings(), TreeSettings()
    io = parser.add_argument_group("model and output")
    io.add_argument("--model", required=True, help="base model: a local folder or a hub id")
    io.add_argument("--out", type=Path, required=True,
                    help="folder for the heads (medusa_heads.safetensors, medusa_config.json) "
                         "and heads_checkpoint/ (training state, data.json)")
    io.add_argument("--also-v01", action="store_true",
                    help="also write the published v0.1 layout (medusa_lm_head.safetensors, "
                         "config.json) to OUT/v0.1")
    io.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    io.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    io.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=fit.bf16,
                    help="bf16 autocast (default: on for cuda, off for cpu; on a CPU with bf16 "
                         "support it trains ~2x faster, e.g. 790 vs 350 tokens/s here)")

    heads = parser.add_argument_group("heads")
    heads.add_argument("--num-heads", type=int, default=fit.num_heads)
    heads.add_argument("--num-layers", type=int, default=fit.num_layers, help="ResBlocks per head")
    heads.add_argument("--shared-lm-head", action="store_true",
                       help="heads reuse the base lm_head instead of a vocabulary projection each "
                            "(Medusa's 'version 2' layout: much smaller, cheaper to draft on a CPU)")

    source = parser.add_argument_group("data")
    source.add_argument("--data", type=Path, nargs="+", default=data.data,
                        help="text files or folders of .txt files, tokenized and cut into --seq-len chunks")
    source.add_argument("--self-distill", action="store_true",
                        help="train on the model's own continuations of prompts (--prompts, and/or "
                             "the first --prompt-tokens of each --data chunk)")
    source.add_argument("--prompts", type=Path, default=data.prompts,
                        help="prompts file: .txt, one prompt a line, or .json list of strings")
    source.add_argument("--prompt-tokens", type=int, default=data.prompt_tokens,
                        help="prompt length when prompts are cut from --data chunks")
    source.add_argument("--max-prompts", type=int, default=data.max_prompts, help="use at most this many prompts")
    source.add_argument("--max-new-tokens", type=int, default=data.max_new_tokens)
    source.add_argument("--sampled", action=argparse.BooleanOptionalAction, default=data.sampled,
                        help="besides the greedy continuation, also a sampled one per prompt")
    source.add_argument("--temperature", type=float, default=data.temperature)
    source.add_argument("--gen-batch-size", type=int, default=data.gen_batch_size)
    source.add_argument("--seq-len", type=int, default=data.seq_len)
    source.add_argument("--heldout-fraction", type=float, default=data.heldout_fraction)

    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=fit.steps,
                       help="overrides --epochs; 0 with --init-heads trains nothing and only "
                            "measures those heads and builds their trees")
    train.add_argument("--epochs", type=float, default=fit.epochs)
    train.add_argument("--lr", type=float, default=fit.lr)
    train.add_argument("--batch-size", type=int, default=fit.batch_size)
    train.add_argument("--weight-decay", type=float, default=fit.weight_decay)
    train.add_argument("--loss-decay", type=float, default=fit.loss_decay, help="head k's loss weight is this^(k-1)")
    train.add_argument("--seed", type=int, default=fit.seed)
    train.add_argument("--save-every", type=int, default=fit.save_every, help="steps between checkpoints")
    train.add_argument("--init-heads", type=Path, default=None,
                       help="start from heads saved by an earlier run instead of fresh ones")
    train.add_argument("--joint-lr", type=float, default=fit.joint_lr,
                       help="Medusa-2: also train the base model, at this learning rate, on its "
                            "next-token loss plus the heads'; the tuned base goes to OUT/base")
    train.add_argument("--joint-heads-weight", type=float, default=fit.joint_heads_weight,
                       help="with --joint-lr: the heads' loss is scaled by this in the joint loss, "
                            "so it does not drown the base model's own")
    train.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default=SAVE_DTYPE,
                       help="dtype of the tuned base's saved weights (with --joint-lr)")
    train.add_argument("--resume", action="store_true",
                       help="continue from OUT/heads_checkpoint on the same data (give the original run's flags)")

    recorded_heads_cli.add_recorded_arguments(parser)

    tree = parser.add_argument_group("trees")
    tree.add_argument("--top-k", type=int, default=trees.top_k, help="ranks measured per head")
    tree.add_argument("--tree-nodes", type=int, nargs="+", default=trees.tree_nodes,
                      help="node budgets (root excluded) of the optimal trees to build")
    tree.add_argument("--default-tree-nodes", type=int, default=trees.default_tree_nodes,
                      help="which budget becomes default_tree (default: the largest)")
    tree.add_argument("--default-tree-family", choices=TREE_FAMILIES, default=trees.default_tree_family,
                      help="optimal: the paper's tree, from the product of per-head accuracies; "
                           "joint: from how often each path of guesses was right on the held-out "
                           "text (best on text like it; on the embedded models' unseen bench "
                           "prompts it was no better)")


def _check_train_heads(args: argparse.Namespace) -> None:
    """Refuse inconsistent flags before any model is loaded: a mistake costs no training time."""
    if not args.data and not args.prompts:
        raise DecodingError("give --data text files, or --self-distill with --prompts")
    if args.prompts and not args.self_distill:
        raise DecodingError("--prompts is only used with --self-distill")
    if args.steps is not None and (args.steps < 0 or (args.steps == 0 and args.init_heads is None)):
        raise DecodingError("--steps must be positive (or 0 with --init-heads, to measure them)")
    if args.num_heads < 1 or args.num_layers < 1:
        raise DecodingError("--num-heads and --num-layers must be at least 1")
    if args.also_v01 and args.shared_lm_head:
        raise DecodingError("--also-v01 writes heads with a vocabulary projection each; "
                            "--shared-lm-head heads have none")
    if not 0.0 < args.heldout_fraction < 1.0:
        raise DecodingError("--heldout-fraction must lie strictly between 0 and 1")
    capacity = sum(args.top_k**d for d in range(1, args.num_heads + 1))
    for budget in args.tree_nodes:
        if not 1 <= budget <= capacity:
            raise DecodingError(f"--tree-nodes {budget}: must lie in 1..{capacity}")
    if args.default_tree_nodes is not None and args.default_tree_nodes not in args.tree_nodes:
        raise DecodingError("--default-tree-nodes must be one of --tree-nodes")
    for path in [*args.data, *([args.prompts] if args.prompts else [])]:
        if not path.exists():
            raise DecodingError(f"{path}: no such file or folder")


def run_train_heads(args: argparse.Namespace) -> int:
    """Train heads as the flags say; 0 on success, 2 (with a message) on a usage problem."""
    try:
        if args.recorded:
            return recorded_heads_cli.run_recorded(args)
        _check_train_heads(args)
        job = HeadsJob(
            model=args.model, out=args.out, data=settings_from(DataSettings, args),
            fit=settings_from(FitSettings, args), trees=settings_from(TreeSettings, args),
            device=args.device, threads=args.threads, init_heads=args.init_heads, resume=args.resume,
            also_v01=args.also_v01, save_dtype=args.save_dtype, command=command_line("train-heads", args),
        )
        train_heads(job)
        return 0
    except DecodingError as err:
        print(f"train-heads: {err}", file=sys.stderr)
        return 2


# ----- train-base -------------------------------------------------------------------------------
def add_train_base_arguments(parser: argparse.ArgumentParser) -> None:
    """train-base's flags; the defaults are the shipped model's settings."""
    s = BaseTrainingSettings()
    parser.add_argument("--corpus", default=s.corpus, help=TRAIN_CORPUS_HELP)
    parser.add_argument("--out", type=Path, default=s.out,
                        help="output folder: final model, tokenizer, log, checkpoint/")
    parser.add_argument("--tokenizer", type=Path, default=s.tokenizer,
                        help="use this saved tokenizer (a folder AutoTokenizer loads) instead of training "
                             "one: a draft model for speculative decoding shares its target's. Its "
                             "vocabulary and BOS/EOS/PAD ids become the model's (--vocab-size is then "
                             "ignored), and the output holds no tokenizer")
    parser.add_argument("--vocab-size", type=int, default=s.vocab_size,
                        help="vocabulary of the tokenizer trained on the corpus (ignored with --tokenizer)")
    parser.add_argument("--hidden-size", type=int, default=s.hidden_size)
    parser.add_argument("--layers", type=int, default=s.layers)
    parser.add_argument("--heads", type=int, default=s.heads)
    parser.add_argument("--intermediate-size", type=int, default=s.intermediate_size)
    parser.add_argument("--mtp-depth", type=int, default=s.mtp_depth,
                        help="train DeepSeek-V3's multi-token prediction modules with the model, this "
                             "many (module k guesses the token k+1 ahead; saved in OUT/mtp); 0: none")
    parser.add_argument("--seq-len", type=int, default=s.seq_len)
    parser.add_argument("--batch-size", type=int, default=s.batch_size)
    parser.add_argument("--lr", type=float, default=s.lr, help="peak learning rate")
    parser.add_argument("--min-lr-ratio", type=float, default=s.min_lr_ratio, help="final LR as a fraction of the peak")
    parser.add_argument("--warmup-steps", type=int, default=s.warmup_steps)
    parser.add_argument("--weight-decay", type=float, default=s.weight_decay)
    parser.add_argument("--max-steps", type=int, default=s.max_steps)
    parser.add_argument("--max-tokens", type=int, default=s.max_tokens,
                        help="alternative to --max-steps (converted to steps)")
    parser.add_argument("--max-minutes", type=float, default=s.max_minutes,
                        help="wall-clock budget for training, 0 for none (cumulative over resumes); "
                             "the LR schedule follows it, so the result depends on CPU speed")
    parser.add_argument("--eval-every", type=int, default=s.eval_every, help="steps between held-out evals")
    parser.add_argument("--eval-batches", type=int, default=s.eval_batches,
                        help="held-out batches per eval (fixed windows, same every time)")
    parser.add_argument("--log-every", type=int, default=s.log_every, help="steps per train-loss log point")
    parser.add_argument("--save-every", type=int, default=s.save_every, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=s.seed)
    parser.add_argument("--threads", type=int, default=s.threads,
                        help="torch CPU threads; 1 is faster than 2 on a CPU shared with other jobs, "
                             "where two threads stall each other at every barrier")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=s.bf16, help="bf16 autocast on CPU")
    parser.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default=s.save_dtype,
                        help="dtype of the saved weights; bfloat16 halves the files, and the engine "
                             "loads them as float32 on a CPU either way")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/checkpoint (same flags as the original run)")


def run_train_base(args: argparse.Namespace) -> int:
    """Train the base model as the flags say; a DecodingError reaches the caller."""
    train_base(settings_from(BaseTrainingSettings, args), command_line("train-base", args))
    return 0


# ----- corpus ----------------------------------------------------------------------------------
def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", default=BaseTrainingSettings.corpus, help=CORPUS_HELP)
    parser.add_argument("--out", type=Path, required=True, help="folder for train.txt and heldout.txt")


def run_corpus(args: argparse.Namespace) -> int:
    train, heldout = write_corpus(args.out, args.corpus)
    print(f"wrote {train} and {heldout}")
    return 0


# Each command's (add its flags, run it), for decoding/cli.py's dispatcher.
TRAINING_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "train-heads": (add_train_heads_arguments, run_train_heads),
    "train-base": (add_train_base_arguments, run_train_base),
    "corpus": (add_corpus_arguments, run_corpus),
    "train-eagle": (train_eagle_cli.add_train_eagle_arguments, train_eagle_cli.run_train_eagle),
    "questions": (record_cli.add_questions_arguments, record_cli.run_questions),
    "record": (record_cli.add_record_arguments, record_cli.run_record),
    "record-bench": (record_cli.add_record_bench_arguments, record_cli.run_record_bench),
}
