"""The tensors one step of head training reads: padded batches, each head's targets, and the
base model's last hidden state, the one input every head reads.

Head k (k = 1..K) at position t learns token t+1+k; where a sequence ends before that, the target
is IGNORE_INDEX and the position is skipped. The base model is only ever asked for the state its
lm_head reads (`last_hidden_states`), and `check_lm_head_reads` makes sure that state really is
the one: heads trained on any other tensor would be useless at decoding time.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence

import torch
from transformers import PreTrainedModel

from ..errors import DecodingError
from ..medusa_modules import MedusaHeads

IGNORE_INDEX = -100  # F.cross_entropy skips targets with this value
BATCH_SIZE = 8  # sequences per step, in training and in evaluation
LOSS_DECAY = 0.8  # head k's loss counts loss_decay^(k-1): the nearer heads are more often useful


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


def training_batch(
    token_sequences: Sequence[Sequence[int]], step: int, batch_size: int, seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = [token_sequences[i] for i in batch_for_step(step, len(token_sequences), batch_size, seed)]
    ids, mask = pad_batch(batch, pad_id=0)
    return ids.to(device), mask.to(device)


def in_batches(
    token_sequences: Sequence[Sequence[int]], batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The sequences in order, padded into (ids, mask) batches on `device`: for evaluation."""
    for start in range(0, len(token_sequences), batch_size):
        ids, mask = pad_batch(token_sequences[start : start + batch_size], pad_id=0)
        yield ids.to(device), mask.to(device)


def next_token_targets(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What the base model's logits at each position should predict; padding is ignored."""
    return ids[:, 1:].masked_fill(mask[:, 1:] == 0, IGNORE_INDEX)


def autocast(device: torch.device, bf16: bool) -> torch.autocast:
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


def model_device(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device


def each_head(
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
            with autocast(hidden.device, bf16):
                logits = heads.head_logits(k - 1, hidden[valid], lm_head)
            yield k, logits.float(), targets[valid], valid


def use_bf16(setting: bool | None, device: torch.device) -> bool:
    """bf16 autocast as asked, or by default where it pays without asking: on CUDA."""
    return device.type == "cuda" if setting is None else setting


def cut_at_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    """Keep up to and including the first stop token (what follows is padding)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens
