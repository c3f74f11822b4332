"""A recording on disk: a saved question list answered shard by shard, resumable at any moment.

    python -m decoding record --model smollm2 --questions assets/questions/chat.json

A recording has two folders. Its **answers** (`shard-NNNNN.json`: questions, prompt and answer token
ids; a few MB a million tokens) are small and belong in the repository, under
`assets/recordings/`. Its **features** (`shard-NNNNN.safetensors`: a few layers' states at every
position and the top-k logits at every answer token; gigabytes) stay in the cache folder, and
can always be rebuilt from the answers by one batched pass (`answer_batcher.recorded_from_tokens`).

Question i belongs to shard i // shard_size. The continuous batcher (`answer_batcher.py`) answers the
questions of every unfinished shard in order; a shard is written, atomically, the moment its
last answer ends: its features first, then its answers, whose presence marks the shard done. A
killed run loses only its unfinished shards' answers; the next run skips every finished shard,
first rebuilding any finished shard's features this machine does not have.
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

from ..assets import RECORDINGS_DIR
from ..atomic import write_atomically
from ..errors import DecodingError
from ..fetch import cache_root
from ..loops import chat_prompt_ids
from ..model import padding_id, stop_token_ids
from .answer_batcher import ContinuousBatcher, Recorded, feature_layers, recorded_from_tokens

MANIFEST = "recording.json"
RUN_DETAILS = ("batch_size",)  # manifest entries a resumed recording may change
ANSWERS_ROOT = RECORDINGS_DIR


@dataclass(frozen=True)
class RecordingSettings:
    max_new_tokens: int = 256
    batch_size: int = 64
    shard_size: int = 256


def features_folder(answers: Path) -> Path:
    """Where the features of the recording whose answers are in `answers` live: the cache folder."""
    return cache_root() / "recordings" / answers.resolve().name


def shard_path(out: Path, number: int) -> Path:
    return out / f"shard-{number:05d}"


def finished_shards(answers: Path) -> list[Path]:
    """Every finished shard of a recording, in order (a shard is done once its answers are saved)."""
    return [p.with_suffix("") for p in sorted(answers.glob("shard-*.json"))]


def _features_file(shard: Path, features: Path | None) -> Path:
    return (features or features_folder(shard.parent)) / f"{shard.name}.safetensors"


def save_shard(path: Path, answers: Sequence[Recorded], layers: tuple[int, ...], features: Path | None = None) -> None:
    """The features first, then the answers: a shard whose answers are saved is whole."""
    _save_features(_features_file(path, features), answers)
    meta = {"feature_layers": list(layers), "questions": [a.question for a in answers],
            "prompts": [a.prompt for a in answers], "answers": [a.answer for a in answers]}
    write_atomically(path.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(meta)))


def _save_features(path: Path, answers: Sequence[Recorded]) -> None:
    tensors = {"features": torch.cat([a.features for a in answers]),
               "top_ids": torch.cat([a.top_ids for a in answers]),
               "top_logits": torch.cat([a.top_logits for a in answers])}
    write_atomically(path, lambda tmp: save_file(tensors, str(tmp)))


def _answered(path: Path) -> list[tuple[int, list[int], list[int]]]:
    meta = json.loads(path.with_suffix(".json").read_text())
    return list(zip(meta["questions"], meta["prompts"], meta["answers"], strict=True))


def rebuild_missing_features(model: PreTrainedModel, answers: Path, features: Path | None = None) -> int:
    """Rebuild, from the saved token ids, the features of every finished shard this machine lacks."""
    missing = [p for p in finished_shards(answers) if not _features_file(p, features).exists()]
    for path in tqdm(missing, desc="rebuild features from the saved answers", unit="shard", disable=not missing):
        _save_features(_features_file(path, features), recorded_from_tokens(model, _answered(path)))
    return len(missing)


def load_shard(path: Path, features: Path | None = None) -> list[Recorded]:
    """A finished shard's answers, each with its features and top-k logits."""
    meta = json.loads(path.with_suffix(".json").read_text())
    stored = _features_file(path, features)
    if not stored.exists():
        raise DecodingError(f"{stored} is missing: run `python -m decoding record` with the same settings "
                            f"to rebuild the features of {path.name} from its saved answers")
    tensors = load_file(str(stored))
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
        # The batch size only says how many rows decoded together, not what they wrote.
        changed = sorted(k for k in manifest if k not in RUN_DETAILS and saved.get(k) != manifest[k])
        if changed:
            raise DecodingError(f"{out} holds a recording made with other {', '.join(changed)}; "
                                "give the same settings or another --out")
    else:
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1)))


def record(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: Sequence[str], out: Path,
           settings: RecordingSettings, manifest: dict, features: Path | None = None,
           max_seconds: float | None = None) -> int:
    """Answer every question of every unfinished shard into the answers folder `out` (features in
    `features`, by default the cache's); return how many answer tokens were recorded. With
    `max_seconds`, stop once that long has passed: the shards finished by then are saved, the
    rest are answered by the next run."""
    out.mkdir(parents=True, exist_ok=True)
    layers = feature_layers(model.config.get_text_config(decoder=True).num_hidden_layers)
    _check_manifest(out, manifest | {"questions": len(questions), "feature_layers": list(layers),
                                     **settings.__dict__})
    rebuild_missing_features(model, out, features)
    size = settings.shard_size
    shards = range((len(questions) + size - 1) // size)
    pending = [s for s in shards if not shard_path(out, s).with_suffix(".json").exists()]
    indices = [i for s in pending for i in range(s * size, min((s + 1) * size, len(questions)))]
    todo = ((i, chat_prompt_ids(tokenizer, questions[i])) for i in indices)  # templated as rows free up
    stop_ids = stop_token_ids(model.generation_config)
    batcher = ContinuousBatcher(model, stop_ids, padding_id(tokenizer, stop_ids), settings.max_new_tokens,
                                settings.batch_size)
    buckets: dict[int, list[Recorded]] = {s: [] for s in pending}
    tokens, started = 0, time.perf_counter()
    bar = tqdm(total=len(indices), desc=f"record ({len(shards) - len(pending)}/{len(shards)} shards done before)",
               unit="answer", smoothing=0.05)
    for answer in batcher.answers(todo):
        shard = answer.question // size
        buckets[shard].append(answer)
        tokens += len(answer.answer)
        bar.update(1)
        bar.set_postfix(tokens=tokens, tok_s=f"{tokens / (time.perf_counter() - started):.0f}", refresh=False)
        expected = min((shard + 1) * size, len(questions)) - shard * size
        if len(buckets[shard]) == expected:
            save_shard(shard_path(out, shard), sorted(buckets.pop(shard), key=lambda a: a.question), layers, features)
        if max_seconds is not None and time.perf_counter() - started > max_seconds:
            break
    bar.close()
    return tokens
