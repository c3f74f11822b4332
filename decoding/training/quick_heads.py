"""Medusa heads trained in about a minute while a visitor watches: "only these small heads are
trained, which is cheap and fast", shown on the loaded model.

1. **Read.** One batched pass of the frozen model over answers it wrote earlier (shipped as token
   ids in `assets/recordings/`) gives, at every answer token, the state that chose it and the
   model's own top guesses there: all a Medusa-1 head learns from (recorded_heads.py). It is the slow
   part on a CPU, so it is kept for the next training of the same model.
2. **Train.** Fresh heads laid out like the shipped ones (the same draft vocabulary, the same
   inputs) learn for a bounded time: the heads the visitor picked; the others keep their fresh
   start, which guesses the token the model just chose, one place too early.
3. **Measure.** Every few seconds, held-out top-1 and top-5 on answers to other questions, beside
   the untrained heads' and the shipped heads' figures on the very same answers.

The heads are the visitor's own: `with_trained_heads` gives a copy of the loaded model that
decodes with them, and the shipped heads are never touched.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..assets import recordings_of
from ..errors import DecodingError
from ..limits import PAGE_LIMITS, PageLimits, training_problem
from ..medusa_modules import MedusaHeads, medusa_part, with_heads
from ..model import LoadedModel
from .answer_batcher import recorded_from_tokens
from .answers import answers_from
from .recorded_heads import (
    RecordedData,
    RecordedEvaluation,
    RecordedTrainingSettings,
    evaluate_recorded_heads,
    new_recorded_heads,
    recorded_training_steps,
)
from .recording import finished_shards

# Answers to other questions, from the recording's end (about 2,000 tokens of SmolLM2's): read
# in a few seconds, and a measurement of one head over them takes a fraction of one.
HELDOUT_ANSWERS = 12
CHECK_EVERY = 4.0  # seconds between held-out measurements while training
TOP_K = 10  # ranks measured at the end: what --tree auto grows the visitor's trees from
# The recipe of the shipped heads (`train-heads --recorded`), but a constant learning rate: a run
# stopped by the clock cannot know how many steps it will get.
LEARNING_RATE = 1e-3
WARMUP_STEPS = 10


@dataclass(frozen=True)
class HeadsCheck:
    """Held-out accuracy of each head, measured `seconds` into training; None: not measured."""

    seconds: float
    positions_seen: int  # training positions the heads have learned from so far, repeats counted
    top1: list[float | None]
    top5: list[float | None]


@dataclass
class TrainingTrace:
    """One training on the page, as it goes: what the page draws and the CLI prints."""

    model: str
    recording: str
    trained_heads: list[int]  # 1-based
    num_heads: int
    seconds_limit: float
    read_limit_s: float  # the most seconds spent reading answers (the page's limit)
    phase: str = "reading"  # "reading", "training", "done"
    train_answers: int = 0
    train_positions: int = 0
    heldout_answers: int = 0
    heldout_positions: int = 0
    read_seconds: float = 0.0
    read_now: bool = True  # False: the answers were read by an earlier training of this model
    untrained: HeadsCheck | None = None  # fresh heads on the held-out answers
    shipped: HeadsCheck | None = None  # the model's shipped heads on the same answers
    checks: list[HeadsCheck] = field(default_factory=list)  # the heads as they learn; the last measures all
    steps: int = 0
    train_seconds: float = 0.0  # the steps' own time, measurements left out
    stop_reason: str = ""  # "time_limit" or "all_steps"

    @property
    def latest(self) -> HeadsCheck | None:
        """The newest measurement: the untrained heads' until the first check while training."""
        return self.checks[-1] if self.checks else self.untrained

    def to_dict(self) -> dict:
        return asdict(self)

    def snapshot(self) -> TrainingTrace:
        """The trace as it is now (training goes on changing this one)."""
        return dataclasses.replace(self, trained_heads=list(self.trained_heads), checks=list(self.checks))


@dataclass
class TrainedHeads:
    """A visitor's heads: the heads, what they measured (acc[h][r], for --tree auto), the trace."""

    heads: MedusaHeads
    accuracy: list[list[float]]
    trace: TrainingTrace

    @property
    def model(self) -> str:
        return self.trace.model


def with_trained_heads(lm: LoadedModel, trained: TrainedHeads) -> LoadedModel:
    """A copy of `lm` that decodes with `trained`'s heads; `lm` itself is left as it was."""
    if trained.model != lm.name:
        raise DecodingError(f"these heads were trained on {trained.model}, not {lm.name}")
    return with_heads(lm, trained.heads, trained.accuracy)


def recording_for(lm: LoadedModel) -> Path:
    """The recording of `lm`'s own answers that training reads, or a one-line refusal."""
    folders = recordings_of(lm.name)
    if not folders:
        raise DecodingError(f"no recorded answers of {lm.name} ship with the project, so its heads cannot be "
                            "trained here (`python -m decoding record --model NAME` writes some)")
    return folders[0]


def heads_problem(heads: tuple[int, ...], num_heads: int) -> str | None:
    """Why `heads` cannot be what learns on a model with `num_heads` heads, or None."""
    if not heads:
        return "pick at least one head to train"
    wrong = [h for h in heads if not isinstance(h, int) or not 1 <= h <= num_heads]
    if wrong:
        return f"this model has heads 1 to {num_heads}, not {', '.join(map(str, wrong))}"
    return None


# ----- 1. read ---------------------------------------------------------------------------------
READ_BATCH = 8  # answers a batched pass reads at once


@dataclass
class _Read:
    train: RecordedData
    heldout: RecordedData
    train_answers: int
    heldout_answers: int
    seconds: float


_last_read: dict[tuple, _Read] = {}  # the latest model's answers, read once: the slow part on a CPU


def _answered(recording: Path) -> list[tuple[int, list[int], list[int]]]:
    rows = []
    for shard in finished_shards(recording):
        meta = json.loads(shard.with_suffix(".json").read_text(encoding="utf-8"))
        rows += list(zip(meta["questions"], meta["prompts"], meta["answers"], strict=True))
    return rows


def _read(lm: LoadedModel, recording: Path, limits: PageLimits, trace: TrainingTrace) -> Iterator[_Read | None]:
    """Read the held-out answers (from the recording's end), then training answers from its start
    until `limits.train_tokens` or `limits.train_read_seconds` is reached, a batch at a time:
    yields None after each batch (the trace says how far it got), then the `_Read`. A recording
    answers each question once, so held-out questions never train."""
    key = (lm.name, str(lm.dtype), str(recording.resolve()))
    if key in _last_read:
        trace.read_now = False
        yield _last_read[key]
        return
    answered = _answered(recording)
    heldout, rest = answered[-HELDOUT_ANSWERS:], answered[:-HELDOUT_ANSWERS]
    if not rest:
        raise DecodingError(f"the recording {recording.name} has too few answers to train on")
    started = time.perf_counter()
    # A loaded model is in eval mode: no dropout, the states decoding sees.
    read_heldout = recorded_from_tokens(lm.model, heldout, batch_size=READ_BATCH)
    trace.heldout_answers, trace.heldout_positions = len(heldout), sum(len(a) for _, _, a in heldout)
    read_train = []
    while len(read_train) < len(rest) and trace.train_positions < limits.train_tokens and (
            time.perf_counter() - started < limits.train_read_seconds):
        batch = rest[len(read_train): len(read_train) + READ_BATCH]
        read_train += recorded_from_tokens(lm.model, batch, batch_size=READ_BATCH)
        trace.train_answers, trace.read_seconds = len(read_train), round(time.perf_counter() - started, 2)
        trace.train_positions += sum(len(a) for _, _, a in batch)
        yield None
    read = _Read(RecordedData.from_answers(answers_from(read_train)),
                 RecordedData.from_answers(answers_from(read_heldout)),
                 len(read_train), len(read_heldout), time.perf_counter() - started)
    _last_read.clear()
    _last_read[key] = read
    yield read


# ----- 2 and 3. train and measure ---------------------------------------------------------------
def _draft_vocab(lm: LoadedModel) -> torch.Tensor:
    """The tokens the shipped heads guess among (the whole vocabulary where they have no draft one)."""
    heads = medusa_part(lm).heads
    return torch.arange(heads.config.vocab_size) if heads.draft_vocab is None else heads.draft_vocab.cpu()


def _settings(lm: LoadedModel, trained_heads: tuple[int, ...], epochs: float) -> RecordedTrainingSettings:
    c = medusa_part(lm).heads.config
    return RecordedTrainingSettings(
        num_heads=c.num_heads, num_layers=c.num_layers, draft_vocab_size=len(_draft_vocab(lm)),
        lr=LEARNING_RATE, warmup_steps=WARMUP_STEPS, reads_root=c.reads_root, trained_heads=trained_heads,
        schedule="constant", bf16=False, epochs=epochs,
    )


def _evaluate(heads: MedusaHeads, lm: LoadedModel, data: RecordedData, measured: tuple[int, ...] | None,
              top_k: int = 5) -> RecordedEvaluation:
    lm_head, embedding = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    return evaluate_recorded_heads(heads, lm_head, embedding, data, top_k, measured=measured)


def _as_check(evaluation: RecordedEvaluation, measured: tuple[int, ...] | None, seconds: float,
              positions: int) -> HeadsCheck:
    keep = [measured is None or k in measured for k in range(1, len(evaluation.accuracy) + 1)]
    return HeadsCheck(round(seconds, 2), positions,
                      [round(v, 4) if k else None for v, k in zip(evaluation.top1, keep, strict=True)],
                      [round(v, 4) if k else None for v, k in zip(evaluation.top5, keep, strict=True)])


def _check(heads: MedusaHeads, lm: LoadedModel, data: RecordedData, measured: tuple[int, ...] | None,
           seconds: float, positions: int) -> HeadsCheck:
    return _as_check(_evaluate(heads, lm, data, measured), measured, seconds, positions)


def train_heads_live(lm: LoadedModel, trained_heads: tuple[int, ...], seconds: float,
                     limits: PageLimits = PAGE_LIMITS, recording: Path | None = None,
                     ) -> Iterator[TrainingTrace | TrainedHeads]:
    """Read, train and measure (the module's steps 1-3), yielding the trace as it grows; the last
    thing yielded is the `TrainedHeads`. The answers come from `recording` (a folder `record`
    wrote), by default the one the project ships for the model. The model is never changed."""
    recording = recording or recording_for(lm)
    shipped = medusa_part(lm)
    if shipped is None:
        raise DecodingError(f"{lm.name} was loaded without Medusa heads: there is no layout to train")
    problem = heads_problem(trained_heads, shipped.num_heads) or training_problem(seconds, limits)
    if problem:
        raise DecodingError(problem)
    trace = TrainingTrace(lm.name, recording.name, sorted(trained_heads), shipped.num_heads, seconds,
                          limits.train_read_seconds)
    yield trace.snapshot()
    for read in _read(lm, recording, limits, trace):
        if read is None:
            yield trace.snapshot()
    trace.train_answers, trace.heldout_answers, trace.read_seconds = (
        read.train_answers, read.heldout_answers, round(read.seconds, 2))
    trace.train_positions, trace.heldout_positions = len(read.train), len(read.heldout)

    lm_head, embedding = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    # So many epochs that the clock, not the data, ends the run.
    settings = _settings(lm, tuple(trained_heads), epochs=1e9)
    heads = new_recorded_heads(lm_head, _draft_vocab(lm), settings).to(lm_head.weight.device)
    heads.origin = f"trained on this page for {seconds:.0f} s"
    measured = tuple(trained_heads)
    trace.untrained = _check(heads, lm, read.heldout, None, 0.0, 0)
    trace.shipped = _check(shipped.heads, lm, read.heldout, None, 0.0, 0)
    trace.phase = "training"
    yield trace.snapshot()

    started = time.perf_counter()
    next_check = CHECK_EVERY
    run = None
    for run in recorded_training_steps(heads, lm_head, embedding, read.train, settings):
        trace.steps = run.steps
        elapsed = time.perf_counter() - started  # measurements included: the visitor waits for them too
        if elapsed >= seconds:
            break
        if elapsed >= next_check:
            trace.checks.append(_check(heads, lm, read.heldout, measured, elapsed, run.steps * settings.batch_size))
            next_check = elapsed + CHECK_EVERY
            yield trace.snapshot()
    trace.stop_reason = "time_limit" if time.perf_counter() - started >= seconds else "all_steps"
    trace.train_seconds = round(run.wall_time_s, 2) if run else 0.0
    evaluation = _evaluate(heads, lm, read.heldout, None, TOP_K)
    trace.checks.append(_as_check(evaluation, None, time.perf_counter() - started, trace.steps * settings.batch_size))
    trace.phase = "done"
    yield trace.snapshot()
    yield TrainedHeads(heads, evaluation.accuracy, trace)
