"""A recording on disk: a saved question list answered shard by shard, resumable at any moment.

    python -m decoding record --model smollm2 --questions assets/questions/chat.json

Question i belongs to shard i // shard_size. The continuous batcher (`recorder.py`) answers the
questions of every unfinished shard in order; a shard is written, atomically, the moment its
last answer ends: `shard-NNNNN.safetensors` (features and top-k logits, big, kept in the cache
folder) and then `shard-NNNNN.json` (questions, prompt and answer token ids, small), whose
presence marks the shard done. A killed run loses only its unfinished shards' answers; the next
run skips every finished shard. The JSON files are the recording's portable part: the answers as
token ids, committed to the repository, from which one batched pass rebuilds the features.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..atomic import write_atomically
from ..errors import DecodingError
from ..loops import chat_prompt_ids
from ..model import padding_id, stop_token_ids
from .recorder import ContinuousBatcher, Recorded, feature_layers

MANIFEST = "recording.json"


@dataclass(frozen=True)
class RecordingSettings:
    max_new_tokens: int = 256
    batch_size: int = 64
    shard_size: int = 256


def shard_path(out: Path, number: int) -> Path:
    return out / f"shard-{number:05d}"


def finished_shards(out: Path) -> list[Path]:
    """Every finished shard in a recording folder, in order (a shard is done once its JSON exists)."""
    return [p.with_suffix("") for p in sorted(out.glob("shard-*.json"))]


def save_shard(path: Path, answers: Sequence[Recorded], layers: tuple[int, ...]) -> None:
    """The tensors first, then the JSON: a shard whose JSON exists is whole."""
    tensors = {"features": torch.cat([a.features for a in answers]),
               "top_ids": torch.cat([a.top_ids for a in answers]),
               "top_logits": torch.cat([a.top_logits for a in answers])}
    write_atomically(path.with_suffix(".safetensors"), lambda tmp: save_file(tensors, str(tmp)))
    meta = {"feature_layers": list(layers), "questions": [a.question for a in answers],
            "prompts": [a.prompt for a in answers], "answers": [a.answer for a in answers]}
    write_atomically(path.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(meta)))


def load_shard(path: Path) -> list[Recorded]:
    """A finished shard's answers, each with its features and top-k logits."""
    meta = json.loads(path.with_suffix(".json").read_text())
    tensors = load_file(str(path.with_suffix(".safetensors")))
    out, row, answer_row = [], 0, 0
    for question, prompt, answer in zip(meta["questions"], meta["prompts"], meta["answers"], strict=True):
        n, a = len(prompt) + len(answer) - 1, len(answer)
        out.append(Recorded(question, prompt, answer, tensors["features"][row: row + n],
                            tensors["top_ids"][answer_row: answer_row + a],
                            tensors["top_logits"][answer_row: answer_row + a]))
        row, answer_row = row + n, answer_row + a
    return out


def _check_manifest(out: Path, manifest: dict) -> None:
    """A folder answers one question list with one model and settings: refuse to mix two."""
    path = out / MANIFEST
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != manifest:
            changed = sorted(k for k in manifest if saved.get(k) != manifest[k])
            raise DecodingError(f"{out} holds a recording made with other {', '.join(changed)}; "
                                "give the same settings or another --out")
    else:
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1)))


def record(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: Sequence[str], out: Path,
           settings: RecordingSettings, manifest: dict) -> int:
    """Answer every question of every unfinished shard; return how many answer tokens were recorded."""
    out.mkdir(parents=True, exist_ok=True)
    layers = feature_layers(model.config.get_text_config(decoder=True).num_hidden_layers)
    _check_manifest(out, manifest | {"questions": len(questions), "feature_layers": list(layers),
                                     **settings.__dict__})
    size = settings.shard_size
    shards = range((len(questions) + size - 1) // size)
    pending = [s for s in shards if not shard_path(out, s).with_suffix(".json").exists()]
    todo = [(i, chat_prompt_ids(tokenizer, questions[i]))
            for s in pending for i in range(s * size, min((s + 1) * size, len(questions)))]
    stop_ids = stop_token_ids(model.generation_config)
    batcher = ContinuousBatcher(model, stop_ids, padding_id(tokenizer, stop_ids), settings.max_new_tokens,
                                settings.batch_size)
    buckets: dict[int, list[Recorded]] = {s: [] for s in pending}
    tokens, started = 0, time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"record ({len(shards) - len(pending)}/{len(shards)} shards done before)",
               unit="answer", smoothing=0.05)
    for answer in batcher.answers(todo):
        shard = answer.question // size
        buckets[shard].append(answer)
        tokens += len(answer.answer)
        bar.update(1)
        bar.set_postfix(tokens=tokens, tok_s=f"{tokens / (time.perf_counter() - started):.0f}", refresh=False)
        expected = min((shard + 1) * size, len(questions)) - shard * size
        if len(buckets[shard]) == expected:
            save_shard(shard_path(out, shard), sorted(buckets.pop(shard), key=lambda a: a.question), layers)
    bar.close()
    return tokens
