"""``train-heads``: Medusa-1 head training for any Hugging Face causal LM.

The recipe (the Medusa paper's, Cai et al. 2024):

* the base model is frozen: it only supplies, once per batch, the last hidden state — the exact
  tensor its lm_head reads — and the heads learn on top of it;
* head k at position t learns to predict token t+1+k with cross-entropy; the heads' losses are
  summed with weights 0.8^(k-1), so the nearer (more often useful) heads count most;
* AdamW, lr 1e-3, 10% linear warmup then cosine decay, about one epoch;
* self-distillation: train on the base model's own continuations (greedy and sampled) of prompts,
  so the heads learn to predict *this model*, which is what Medusa decoding has to match.

At the end the heads' accuracy per rank is measured on a held-out split, the paper's optimal
trees are grown from it for each node budget, and everything is saved next to the heads.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import random
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_cosine_schedule_with_warmup,
)

from ..checkpoints import save_v01
from ..errors import DecodingError
from ..heads import HeadsConfig, MedusaHeads
from ..loading import resolve_device, resolve_dtype
from ..prompts import read_prompts
from . import recorded_run
from .train_base import SAVE_DTYPES, save_model_as
from .trees import (
    count_paths,
    expected_tokens_per_pass,
    joint_optimal_choices,
    measured_tokens_per_pass,
    optimal_choices,
)

IGNORE_INDEX = -100  # F.cross_entropy skips targets with this value
# Not "checkpoint": heads may be trained into a base model's run folder, where train-base keeps its own.
CHECKPOINT_DIR = "heads_checkpoint"
TUNED_BASE_DIR = "base"  # Medusa-2's fine-tuned base model, beside its heads
STATE_FILE = "state.pt"
DATA_FILE = "data.json"
# In data.json: where each held-out sequence's self-distilled continuation starts (absent for text).
HELDOUT_STARTS = "heldout_starts"
# The v0.1 files go to a subfolder: their config.json would overwrite a model's own when the heads
# are saved beside the model. The subfolder is self-describing, ready to upload as it is.
V01_DIR = "v0.1"
DEFAULT_TREE_NODES = [4, 8, 12, 16, 24]

# Prompts are plain text, or token ids when they are cut from tokenized data.
Prompt = str | Sequence[int]


# ----- the hidden state the heads read ---------------------------------------------------------


def _forward(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
    """One frozen forward pass that returns every layer's hidden state.

    Only the last position's logits are asked for when the model allows it: we need hidden
    states, and a full (batch, seq, vocab) logits tensor would cost as much as a head.
    """
    few_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=True,
        use_cache=False,
        **({"logits_to_keep": 1} if few_logits else {}),
    )


@torch.no_grad()
def last_hidden_states(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """(batch, seq, hidden): the state the lm_head turns into next-token logits.

    `hidden_states[-1]` is taken *after* the final norm for Llama, Qwen2/3, Mistral, Gemma, Phi,
    GPT-2, GPT-NeoX and OPT in transformers 5.24 (checked by `check_lm_head_reads`).
    """
    return _forward(model, input_ids, attention_mask).hidden_states[-1]


@torch.no_grad()
def check_lm_head_reads(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> None:
    """Raise unless `lm_head(last_hidden_states(...))` reproduces the model's own logits.

    Heads trained on any other tensor (a pre-norm state, say) would be useless at decode time.
    """
    out = _forward(model, input_ids, attention_mask)
    logits = out.logits[:, -1].float()
    rebuilt = model.get_output_embeddings()(out.hidden_states[-1][:, -1]).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma 2/3 squash the lm_head's output; the hidden state is still the right one
        rebuilt = cap * torch.tanh(rebuilt / cap)
    tolerance = 1e-3 * (1.0 + logits.abs().max().item())
    if not torch.allclose(rebuilt, logits, rtol=1e-3, atol=tolerance):
        raise DecodingError(
            f"{type(model).__name__}: lm_head(hidden_states[-1]) does not reproduce the model's "
            "logits, so Medusa heads cannot be trained on that state for this architecture"
        )


# ----- batches ---------------------------------------------------------------------------------


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int, side: str = "right"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token lists to one length: (input_ids, attention_mask).

    Training pads on the right (a causal model's real tokens never see right padding);
    generation pads on the left, so every row's next token goes in the same column.
    """
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(0, len(seq)) if side == "right" else slice(length - len(seq), length)
        ids[row, span] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, span] = 1
    return ids, mask


def head_targets(input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int) -> torch.Tensor:
    """Head k's target at every position t: token t+1+k, or IGNORE_INDEX past a sequence's end."""
    targets = torch.full_like(input_ids, IGNORE_INDEX)
    shift = 1 + k
    ahead = input_ids[:, shift:]
    targets[:, :-shift] = ahead.masked_fill(attention_mask[:, shift:] == 0, IGNORE_INDEX)
    return targets


def batch_for_step(step: int, num_sequences: int, batch_size: int, seed: int) -> list[int]:
    """The sequence indices of one training step: a fresh seeded shuffle each epoch.

    A pure function of the step, so a resumed run sees exactly the batches it would have seen.
    """
    per_epoch = math.ceil(num_sequences / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(num_sequences, generator=torch.Generator().manual_seed(seed + epoch))
    return order[index * batch_size : (index + 1) * batch_size].tolist()


def _training_batch(
    token_sequences: Sequence[Sequence[int]], step: int, batch_size: int, seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = [token_sequences[i] for i in batch_for_step(step, len(token_sequences), batch_size, seed)]
    ids, mask = pad_batch(batch, pad_id=0)
    return ids.to(device), mask.to(device)


def _in_batches(
    token_sequences: Sequence[Sequence[int]], batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The sequences in order, padded into (ids, mask) batches on `device`: for evaluation."""
    for start in range(0, len(token_sequences), batch_size):
        ids, mask = pad_batch(token_sequences[start : start + batch_size], pad_id=0)
        yield ids.to(device), mask.to(device)


def _next_token_targets(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What the base model's logits at each position should predict; padding is ignored."""
    return ids[:, 1:].masked_fill(mask[:, 1:] == 0, IGNORE_INDEX)


def _autocast(device: torch.device, bf16: bool) -> torch.autocast:
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


def _model_device(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device


def _each_head(
    heads: MedusaHeads, hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, bf16: bool,
    lm_head: torch.nn.Module,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(k, logits, targets, valid) for head k = 1..K, over just the positions where head k has a
    target; `valid` is the (batch, seq) mask of those positions.

    A generator on purpose: the training loop calls backward on one head's loss before the next
    head's (positions, vocab) logits are made, so only one head's logits are alive at a time.
    """
    for k in range(1, heads.num_heads + 1):
        targets = head_targets(ids, mask, k)
        valid = targets != IGNORE_INDEX
        if valid.any():
            with _autocast(hidden.device, bf16):
                logits = heads.head_logits(k - 1, hidden[valid], lm_head)
            yield k, logits.float(), targets[valid], valid


# ----- heads -----------------------------------------------------------------------------------


def new_heads(
    model: PreTrainedModel, num_heads: int = 5, num_layers: int = 1, shared_lm_head: bool = False
) -> MedusaHeads:
    """Fresh heads sized from the model's lm_head and initialised from it (the reference init).

    With `shared_lm_head` the heads have no vocabulary projection of their own and reuse the
    frozen base lm_head (the "version 2" layout): far smaller, and cheaper to draft with on a CPU.
    """
    lm_head = model.get_output_embeddings()
    config = HeadsConfig(
        num_heads=num_heads,
        num_layers=num_layers,
        hidden_size=lm_head.in_features,
        vocab_size=lm_head.out_features,
        shared_lm_head=shared_lm_head,
    )
    heads = MedusaHeads(config)
    heads.init_from_lm_head(lm_head)
    return heads.to(_model_device(model))


@dataclass
class HeadsEvaluation:
    """How well each head predicts its token on some sequences."""

    loss: float  # the training objective: sum over heads of 0.8^(k-1) * mean cross-entropy
    head_losses: list[float]
    accuracy: list[list[float]]  # accuracy[h][r]: share of positions where head h+1's rank r is right
    positions: list[int]  # how many positions each head was scored on
    # Paths of ranks exactly right, counted at the positions where every head has a target
    # (see trees.count_paths): what the joint trees are grown from.
    path_counts: Counter[tuple[int, ...]] = field(default_factory=Counter)
    joint_positions: int = 0

    @property
    def top1(self) -> list[float]:
        return [row[0] for row in self.accuracy]

    @property
    def top5(self) -> list[float]:
        # Ranks are exclusive (one true token per position), so top-5 is a sum of ranks 0..4.
        return [sum(row[:5]) for row in self.accuracy]


@torch.no_grad()
def evaluate_heads(
    model: PreTrainedModel,
    heads: MedusaHeads,
    token_sequences: Sequence[Sequence[int]],
    top_k: int = 10,
    batch_size: int = 8,
    loss_decay: float = 0.8,
    bf16: bool | None = None,
    starts: Sequence[int] | None = None,
) -> HeadsEvaluation:
    """Loss and per-rank accuracy of every head, the target being defined as in training.

    With `starts` (where each sequence's self-distilled continuation begins), the joint path
    counts keep only the positions decoding meets: from the prompt's last token on, where the
    base model's next token and every head's target are the model's own output.
    """
    device = _model_device(model)
    bf16 = device.type == "cuda" if bf16 is None else bf16
    heads.eval()
    k_max = heads.num_heads
    loss_sums, counts = [0.0] * k_max, [0] * k_max
    rank_hits = torch.zeros((k_max, top_k), dtype=torch.long)
    path_counts: Counter[tuple[int, ...]] = Counter()
    joint_positions = 0
    for batch_index, (ids, mask) in enumerate(_in_batches(token_sequences, batch_size, device)):
        with _autocast(device, bf16):
            hidden = last_hidden_states(model, ids, mask).float()
        # Where the last head has a target, every head has one: those positions give the joint ranks.
        every_head = head_targets(ids, mask, k_max) != IGNORE_INDEX
        if starts is not None:
            batch_starts = torch.tensor(starts[batch_index * batch_size : (batch_index + 1) * batch_size],
                                        device=device)
            positions = torch.arange(ids.shape[1], device=device)
            every_head &= positions[None, :] >= batch_starts[:, None] - 1
        joint_ranks = []
        for k, logits, targets, valid in _each_head(heads, hidden, ids, mask, bf16, model.get_output_embeddings()):
            loss_sums[k - 1] += F.cross_entropy(logits, targets, reduction="sum").item()
            counts[k - 1] += len(targets)
            guesses = logits.topk(min(top_k, logits.shape[-1])).indices
            found = guesses == targets[:, None]
            hits = found.sum(0).cpu()
            rank_hits[k - 1, : len(hits)] += hits
            # The rank of the true token, or top_k where it is not among the guesses.
            ranks = torch.where(found.any(-1), found.int().argmax(-1), top_k)
            joint_ranks.append(ranks[every_head[valid]])
        if joint_ranks and len(joint_ranks[0]):
            rows = torch.stack(joint_ranks, dim=1).tolist()
            path_counts.update(count_paths(rows, top_k))
            joint_positions += len(rows)
    head_losses = [s / c if c else float("nan") for s, c in zip(loss_sums, counts)]
    accuracy = [[h / c if c else 0.0 for h in row] for row, c in zip(rank_hits.tolist(), counts)]
    loss = sum(loss_decay**i * h for i, h in enumerate(head_losses))
    return HeadsEvaluation(loss, head_losses, accuracy, counts, path_counts, joint_positions)


def measure_head_accuracy(
    model: PreTrainedModel,
    heads: MedusaHeads,
    token_sequences: Sequence[Sequence[int]],
    top_k: int = 10,
    batch_size: int = 8,
) -> list[list[float]]:
    """acc[h][r]: share of positions t where head h+1's rank-r guess equals token t+2+h."""
    return evaluate_heads(model, heads, token_sequences, top_k, batch_size).accuracy


# ----- training --------------------------------------------------------------------------------


@dataclass
class TrainingRun:
    heads: MedusaHeads
    steps: int
    tokens: int  # real (unpadded) tokens the base model read for training
    losses: list[float] = field(default_factory=list)  # training objective, one per step
    wall_time_s: float = 0.0

    @property
    def final_loss(self) -> float:
        """Mean loss over the last tenth of the steps (a single step's loss is noisy)."""
        tail = self.losses[-max(1, len(self.losses) // 10) :]
        return sum(tail) / len(tail) if tail else float("nan")


def _train_step(
    model: PreTrainedModel,
    heads: MedusaHeads,
    ids: torch.Tensor,
    mask: torch.Tensor,
    loss_decay: float,
    bf16: bool,
) -> float:
    """Forward the frozen base once, then each head; return the weighted loss (grads accumulated).

    Each head's loss is backpropagated on its own: the heads share no parameters, so the
    gradients equal those of the summed loss, while only one head's logits are in memory at a
    time — with 5 heads and a large vocabulary that is most of the memory.
    """
    with _autocast(ids.device, bf16):
        hidden = last_hidden_states(model, ids, mask).float()
    total = 0.0
    for k, logits, targets, _ in _each_head(heads, hidden, ids, mask, bf16, model.get_output_embeddings()):
        # Weight 1 for head 1, as the reference code does; Adam ignores the overall scale anyway.
        loss = loss_decay ** (k - 1) * F.cross_entropy(logits, targets)
        loss.backward()
        total += loss.item()
    return total


def _joint_train_step(
    model: PreTrainedModel,
    heads: MedusaHeads,
    ids: torch.Tensor,
    mask: torch.Tensor,
    loss_decay: float,
    bf16: bool,
    heads_weight: float,
) -> float:
    """Medusa-2: the base model's own next-token loss plus the heads', backpropagated into both.

    The sequences are the base model's own continuations, so its next-token loss pulls it
    towards what it already wrote: it keeps its behaviour while its last hidden state learns to
    say more about the tokens after the next, which is what the heads read. The heads' summed
    loss is many times the base's, so it is scaled by `heads_weight` lest it drag the base
    model away from its own predictions.
    """
    with _autocast(ids.device, bf16):
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    targets = _next_token_targets(ids, mask)
    loss = F.cross_entropy(out.logits[:, :-1].float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX)
    hidden = out.hidden_states[-1].float()
    for k, logits, head_targets_k, _ in _each_head(heads, hidden, ids, mask, bf16, model.get_output_embeddings()):
        loss = loss + heads_weight * loss_decay ** (k - 1) * F.cross_entropy(logits, head_targets_k)
    loss.backward()
    return loss.item()


@torch.no_grad()
def next_token_loss(model: PreTrainedModel, token_sequences: Sequence[Sequence[int]], batch_size: int = 8) -> float:
    """The base model's mean next-token cross-entropy on `token_sequences`."""
    total, count = 0.0, 0
    for ids, mask in _in_batches(token_sequences, batch_size, _model_device(model)):
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        targets = _next_token_targets(ids, mask)
        total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="sum").item()
        count += int((targets != IGNORE_INDEX).sum())
    return total / max(count, 1)


def _save_state(path: Path, state: dict[str, Any]) -> None:
    """Write atomically, so a kill during the save never spoils the previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def fit_heads(
    model: PreTrainedModel,
    token_sequences: Sequence[Sequence[int]],
    *,
    num_heads: int = 5,
    num_layers: int = 1,
    shared_lm_head: bool = False,
    steps: int | None = None,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 8,
    weight_decay: float = 0.0,
    loss_decay: float = 0.8,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    bf16: bool | None = None,
    checkpoint: Path | None = None,
    save_every: int = 200,
    resume: bool = False,
    progress: bool = True,
    init_heads: MedusaHeads | None = None,
    base_lr: float = 0.0,
    joint_heads_weight: float = 0.2,
) -> TrainingRun:
    """Train heads on `token_sequences`; the run's statistics come with them.

    `steps` defaults to `epochs` passes over the sequences. With `checkpoint` (a file path) the
    state is saved every `save_every` steps and at the end; `resume=True` continues from it
    when there is one. Heads start fresh, or from `init_heads`. With `base_lr` > 0 the base
    model is trained too, at that learning rate (Medusa-2); otherwise it stays frozen.
    """
    if len(token_sequences) == 0:
        raise DecodingError("no training sequences")
    device = _model_device(model)
    bf16 = device.type == "cuda" if bf16 is None else bf16
    if steps is None:
        steps = max(1, math.ceil(epochs * len(token_sequences) / batch_size))
    joint = base_lr > 0
    # Medusa-1 freezes the base: no gradient may reach it, not even through a shared lm_head
    # (tied embeddings). Dropout stays off either way (eval mode): the heads see the states
    # decoding will give them.
    model.eval().requires_grad_(joint)
    heads = init_heads or new_heads(model, num_heads, num_layers, shared_lm_head)
    groups = [{"params": list(heads.parameters()), "lr": lr}]
    if joint:
        groups.append({"params": list(model.parameters()), "lr": base_lr})
    trained = [param for group in groups for param in group["params"]]
    optimizer = torch.optim.AdamW(groups, weight_decay=weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(0.1 * steps), steps)
    run = TrainingRun(heads=heads, steps=0, tokens=0)
    if joint:
        train_step = partial(_joint_train_step, heads_weight=joint_heads_weight)
    else:
        train_step = _train_step
    if resume and checkpoint is not None and checkpoint.exists():
        _restore(run, optimizer, scheduler, checkpoint, steps, model if joint else None)
    else:  # a fresh start (also a resume killed before its first save)
        check_lm_head_reads(model, *_training_batch(token_sequences, 0, batch_size, seed, device))

    def save() -> None:
        if checkpoint is not None:
            _save_state(checkpoint, {
                "heads_config": asdict(heads.config),
                "heads": heads.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "total_steps": steps,
                "step": run.steps,
                "tokens": run.tokens,
                "losses": run.losses,
                "wall_time_s": run.wall_time_s,
                **({"base": model.state_dict()} if joint else {}),
            })

    heads.train()
    started, before = time.perf_counter(), run.wall_time_s
    bar = tqdm(total=steps, initial=run.steps, unit="step", disable=not progress, mininterval=1.0)
    while run.steps < steps:
        ids, mask = _training_batch(token_sequences, run.steps, batch_size, seed, device)
        loss = train_step(model, heads, ids, mask, loss_decay, bf16)
        torch.nn.utils.clip_grad_norm_(trained, max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        run.steps += 1
        run.tokens += int(mask.sum())
        run.losses.append(loss)
        run.wall_time_s = before + time.perf_counter() - started
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{run.tokens / max(run.wall_time_s, 1e-9):,.0f}",
                        refresh=False)
        if run.steps % save_every == 0:
            save()
    bar.close()
    save()
    heads.eval()
    model.requires_grad_(False)
    return run


def _restore(
    run: TrainingRun,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    checkpoint: Path,
    steps: int,
    model: PreTrainedModel | None = None,
) -> None:
    """Continue a run from its checkpoint; `model` too when the run trains the base (Medusa-2)."""
    state = torch.load(checkpoint, weights_only=True, map_location="cpu")
    if state["heads_config"] != asdict(run.heads.config) or state["total_steps"] != steps:
        raise DecodingError(
            "the checkpoint was made with other heads or another step count: resume with the "
            "original run's flags"
        )
    run.heads.load_state_dict(state["heads"])
    if model is not None:
        model.load_state_dict(state["base"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    run.steps, run.tokens = state["step"], state["tokens"]
    run.losses, run.wall_time_s = state["losses"], state["wall_time_s"]


# ----- self-distillation -----------------------------------------------------------------------


@contextmanager
def _plain_generation_config(model: PreTrainedModel, **settings: Any) -> Iterator[None]:
    """Generate with exactly `settings`, nothing from the model's saved generation config.

    `generate` fills every option we leave unset from `model.generation_config` (a repetition
    penalty, a top-k...). Self-distillation must follow the model's plain distribution — its
    greedy path is what lossless Medusa decoding reproduces — so we swap in a bare config.
    """
    saved = model.generation_config
    model.generation_config = GenerationConfig(**settings)
    try:
        yield
    finally:
        model.generation_config = saved


def _special_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], int]:
    """(end-of-sequence ids, padding id).

    The stop tokens are the model's generation config's, as in the decoding engine: a model
    that declares none is decoded past its tokenizer's EOS, so its heads should see that too.
    """
    eos = model.generation_config.eos_token_id
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    return eos_ids, pad


def _encode(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    return tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)


def _cut_at_eos(tokens: list[int], eos_ids: Sequence[int]) -> list[int]:
    """Keep up to and including the first end-of-sequence token (the rest is padding)."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


@dataclass
class Distilled:
    sequences: list[list[int]]  # prompt + the model's own continuation
    starts: list[int]  # where each continuation starts: its prompt's length


@torch.no_grad()
def self_distill(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    max_new_tokens: int,
    greedy_and_sampled: bool = True,
    batch_size: int = 16,
    temperature: float = 0.8,
    seed: int = 0,
    progress: bool = True,
) -> Distilled:
    """Prompt + the model's own continuation, for every prompt: greedy, then (optionally) sampled.

    Prompts are text or token ids. Sampling uses the plain softmax at `temperature` (no top-k),
    so the heads see the model's spread of plausible continuations, not only its greedy path.
    """
    device = _model_device(model)
    eos_ids, pad_id = _special_ids(model, tokenizer)
    encoded = [_encode(tokenizer, p) for p in prompts]
    modes = [False, True] if greedy_and_sampled else [False]
    torch.manual_seed(seed)
    model.eval()
    out = Distilled([], [])
    bar = tqdm(total=len(encoded) * len(modes), unit="seq", desc="self-distill", disable=not progress)
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start : start + batch_size]
        ids, mask = pad_batch(batch, pad_id, side="left")
        for sample in modes:
            settings = {"do_sample": sample, "temperature": temperature, "top_k": 0} if sample else {}
            with _plain_generation_config(
                model, max_new_tokens=max_new_tokens, eos_token_id=eos_ids or None,
                pad_token_id=pad_id, **settings,
            ):
                generated = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device))
            continuations = generated[:, ids.shape[1] :].tolist()
            out.sequences.extend(p + _cut_at_eos(c, eos_ids) for p, c in zip(batch, continuations))
            out.starts.extend(len(p) for p in batch)
            bar.update(len(batch))
    bar.close()
    return out


# ----- the command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register train-heads' flags."""
    io = parser.add_argument_group("model and output")
    io.add_argument("--model", required=True, help="base model: a local folder or a hub id")
    io.add_argument("--out", type=Path, required=True,
                    help="folder for the heads (medusa_heads.safetensors, medusa_config.json) "
                         "and heads_checkpoint/ (training state, data.json)")
    io.add_argument("--also-v01", action="store_true",
                    help="also write the published v0.1 layout (medusa_lm_head.safetensors, "
                         "config.json) to OUT/v0.1")
    io.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    io.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice). On a CPU another job keeps "
                         "busy, use fewer threads than cores: contention made generation 13x slower here")
    io.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default: on for cuda, off for cpu; on a CPU with bf16 "
                         "support it trains ~2x faster, e.g. 790 vs 350 tokens/s here)")

    heads = parser.add_argument_group("heads")
    heads.add_argument("--num-heads", type=int, default=5)
    heads.add_argument("--num-layers", type=int, default=1, help="ResBlocks per head")
    heads.add_argument("--shared-lm-head", action="store_true",
                       help="heads reuse the base lm_head instead of a vocabulary projection each "
                            "(Medusa's 'version 2' layout: much smaller, cheaper to draft on a CPU)")

    data = parser.add_argument_group("data")
    data.add_argument("--data", type=Path, nargs="+", default=[],
                      help="text files or folders of .txt files, tokenized and cut into "
                           "--seq-len chunks")
    data.add_argument("--self-distill", action="store_true",
                      help="train on the model's own continuations of prompts (--prompts, and/or "
                           "the first --prompt-tokens of each --data chunk)")
    data.add_argument("--prompts", type=Path, help="prompts file: .txt, one prompt a line, or .json list of strings")
    data.add_argument("--prompt-tokens", type=int, default=32,
                      help="prompt length when prompts are cut from --data chunks")
    data.add_argument("--max-prompts", type=int, default=None, help="use at most this many prompts")
    data.add_argument("--max-new-tokens", type=int, default=128)
    data.add_argument("--sampled", action=argparse.BooleanOptionalAction, default=True,
                      help="besides the greedy continuation, also a sampled one per prompt")
    data.add_argument("--temperature", type=float, default=0.8)
    data.add_argument("--gen-batch-size", type=int, default=32)
    data.add_argument("--seq-len", type=int, default=256)
    data.add_argument("--heldout-fraction", type=float, default=0.05)

    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=None,
                       help="overrides --epochs; 0 with --init-heads trains nothing and only "
                            "measures those heads and builds their trees")
    train.add_argument("--epochs", type=float, default=1.0)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--weight-decay", type=float, default=0.0)
    train.add_argument("--loss-decay", type=float, default=0.8,
                       help="head k's loss weight is this^(k-1)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    train.add_argument("--init-heads", type=Path, default=None,
                       help="start from heads saved by an earlier run instead of fresh ones")
    train.add_argument("--joint-lr", type=float, default=0.0,
                       help="Medusa-2: also train the base model, at this learning rate, on its "
                            "next-token loss plus the heads'; the tuned base goes to OUT/base")
    train.add_argument("--joint-heads-weight", type=float, default=0.2,
                       help="with --joint-lr: the heads' loss is scaled by this in the joint loss, "
                            "so it does not drown the base model's own")
    train.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default="float32",
                       help="dtype of the tuned base's saved weights (with --joint-lr)")
    train.add_argument("--resume", action="store_true",
                       help="continue from OUT/heads_checkpoint on the same data "
                            "(give the original run's flags)")

    recorded_run.add_recorded_arguments(parser)

    tree = parser.add_argument_group("trees")
    tree.add_argument("--top-k", type=int, default=10, help="ranks measured per head")
    tree.add_argument("--tree-nodes", type=int, nargs="+", default=DEFAULT_TREE_NODES,
                      help="node budgets (root excluded) of the optimal trees to build")
    tree.add_argument("--default-tree-nodes", type=int, default=None,
                      help="which budget becomes default_tree (default: the largest)")
    tree.add_argument("--default-tree-family", choices=("optimal", "joint"), default="optimal",
                      help="optimal: the paper's tree, from the product of per-head accuracies; "
                           "joint: from how often each path of guesses was right on the held-out "
                           "text (best on text like it; on the embedded models' unseen bench "
                           "prompts it was no better)")


def command_line(args: argparse.Namespace) -> str:
    """The reproducible command for these arguments, every flag spelled out."""
    parts = ["python", "-m", "decoding", "train-heads"]
    for key, value in vars(args).items():
        if key in ("func", "command") or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                parts.append(flag)
            elif key in ("bf16", "sampled"):  # the flags that are on unless negated
                parts.append("--no-" + key)
        elif isinstance(value, list):
            if value:
                parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def _check_arguments(args: argparse.Namespace) -> None:
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


def load_base_model(name: str, device: torch.device) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and frozen model, in the dtype decoding uses on this device (fp32 on CPUs)."""
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=resolve_dtype("auto", device))
    return tokenizer, model.to(device).eval()


def text_files(paths: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.rglob("*.txt")) if path.is_dir() else [path])
    return files


def tokenized_chunks(
    tokenizer: PreTrainedTokenizerBase, paths: Sequence[Path], seq_len: int
) -> list[list[int]]:
    """Every file tokenized whole, then cut into consecutive `seq_len`-token chunks."""
    chunks: list[list[int]] = []
    for path in text_files(paths):
        # verbose=False: a whole book is longer than model_max_length, which is fine here
        ids = tokenizer(path.read_text(encoding="utf-8"), verbose=False)["input_ids"]
        chunks.extend(ids[i : i + seq_len] for i in range(0, len(ids), seq_len))
    return [c for c in chunks if len(c) >= 2]


def split_heldout(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """Seeded shuffle, then (train, held-out) with at least one item on each side."""
    if len(items) < 2:
        raise DecodingError(f"need at least 2 prompts or chunks to hold some out, got {len(items)}")
    items = items[:]
    random.Random(seed).shuffle(items)
    held = min(len(items) - 1, max(1, round(fraction * len(items))))
    return items[held:], items[:held]


def build_data(
    args: argparse.Namespace, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    """The train and held-out token sequences, plus a note of where they came from.

    Held-out items are split off *before* self-distillation, so a prompt's greedy and sampled
    continuations never land on both sides.
    """
    chunks = tokenized_chunks(tokenizer, args.data, args.seq_len) if args.data else []
    if not args.self_distill:
        train, heldout = split_heldout(chunks, args.heldout_fraction, args.seed)
        return {"train": train, "heldout": heldout,
                "source": {"kind": "text", "files": [str(p) for p in text_files(args.data)]}}

    prompts: list[Prompt] = []
    if args.prompts:
        prompts += read_prompts(args.prompts)
    prompts += [c[: args.prompt_tokens] for c in chunks]
    random.Random(args.seed).shuffle(prompts)
    prompts = prompts[: args.max_prompts]
    train_prompts, heldout_prompts = split_heldout(prompts, args.heldout_fraction, args.seed)
    started = time.perf_counter()
    distilled = {
        name: self_distill(model, tokenizer, split, args.max_new_tokens, args.sampled,
                           args.gen_batch_size, args.temperature, args.seed)
        for name, split in (("train", train_prompts), ("heldout", heldout_prompts))
    }
    seconds = time.perf_counter() - started
    generated = sum(len(s) - start for d in distilled.values() for s, start in zip(d.sequences, d.starts))
    return {"train": distilled["train"].sequences, "heldout": distilled["heldout"].sequences,
            HELDOUT_STARTS: distilled["heldout"].starts, "source": {
        "kind": "self-distill",
        "prompts": len(prompts),
        "greedy_and_sampled": args.sampled,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "generated_tokens": generated,
        "generation_wall_time_s": round(seconds, 1),
        "generation_tokens_per_s": round(generated / max(seconds, 1e-9), 1),
    }}


def load_or_build_data(
    args: argparse.Namespace, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    """Data is saved before training so `--resume` trains on exactly the same sequences
    (self-distillation is slow and sampling would not repeat itself)."""
    path = args.out / CHECKPOINT_DIR / DATA_FILE
    if args.resume:
        if not path.exists():
            raise DecodingError(f"nothing to resume: no {path}")
        return json.loads(path.read_text())
    data = build_data(args, model, tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return data


@dataclass
class BuiltTrees:
    trees: dict[str, list[list[int]]]
    expected: dict[str, float]  # the paper's product rule, for the optimal-N trees
    measured: dict[str, float]  # tokens per pass on the held-out positions, for every tree


def build_trees(evaluation: HeadsEvaluation, budgets: Sequence[int]) -> BuiltTrees:
    """For each node budget, the paper's optimal tree and the joint tree, with their figures."""
    acc, counts, positions = evaluation.accuracy, evaluation.path_counts, evaluation.joint_positions
    budgets = sorted(set(budgets))
    trees = {f"optimal-{n}": optimal_choices(acc, n) for n in budgets}
    trees |= {f"joint-{n}": joint_optimal_choices(acc, counts, n) for n in budgets}
    expected = {name: round(expected_tokens_per_pass(acc, c), 4)
                for name, c in trees.items() if name.startswith("optimal-")}
    measured = ({name: round(measured_tokens_per_pass(counts, positions, c), 4) for name, c in trees.items()}
                if positions else {})
    return BuiltTrees(trees, expected, measured)


def _print_report(before: HeadsEvaluation, after: HeadsEvaluation, built: BuiltTrees) -> None:
    print(f"held-out loss: {before.loss:.4f} untrained -> {after.loss:.4f} trained")
    print("head  top-1 (untrained -> trained)   top-5 (untrained -> trained)")
    for h in range(len(after.accuracy)):
        print(f"{h + 1:>4}  {before.top1[h]:.3f} -> {after.top1[h]:.3f}"
              f"                 {before.top5[h]:.3f} -> {after.top5[h]:.3f}")
    print(f"tokens per pass: expected by the product rule, and measured on {after.joint_positions:,} "
          "held-out positions")
    for name in built.trees:
        rule = f"product rule {built.expected[name]:.3f}" if name in built.expected else ""
        measured = f"measured {built.measured[name]:.3f}" if name in built.measured else ""
        print(f"{name:>12}  {rule:<20}  {measured}")


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    _check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    bf16 = device.type == "cuda" if args.bf16 is None else args.bf16
    tokenizer, model = load_base_model(args.model, device)
    data = load_or_build_data(args, model, tokenizer)
    print(f"{len(data['train'])} training and {len(data['heldout'])} held-out sequences")

    def evaluate(heads: MedusaHeads) -> HeadsEvaluation:
        return evaluate_heads(model, heads, data["heldout"], args.top_k, args.batch_size,
                              args.loss_decay, bf16, data.get(HELDOUT_STARTS))

    init_heads = None
    if args.init_heads is not None:
        init_heads, _ = MedusaHeads.load(args.init_heads)
        wanted = (args.num_heads, args.num_layers, args.shared_lm_head)
        found = (init_heads.num_heads, init_heads.config.num_layers, init_heads.config.shared_lm_head)
        if found != wanted:
            raise DecodingError(f"--init-heads {args.init_heads}: heads/layers/shared are {found}, "
                                f"the flags say {wanted}")
        init_heads.to(device)
    before = evaluate(new_heads(model, args.num_heads, args.num_layers, args.shared_lm_head))
    base_loss_before = next_token_loss(model, data["heldout"], args.batch_size) if args.joint_lr else None
    run = fit_heads(
        model, data["train"], num_heads=args.num_heads, num_layers=args.num_layers,
        shared_lm_head=args.shared_lm_head,
        steps=args.steps, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
        weight_decay=args.weight_decay, loss_decay=args.loss_decay, seed=args.seed, bf16=bf16,
        checkpoint=args.out / CHECKPOINT_DIR / STATE_FILE, save_every=args.save_every,
        resume=args.resume, init_heads=init_heads, base_lr=args.joint_lr,
        joint_heads_weight=args.joint_heads_weight,
    )
    after = evaluate(run.heads)
    base_model = args.model
    if args.joint_lr:
        base_model = str(args.out / TUNED_BASE_DIR)
        save_model_as(model, tokenizer, args.out / TUNED_BASE_DIR, args.save_dtype)
    built = build_trees(after, args.tree_nodes)
    default = f"{args.default_tree_family}-{args.default_tree_nodes or max(args.tree_nodes)}"
    extra = {
        "base_model": base_model,
        "accuracy": after.accuracy,
        "trees": built.trees,
        "expected_tokens_per_pass": built.expected,
        "heldout_tokens_per_pass": built.measured,
        "default_tree": default,
        "training": {
            "steps": run.steps,
            "tokens": run.tokens,
            "epochs": round(run.steps * args.batch_size / len(data["train"]), 3),
            "train_sequences": len(data["train"]),
            "heldout_sequences": len(data["heldout"]),
            "data": data["source"],
            "final_train_loss": round(run.final_loss, 4),
            "heldout_loss": round(after.loss, 4),
            "heldout_loss_untrained": round(before.loss, 4),
            "heldout_top1": [round(a, 4) for a in after.top1],
            "heldout_top5": [round(a, 4) for a in after.top5],
            "heldout_top1_untrained": [round(a, 4) for a in before.top1],
            **({"base_next_token_loss": {"before": round(base_loss_before, 4),
                                         "after": round(next_token_loss(model, data["heldout"], args.batch_size), 4)}}
               if args.joint_lr else {}),
            "heldout_top5_untrained": [round(a, 4) for a in before.top5],
            "training_wall_time_s": round(run.wall_time_s, 1),
            "training_tokens_per_s": round(run.tokens / max(run.wall_time_s, 1e-9), 1),
            "wall_time_s": round(time.perf_counter() - started, 1),
            "device": str(device),
            "bf16": bf16,
            "command": command_line(args),
        },
    }
    run.heads.save(args.out, extra=extra)
    if args.also_v01:
        save_v01(run.heads, args.out / V01_DIR, base_model)  # the tuned base, after --joint-lr
    _print_report(before, after, built)
    if args.joint_lr:
        losses = extra["training"]["base_next_token_loss"]
        print(f"base model's next-token loss on the held-out sequences: {losses['before']:.4f} -> "
              f"{losses['after']:.4f}; tuned base saved to {base_model}")
    print(f"saved heads to {args.out} (default tree {default}); {run.steps} steps, "
          f"{run.tokens:,} tokens, {extra['training']['wall_time_s']:.0f} s")
    return 0


def run(args: argparse.Namespace) -> int:
    """Train heads as the flags say; 0 on success, 2 (with a message) on a usage problem."""
    try:
        return recorded_run.run_recorded(args) if args.recorded else _run(args)
    except DecodingError as err:
        print(f"train-heads: {err}", file=sys.stderr)
        return 2

