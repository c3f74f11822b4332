"""The command line of `questions`, `record` and `record-bench`.

    python -m decoding questions --out assets/questions/chat.json
    python -m decoding record --model smollm2 --questions assets/questions/chat.json   # resumes
    python -m decoding record-bench --model smollm2 --questions assets/questions/chat.json

`questions` builds the question list once (it downloads two small corpora from the package index).
`record` answers it with the model's greedy answers, shard by shard, resumable (stop it at any
time; run the same command again): the answers as token ids in assets/recordings/, the features
in the cache folder (rebuilt from the answers on a machine that lacks them). `record-bench` times the
recorder at batch 1 and at its batch size against transformers' `generate` at the same batch, on
the same questions, one after the other in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from ..atomic import write_atomically
from ..errors import DecodingError
from ..loops import chat_prompt_ids
from ..model import padding_id, stop_token_ids
from .answer_batcher import ContinuousBatcher
from .base_model import load_base
from .batches import cut_at_stop, pad_batch
from .questions import QUESTIONS_FILE, build_questions, read_questions
from .recording import ANSWERS_ROOT, RecordingSettings, finished_shards, record
from .self_instruct import self_instruct_questions


def default_answers_dir(model: str, questions: Path) -> Path:
    """A recording's answers go in the repository (its features, big, in the cache folder)."""
    return ANSWERS_ROOT / f"{Path(model).name}-{questions.stem}"


def add_questions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=QUESTIONS_FILE, help="the JSON file to write")
    parser.add_argument("--templates", type=int, default=12000, help="how many template instructions to add")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--self-instruct", type=int, default=0,
                        help="also this many questions the model (--model) writes itself, sampled")
    parser.add_argument("--model", default=None, help="with --self-instruct: the chat model that writes them")
    parser.add_argument("--threads", type=int, default=None)


def run_questions(args: argparse.Namespace) -> int:
    written = []
    if args.self_instruct:
        if not args.model:
            raise DecodingError("--self-instruct needs --model: the chat model that writes the questions")
        tokenizer, model = load_base(args.model, args.threads)
        written = self_instruct_questions(model, tokenizer, args.self_instruct, args.seed)
    questions = build_questions(args.templates, args.seed, written)
    counts: dict[str, int] = {}
    for q in questions:
        counts[q["source"]] = counts.get(q["source"], 0) + 1
    record = {"seed": args.seed, "templates": args.templates, "counts": counts, "questions": questions}
    write_atomically(args.out, lambda tmp: tmp.write_text(json.dumps(record, indent=0, ensure_ascii=False)))
    print(f"{len(questions):,} questions ({', '.join(f'{n:,} {s}' for s, n in counts.items())}) saved to {args.out}")
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    defaults = RecordingSettings()
    parser.add_argument("--model", required=True, help="a chat model: wheel model name, folder or hub id")
    parser.add_argument("--questions", type=Path, default=QUESTIONS_FILE, help="a list written by `questions`")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size,
                        help="rows decoded together (a finished row takes the next question at once)")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the answers, token ids (default: assets/recordings/MODEL-QUESTIONS); "
                             "the features go to the cache folder's recordings/ under the same name")
    parser.add_argument("--shard-size", type=int, default=RecordingSettings().shard_size,
                        help="questions per shard, the unit that is saved and resumed")
    parser.add_argument("--limit", type=int, default=None, help="answer only the first this many questions")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop after this long (the shards finished by then are saved; run again to go on)")


def _positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise DecodingError(f"--{name.replace('_', '-')} must be at least 1, not {value}")


def run_record(args: argparse.Namespace) -> int:
    _positive(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, shard_size=args.shard_size,
              limit=args.limit, threads=args.threads)
    questions = read_questions(args.questions)[: args.limit]
    out = args.out or default_answers_dir(args.model, args.questions)
    # float32 on every device: the answers are the ones decoding writes in float32 on a CPU.
    tokenizer, model = load_base(args.model, args.threads, batch_size_hint=args.batch_size, device=args.device,
                                 dtype=torch.float32)
    settings = RecordingSettings(args.max_new_tokens, args.batch_size, args.shard_size)
    started = time.perf_counter()
    tokens = record(model, tokenizer, questions, out, settings,
                    {"model": args.model, "questions_file": args.questions.name}, max_seconds=args.max_seconds)
    seconds = time.perf_counter() - started
    print(f"{tokens:,} answer tokens in {seconds:.0f} s ({tokens / max(seconds, 1e-9):.0f} tok/s, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}); {len(finished_shards(out))} shards in {out}")
    return 0


def add_record_bench_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.add_argument("--count", type=int, default=128, help="questions answered by each contender a round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each contender once a round")


def run_record_bench(args: argparse.Namespace) -> int:
    _positive(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, count=args.count, rounds=args.rounds,
              threads=args.threads)
    tokenizer, model = load_base(args.model, args.threads, batch_size_hint=args.batch_size, device=args.device)
    texts = read_questions(args.questions)[-args.count:]  # the list's end: answered last by `record`
    questions = [(i, chat_prompt_ids(tokenizer, t)) for i, t in enumerate(texts)]
    stop_ids = stop_token_ids(model.generation_config)
    pad_id = padding_id(tokenizer, stop_ids)

    def recorder(batch_size: int):
        batcher = ContinuousBatcher(model, stop_ids, pad_id, args.max_new_tokens, batch_size)
        return lambda qs: sum(len(r.answer) for r in batcher.answers(qs))

    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad_id,
                              eos_token_id=sorted(stop_ids) or None)

    @torch.inference_mode()
    def generate(qs) -> int:
        tokens = 0
        for start in range(0, len(qs), args.batch_size):
            ids, mask = pad_batch([p for _, p in qs[start: start + args.batch_size]], pad_id, side="left")
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            tokens += sum(len(cut_at_stop(row, stop_ids)) for row in out[:, ids.shape[1]:].tolist())
        return tokens

    few = questions[: max(2, args.count // 16)]  # batch 1 is slow: a few questions tell its speed
    runs = [("recorder, batch 1", recorder(1), few),
            (f"recorder, batch {args.batch_size}", recorder(args.batch_size), questions),
            (f"generate, batch {args.batch_size}", generate, questions)]
    print(f"{args.model}, {len(questions)} questions, at most {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, load before {os.getloadavg()[0]:.1f}")
    # Rounds in alternating order, so a neighbour's load falls on every contender alike.
    totals = {name: [0, 0.0] for name, _, _ in runs}
    for round_number in range(args.rounds):
        for name, answer, qs in runs if round_number % 2 == 0 else reversed(runs):
            started = time.perf_counter()
            totals[name][0] += answer(qs)
            totals[name][1] += time.perf_counter() - started
    for name, (tokens, seconds) in totals.items():
        print(f"{name:>22}: {tokens / seconds:6.1f} answer tokens/s ({tokens:,} tokens in {seconds:.0f} s)")
    print(f"load after {os.getloadavg()[0]:.1f}")
    return 0
