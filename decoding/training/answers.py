"""A recording's answers as Medusa's heads read them: one row per answer token.

The recorder (`answer_batcher.py`) keeps, at every position of prompt + answer, a few layers' states,
and for every answer token the base model's top-k logits. The heads need less: for answer token
i, the final hidden state that chose it (what a head reads at decoding time) and the base
model's top guesses at that step (the soft targets of a distillation loss). `Answers` holds that
view, answers concatenated in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .answer_batcher import Recorded
from .recording import finished_shards, load_shard


@dataclass
class Answers:
    """Row i of the tensors belongs to answer token i, answers concatenated in order: `states[i]`
    is the final hidden state whose logits chose `tokens[i]`, and `teacher_ids/logits[i]` are the
    base model's top guesses at that step (logits in float16: only their softmax is used)."""

    prompts: list[list[int]]
    answers: list[list[int]]
    states: torch.Tensor  # (N, hidden) float16
    tokens: torch.Tensor  # (N,) int64
    teacher_ids: torch.Tensor  # (N, top_k) int32
    teacher_logits: torch.Tensor  # (N, top_k) float16


def answers_from(recorded: list[Recorded]) -> Answers:
    """The heads' view of recorded answers: the final state (the recording's last kept layer) at
    the positions that chose each answer token, from the prompt's last position on."""
    states = [r.features[len(r.prompt) - 1:, -1] for r in recorded]
    return Answers(
        prompts=[r.prompt for r in recorded], answers=[r.answer for r in recorded],
        states=torch.cat(states), tokens=torch.tensor([t for r in recorded for t in r.answer]),
        teacher_ids=torch.cat([r.top_ids for r in recorded]),
        teacher_logits=torch.cat([r.top_logits for r in recorded]),
    )


def load_answers(path: Path) -> Answers:
    return answers_from(load_shard(path))


def read_shards(*folders: Path) -> list[Path]:
    """Every finished shard in these recording folders, folder by folder, in order."""
    return [p for folder in folders for p in finished_shards(folder)]


def concat_answers(parts: list[Answers]) -> Answers:
    return Answers(
        prompts=[p for a in parts for p in a.prompts], answers=[s for a in parts for s in a.answers],
        **{name: torch.cat([getattr(a, name) for a in parts])
           for name in ("states", "tokens", "teacher_ids", "teacher_logits")},
    )


def drop_prompts(answers: Answers, prompts: set[tuple[int, ...]]) -> Answers:
    """The answers whose prompt is not in `prompts`: keeps held-out questions out of training."""
    keep = torch.tensor([tuple(p) not in prompts for p in answers.prompts])
    rows = torch.repeat_interleave(keep, torch.tensor([len(a) for a in answers.answers]))
    return Answers(
        prompts=[p for p, k in zip(answers.prompts, keep, strict=True) if k],
        answers=[a for a, k in zip(answers.answers, keep, strict=True) if k],
        **{name: getattr(answers, name)[rows] for name in ("states", "tokens", "teacher_ids", "teacher_logits")},
    )
