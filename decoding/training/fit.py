"""Fitting Medusa heads to token sequences: Medusa-1 (frozen base) and Medusa-2 (base tuned too).

The recipe (the Medusa paper's, Cai et al. 2024):

* Medusa-1 freezes the base model: it only supplies, once per batch, the last hidden state (the
  exact tensor its lm_head reads) and the heads learn on top of it;
* head k at position t learns token t+1+k with cross-entropy; the heads' losses are summed with
  weights 0.8^(k-1), so the nearer (more often useful) heads count most;
* AdamW, lr 1e-3, 10% linear warmup then cosine decay, about one epoch;
* Medusa-2 (`joint_lr` > 0) trains the base model too, on its own next-token loss plus the
  heads' (scaled down), so its last hidden state learns to say more about the tokens after the
  next.

A run saves its whole state every `save_every` steps, and a resumed run sees exactly the batches
it would have seen: `batches.batch_for_step` is a pure function of the step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_cosine_schedule_with_warmup

from ..errors import DecodingError
from ..medusa_modules import HeadsConfig, MedusaHeads
from .batches import (
    BATCH_SIZE,
    IGNORE_INDEX,
    LOSS_DECAY,
    autocast,
    check_lm_head_reads,
    each_head,
    in_batches,
    last_hidden_states,
    model_device,
    next_token_targets,
    training_batch,
    use_bf16,
)
from .saving import load_state, save_state

WARMUP = 0.1  # share of the steps spent warming the learning rate up


@dataclass
class FitSettings:
    """What `fit_heads` trains and how; the defaults are `train-heads`' defaults."""

    num_heads: int = 5
    num_layers: int = 1  # ResBlocks per head
    # Heads reuse the base lm_head instead of a vocabulary projection each (Medusa's "version 2"
    # layout): far smaller, and cheaper to draft with on a CPU.
    shared_lm_head: bool = False
    steps: int | None = None  # None: `epochs` passes over the sequences
    epochs: float = 1.0
    lr: float = 1e-3
    batch_size: int = BATCH_SIZE
    weight_decay: float = 0.0
    loss_decay: float = LOSS_DECAY
    max_grad_norm: float = 1.0
    seed: int = 0
    bf16: bool | None = None  # autocast; None: on for CUDA, off elsewhere
    save_every: int = 200  # steps between checkpoints
    joint_lr: float = 0.0  # > 0: Medusa-2, the base model trains too, at this learning rate
    joint_heads_weight: float = 0.2  # with joint_lr: the heads' loss is scaled by this

    def total_steps(self, num_sequences: int) -> int:
        if self.steps is not None:
            return self.steps
        return max(1, math.ceil(self.epochs * num_sequences / self.batch_size))

    @property
    def joint(self) -> bool:
        return self.joint_lr > 0


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


def new_heads(
    model: PreTrainedModel, num_heads: int = FitSettings.num_heads, num_layers: int = FitSettings.num_layers,
    shared_lm_head: bool = False,
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
    return heads.to(model_device(model))


# ----- one step ---------------------------------------------------------------------------------
TrainStep = Callable[[PreTrainedModel, MedusaHeads, torch.Tensor, torch.Tensor, float, bool], float]


def _train_step(
    model: PreTrainedModel, heads: MedusaHeads, ids: torch.Tensor, mask: torch.Tensor, loss_decay: float,
    bf16: bool,
) -> float:
    """Forward the frozen base once, then each head; return the weighted loss (grads accumulated).

    Each head's loss is backpropagated on its own: the heads share no parameters, so the
    gradients equal those of the summed loss, while only one head's logits are in memory at a
    time — with 5 heads and a large vocabulary that is most of the memory.
    """
    with autocast(ids.device, bf16):
        hidden = last_hidden_states(model, ids, mask).float()
    total = 0.0
    for k, logits, targets, _ in each_head(heads, hidden, ids, mask, bf16, model.get_output_embeddings()):
        # Weight 1 for head 1, as the reference code does; Adam ignores the overall scale anyway.
        loss = loss_decay ** (k - 1) * F.cross_entropy(logits, targets)
        loss.backward()
        total += loss.item()
    return total


def _joint_train_step(
    model: PreTrainedModel, heads: MedusaHeads, ids: torch.Tensor, mask: torch.Tensor, loss_decay: float,
    bf16: bool, heads_weight: float,
) -> float:
    """Medusa-2: the base model's own next-token loss plus the heads', backpropagated into both.

    The sequences are the base model's own continuations, so its next-token loss pulls it
    towards what it already wrote: it keeps its behaviour while its last hidden state learns to
    say more about the tokens after the next, which is what the heads read. The heads' summed
    loss is many times the base's, so it is scaled by `heads_weight` lest it drag the base
    model away from its own predictions.
    """
    with autocast(ids.device, bf16):
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    targets = next_token_targets(ids, mask)
    loss = F.cross_entropy(out.logits[:, :-1].float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX)
    hidden = out.hidden_states[-1].float()
    for k, logits, head_targets_k, _ in each_head(heads, hidden, ids, mask, bf16, model.get_output_embeddings()):
        loss = loss + heads_weight * loss_decay ** (k - 1) * F.cross_entropy(logits, head_targets_k)
    loss.backward()
    return loss.item()


@torch.no_grad()
def next_token_loss(model: PreTrainedModel, token_sequences: Sequence[Sequence[int]],
                    batch_size: int = BATCH_SIZE) -> float:
    """The base model's mean next-token cross-entropy on `token_sequences`."""
    total, count = 0.0, 0
    for ids, mask in in_batches(token_sequences, batch_size, model_device(model)):
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        targets = next_token_targets(ids, mask)
        total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="sum").item()
        count += int((targets != IGNORE_INDEX).sum())
    return total / max(count, 1)


# ----- the loop ---------------------------------------------------------------------------------
@dataclass
class _Training:
    """What a checkpoint holds besides the run's counters: the optimizer and its schedule, and
    the base model when it trains too (Medusa-2)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    total_steps: int
    base: PreTrainedModel | None


def _start(heads: MedusaHeads, model: PreTrainedModel, settings: FitSettings, steps: int) -> _Training:
    groups = [{"params": list(heads.parameters()), "lr": settings.lr}]
    if settings.joint:
        groups.append({"params": list(model.parameters()), "lr": settings.joint_lr})
    optimizer = torch.optim.AdamW(groups, weight_decay=settings.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(WARMUP * steps), steps)
    return _Training(optimizer, scheduler, steps, model if settings.joint else None)


def _save(path: Path | None, run: TrainingRun, training: _Training) -> None:
    if path is None:
        return
    save_state(path, {
        "heads_config": asdict(run.heads.config),
        "heads": run.heads.state_dict(),
        "optimizer": training.optimizer.state_dict(),
        "scheduler": training.scheduler.state_dict(),
        "total_steps": training.total_steps,
        "step": run.steps,
        "tokens": run.tokens,
        "losses": run.losses,
        "wall_time_s": run.wall_time_s,
        **({"base": training.base.state_dict()} if training.base is not None else {}),
    })


def _restore(path: Path, run: TrainingRun, training: _Training) -> None:
    """Continue a run from its checkpoint; the base model too when the run trains it (Medusa-2)."""
    state = load_state(path)
    if state["heads_config"] != asdict(run.heads.config) or state["total_steps"] != training.total_steps:
        raise DecodingError(
            "the checkpoint was made with other heads or another step count: resume with the "
            "original run's flags"
        )
    run.heads.load_state_dict(state["heads"])
    if training.base is not None:
        training.base.load_state_dict(state["base"])
    training.optimizer.load_state_dict(state["optimizer"])
    training.scheduler.load_state_dict(state["scheduler"])
    run.steps, run.tokens = state["step"], state["tokens"]
    run.losses, run.wall_time_s = state["losses"], state["wall_time_s"]


def fit_heads(
    model: PreTrainedModel,
    token_sequences: Sequence[Sequence[int]],
    settings: FitSettings | None = None,
    *,
    init_heads: MedusaHeads | None = None,
    checkpoint: Path | None = None,
    resume: bool = False,
    progress: bool = True,
) -> TrainingRun:
    """Train heads on `token_sequences`; the run's statistics come with them.

    Heads start fresh, or from `init_heads`. With `checkpoint` (a file path) the state is saved
    every `settings.save_every` steps and at the end; `resume=True` continues from it when there
    is one (a run killed before its first save starts afresh).
    """
    settings = settings or FitSettings()
    if len(token_sequences) == 0:
        raise DecodingError("no training sequences")
    device = model_device(model)
    bf16 = use_bf16(settings.bf16, device)
    steps = settings.total_steps(len(token_sequences))
    # Medusa-1 freezes the base: no gradient may reach it, not even through a shared lm_head
    # (tied embeddings). Dropout stays off either way (eval mode): the heads see the states
    # decoding will give them.
    model.eval().requires_grad_(settings.joint)
    heads = init_heads or new_heads(model, settings.num_heads, settings.num_layers, settings.shared_lm_head)
    training = _start(heads, model, settings, steps)
    run = TrainingRun(heads=heads, steps=0, tokens=0)
    if resume and checkpoint is not None and checkpoint.exists():
        _restore(checkpoint, run, training)
    else:
        check_lm_head_reads(model, *training_batch(token_sequences, 0, settings.batch_size, settings.seed, device))
    train_step: TrainStep = (partial(_joint_train_step, heads_weight=settings.joint_heads_weight)
                             if settings.joint else _train_step)
    trained = [param for group in training.optimizer.param_groups for param in group["params"]]

    heads.train()
    started, before = time.perf_counter(), run.wall_time_s
    bar = tqdm(total=steps, initial=run.steps, unit="step", disable=not progress, mininterval=1.0)
    while run.steps < steps:
        ids, mask = training_batch(token_sequences, run.steps, settings.batch_size, settings.seed, device)
        loss = train_step(model, heads, ids, mask, settings.loss_decay, bf16)
        torch.nn.utils.clip_grad_norm_(trained, settings.max_grad_norm)
        training.optimizer.step()
        training.scheduler.step()
        training.optimizer.zero_grad(set_to_none=True)
        run.steps += 1
        run.tokens += int(mask.sum())
        run.losses.append(loss)
        run.wall_time_s = before + time.perf_counter() - started
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{run.tokens / max(run.wall_time_s, 1e-9):,.0f}", refresh=False)
        if run.steps % settings.save_every == 0:
            _save(checkpoint, run, training)
    bar.close()
    _save(checkpoint, run, training)
    heads.eval()
    model.requires_grad_(False)
    return run
