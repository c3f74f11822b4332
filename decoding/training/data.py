"""What heads train on: token sequences from text files, or the base model's own continuations.

Two sources:
* text: every file tokenized whole and cut into `seq_len`-token chunks;
* self-distillation: the base model's own continuations (greedy, and optionally sampled) of
  prompts, so the heads learn to predict *this model*, which is what Medusa decoding has to
  match. Prompts come from a prompts file and/or the first tokens of each text chunk.

A seeded share of the items is held out to measure the heads and grow their trees; it is split
off *before* self-distillation, so a prompt's greedy and sampled continuations never land on both
sides. The data is saved before training (`data.json`), so `--resume` trains on exactly the same
sequences: self-distillation is slow, and sampling would not repeat itself.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..errors import DecodingError
from ..model import padding_id, stop_token_ids
from ..prompts import read_prompts
from .batches import cut_at_stop, model_device, pad_batch
from .saving import write_atomically

# Prompts are plain text, or token ids when they are cut from tokenized data.
Prompt = str | Sequence[int]


@dataclass
class DataSettings:
    """Where the sequences come from; the defaults are `train-heads`' defaults."""

    data: list[Path] = field(default_factory=list)  # text files, or folders of .txt files
    self_distill: bool = False
    prompts: Path | None = None  # .txt, one prompt a line, or .json list of strings
    prompt_tokens: int = 32  # prompt length when prompts are cut from the text chunks
    max_prompts: int | None = None
    max_new_tokens: int = 128
    sampled: bool = True  # besides the greedy continuation, a sampled one per prompt
    temperature: float = 0.8
    gen_batch_size: int = 32
    seq_len: int = 256
    heldout_fraction: float = 0.05
    seed: int = 0


@dataclass
class HeadsData:
    """The train and held-out token sequences, and a note of where they came from."""

    train: list[list[int]]
    heldout: list[list[int]]
    source: dict[str, Any]
    # Where each held-out sequence's self-distilled continuation starts (None for text).
    heldout_starts: list[int] | None = None

    def to_json(self) -> str:
        fields = {"train": self.train, "heldout": self.heldout}
        if self.heldout_starts is not None:
            fields["heldout_starts"] = self.heldout_starts
        return json.dumps({**fields, "source": self.source})

    @classmethod
    def from_json(cls, text: str) -> HeadsData:
        data = json.loads(text)
        return cls(data["train"], data["heldout"], data["source"], data.get("heldout_starts"))


# ----- text --------------------------------------------------------------------------------------
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


# ----- self-distillation -------------------------------------------------------------------------
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


def _encode(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    return tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)


@dataclass
class Distilled:
    sequences: list[list[int]]  # prompt + the model's own continuation
    starts: list[int]  # where each continuation starts: its prompt's length


@torch.no_grad()
def self_distill(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    settings: DataSettings | None = None,
    progress: bool = True,
) -> Distilled:
    """Prompt + the model's own continuation, for every prompt: greedy, then (optionally) sampled.

    Prompts are text or token ids. Sampling uses the plain softmax at `settings.temperature` (no
    top-k), so the heads see the model's spread of plausible continuations, not only its greedy
    path. The stop tokens are the model's generation config's, as in the decoding engine: a
    model that declares none is decoded past its tokenizer's EOS, so its heads should see that too.
    """
    settings = settings or DataSettings()
    device = model_device(model)
    stop_ids = stop_token_ids(model.generation_config)
    pad_id = padding_id(tokenizer, stop_ids)
    encoded = [_encode(tokenizer, p) for p in prompts]
    modes = [False, True] if settings.sampled else [False]
    torch.manual_seed(settings.seed)
    model.eval()
    out = Distilled([], [])
    bar = tqdm(total=len(encoded) * len(modes), unit="seq", desc="self-distill", disable=not progress)
    for start in range(0, len(encoded), settings.gen_batch_size):
        batch = encoded[start : start + settings.gen_batch_size]
        ids, mask = pad_batch(batch, pad_id, side="left")
        for sample in modes:
            sampling = {"do_sample": True, "temperature": settings.temperature, "top_k": 0} if sample else {}
            with _plain_generation_config(
                model, max_new_tokens=settings.max_new_tokens, eos_token_id=sorted(stop_ids) or None,
                pad_token_id=pad_id, **sampling,
            ):
                generated = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device))
            continuations = generated[:, ids.shape[1] :].tolist()
            out.sequences.extend(p + cut_at_stop(c, stop_ids) for p, c in zip(batch, continuations, strict=True))
            out.starts.extend(len(p) for p in batch)
            bar.update(len(batch))
    bar.close()
    return out


# ----- both, split and saved ---------------------------------------------------------------------
def _text_data(chunks: list[list[int]], settings: DataSettings) -> HeadsData:
    train, heldout = split_heldout(chunks, settings.heldout_fraction, settings.seed)
    return HeadsData(train, heldout, {"kind": "text", "files": [str(p) for p in text_files(settings.data)]})


def _distilled_data(chunks: list[list[int]], settings: DataSettings, model: PreTrainedModel,
                    tokenizer: PreTrainedTokenizerBase) -> HeadsData:
    prompts: list[Prompt] = []
    if settings.prompts:
        prompts += read_prompts(settings.prompts)
    prompts += [c[: settings.prompt_tokens] for c in chunks]
    random.Random(settings.seed).shuffle(prompts)
    prompts = prompts[: settings.max_prompts]
    train_prompts, heldout_prompts = split_heldout(prompts, settings.heldout_fraction, settings.seed)
    started = time.perf_counter()
    train = self_distill(model, tokenizer, train_prompts, settings)
    heldout = self_distill(model, tokenizer, heldout_prompts, settings)
    seconds = time.perf_counter() - started
    generated = sum(len(s) - start for d in (train, heldout) for s, start in zip(d.sequences, d.starts, strict=True))
    source = {
        "kind": "self-distill",
        "prompts": len(prompts),
        "greedy_and_sampled": settings.sampled,
        "temperature": settings.temperature,
        "max_new_tokens": settings.max_new_tokens,
        "generated_tokens": generated,
        "generation_wall_time_s": round(seconds, 1),
        "generation_tokens_per_s": round(generated / max(seconds, 1e-9), 1),
    }
    return HeadsData(train.sequences, heldout.sequences, source, heldout.starts)


def build_data(settings: DataSettings, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> HeadsData:
    """The train and held-out sequences the settings ask for."""
    chunks = tokenized_chunks(tokenizer, settings.data, settings.seq_len) if settings.data else []
    if settings.self_distill:
        return _distilled_data(chunks, settings, model, tokenizer)
    return _text_data(chunks, settings)


def load_or_build_data(path: Path, settings: DataSettings, model: PreTrainedModel,
                       tokenizer: PreTrainedTokenizerBase, resume: bool) -> HeadsData:
    """The data saved at `path` when resuming; else built, and saved there before training."""
    if resume:
        if not path.exists():
            raise DecodingError(f"nothing to resume: no {path}")
        return HeadsData.from_json(path.read_text())
    data = build_data(settings, model, tokenizer)
    write_atomically(path, lambda tmp: tmp.write_text(data.to_json()))
    return data
