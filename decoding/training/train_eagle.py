"""Training an EAGLE draft head on recorded answers, with the base model frozen.

    python -m decoding train-eagle --model smollm2 --recorded assets/recordings/smollm2-chat --out eagle/

The recording (`record`, recording.py) holds the model's own greedy answers and, at every position
j of prompt + answer, the base model's states there: the final normed state f_j (what its lm_head
reads: f_j chose token t_{j+1}) and, for EAGLE-3, a low, a middle and a high layer's. That is all
EAGLE learns from: the base model never runs again. The draft reads the pair (text feature at j,
t_{j+1}) and learns:

* **the next token's distribution**: KL from the base model's own distribution at j + 1,
  softmax(lm_head(f_{j+1})) over the draft vocabulary, to the draft's, softmax(lm_head(output)).
  This is what acceptance depends on, and EAGLE-3 trains on it alone. Optionally mixed
  (`hard_weight`) with cross-entropy on the token the base model chose there, t_{j+2}: greedy
  acceptance counts only that one, and a small layer spends capacity matching the tail;
* optionally **the next feature** (EAGLE-1): a smooth-L1 regression of its output onto f_{j+1}
  (`feature_weight`; 0 in EAGLE-3's recipe, where it measured worse).

**Fused features** (EAGLE-3, `fused`): the text's feature is one linear layer over the three
layers' states side by side (eagle.py `text_features`); a guessed position reads the draft's own
output instead.

**Training-time test** (EAGLE-3). At decoding time the draft's second step reads its *own* output,
not a true feature, and errors compound. So each batch is unrolled `unroll` steps: step s reads,
at position j, what step s-1 output for j, and attends to the true features of the text before
the guesses began plus its own guessed rows since, exactly the attention the drafted tree has
(see `unroll_mask`). Each step's loss counts `STEP_DECAY` times the one before. Uniform noise on
the true input states (EAGLE-1) makes the first step robust too.

Answers are packed into batches of about `batch_tokens` tokens with a block-diagonal mask. The
last shards are held out for the per-depth acceptance on the card; validation shards before them
choose the epoch kept. Checkpoints after every epoch make a run resumable (`--resume`).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel, get_cosine_schedule_with_warmup

from ..eagle_layer import EagleHead
from ..medusa_modules import draft_indices, vocabulary_rows
from ..passes import additive_mask
from .answer_batcher import Recorded

STEP_DECAY = 0.8  # each unrolled step's loss weighs this much less than the step before
CHECKPOINT = "eagle_checkpoint.pt"


@dataclass
class EagleTrainingSettings:
    epochs: int = 8
    lr: float = 1e-3
    warmup_steps: int = 20
    batch_tokens: int = 512
    unroll: int = 7  # training-time test steps
    noise: float = 0.2  # uniform noise on the true input states, times their RMS
    feature_weight: float = 0.0  # the next-feature regression's weight, against the token KL's 1
    # 0: the token loss is the KL to the base model's distribution alone; 1: cross-entropy on the
    # token it chose alone (Medusa's heads mix them half and half, recorded_heads.py).
    hard_weight: float = 0.0
    # EAGLE-3: read a low, a middle, a high layer and the final state, fused; else (EAGLE-1) the
    # final state. EAGLE-1 measured better on SmolLM2's recording (docs/measured.md).
    fused: bool = False
    draft_vocab_size: int = 8192
    patience: int = 2  # epochs without a validation gain before training stops
    # "identity": the draft layer starts by passing the text's feature through unchanged, the way
    # Medusa's heads start (see `start_as_identity`); "random": the layer class's own initialisation.
    start: str = "identity"
    max_seconds: float = 0.0  # stop after the epoch that ends past this much training (0: no limit)
    seed: int = 0


@dataclass
class Sequence:
    """One recorded answer with its prompt: tokens, the base model's states, where the answer starts."""

    tokens: torch.Tensor  # (L,) long
    features: torch.Tensor  # (L, H): the final state f_j, which chose tokens[j + 1]
    answer_start: int
    # (L, layers * H): the states a fused head reads for the text (None: it reads `features`)
    inputs: torch.Tensor | None = None

    @property
    def text_states(self) -> torch.Tensor:
        return self.features if self.inputs is None else self.inputs


def sequences_from(recorded: list[Recorded], layers: list[int], fused: bool) -> list[Sequence]:
    """Training sequences from a recording's answers: prompt + answer, the states at every position.

    The recording keeps `layers` (answer_batcher.feature_layers: EAGLE-3's three, then the final
    state) at every position but the last, so the last answer token, whose state was never
    computed, is dropped from the tokens: it has no pair to form. A fused head reads all of
    them, the final state last (EAGLE-3 fuses the three alone; the final one lets the head start
    where Medusa's heads do, see `start_as_identity`).
    """
    out = []
    for r in recorded:
        states = r.features  # (L, len(layers), H) float16
        tokens = torch.tensor(r.prompt + r.answer[:-1])
        inputs = states.flatten(1) if fused else None
        out.append(Sequence(tokens, states[:, -1].clone(), len(r.prompt), inputs))
    return out


# ----- batches -----
@dataclass
class Batch:
    tokens: torch.Tensor  # (N,) the packed sequences
    features: torch.Tensor  # (N, H) final states, float32
    inputs: torch.Tensor  # (N, F) what the draft reads for the text there, float32
    sequence: torch.Tensor  # (N,) which packed sequence each position belongs to
    local: torch.Tensor  # (N,) its position within that sequence
    target: torch.Tensor  # (N,) whether position j trains: f_{j+1} exists and chooses an answer token

    def to(self, device: torch.device) -> Batch:
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))


def pack(sequences: list[Sequence]) -> Batch:
    """Concatenate sequences; position j trains where f_{j+1} chooses a token of the answer."""
    parts = []
    for number, s in enumerate(sequences):
        length = len(s.tokens)
        local = torch.arange(length)
        # f_{j+1} chooses tokens[j + 2]: an answer token from j + 2 >= answer_start; the last
        # feature chooses what would follow the answer, still the base model's own distribution.
        target = (local + 1 <= length - 1) & (local + 2 >= s.answer_start)
        parts.append((s.tokens, s.features.float(), s.text_states.float(), torch.full((length,), number), local,
                      target))
    return Batch(*(torch.cat(column) for column in zip(*parts, strict=True)))


def batches(sequences: list[Sequence], batch_tokens: int, rng: random.Random | None) -> list[Batch]:
    """Sequences in (shuffled) order, packed into batches of about `batch_tokens` tokens."""
    order = list(range(len(sequences)))
    if rng is not None:
        rng.shuffle(order)
    out, current, size = [], [], 0
    for i in order:
        current.append(sequences[i])
        size += len(sequences[i].tokens)
        if size >= batch_tokens:
            out.append(pack(current))
            current, size = [], 0
    if current:
        out.append(pack(current))
    return out


def unroll_mask(batch: Batch, step: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, N, step * N) additive mask for unrolled step `step` (1-based) over the keys of
    steps 1..step, in that order.

    A draft `step` levels deep at position j has read the true features up to position
    j - step + 1 (step 1's keys) and then one guessed row per level since: level s' at position
    j - step + s'. The same sequence only; a row always sees itself.
    """
    same = batch.sequence[:, None] == batch.sequence[None, :]
    gap = batch.local[:, None] - batch.local[None, :]
    blocks = [same & (gap >= step - 1)]
    blocks += [same & (gap == step - level) for level in range(2, step + 1)]
    return additive_mask(torch.cat(blocks, dim=1), dtype)[None, None]


def previous_position(batch: Batch, values: torch.Tensor) -> torch.Tensor:
    """values[j - 1] at every position j (zeros at each sequence's first position)."""
    shifted = torch.cat([torch.zeros_like(values[:1]), values[:-1]])
    return shifted.masked_fill((batch.local == 0)[:, None], 0.0)


# ----- the unrolled forward -----
def unrolled_outputs(head: EagleHead, embedding: nn.Embedding, batch: Batch, steps: int,
                     noise: float) -> list[torch.Tensor]:
    """The draft's guessed next features at every position, for unrolled steps 1..steps (N, H) each."""
    next_tokens = torch.cat([batch.tokens[1:], batch.tokens[:1]])  # t_{j+1} (junk past a sequence's end)
    token_embeddings = embedding(next_tokens)[None].detach()
    states = batch.inputs
    if noise:
        # Each layer's states at their own scale: a low layer's are far smaller than a high one's.
        layers = states.view(len(states), -1, head.config.hidden_size)
        scale = noise * layers.pow(2).mean(dim=(0, 2), keepdim=True).sqrt()
        states = (layers + (torch.rand_like(layers) * 2 - 1) * scale).view_as(states)
    features = head.text_features(states)
    positions = batch.local[None]
    cache = DynamicCache(config=head.layer_config)
    outputs = []
    for step in range(1, steps + 1):
        inputs = features if step == 1 else previous_position(batch, outputs[-1])
        mask = unroll_mask(batch, step, features.dtype)
        outputs.append(head(inputs[None], token_embeddings, positions, cache, mask)[0])
    return outputs


def chosen_targets(head: EagleHead, batch: Batch) -> torch.Tensor:
    """(N,) the draft-vocabulary index of t_{j+2}, the token the base model chose from f_{j+1};
    -1 where it is outside the draft vocabulary or past the sequence's end."""
    chosen = torch.cat([batch.tokens[2:], batch.tokens[:2]])
    if head.draft_vocab is not None:
        chosen = draft_indices(head.draft_vocab, head.config.vocab_size).to(chosen.device)[chosen]
    return chosen.masked_fill(batch.local + 2 >= _lengths(batch), -1)


def batch_loss(head: EagleHead, rows: nn.Linear, embedding: nn.Embedding, batch: Batch,
               settings: EagleTrainingSettings) -> torch.Tensor:
    target_features = torch.cat([batch.features[1:], batch.features[:1]])  # f_{j+1}
    with torch.no_grad():
        teacher = F.log_softmax(rows(target_features).float(), dim=-1)
    chosen = chosen_targets(head, batch) if settings.hard_weight else None
    total, weight_sum = 0.0, 0.0
    outputs = unrolled_outputs(head, embedding, batch, settings.unroll, settings.noise)
    for step, out in enumerate(outputs, start=1):
        trains = batch.target & (batch.local >= step - 1)
        if not trains.any():
            continue
        student = F.log_softmax(rows(out[trains]).float(), dim=-1)
        loss = F.kl_div(student, teacher[trains], log_target=True, reduction="batchmean")
        if chosen is not None and (chosen[trains] >= 0).any():
            hard = F.nll_loss(student, chosen[trains], ignore_index=-1)
            loss = (1 - settings.hard_weight) * loss + settings.hard_weight * hard
        if settings.feature_weight:
            loss = loss + settings.feature_weight * F.smooth_l1_loss(out[trains], target_features[trains])
        weight = STEP_DECAY ** (step - 1)
        total = total + weight * loss
        weight_sum += weight
    return total / max(weight_sum, 1e-9)


# ----- measuring -----
@dataclass
class EagleEvaluation:
    top1: list[float]  # top1[d]: share of depth-(d+1) guesses right, the guesses before right or not
    acceptance: list[float]  # acceptance[d]: right at depth d+1 given depths 1..d were right
    chain_tokens_per_pass: float  # 1 + expected accepted guesses of a top-1 chain this deep
    positions: int


@torch.inference_mode()
def evaluate_eagle(head: EagleHead, rows: nn.Linear, embedding: nn.Embedding, sequences: list[Sequence],
                   depth: int = 6, batch_tokens: int = 2048) -> EagleEvaluation:
    """Greedy drafting along the recorded text, `depth` levels: how often each level is right.

    A chain drafted from position m guesses t_{m+d+1} at level d from step d's output at
    position m + d - 1; it is right when that is the base model's greedy token (the text's).
    """
    head.eval()
    right_rows, valid_rows = [], []
    device = embedding.weight.device
    for batch in batches(sequences, batch_tokens, rng=None):
        outputs = unrolled_outputs(head, embedding, batch.to(device), depth, noise=0.0)
        target_tokens = torch.cat([batch.tokens[2:], batch.tokens[:2]])  # t_{j+2}
        right = torch.stack([head.token_ids(rows(out).argmax(-1)).cpu() == target_tokens for out in outputs])
        valid = torch.stack([batch.target & (batch.local >= step - 1) & (batch.local + 2 < _lengths(batch))
                             for step in range(1, depth + 1)])
        # Re-index by the chain's start m = j - (d - 1): level d of chain m sits at j = m + d - 1.
        right_rows.append(_by_chain_start(right, batch))
        valid_rows.append(_by_chain_start(valid, batch))
    right, valid = torch.cat(right_rows, dim=1), torch.cat(valid_rows, dim=1)
    top1 = [float(right[d][valid[d]].float().mean()) if valid[d].any() else 0.0 for d in range(depth)]
    acceptance, chain = [], 1.0
    still = valid[0].clone()  # chains whose levels so far were all right (and all measurable)
    for d in range(depth):
        still &= valid[d]
        kept = still & right[d]
        acceptance.append(float(kept.sum() / still.sum()) if still.any() else 0.0)
        still = kept
    total = valid[0].sum().clamp(min=1)
    still = valid[0].clone()
    for d in range(depth):
        still = still & valid[d] & right[d]
        chain += float(still.sum() / total)
    head.train()
    return EagleEvaluation(top1, acceptance, chain, int(valid[0].sum()))


def _lengths(batch: Batch) -> torch.Tensor:
    counts = torch.bincount(batch.sequence)
    return counts[batch.sequence]


def _by_chain_start(table: torch.Tensor, batch: Batch) -> torch.Tensor:
    """table[d][j] -> table[d][m + d] for chain starts m (False where that leaves the sequence)."""
    depth, n = table.shape
    out = torch.zeros_like(table)
    for d in range(depth):
        shifted = torch.zeros(n, dtype=table.dtype)
        shifted[: n - d] = table[d, d:]
        inside = torch.zeros(n, dtype=torch.bool)
        inside[: n - d] = batch.sequence[d:] == batch.sequence[: n - d]
        out[d] = shifted & inside
    return out


# ----- the whole training -----
def draft_rows(head: EagleHead, base: PreTrainedModel) -> nn.Module:
    """The frozen lm_head rows the draft guesses among: its draft vocabulary's, or all of them."""
    lm_head = base.get_output_embeddings()
    return lm_head if head.draft_vocab is None else vocabulary_rows(lm_head, head.draft_vocab)



def fit_eagle(head: EagleHead, base: PreTrainedModel, train: list[Sequence], validation: list[Sequence],
              settings: EagleTrainingSettings, checkpoint_dir: Path | None = None,
              resume: bool = False) -> tuple[list[dict], int]:
    """Train `head`; returns the per-epoch record and the epoch kept (best validation)."""
    embedding = base.get_input_embeddings()
    device = embedding.weight.device
    head.to(device)
    rows = draft_rows(head, base)
    rng = random.Random(settings.seed)
    steps_per_epoch = len(batches(train, settings.batch_tokens, rng=None))
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, settings.warmup_steps, settings.epochs * steps_per_epoch)
    record, best, best_state, first_epoch = [], -math.inf, None, 1
    path = None if checkpoint_dir is None else checkpoint_dir / CHECKPOINT
    if resume and path is not None and path.exists():
        saved = torch.load(path, weights_only=False)
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        record, best, best_state = saved["record"], saved["best"], saved["best_state"]
        rng.setstate(saved["rng"])
        _set_noise_state(saved["noise_rng"], device)
        first_epoch = len(record) + 1
    head.train()
    for epoch in range(first_epoch, settings.epochs + 1):
        started, losses = time.time(), []
        for batch in tqdm(batches(train, settings.batch_tokens, rng), desc=f"train eagle, epoch {epoch}", unit="batch"):
            loss = batch_loss(head, rows, embedding, batch.to(device), settings)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        measured = evaluate_eagle(head, rows, embedding, validation) if validation else None
        score = measured.chain_tokens_per_pass if measured else -float(sum(losses) / len(losses))
        record.append({"epoch": epoch, "loss": sum(losses) / len(losses), "seconds": time.time() - started,
                       **({"validation": asdict(measured)} if measured else {})})
        print(f"epoch {epoch}: loss {record[-1]['loss']:.4f}" + (
            f", validation chain tokens per pass {measured.chain_tokens_per_pass:.3f}, "
            f"acceptance {' '.join(f'{a:.3f}' for a in measured.acceptance)}" if measured else ""))
        if score > best:
            best, best_state = score, {k: v.detach().clone() for k, v in head.state_dict().items()}
        if path is not None:
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(),
                        "record": record, "best": best, "best_state": best_state, "rng": rng.getstate(),
                        "noise_rng": _noise_state(device)}, path)
        kept = max(record, key=lambda r: r["validation"]["chain_tokens_per_pass"] if "validation" in r else -r["loss"])
        if epoch - kept["epoch"] >= settings.patience:
            break
        if settings.max_seconds and training_time(record) > settings.max_seconds:
            print(f"stopping after epoch {epoch}: {training_time(record):.0f} s of training is past "
                  f"--max-seconds {settings.max_seconds:.0f}")
            break
    head.load_state_dict(best_state)
    kept = max(record, key=lambda r: r["validation"]["chain_tokens_per_pass"] if "validation" in r else -r["loss"])
    return record, kept["epoch"]


def _noise_state(device: torch.device) -> torch.Tensor:
    """The state of the generator the input states' noise is drawn from (torch's, on `device`):
    saved with each checkpoint, so a resumed run draws the noise an uninterrupted one would."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_noise_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def training_time(record: list[dict]) -> float:
    return math.fsum(r["seconds"] for r in record)
