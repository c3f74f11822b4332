"""The command line of `train-eagle`: an EAGLE draft head from a recording of the model's answers.

    python -m decoding train-eagle --model smollm2 --recorded assets/recordings/smollm2-chat \\
        --heldout-shards 2 --validation-shards 1 --out assets/models/smollm2/eagle

The shards are split as `train-heads --recorded` splits them (the last `--heldout-shards` held out,
the `--validation-shards` before them choose the epoch), so the card can set Medusa's heads and
EAGLE side by side on the same held-out answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from ..eagle_layer import EagleHead, find_eagle
from ..errors import DecodingError
from .base_model import load_base
from .commands import command_line, settings_from
from .eagle_start import new_eagle_head
from .recorded_heads import coverage
from .recording import finished_shards, load_shard
from .train_eagle import (
    EagleEvaluation,
    EagleTrainingSettings,
    Sequence,
    draft_rows,
    evaluate_eagle,
    fit_eagle,
    sequences_from,
    training_time,
)


def read_sequences(shards: list[Path], fused: bool) -> tuple[list[Sequence], list[int]]:
    """These shards' answers as training sequences, and the layers a fused head reads."""
    sequences, layers = [], []
    for path in shards:
        recorded = load_shard(path)
        layers = _feature_layers(path)
        sequences += sequences_from(recorded, layers, fused)
    return sequences, layers


def _feature_layers(path: Path) -> list[int]:
    return json.loads(path.with_suffix(".json").read_text())["feature_layers"]


def add_train_eagle_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EagleTrainingSettings()
    parser.add_argument("--model", required=True, help="the base chat model: wheel model name, folder or hub id")
    parser.add_argument("--recorded", type=Path, nargs="+", required=True,
                        help="recordings' answer folders (`record`); their features are read from the cache folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for eagle_config.json and eagle.safetensors")
    parser.add_argument("--heldout-shards", type=int, default=2, help="last shards kept out, for the card")
    parser.add_argument("--validation-shards", type=int, default=1, help="shards before those, to choose the epoch")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: where the head trains")
    parser.add_argument("--init-eagle", type=Path, default=None,
                        help="start from this saved EAGLE head (either layout) instead of a fresh one")
    parser.add_argument("--compare-eagle", type=Path, nargs="+", default=[],
                        help="also measure these saved EAGLE heads (either layout) on the same held-out answers")
    for field in dataclasses.fields(EagleTrainingSettings):
        kind = type(getattr(defaults, field.name))
        if kind is bool:
            parser.add_argument("--" + field.name.replace("_", "-"), action=argparse.BooleanOptionalAction,
                                default=getattr(defaults, field.name))
        else:
            parser.add_argument("--" + field.name.replace("_", "-"), type=kind, default=getattr(defaults, field.name))


def run_train_eagle(args: argparse.Namespace) -> int:
    settings = settings_from(EagleTrainingSettings, args)
    shards = [p for folder in args.recorded for p in finished_shards(folder)]
    held, checked = args.heldout_shards, args.validation_shards
    if held < 1 or checked < 0 or len(shards) < held + checked + 1:
        raise DecodingError(f"{len(shards)} shards in {', '.join(map(str, args.recorded))}: need at least "
                            f"{held + checked + 1} for {held} held out, {checked} for validation and one to train on")
    _, base = load_base(args.model, args.threads, device=args.device, dtype=torch.float32)
    started = time.time()
    train_shards, heldout_shards = shards[: -held - checked], shards[-held:]
    validation_shards = shards[-held - checked: -held]
    groups = {"train": train_shards, "validation": validation_shards, "heldout": heldout_shards}
    parts, text_layers = {}, []
    for name, group in groups.items():
        if group:
            parts[name], text_layers = read_sequences(group, settings.fused)
    features_seconds = time.time() - started
    head = (_init_eagle(args.init_eagle, base, settings) if args.init_eagle is not None
            else new_eagle_head(base, parts["train"], settings, text_layers if settings.fused else None))
    answer_tokens = lambda group: torch.cat([s.tokens[s.answer_start:] for s in group])  # noqa: E731
    covered = coverage(answer_tokens(parts["heldout"]), head.draft_vocab)
    print(f"{sum(len(answer_tokens(g)) for g in parts.values()):,} answer tokens; the draft vocabulary of "
          f"{len(head.draft_vocab):,} tokens covers {covered:.1%} of the held-out answers' tokens")
    args.out.mkdir(parents=True, exist_ok=True)
    record, kept = fit_eagle(head, base, parts["train"], parts.get("validation", []), settings, args.out, args.resume)
    rows = draft_rows(head, base)
    heldout = evaluate_eagle(head, rows, base.get_input_embeddings(), parts["heldout"])
    compared = {str(path): dataclasses.asdict(_evaluate_saved(path, base, parts["heldout"]))
                for path in args.compare_eagle}
    count = lambda group: sum(len(s.tokens) - s.answer_start for s in group)  # noqa: E731
    per_million = training_time(record) / max(len(record), 1) / max(count(parts["train"]), 1) * 1e6
    head.save(args.out, extra={
        "base_model": args.model,
        "accuracy": heldout.acceptance,
        "heldout": dataclasses.asdict(heldout),
        "training": {"command": command_line("train-eagle", args), "settings": dataclasses.asdict(settings),
                     "answer_tokens": {name: count(group) for name, group in parts.items()},
                     "shards": {name: [str(p) for p in group] for name, group in groups.items()},
                     "init_eagle": None if args.init_eagle is None else str(args.init_eagle),
                     "reading_seconds": round(features_seconds, 1),
                     "draft_vocab_coverage_heldout": round(covered, 4),
                     "training_seconds": round(training_time(record), 1),
                     "seconds_per_epoch_per_million_tokens": round(per_million),
                     "epochs": record, "kept_epoch": kept,
                     **({"compared_on_same_heldout": compared} if compared else {})},
    })
    print(f"held out ({heldout.positions} answer positions): top-1 by depth "
          f"{' '.join(f'{a:.3f}' for a in heldout.top1)}; acceptance given the levels before "
          f"{' '.join(f'{a:.3f}' for a in heldout.acceptance)}; "
          f"chain tokens per pass {heldout.chain_tokens_per_pass:.3f}")
    for path, other in compared.items():
        print(f"{path} on the same held-out answers: top-1 by depth {' '.join(f'{a:.3f}' for a in other['top1'])}; "
              f"chain tokens per pass {other['chain_tokens_per_pass']:.3f}")
    print(f"saved the EAGLE head to {args.out} (epoch {kept} kept; {training_time(record):.0f} s training, "
          f"{per_million:,.0f} s an epoch per million answer tokens here)")
    return 0


def _saved_eagle(path: Path, base: object, flag: str) -> EagleHead:
    """The EAGLE head saved in `path` (either layout), or a one-line error naming `flag`."""
    head, _ = find_eagle(path, base)
    if head is None:
        raise DecodingError(f"{flag} {path}: no EAGLE head there")
    return head


def _init_eagle(path: Path, base: object, settings: EagleTrainingSettings) -> EagleHead:
    """The saved head a run continues from: its draft vocabulary and layers are kept as they are."""
    head = _saved_eagle(path, base, "--init-eagle")
    if (head.fuse is not None) != settings.fused:
        raise DecodingError(f"--init-eagle {path}: that head {'fuses' if head.fuse is not None else 'does not fuse'} "
                            f"layers, and this run has --{'' if settings.fused else 'no-'}fused")
    return head


def _evaluate_saved(path: Path, base: object, heldout: list[Sequence]) -> EagleEvaluation:
    """A saved head on the same held-out answers: a head that reads the final state alone gets it."""
    other = _saved_eagle(path, base, "--compare-eagle")
    if other.fuse is None:
        heldout = [dataclasses.replace(s, inputs=None) for s in heldout]
    elif heldout[0].inputs is None:
        raise DecodingError(f"--compare-eagle {path}: a fused head is measured on a --fused run's answers")
    return evaluate_eagle(other, draft_rows(other, base), base.get_input_embeddings(), heldout)
