"""Medusa-1 heads trained on a recording of the model's own answers: no base-model pass per step.

The recorder (`answer_batcher.py`, seen through `answers.py`) keeps, for every answer token, the final
hidden state that chose it and the base model's top guesses there. That is all a frozen-base head
needs, so the heads train for as many epochs as they like at the price of the heads alone — on a
CPU, a small fraction of one base pass.

Three choices make the heads cheap to train and to run:

* **A draft vocabulary.** The heads guess only among the `draft_vocab_size` tokens the model wrote
  most often in its own answers (FR-Spec). Their logits are `ResBlock(state) @ W[vocab].T`, with
  `W` the base model's lm_head rows for those tokens, frozen: the heads reuse the base model's
  vocabulary projection (shared lm_head), so each head is one ResBlock of hidden x hidden.
* **Soft targets.** Head k at answer token i learns the base model's whole distribution at token
  i+k (its recorded top guesses, renormalised over the draft vocabulary), not only the token it
  chose: a KL loss against the base model's distribution, which teaches the heads the base
  model's *second* choices as well — the ones the tree's rank-2 and rank-3 branches try. Mixed
  with plain cross-entropy on the chosen token by `hard_weight`.
* **Sum over heads weighted 0.8^(k-1)**, as in the Medusa recipe: nearer heads matter more.

Positions are the recorded answer tokens, concatenated; `remaining[i]` counts the tokens after
token i in its own answer, so head k trains at i only if `remaining[i] >= k`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from ..medusa_modules import HeadsConfig, MedusaHeads, draft_indices
from .answers import Answers
from .evaluate import RankAccuracy
from .trees import count_paths


@dataclass
class RecordedData:
    """Recorded answers, flattened: one row per answer token."""

    states: torch.Tensor  # (N, H) float16: the state that chose token i
    tokens: torch.Tensor  # (N,) the token it chose
    remaining: torch.Tensor  # (N,) tokens after i in the same answer
    teacher_ids: torch.Tensor  # (N, k) the base model's top guesses for token i
    teacher_logits: torch.Tensor  # (N, k)

    @classmethod
    def from_answers(cls, answers: Answers) -> RecordedData:
        remaining = torch.cat([torch.arange(len(a) - 1, -1, -1) for a in answers.answers])
        return cls(answers.states, answers.tokens, remaining, answers.teacher_ids.long(),
                   answers.teacher_logits)

    def __len__(self) -> int:
        return len(self.tokens)


def choose_draft_vocab(tokens: torch.Tensor, size: int, vocab_size: int) -> torch.Tensor:
    """The `size` token ids written most often (ties to the lower id), most frequent first."""
    counts = torch.bincount(tokens, minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))
    return torch.tensor(order[:size], dtype=torch.long)


def coverage(tokens: torch.Tensor, draft_vocab: torch.Tensor) -> float:
    """Share of `tokens` inside the draft vocabulary: the ceiling on any head's accuracy."""
    return float(torch.isin(tokens, draft_vocab).float().mean())


@dataclass
class RecordedTrainingSettings:
    num_heads: int = 5
    num_layers: int = 1
    draft_vocab_size: int = 8192
    epochs: float = 2.0
    batch_size: int = 512
    lr: float = 1e-3
    warmup: float = 0.1
    loss_decay: float = 0.8
    hard_weight: float = 0.5  # 0: pure KL to the base model; 1: pure cross-entropy on its choice
    bf16: bool = True  # autocast the vocabulary products (the CPUs this runs on do bf16 natively)
    reads_root: bool = True  # heads also read the root token's embedding (see heads.py)
    seed: int = 0
    # Which heads learn (1-based); None: all. The others keep what they had and cost nothing.
    trained_heads: tuple[int, ...] | None = None
    # "cosine" over `epochs`; "constant" after the warmup, for a run stopped by the clock, which
    # cannot know how many steps it will get (nor take its warmup as a share of them: `warmup_steps`).
    schedule: str = "cosine"
    warmup_steps: int | None = None  # None: `warmup` of the steps

    def learns(self, head: int) -> bool:
        return self.trained_heads is None or head in self.trained_heads


@dataclass
class RecordedTrainingRun:
    heads: MedusaHeads
    steps: int
    positions: int
    losses: list[float] = field(default_factory=list)
    wall_time_s: float = 0.0


class _Vocabulary:
    """Maps token ids to draft-vocabulary indices (-1 outside it), and holds the frozen projection
    and the base model's frozen input embedding (for heads that read the root token)."""

    def __init__(self, heads: MedusaHeads, lm_head: nn.Linear, embedding: nn.Embedding) -> None:
        self.projection = heads.draft_projection(lm_head)
        self.embedding = embedding if heads.config.reads_root else None
        guessed = heads.draft_vocab if heads.draft_vocab is not None else torch.arange(heads.config.vocab_size)
        self.index = draft_indices(guessed, heads.config.vocab_size)

    def roots(self, data: RecordedData, rows: torch.Tensor) -> torch.Tensor | None:
        """The embedding of the token each row's state chose: the root a head reads."""
        return None if self.embedding is None else self.embedding(data.tokens[rows]).detach().float()


def _head_loss(log_q: torch.Tensor, rows: torch.Tensor, data: RecordedData, vocab: _Vocabulary,
               hard_weight: float) -> torch.Tensor:
    """Soft cross-entropy to the base model's (renormalised) top guesses, mixed with hard CE."""
    teacher = vocab.index[data.teacher_ids[rows]]  # (n, k) draft indices, -1 outside
    inside = teacher >= 0
    teacher_logits = data.teacher_logits[rows].float().masked_fill(~inside, -math.inf)
    has_mass = inside.any(dim=1)
    p = torch.softmax(teacher_logits[has_mass], dim=-1)
    soft = -(p * log_q[has_mass].gather(1, teacher[has_mass].clamp(min=0))).sum(1).mean()
    hard_targets = vocab.index[data.tokens[rows]]
    hard = F.nll_loss(log_q, hard_targets, ignore_index=-1) if (hard_targets >= 0).any() else soft * 0
    return (1 - hard_weight) * soft + hard_weight * hard


def _batch_loss(heads: MedusaHeads, data: RecordedData, rows: torch.Tensor, vocab: _Vocabulary,
                settings: RecordedTrainingSettings) -> torch.Tensor:
    states = data.states[rows].float()
    roots = vocab.roots(data, rows)
    total = states.new_zeros(())
    for k in range(1, heads.num_heads + 1):
        valid = data.remaining[rows] >= k
        if not settings.learns(k) or not valid.any():
            continue
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            logits = heads.head_logits(k - 1, states[valid], vocab.projection,
                                       None if roots is None else roots[valid])
        log_q = torch.log_softmax(logits.float(), dim=-1)
        total = total + settings.loss_decay ** (k - 1) * _head_loss(
            log_q, rows[valid] + k, data, vocab, settings.hard_weight)
    return total


def new_recorded_heads(lm_head: nn.Linear, draft_vocab: torch.Tensor, settings: RecordedTrainingSettings
                       ) -> MedusaHeads:
    config = HeadsConfig(num_heads=settings.num_heads, num_layers=settings.num_layers,
                         hidden_size=lm_head.in_features, vocab_size=lm_head.out_features,
                         shared_lm_head=True, draft_vocab_size=len(draft_vocab), reads_root=settings.reads_root)
    heads = MedusaHeads(config)
    heads.draft_vocab.copy_(draft_vocab)
    return heads


def recorded_training_steps(heads: MedusaHeads, lm_head: nn.Linear, embedding: nn.Embedding, data: RecordedData,
                            settings: RecordedTrainingSettings) -> Iterator[RecordedTrainingRun]:
    """Train `heads` in place on the recorded answers, yielding the run after every step; the base
    model is never run. The heads are in eval mode while the caller holds them (to measure them,
    or to stop: a generator stops where its caller does); `run.wall_time_s` counts the steps alone.

    The learning rate follows one cosine over `settings.epochs`, the most epochs there can be (or
    stays constant after the warmup: `settings.schedule`).
    """
    generator = torch.Generator().manual_seed(settings.seed)
    vocab = _Vocabulary(heads, lm_head, embedding)
    trainable = torch.nonzero(data.remaining >= 1).flatten()
    steps = max(1, math.ceil(settings.epochs * len(trainable) / settings.batch_size))
    trained = [p for k in range(1, heads.num_heads + 1) if settings.learns(k) for p in heads.head_parameters(k)]
    optimizer = torch.optim.AdamW(trained, lr=settings.lr, weight_decay=0.0)
    warmup = settings.warmup_steps if settings.warmup_steps is not None else round(settings.warmup * steps)
    scheduler = (get_constant_schedule_with_warmup(optimizer, warmup) if settings.schedule == "constant"
                 else get_cosine_schedule_with_warmup(optimizer, warmup, steps))
    run = RecordedTrainingRun(heads=heads, steps=0, positions=len(trainable))
    order = trainable[torch.randperm(len(trainable), generator=generator)]
    cursor = 0
    for step in range(steps):
        started = time.perf_counter()
        heads.train()
        if cursor + settings.batch_size > len(order):
            order, cursor = trainable[torch.randperm(len(trainable), generator=generator)], 0
        rows = order[cursor : cursor + settings.batch_size]
        cursor += settings.batch_size
        loss = _batch_loss(heads, data, rows, vocab, settings)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        scheduler.step()
        heads.eval()
        run.losses.append(loss.item())
        run.steps = step + 1
        run.wall_time_s += time.perf_counter() - started
        yield run


def fit_recorded_heads(heads: MedusaHeads, lm_head: nn.Linear, embedding: nn.Embedding, data: RecordedData,
                       settings: RecordedTrainingSettings, progress: bool = True,
                       after_epoch: Callable[[int], bool] | None = None) -> RecordedTrainingRun:
    """Train `heads` in place on the recorded answers, for `settings.epochs`.

    `after_epoch(epoch)` is called after each epoch (1, 2, ...; the last may be a part of one)
    and ends training when it returns True: the caller measures held-out accuracy there and
    stops once it no longer rises.
    """
    steps_per_epoch = math.ceil(int((data.remaining >= 1).sum()) / settings.batch_size)
    run = RecordedTrainingRun(heads=heads, steps=0, positions=0)
    bar = tqdm(desc="train heads", unit="step", disable=not progress,
               total=max(1, math.ceil(settings.epochs * steps_per_epoch)))
    for run in recorded_training_steps(heads, lm_head, embedding, data, settings):
        bar.update(1)
        if after_epoch is not None and (run.steps % steps_per_epoch == 0 or run.steps == bar.total):
            if after_epoch(math.ceil(run.steps / steps_per_epoch)):
                break
    bar.close()
    return run


@dataclass
class RecordedEvaluation(RankAccuracy):
    """How often each head's rank-r guess was the token the base model then wrote."""

    vocab_coverage: float = 1.0  # share of the answers' tokens inside the draft vocabulary


@torch.no_grad()
def evaluate_recorded_heads(heads: MedusaHeads, lm_head: nn.Linear, embedding: nn.Embedding, data: RecordedData,
                            top_k: int = 10, batch_size: int = 2048,
                            measured: Sequence[int] | None = None) -> RecordedEvaluation:
    """Per-rank accuracy of every head and the joint path counts, on held-out recorded answers.

    A joint position is one where every head has a target: there the row of ranks at which the
    heads found their true tokens says which paths of a tree would have been accepted.
    `measured` (1-based heads) measures only those, at a fraction of the price (a measurement
    while training): the others' rows stay empty, and so do the path counts.
    """
    vocab = _Vocabulary(heads, lm_head, embedding)
    heads.eval()
    k_max = heads.num_heads
    hits = torch.zeros((k_max, top_k), dtype=torch.long)
    counts = [0] * k_max
    path_counts: Counter[tuple[int, ...]] = Counter()
    joint_positions = 0
    for start in range(0, len(data), batch_size):
        rows = torch.arange(start, min(start + batch_size, len(data)))
        states = data.states[rows].float()
        roots = vocab.roots(data, rows)
        ranks = torch.full((len(rows), k_max), top_k, dtype=torch.long)
        for k in range(1, k_max + 1):
            valid = data.remaining[rows] >= k
            if (measured is not None and k not in measured) or not valid.any():
                continue
            logits = heads.head_logits(k - 1, states[valid], vocab.projection, None if roots is None else roots[valid])
            guesses = logits.topk(top_k).indices
            found = guesses == vocab.index[data.tokens[rows[valid] + k]][:, None]
            hits[k - 1] += found.sum(0)
            counts[k - 1] += int(valid.sum())
            ranks[valid, k - 1] = torch.where(found.any(-1), found.int().argmax(-1), top_k)
        if measured is not None:
            continue
        joint = data.remaining[rows] >= k_max
        path_counts.update(count_paths(ranks[joint].tolist(), top_k))
        joint_positions += int(joint.sum())
    accuracy = [[h / c if c else 0.0 for h in row] for row, c in zip(hits.tolist(), counts, strict=True)]
    return RecordedEvaluation(accuracy, counts, path_counts, joint_positions,
                              coverage(data.tokens, heads.draft_vocab) if heads.draft_vocab is not None else 1.0)
