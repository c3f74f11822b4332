"""``train-base``: train the project's small base language model from scratch on CPU.

The model is a stock ``LlamaForCausalLM`` (the same code path as real Llama
checkpoints, so the Medusa code never special-cases it) with a byte-level BPE
tokenizer trained on the same corpus. Everything is saved with
``save_pretrained`` so ``AutoModelForCausalLM`` / ``AutoTokenizer`` load it
offline.

With ``--tokenizer DIR`` it trains a model for an existing tokenizer instead: a *draft model*
for speculative decoding, which must share its target model's vocabulary and special tokens.
Then nothing is trained or saved for the tokenizer (the draft loads its target's), and the
corpus may be the target's own recorded answers, already token ids (see corpus.py).

Training is built for a shared 2-core CPU with a wall-clock budget:

* bf16 autocast (about 1.5x faster than fp32 on this project's 2-core development CPU);
* ``--max-minutes`` stops cleanly and saves; the cosine LR schedule runs on
  *progress* = the larger of step and wall-clock fraction, so the learning rate
  has decayed by the time the budget ends however fast the shared CPU turns out;
* periodic checkpoints (model, optimizer, step, elapsed time, RNG states) let
  ``--resume`` continue exactly where a run stopped.

With ``--mtp-depth D`` the model trains with DeepSeek-V3's multi-token prediction objective
(see mtp.py): D modules beside it, each guessing one token further ahead, their mean loss added
to the model's with DeepSeek-V3's weights. The held-out log then keeps each depth's loss and
top-1 beside the model's own loss, so a twin trained without them (same flags, no
``--mtp-depth``) measures what the objective did to the model itself.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ..errors import DecodingError
from ..mtp_modules import MTP_DIR, MTPConfig, MTPModules, loss_weight, mtp_loss
from .base_heldout import heldout_loss, heldout_mtp, plot_curve
from .base_tokens import MAX_POSITIONS, encode_documents, special_ids, token_stream, train_tokenizer
from .corpus import build_corpus, build_record_corpus, record_folders
from .saving import load_state, save_model_as, save_state

CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FILE = "state.pt"
BEST_DIR = "best"
LOG_FILE = "training_log.json"
CURVE_FILE = "loss_curve.png"


@dataclass
class BaseTrainingSettings:
    """train-base's settings; the defaults are those of the shipped `austen` model."""

    # 'austen', 'stdlib', a .txt file / folder of them, or recording folders (see corpus.py)
    corpus: str = "austen"
    out: Path = Path("runs/train_base/austen")  # final model, tokenizer, log, checkpoint/
    # A saved tokenizer to use as it is (a draft model's is its target's); None: train one.
    tokenizer: Path | None = None
    vocab_size: int = 8192  # of a trained tokenizer; a given one has its own
    hidden_size: int = 256
    layers: int = 6
    heads: int = 8
    intermediate_size: int = 704
    mtp_depth: int = 0  # multi-token prediction modules trained with the model (mtp.py); 0: none
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 2e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # final learning rate as a fraction of the peak
    warmup_steps: int = 200
    weight_decay: float = 0.1
    max_steps: int | None = None
    max_tokens: int | None = None  # an alternative to max_steps (converted to steps)
    # Wall-clock budget, cumulative over resumes; 0 for none. The LR schedule follows it.
    max_minutes: float = 77.0
    eval_every: int = 100  # steps between held-out evaluations
    eval_batches: int = 8  # held-out batches per evaluation (fixed windows, the same every time)
    log_every: int = 10  # steps per train-loss log point
    save_every: int = 200  # steps between checkpoints
    seed: int = 1234
    # torch CPU threads: 1 is faster than 2 on a CPU shared with other jobs, where two threads
    # stall each other at every barrier.
    threads: int = 1
    bf16: bool = True  # bf16 autocast on the CPU
    save_dtype: str = "float32"  # of the saved weights; bfloat16 halves the files
    resume: bool = False

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def step_limit(self) -> int | None:
        """max_steps, or max_tokens in steps, whichever comes first; None: the clock decides."""
        if self.max_tokens is None:
            return self.max_steps
        return min(self.max_steps or math.inf, math.ceil(self.max_tokens / self.tokens_per_step))


def build_model(settings: BaseTrainingSettings, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A small Llama with tied embeddings (saves vocab x hidden parameters), whose vocabulary and
    special ids are the tokenizer's."""
    bos, eos, pad = special_ids(tokenizer)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads,
        num_key_value_heads=settings.heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, do_sample=False
    )
    return model


def lr_at(step: int, progress: float, settings: BaseTrainingSettings) -> float:
    """Linear warmup by steps, then cosine decay to min_lr over training progress."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, settings: BaseTrainingSettings) -> torch.optim.AdamW:
    """AdamW; no weight decay on norms (1-D weights), as usual for transformers."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": settings.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)


def sample_batch(stream: torch.Tensor, settings: BaseTrainingSettings, gen: torch.Generator) -> torch.Tensor:
    """Random fixed-length windows of the token stream (seeded, so resumable)."""
    starts = torch.randint(0, len(stream) - settings.seq_len, (settings.batch_size,), generator=gen)
    return torch.stack([stream[s : s + settings.seq_len] for s in starts.tolist()])


class BaseTraining:
    """One train-base run: the data, the model and its optimizer, and the counters a checkpoint
    keeps (step, elapsed time, log). `run()` trains until the step limit or the clock says stop."""

    def __init__(self, settings: BaseTrainingSettings, command: str) -> None:
        self.settings = s = settings
        self.checkpoint_dir = s.out / CHECKPOINT_DIR
        resume_state = self._resume_state()
        torch.manual_seed(s.seed)
        folders = record_folders(s.corpus)
        if folders is not None:  # token ids already: they become the streams as they are
            if s.tokenizer is None:
                raise DecodingError(f"--corpus {s.corpus} holds token ids: give --tokenizer, "
                                    "the tokenizer of the model that wrote them")
            self.tokenizer = AutoTokenizer.from_pretrained(s.tokenizer)
            train_docs, heldout_docs = build_record_corpus(folders)
        else:
            train_text, heldout_text = build_corpus(s.corpus)
            self.tokenizer = self._tokenizer(train_text, resume_state is not None)
            train_docs = encode_documents(self.tokenizer, train_text)
            heldout_docs = encode_documents(self.tokenizer, heldout_text)
        self.train_ids, self.heldout_ids = token_stream(train_docs), token_stream(heldout_docs)
        top = max((int(ids.max()) for ids in (self.train_ids, self.heldout_ids) if len(ids)), default=-1)
        if top >= len(self.tokenizer):
            raise DecodingError(f"--corpus {s.corpus} has token id {top}, beyond the tokenizer's "
                                f"{len(self.tokenizer)}: not the tokenizer that wrote it")
        if len(self.train_ids) <= s.seq_len:
            raise DecodingError(f"corpus too small: {len(self.train_ids)} tokens for --seq-len {s.seq_len}")

        self.model = build_model(s, self.tokenizer)
        self.mtp = (MTPModules(MTPConfig(s.hidden_size, len(self.tokenizer), s.mtp_depth), self.model)
                    if s.mtp_depth else None)
        # The modules share the model's embedding and lm_head; they are not stored twice.
        trained = self.model if self.mtp is None else torch.nn.ModuleList([self.model, self.mtp])
        self.optimizer = make_optimizer(trained, s)
        self.generator = torch.Generator().manual_seed(s.seed)
        self.max_steps = s.step_limit
        self.budget_s = s.max_minutes * 60 if s.max_minutes else None
        if self.max_steps is None and self.budget_s is None:
            raise DecodingError("--max-minutes 0 needs --max-steps or --max-tokens")
        self.step, self.elapsed = 0, 0.0
        self.log: dict[str, Any] = {
            "command": command,
            "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
            "params": sum(p.numel() for p in self.model.parameters()),
            "mtp_params": sum(p.numel() for p in self.mtp.parameters()) if self.mtp else 0,
            "seed": s.seed,
            "corpus": s.corpus,
            "tokenizer": str(s.tokenizer) if s.tokenizer else "trained on the corpus",
            "train_documents": len(train_docs),
            "heldout_documents": len(heldout_docs),
            "train_tokens_in_corpus": len(self.train_ids),
            "heldout_tokens_in_corpus": len(self.heldout_ids),
            "train_curve": [],
            "heldout_curve": [],
        }
        if resume_state is not None:
            self._restore(resume_state)

    def _tokenizer(self, train_text: str, resuming: bool) -> PreTrainedTokenizerBase:
        """The given tokenizer, or the one trained on the corpus (kept in the checkpoint for a resume)."""
        s = self.settings
        if s.tokenizer is not None:
            return AutoTokenizer.from_pretrained(s.tokenizer)
        if resuming:
            return PreTrainedTokenizerFast.from_pretrained(self.checkpoint_dir)
        tokenizer = train_tokenizer(train_text, s.vocab_size)
        tokenizer.save_pretrained(self.checkpoint_dir)
        return tokenizer

    def _resume_state(self) -> dict[str, Any] | None:
        if not self.settings.resume:
            return None
        path = self.checkpoint_dir / CHECKPOINT_FILE
        if not path.exists():
            raise DecodingError(f"--resume: no checkpoint at {path}")
        return load_state(path)

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.mtp is not None:
            self.mtp.load_state_dict(state[MTP_DIR])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        self.step, self.elapsed = state["step"], state["elapsed"]
        self.log["train_curve"] = state["log"]["train_curve"]
        self.log["heldout_curve"] = state["log"]["heldout_curve"]
        self.log["resumed_from_steps"] = state["log"].get("resumed_from_steps", []) + [self.step]
        if "best" in state["log"]:
            self.log["best"] = state["log"]["best"]

    @property
    def progress(self) -> float:
        """How far training is, 0 to 1: the larger of the step and the clock fractions."""
        fractions = [0.0]
        if self.max_steps is not None:
            fractions.append(self.step / self.max_steps)
        if self.budget_s is not None:
            fractions.append(self.elapsed / self.budget_s)
        return max(fractions)

    @property
    def tokens_seen(self) -> int:
        return self.step * self.settings.tokens_per_step

    def train_step(self) -> tuple[float, float]:
        """One optimizer step on a fresh batch: (loss, learning rate)."""
        lr = lr_at(self.step, self.progress, self.settings)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(self.train_ids, self.settings, self.generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.settings.bf16):
            out = self.model(input_ids=batch, labels=batch, output_hidden_states=self.mtp is not None)
            loss = out.loss
            if self.mtp is not None:  # the model's loss is what is logged; the modules' is added
                modules_loss, _ = mtp_loss(self.mtp, self.model, out.hidden_states[-1], batch)
                total = loss + loss_weight(self.progress) * modules_loss
        (loss if self.mtp is None else total).backward()
        torch.nn.utils.clip_grad_norm_([p for group in self.optimizer.param_groups for p in group["params"]], 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss.item(), lr

    def evaluate(self) -> None:
        loss = heldout_loss(self.model, self.heldout_ids, self.settings)
        point = {"step": self.step, "tokens": self.tokens_seen, "loss": loss}
        if self.mtp is not None:
            point.update(heldout_mtp(self.model, self.mtp, self.heldout_ids, self.settings))
        self.log["heldout_curve"].append(point)
        tqdm.write(f"step {self.step}: held-out loss {loss:.4f}"
                   + (f", MTP top-1 {' / '.join(f'{a:.3f}' for a in point['mtp_top1'])}" if self.mtp else ""))
        # A small corpus is memorised before the schedule ends; the best held-out point is kept
        # in OUT/best so it can be chosen over the final weights.
        if loss < self.log.get("best", {}).get("heldout_loss", float("inf")):
            self.log["best"] = {"step": self.step, "tokens": self.tokens_seen, "heldout_loss": loss}
            self.save_model(self.settings.out / BEST_DIR)

    def save_checkpoint(self) -> None:
        save_state(self.checkpoint_dir / CHECKPOINT_FILE, {
            "model": self.model.state_dict(),
            **({MTP_DIR: self.mtp.state_dict()} if self.mtp is not None else {}),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "step": self.step,
            "elapsed": self.elapsed,
            "log": self.log,
        })

    def save_model(self, directory: Path) -> None:
        """The model, with the tokenizer if it was trained here; a given tokenizer stays where it
        is (a draft model is loaded with its target's), so the folder holds the model alone."""
        tokenizer = self.tokenizer if self.settings.tokenizer is None else None
        save_model_as(self.model, tokenizer, directory, self.settings.save_dtype)
        if self.mtp is not None:  # with the held-out top-1 per depth it was last measured at
            last = self.log["heldout_curve"][-1] if self.log["heldout_curve"] else {}
            self.mtp.save(directory / MTP_DIR, {"accuracy": last.get("mtp_top1"), "command": self.log["command"]})

    def run(self) -> None:
        """Train to the end of the schedule, then save the model, its log and its loss curve."""
        s = self.settings
        print(f"params {self.log['params']:,}  train tokens {len(self.train_ids):,}  "
              f"held-out tokens {len(self.heldout_ids):,}  tokens/step {s.tokens_per_step:,}  "
              f"starting at step {self.step}")
        self.model.train()
        bar = tqdm(total=self.max_steps, initial=self.step, unit="step", dynamic_ncols=True, mininterval=2.0)
        window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
        # wall clock of this invocation (evals and saves included) on top of earlier runs
        elapsed_before, started = self.elapsed, time.perf_counter()
        while self.progress < 1.0:
            loss, lr = self.train_step()
            now = time.perf_counter()
            self.elapsed = elapsed_before + now - started
            window_loss += loss
            window_steps += 1
            if self.step % s.log_every == 0:
                mean = window_loss / window_steps
                tok_s = window_steps * s.tokens_per_step / (now - window_start)
                self.log["train_curve"].append({"step": self.step, "tokens": self.tokens_seen, "loss": mean,
                                                "lr": lr, "elapsed_s": round(self.elapsed, 1)})
                bar.set_postfix(loss=f"{mean:.3f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}")
                window_loss, window_steps, window_start = 0.0, 0, now
            bar.update(1)
            if self.step % s.eval_every == 0:
                self.evaluate()
            if self.step % s.save_every == 0:
                self.save_checkpoint()
        bar.close()
        self._finish()

    def _finish(self) -> None:
        if not self.log["heldout_curve"] or self.log["heldout_curve"][-1]["step"] != self.step:
            self.evaluate()
        self.save_checkpoint()
        self.log.update({
            "steps": self.step,
            "tokens_seen": self.tokens_seen,
            "epochs": self.tokens_seen / len(self.train_ids),
            "wall_time_s": round(self.elapsed, 1),
            "final_train_loss": self.log["train_curve"][-1]["loss"] if self.log["train_curve"] else None,
            "final_heldout_loss": self.log["heldout_curve"][-1]["loss"],
        })
        out = self.settings.out
        self.save_model(out)
        (out / LOG_FILE).write_text(json.dumps(self.log, indent=1) + "\n", encoding="utf-8")
        plot_curve(self.log, out / CURVE_FILE)
        print(f"saved to {out}: {self.step} steps, {self.tokens_seen:,} tokens, "
              f"held-out loss {self.log['final_heldout_loss']:.4f}, {self.elapsed / 60:.1f} min")


def train_base(settings: BaseTrainingSettings, command: str = "") -> None:
    """Train (or resume) the base model and save it to `settings.out`.

    Raises DecodingError for problems the user can fix (missing checkpoint or corpus).
    """
    torch.set_num_threads(settings.threads)
    BaseTraining(settings, command).run()
