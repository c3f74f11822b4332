"""How well heads guess: loss and per-rank accuracy of every head on held-out sequences, and how
often each path of guesses was exactly right (what the joint trees are grown from).

The target is the one training uses (`batches.head_targets`): head k at position t is scored on
token t+1+k. Accuracy is counted per rank, so `accuracy[h][r]` is the share of positions where
head h+1's rank-r guess was the true token; ranks exclude each other, so a row sums to at most 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..medusa_modules import MedusaHeads
from .batches import (
    BATCH_SIZE,
    IGNORE_INDEX,
    LOSS_DECAY,
    autocast,
    each_head,
    head_targets,
    in_batches,
    last_hidden_states,
    model_device,
    use_bf16,
)
from .trees import TOP_K, count_paths


@dataclass
class RankAccuracy:
    """How often each head's rank-r guess was the true token, and which paths of guesses were right."""

    accuracy: list[list[float]]  # accuracy[h][r]: share of positions where head h+1's rank r is right
    positions: list[int]  # how many positions each head was scored on
    # Paths of ranks exactly right, counted at the positions where every head has a target
    # (see `trees.count_paths`): what the joint trees are grown from.
    path_counts: Counter[tuple[int, ...]]
    joint_positions: int

    @property
    def top1(self) -> list[float]:
        return [row[0] for row in self.accuracy]

    @property
    def top5(self) -> list[float]:
        # Ranks are exclusive (one true token per position), so top-5 is a sum of ranks 0..4.
        return [sum(row[:5]) for row in self.accuracy]


@dataclass
class HeadsEvaluation(RankAccuracy):
    """How well each head predicts its token on some sequences, with the training objective."""

    loss: float = 0.0  # sum over heads of 0.8^(k-1) * mean cross-entropy
    head_losses: list[float] = field(default_factory=list)


@torch.no_grad()
def evaluate_heads(
    model: PreTrainedModel,
    heads: MedusaHeads,
    token_sequences: Sequence[Sequence[int]],
    top_k: int = TOP_K,
    batch_size: int = BATCH_SIZE,
    loss_decay: float = LOSS_DECAY,
    bf16: bool | None = None,
    starts: Sequence[int] | None = None,
) -> HeadsEvaluation:
    """Loss and per-rank accuracy of every head, the target being defined as in training.

    With `starts` (where each sequence's self-distilled continuation begins), the joint path
    counts keep only the positions decoding meets: from the prompt's last token on, where the
    base model's next token and every head's target are the model's own output.
    """
    device = model_device(model)
    bf16 = use_bf16(bf16, device)
    heads.eval()
    k_max = heads.num_heads
    loss_sums, counts = [0.0] * k_max, [0] * k_max
    rank_hits = torch.zeros((k_max, top_k), dtype=torch.long)
    path_counts: Counter[tuple[int, ...]] = Counter()
    joint_positions = 0
    for batch_index, (ids, mask) in enumerate(in_batches(token_sequences, batch_size, device)):
        with autocast(device, bf16):
            hidden = last_hidden_states(model, ids, mask).float()
        # Where the last head has a target, every head has one: those positions give the joint ranks.
        every_head = head_targets(ids, mask, k_max) != IGNORE_INDEX
        if starts is not None:
            batch_starts = torch.tensor(starts[batch_index * batch_size : (batch_index + 1) * batch_size],
                                        device=device)
            positions = torch.arange(ids.shape[1], device=device)
            every_head &= positions[None, :] >= batch_starts[:, None] - 1
        joint_ranks = []
        for k, logits, targets, valid in each_head(heads, hidden, ids, mask, bf16, model.get_output_embeddings()):
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
    head_losses = [s / c if c else float("nan") for s, c in zip(loss_sums, counts, strict=True)]
    accuracy = [[h / c if c else 0.0 for h in row] for row, c in zip(rank_hits.tolist(), counts, strict=True)]
    loss = sum(loss_decay**i * h for i, h in enumerate(head_losses))
    return HeadsEvaluation(accuracy=accuracy, positions=counts, path_counts=path_counts,
                           joint_positions=joint_positions, loss=loss, head_losses=head_losses)

