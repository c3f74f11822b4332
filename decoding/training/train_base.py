"""``train-base``: train the project's small base language model from scratch on CPU.

The model is a stock ``LlamaForCausalLM`` (the same code path as real Llama
checkpoints, so the Medusa code never special-cases it) with a byte-level BPE
tokenizer trained on the same corpus. Everything is saved with
``save_pretrained`` so ``AutoModelForCausalLM`` / ``AutoTokenizer`` load it
offline.

Training is built for a shared 2-core CPU with a wall-clock budget:

* bf16 autocast (about 1.5x faster than fp32 on this project's 2-core development CPU);
* ``--max-minutes`` stops cleanly and saves; the cosine LR schedule runs on
  *progress* = the larger of step and wall-clock fraction, so the learning rate
  has decayed by the time the budget ends however fast the shared CPU turns out;
* periodic checkpoints (model, optimizer, step, elapsed time, RNG states) let
  ``--resume`` continue exactly where a run stopped.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm.auto import tqdm
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ..errors import DecodingError
from .corpus import DOC_SEPARATOR, build_corpus

CHECKPOINT_DIR = "checkpoint"
BEST_DIR = "best"
SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CHECKPOINT_FILE = "state.pt"
LOG_FILE = "training_log.json"
CURVE_FILE = "loss_curve.png"
MAX_POSITIONS = 1024
# Namespace entries a subcommand dispatcher may add that are not train-base flags.
_NOT_FLAGS = ("func", "command")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register train-base's flags; defaults are the settings of the shipped model."""
    parser.add_argument("--corpus", default="austen",
                        help="'austen' (Debian r-cran-janeaustenr), 'stdlib' (this Python's standard library) "
                             "or a .txt file / folder of them")
    parser.add_argument("--out", type=Path, default=Path("runs/train_base/austen"),
                        help="output folder: final model, tokenizer, log, checkpoint/")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--intermediate-size", type=int, default=704)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--min-lr-ratio", type=float, default=0.1,
                        help="final LR as a fraction of the peak")
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="alternative to --max-steps (converted to steps)")
    parser.add_argument("--max-minutes", type=float, default=77.0,
                        help="wall-clock budget for training, 0 for none (cumulative over resumes); "
                             "the LR schedule follows it, so the result depends on CPU speed")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between held-out evals")
    parser.add_argument("--eval-batches", type=int, default=8,
                        help="held-out batches per eval (fixed windows, same every time)")
    parser.add_argument("--log-every", type=int, default=10, help="steps per train-loss log point")
    parser.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 is faster than 2 on a CPU shared with other jobs, "
                             "where two threads stall each other at every barrier")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="bf16 autocast on CPU")
    parser.add_argument("--save-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="dtype of the saved weights; bfloat16 halves the files, and the engine "
                             "loads them as float32 on a CPU either way")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/checkpoint (same flags as the original run)")


def save_model_as(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path,
                  dtype: str) -> None:
    """Save model and tokenizer with the weights in `dtype` ("float32" or "bfloat16").

    A converted copy: the model itself keeps its dtype, so training can go on in float32.
    Copying the module (not just its tensors) keeps tied embeddings tied: they are saved once.
    """
    copy.deepcopy(model).to(SAVE_DTYPES[dtype]).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def command_line(args: argparse.Namespace) -> str:
    """The full, reproducible CLI for these arguments (every flag spelled out)."""
    parts = ["python", "-m", "decoding", "train-base"]
    for key, value in sorted(vars(args).items()):
        flag = "--" + key.replace("_", "-")
        if key in _NOT_FLAGS or value is None:
            continue
        if isinstance(value, bool):
            if key == "bf16":
                parts.append(flag if value else "--no-bf16")
            elif value:
                parts.append(flag)
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def train_tokenizer(train_text: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with one special token used as BOS, EOS and PAD.

    Byte-level means any input round-trips (no unknown tokens) and decoding
    restores spaces. The post-processor prepends BOS, matching training where
    every document follows the separator, so a prompt looks like a fresh
    document to the model.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[DOC_SEPARATOR],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(train_text.split(DOC_SEPARATOR), trainer=trainer)
    eos_id = tokenizer.token_to_id(DOC_SEPARATOR)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{DOC_SEPARATOR} $A",
        pair=f"{DOC_SEPARATOR} $A {DOC_SEPARATOR} $B",
        special_tokens=[(DOC_SEPARATOR, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=DOC_SEPARATOR,
        eos_token=DOC_SEPARATOR,
        pad_token=DOC_SEPARATOR,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, text: str) -> torch.Tensor:
    """Token ids of all documents, each preceded by the separator (as at inference)."""
    docs = [d for d in text.split(DOC_SEPARATOR) if d.strip()]
    encodings = tokenizer(docs, add_special_tokens=True)["input_ids"]
    return torch.tensor([i for ids in encodings for i in ids], dtype=torch.long)


def build_model(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A small Llama with tied embeddings (saves vocab x hidden parameters)."""
    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, do_sample=False
    )
    return model


def lr_at(step: int, progress: float, args: argparse.Namespace) -> float:
    """Linear warmup by steps, then cosine decay to min_lr over training progress."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW; no weight decay on norms (1-D weights), as usual for transformers."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def sample_batch(stream: torch.Tensor, args: argparse.Namespace, gen: torch.Generator) -> torch.Tensor:
    """Random fixed-length windows of the token stream (seeded, so resumable)."""
    starts = torch.randint(0, len(stream) - args.seq_len, (args.batch_size,), generator=gen)
    return torch.stack([stream[s : s + args.seq_len] for s in starts.tolist()])


@torch.no_grad()
def heldout_loss(model: LlamaForCausalLM, heldout: torch.Tensor, args: argparse.Namespace) -> float:
    """Mean loss over fixed, non-overlapping held-out windows (comparable across evals)."""
    n_windows = min(len(heldout) // args.seq_len, args.eval_batches * args.batch_size)
    if n_windows == 0:
        return float("nan")
    windows = heldout[: n_windows * args.seq_len].view(n_windows, args.seq_len)
    model.eval()
    losses = []
    for batch in windows.split(args.batch_size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            losses.append(model(input_ids=batch, labels=batch).loss.float().item() * len(batch))
    model.train()
    return sum(losses) / n_windows


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically so a kill mid-save never corrupts the last good checkpoint."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (CHECKPOINT_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path / CHECKPOINT_FILE)


def plot_curve(log: dict[str, Any], path: Path) -> None:
    """Loss against tokens seen, train and held-out, as a PNG for the model card."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on the training machine
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    train = log["train_curve"]
    held = log["heldout_curve"]
    ax.plot([p["tokens"] / 1e6 for p in train], [p["loss"] for p in train], label="train", lw=1)
    ax.plot([p["tokens"] / 1e6 for p in held], [p["loss"] for p in held], "o-", label="held-out", ms=3)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(f"train-base: {log['params'] / 1e6:.2f}M-param Llama")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Train (or resume) the base model and save it to ``args.out``; returns 0.

    Raises DecodingError for problems the user can fix (missing checkpoint or corpus).
    """
    torch.set_num_threads(args.threads)
    out: Path = args.out
    ckpt_dir = out / CHECKPOINT_DIR
    resume_state: dict[str, Any] | None = None
    if args.resume:
        if not (ckpt_dir / CHECKPOINT_FILE).exists():
            raise DecodingError(f"--resume: no checkpoint at {ckpt_dir / CHECKPOINT_FILE}")
        resume_state = torch.load(ckpt_dir / CHECKPOINT_FILE, weights_only=True)

    torch.manual_seed(args.seed)
    train_text, heldout_text = build_corpus(args.corpus)
    if resume_state is not None:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(ckpt_dir)
    else:
        tokenizer = train_tokenizer(train_text, args.vocab_size)
        tokenizer.save_pretrained(ckpt_dir)
    train_ids = encode_stream(tokenizer, train_text)
    heldout_ids = encode_stream(tokenizer, heldout_text)
    if len(train_ids) <= args.seq_len:
        raise DecodingError(f"corpus too small: {len(train_ids)} tokens for --seq-len {args.seq_len}")

    model = build_model(args, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch_size * args.seq_len
    max_steps = args.max_steps
    if args.max_tokens is not None:
        max_steps = min(max_steps or math.inf, math.ceil(args.max_tokens / tokens_per_step))
    budget_s = args.max_minutes * 60 if args.max_minutes else None
    if max_steps is None and budget_s is None:
        raise DecodingError("--max-minutes 0 needs --max-steps or --max-tokens")

    step, elapsed = 0, 0.0
    log: dict[str, Any] = {
        "command": command_line(args),
        "arguments": {k: str(v) if isinstance(v, Path) else v
                      for k, v in vars(args).items() if k not in _NOT_FLAGS},
        "params": params,
        "seed": args.seed,
        "corpus": args.corpus,
        "train_tokens_in_corpus": len(train_ids),
        "heldout_tokens_in_corpus": len(heldout_ids),
        "train_curve": [],
        "heldout_curve": [],
    }
    if resume_state is not None:
        model.load_state_dict(resume_state["model"])
        optimizer.load_state_dict(resume_state["optimizer"])
        gen.set_state(resume_state["generator"])
        torch.set_rng_state(resume_state["torch_rng"])
        step, elapsed = resume_state["step"], resume_state["elapsed"]
        log["train_curve"] = resume_state["log"]["train_curve"]
        log["heldout_curve"] = resume_state["log"]["heldout_curve"]
        log["resumed_from_steps"] = resume_state["log"].get("resumed_from_steps", []) + [step]
        if "best" in resume_state["log"]:
            log["best"] = resume_state["log"]["best"]

    print(f"params {params:,}  train tokens {len(train_ids):,}  held-out tokens {len(heldout_ids):,}"
          f"  tokens/step {tokens_per_step:,}  starting at step {step}")

    def progress() -> float:
        fractions = [0.0]
        if max_steps is not None:
            fractions.append(step / max_steps)
        if budget_s is not None:
            fractions.append(elapsed / budget_s)
        return max(fractions)

    def checkpoint() -> None:
        save_checkpoint(ckpt_dir, {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "generator": gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "step": step,
            "elapsed": elapsed,
            "log": log,
        })

    def save_model(directory: Path) -> None:
        save_model_as(model, tokenizer, directory, args.save_dtype)

    def evaluate() -> None:
        loss = heldout_loss(model, heldout_ids, args)
        log["heldout_curve"].append({"step": step, "tokens": step * tokens_per_step, "loss": loss})
        tqdm.write(f"step {step}: held-out loss {loss:.4f}")
        # A small corpus is memorised before the schedule ends; the best held-out point is kept
        # in OUT/best so it can be chosen over the final weights.
        if loss < log.get("best", {}).get("heldout_loss", float("inf")):
            log["best"] = {"step": step, "tokens": step * tokens_per_step, "heldout_loss": loss}
            save_model(out / BEST_DIR)

    model.train()
    bar = tqdm(total=max_steps, initial=step, unit="step", dynamic_ncols=True, mininterval=2.0)
    window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
    # wall clock of this invocation (evals and saves included) on top of earlier runs
    elapsed_before, started = elapsed, time.perf_counter()
    while progress() < 1.0:
        lr = lr_at(step, progress(), args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(train_ids, args, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        now = time.perf_counter()
        elapsed = elapsed_before + now - started
        window_loss += loss.item()
        window_steps += 1
        if step % args.log_every == 0:
            mean = window_loss / window_steps
            tok_s = window_steps * tokens_per_step / (now - window_start)
            log["train_curve"].append({"step": step, "tokens": step * tokens_per_step, "loss": mean,
                                       "lr": lr, "elapsed_s": round(elapsed, 1)})
            bar.set_postfix(loss=f"{mean:.3f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}")
            window_loss, window_steps, window_start = 0.0, 0, now
        bar.update(1)
        if step % args.eval_every == 0:
            evaluate()
        if step % args.save_every == 0:
            checkpoint()
    bar.close()

    if not log["heldout_curve"] or log["heldout_curve"][-1]["step"] != step:
        evaluate()
    checkpoint()
    log.update({
        "steps": step,
        "tokens_seen": step * tokens_per_step,
        "epochs": step * tokens_per_step / len(train_ids),
        "wall_time_s": round(elapsed, 1),
        "final_train_loss": log["train_curve"][-1]["loss"] if log["train_curve"] else None,
        "final_heldout_loss": log["heldout_curve"][-1]["loss"],
    })
    save_model(out)
    (out / LOG_FILE).write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    plot_curve(log, out / CURVE_FILE)
    print(f"saved to {out}: {step} steps, {log['tokens_seen']:,} tokens, "
          f"held-out loss {log['final_heldout_loss']:.4f}, {elapsed / 60:.1f} min")
    return 0
