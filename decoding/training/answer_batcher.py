"""Recording a chat model's greedy answers with every core busy: continuous batching.

The drafters learn to guess what *this* model writes, so they train on its own greedy answers,
and they need a great many of them (the papers' drafts read 10^7-10^8 tokens). `generate` is the
wrong tool for that on a CPU: a batch keeps decoding until its *longest* answer ends, so most rows
idle after the first few answers stop, and asking it for hidden states and logits keeps every
layer's state and every vocabulary logit of every step. This loop keeps its batch full instead:

* B rows decode together, one token each per forward pass (a B-row matrix product costs little
  more than a one-row one on a CPU: the weights are read once for all rows).
* When a row's answer ends (a stop token, or `max_new_tokens`), its slot takes the next question.
  Newcomers are prefilled together, left-padded, in one pass of their own, and their keys and
  values are written into the shared cache at its right edge, where every row writes its next
  token. So row r's keys sit in columns [start_r, L) of one cache, and its attention mask hides
  every column before start_r: each row attends to its own question and answer alone.
* Each row counts its own positions from 0 (`position_ids`), so its rotary phases are those of
  the question decoded alone. Columns no live row can see are cut off the cache's left edge.

Only what training reads is kept, for every token: a few layers' features (the final normed
state Medusa's heads read; EAGLE-3's low, middle and high layers), and for every answer token the
base model's top-k logits (the soft targets). The features of the prompt come from its prefill,
free, so training never runs the base model. Each row's result is exactly its own question's
greedy answer up to floating-point rounding (`tests/test_recorder.py` checks it against
`generate` at batch 1, rows refilled mid-batch included).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from .batches import pad_batch

TOP_K_LOGITS = 32  # the base model's guesses kept per answer token: nearly all of its probability mass


def feature_layers(num_layers: int) -> tuple[int, ...]:
    """Which of `output_hidden_states` to keep: EAGLE-3's low, middle and high layers, then the last.

    `hidden_states[i]` is the input of layer i (i < num_layers); `hidden_states[num_layers]` is
    the final normed state the lm_head reads. EAGLE-3 fuses the inputs of layers 2, n/2 and n-3.
    """
    low, middle, high = min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)
    return (low, middle, high, num_layers)


@dataclass
class Recorded:
    """One question's greedy answer and what the drafters learn from it.

    `features[j]` (one row per kept layer) is the model's state at position j of prompt + answer,
    the state that chose token j + 1; there is none for the last token. `top_ids/top_logits[i]`
    are the base model's best guesses for answer token i.
    """

    question: int
    prompt: list[int]
    answer: list[int]
    features: torch.Tensor  # (len(prompt) + len(answer) - 1, layers, hidden) float16
    top_ids: torch.Tensor  # (len(answer), TOP_K_LOGITS) int32
    top_logits: torch.Tensor  # (len(answer), TOP_K_LOGITS) float16


@dataclass
class _Row:
    """A slot of the batch while its question is answered."""

    question: int
    prompt: list[int]
    answer: list[int] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)
    top_ids: list[torch.Tensor] = field(default_factory=list)
    top_logits: list[torch.Tensor] = field(default_factory=list)

    def finish(self) -> Recorded:
        return Recorded(self.question, self.prompt, self.answer, torch.cat(self.features),
                        torch.stack(self.top_ids).int(), torch.stack(self.top_logits).half())


class _SharedCache:
    """Every row's keys and values in one cache, each row in its own columns [start_r, length).

    The library's DynamicCache holds the tensors (its layers' `keys`/`values`, batch, heads,
    columns, head_dim); this class only splices rows in, pads and trims columns, and keeps the
    attention mask that says which columns each row may see.
    """

    def __init__(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        self.cache, self.mask = cache, mask  # mask: (rows, columns) long, 1 = this row's key

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def _each_tensor(self, change) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = change(layer.keys), change(layer.values)

    def pad_left(self, columns: int) -> None:
        pad = lambda t: torch.cat([t.new_zeros(*t.shape[:2], columns, t.shape[3]), t], dim=2)  # noqa: E731
        self._each_tensor(pad)
        self.mask = torch.cat([self.mask.new_zeros(self.mask.shape[0], columns), self.mask], dim=1)

    def trim_left(self) -> None:
        """Drop the columns no row can see any more (they only cost attention work)."""
        seen = self.mask.any(dim=0).nonzero()
        first = int(seen[0]) if len(seen) else self.length
        if first:
            self._each_tensor(lambda t: t[:, :, first:].contiguous())
            self.mask = self.mask[:, first:].contiguous()

    def keep_rows(self, rows: torch.Tensor) -> None:
        self._each_tensor(lambda t: t.index_select(0, rows))
        self.mask = self.mask.index_select(0, rows)

    def place(self, rows: list[int], other: DynamicCache, other_mask: torch.Tensor) -> None:
        """Write a newcomers' cache (its rows in order) into `rows`, ending at the right edge."""
        width = other_mask.shape[1]
        if width > self.length:
            self.pad_left(width - self.length)
        index = torch.tensor(rows, device=self.mask.device)
        for layer, new in zip(self.cache.layers, other.layers, strict=True):
            layer.keys[index, :, -width:] = new.keys
            layer.values[index, :, -width:] = new.values
        self.mask[index] = 0
        self.mask[index, -width:] = other_mask

    def append_column(self) -> None:
        """Every row writes its next token's key in a new column: the mask must admit it."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)


def _cache_argument(model: PreTrainedModel) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; older model code has the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.inference_mode()
def recorded_from_tokens(model: PreTrainedModel, answered: Sequence[tuple[int, list[int], list[int]]],
                         batch_size: int = 16) -> list[Recorded]:
    """The records of answers already written, (question, prompt, answer) token ids, rebuilt by
    batched passes over prompt + answer: the features and top-k logits `ContinuousBatcher` keeps,
    to rounding (a pass over many positions sums in another order than a step)."""
    layers = feature_layers(model.config.get_text_config(decoder=True).num_hidden_layers)
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(answered), batch_size):
        chunk = answered[start: start + batch_size]
        # The last answer token is never read: its state would choose what follows the answer.
        ids, mask = pad_batch([prompt + answer[:-1] for _, prompt, answer in chunk], 0, side="right")
        result = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True,
                       use_cache=False)
        states = torch.stack([result.hidden_states[i] for i in layers], dim=2).half().cpu()
        for b, (question, prompt, answer) in enumerate(chunk):
            length = len(prompt) + len(answer) - 1
            top_logits, top_ids = result.logits[b, len(prompt) - 1: length].float().topk(TOP_K_LOGITS)
            out.append(Recorded(question, prompt, answer, states[b, :length].clone(), top_ids.int().cpu(),
                                top_logits.half().cpu()))
    return out


class ContinuousBatcher:
    """Greedy answers to `questions` (prompt token ids), `batch_size` decoded at a time.

    Iterating yields each question's `Recorded` as soon as its answer ends (not in order).
    """

    def __init__(self, model: PreTrainedModel, stop_ids: frozenset[int], pad_id: int, max_new_tokens: int,
                 batch_size: int = 64, refill_share: float = 0.125) -> None:
        self.model, self.stop_ids, self.pad_id = model, stop_ids, pad_id
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        # Newcomers are prefilled together once this share of the slots is free: one prefill of
        # several prompts costs far less than several prefills of one.
        self.refill_at = max(1, round(batch_size * refill_share))
        self.layers = feature_layers(model.config.get_text_config(decoder=True).num_hidden_layers)
        self.cache_argument = _cache_argument(model)
        self.device = next(model.parameters()).device

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache):
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                          **{self.cache_argument: cache}, use_cache=True, output_hidden_states=True)

    def _kept_features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(batch, seq, layers, hidden) float16, in the CPU's memory: the kept layers' states."""
        return torch.stack([hidden_states[i] for i in self.layers], dim=2).half().cpu()

    @staticmethod
    def _top_k(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The best guesses of every row at once (rows, TOP_K_LOGITS), in the CPU's memory."""
        top_logits, top_ids = logits.float().topk(TOP_K_LOGITS, dim=-1)
        return top_logits.cpu(), top_ids.cpu()

    def _take_token(self, row: _Row, top_logits: torch.Tensor, top_ids: torch.Tensor, feature: torch.Tensor) -> int:
        """Record the state and guesses at a row's newest position and append its greedy token."""
        token = int(top_ids[0])  # topk sorts, so its first is the argmax
        row.answer.append(token)
        row.features.append(feature)
        row.top_ids.append(top_ids)
        row.top_logits.append(top_logits)
        return token

    def _done(self, row: _Row) -> bool:
        return row.answer[-1] in self.stop_ids or len(row.answer) >= self.max_new_tokens

    def _prefill(self, questions: list[tuple[int, list[int]]]) -> tuple[list[_Row], DynamicCache, torch.Tensor,
                                                                         list[int]]:
        """Newcomers' prompts in one left-padded pass: their rows (first token taken), cache, mask."""
        ids, mask = pad_batch([prompt for _, prompt in questions], self.pad_id, side="left")
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self._forward(ids, mask, positions, cache)
        features = self._kept_features(out.hidden_states)
        top_logits, top_ids = self._top_k(out.logits[:, -1])
        rows, tokens = [], []
        for b, (question, prompt) in enumerate(questions):
            row = _Row(question, list(prompt))
            # The prompt's states before its last position chose its own next tokens: kept as
            # features; the last one chose the answer's first token.
            row.features.append(features[b, -len(prompt):-1])
            tokens.append(self._take_token(row, top_logits[b], top_ids[b], features[b, -1:]))
            rows.append(row)
        return rows, cache, mask, tokens

    @torch.inference_mode()
    def answers(self, questions: Iterable[tuple[int, list[int]]]) -> Iterator[Recorded]:
        """Read lazily: a question's prompt is only asked for when a row is free to take it."""
        source = iter(questions)
        waiting = True  # until the source runs dry

        def take(count: int) -> list[tuple[int, list[int]]]:
            nonlocal waiting
            taken = list(itertools.islice(source, count))
            waiting = len(taken) == count
            return taken

        first = take(self.batch_size)
        if not first:
            return
        rows, cache, mask, tokens = self._prefill(first)
        shared = _SharedCache(cache, mask)
        slots: list[_Row | None] = list(rows)
        next_tokens = torch.tensor(tokens, device=self.device)
        positions = torch.tensor([len(row.prompt) for row in rows], device=self.device)
        while True:
            for b, row in enumerate(slots):
                if row is not None and self._done(row):
                    yield row.finish()
                    slots[b] = None
                    shared.mask[b] = 0  # an empty slot sees only its newest column, whatever it holds
            free = [b for b, row in enumerate(slots) if row is None]
            newcomers = take(len(free)) if waiting and len(free) >= self.refill_at else []
            if newcomers:
                newcomers, new_cache, new_mask, new_tokens = self._prefill(newcomers)
                used = free[: len(newcomers)]
                shared.place(used, new_cache, new_mask)
                for b, row, token in zip(used, newcomers, new_tokens, strict=True):
                    slots[b], next_tokens[b], positions[b] = row, token, len(row.prompt)
                free = free[len(newcomers):]
            if len(free) == len(slots):
                return
            if not waiting and free:
                # No question left to fill them: stop computing the empty rows.
                live = [b for b, row in enumerate(slots) if row is not None]
                shared.keep_rows(torch.tensor(live, device=self.device))
                slots = [slots[b] for b in live]
                next_tokens, positions = next_tokens[live], positions[live]
            shared.trim_left()
            shared.append_column()
            out = self._forward(next_tokens[:, None], shared.mask, positions[:, None], shared.cache)
            features = self._kept_features(out.hidden_states)
            top_logits, top_ids = self._top_k(out.logits[:, -1])
            for b, row in enumerate(slots):
                if row is not None:
                    next_tokens[b] = self._take_token(row, top_logits[b], top_ids[b], features[b])
            positions += 1
