"""``train-heads``: Medusa heads for any Hugging Face causal LM, trained, measured and saved.

One run, step by step:
1. load the base model, frozen, in the dtype decoding uses on the device;
2. build its data, or reload it when resuming (`data.py`: text chunks or self-distillation);
3. measure fresh heads on the held-out split, the baseline the report compares with;
4. fit the heads (`fit.py`: Medusa-1, or Medusa-2 with the base tuned too);
5. measure them again (`evaluate.py`) and grow each node budget's trees from that (`trees.py`);
6. save the heads with everything measured in `medusa_config.json`, the tuned base beside them
   after Medusa-2, and the published v0.1 layout when asked.

The training state and the data go to `OUT/heads_checkpoint/`, so a killed run resumes where
it stopped. Chat models trained on recorded self-distillation take their own path
(`recorded_heads_cli.py`); the command line for both is `training_cli.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..checkpoints import save_v01
from ..errors import DecodingError
from ..loading import resolve_device, resolve_dtype
from ..medusa_modules import MedusaHeads
from .batches import use_bf16
from .data import DataSettings, HeadsData, load_or_build_data
from .evaluate import HeadsEvaluation, evaluate_heads
from .fit import FitSettings, TrainingRun, fit_heads, new_heads, next_token_loss
from .saving import save_model_as
from .trees import BuiltTrees, TreeSettings, build_trees

# Not "checkpoint": heads may be trained into a base model's run folder, where train-base keeps its own.
CHECKPOINT_DIR = "heads_checkpoint"
STATE_FILE = "state.pt"
DATA_FILE = "data.json"
TUNED_BASE_DIR = "base"  # Medusa-2's fine-tuned base model, beside its heads
# The v0.1 files go to a subfolder: their config.json would overwrite a model's own when the heads
# are saved beside the model. The subfolder is self-describing, ready to upload as it is.
V01_DIR = "v0.1"
SAVE_DTYPE = "float32"


@dataclass
class HeadsJob:
    """Everything one train-heads run needs; the nested settings carry each stage's defaults."""

    model: str  # base model: a local folder or a hub id
    out: Path
    data: DataSettings = field(default_factory=DataSettings)
    fit: FitSettings = field(default_factory=FitSettings)
    trees: TreeSettings = field(default_factory=TreeSettings)
    device: str = "auto"
    threads: int | None = None
    init_heads: Path | None = None  # start from heads an earlier run saved
    resume: bool = False
    also_v01: bool = False
    save_dtype: str = SAVE_DTYPE  # of the tuned base's weights (Medusa-2)
    command: str = ""  # the command line that asked for this run, saved with the heads

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / CHECKPOINT_DIR


def load_base_model(name: str, device: torch.device) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and frozen model, in the dtype decoding uses on this device (fp32 on CPUs)."""
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=resolve_dtype("auto", device))
    return tokenizer, model.to(device).eval()


def _init_heads(job: HeadsJob, device: torch.device) -> MedusaHeads | None:
    """The heads `--init-heads` names, checked against the shape the settings ask for."""
    if job.init_heads is None:
        return None
    heads, _ = MedusaHeads.load(job.init_heads)
    wanted = (job.fit.num_heads, job.fit.num_layers, job.fit.shared_lm_head)
    found = (heads.num_heads, heads.config.num_layers, heads.config.shared_lm_head)
    if found != wanted:
        raise DecodingError(f"--init-heads {job.init_heads}: heads/layers/shared are {found}, "
                            f"the flags say {wanted}")
    return heads.to(device)


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 4) for v in values]


def _training_record(data: HeadsData, run: TrainingRun, batch_size: int, before: HeadsEvaluation,
                     after: HeadsEvaluation, base_losses: dict[str, float] | None) -> dict[str, Any]:
    """What was trained on, how long, and how well: the "training" entry of medusa_config.json."""
    return {
        "steps": run.steps,
        "tokens": run.tokens,
        "epochs": round(run.steps * batch_size / len(data.train), 3),
        "train_sequences": len(data.train),
        "heldout_sequences": len(data.heldout),
        "data": data.source,
        "final_train_loss": round(run.final_loss, 4),
        "heldout_loss": round(after.loss, 4),
        "heldout_loss_untrained": round(before.loss, 4),
        "heldout_top1": _rounded(after.top1),
        "heldout_top5": _rounded(after.top5),
        "heldout_top1_untrained": _rounded(before.top1),
        "heldout_top5_untrained": _rounded(before.top5),
        # Medusa-2: the base model's own next-token loss on the held-out sequences, before and after.
        **({"base_next_token_loss": base_losses} if base_losses else {}),
        "training_wall_time_s": round(run.wall_time_s, 1),
        "training_tokens_per_s": round(run.tokens / max(run.wall_time_s, 1e-9), 1),
    }


def _print_report(before: HeadsEvaluation, after: HeadsEvaluation, built: BuiltTrees) -> None:
    print(f"held-out loss: {before.loss:.4f} untrained -> {after.loss:.4f} trained")
    print("head  top-1 (untrained -> trained)   top-5 (untrained -> trained)")
    for h in range(len(after.accuracy)):
        print(f"{h + 1:>4}  {before.top1[h]:.3f} -> {after.top1[h]:.3f}"
              f"                 {before.top5[h]:.3f} -> {after.top5[h]:.3f}")
    print(f"tokens per pass: expected by the product rule, and measured on {after.joint_positions:,} "
          "held-out positions")
    for name in built.trees:
        rule = f"product rule {built.expected[name]:.3f}" if name in built.expected else ""
        measured = f"measured {built.measured[name]:.3f}" if name in built.measured else ""
        print(f"{name:>12}  {rule:<20}  {measured}")


def train_heads(job: HeadsJob) -> None:
    """Train, measure and save heads as `job` says (steps 1-6 above)."""
    started = time.perf_counter()
    if job.threads:
        torch.set_num_threads(job.threads)
    device = resolve_device(job.device)
    fit = replace(job.fit, bf16=use_bf16(job.fit.bf16, device))
    tokenizer, model = load_base_model(job.model, device)
    data = load_or_build_data(job.checkpoint_dir / DATA_FILE, job.data, model, tokenizer, job.resume)
    print(f"{len(data.train)} training and {len(data.heldout)} held-out sequences")

    def evaluate(heads: MedusaHeads) -> HeadsEvaluation:
        return evaluate_heads(model, heads, data.heldout, job.trees.top_k, fit.batch_size, fit.loss_decay,
                              fit.bf16, data.heldout_starts)

    init_heads = _init_heads(job, device)
    before = evaluate(new_heads(model, fit.num_heads, fit.num_layers, fit.shared_lm_head))
    base_loss_before = next_token_loss(model, data.heldout, fit.batch_size) if fit.joint else None
    run = fit_heads(model, data.train, fit, init_heads=init_heads, checkpoint=job.checkpoint_dir / STATE_FILE,
                    resume=job.resume)
    after = evaluate(run.heads)

    base_model, base_losses = job.model, None
    if fit.joint:
        base_losses = {"before": round(base_loss_before, 4),
                       "after": round(next_token_loss(model, data.heldout, fit.batch_size), 4)}
        base_model = str(job.out / TUNED_BASE_DIR)
        save_model_as(model, tokenizer, job.out / TUNED_BASE_DIR, job.save_dtype)
    built = build_trees(after, job.trees.tree_nodes)
    training = _training_record(data, run, fit.batch_size, before, after, base_losses)
    training |= {"wall_time_s": round(time.perf_counter() - started, 1), "device": str(device), "bf16": fit.bf16,
                 "command": job.command}
    run.heads.save(job.out, extra={
        "base_model": base_model,
        "accuracy": after.accuracy,
        "trees": built.trees,
        "expected_tokens_per_pass": built.expected,
        "heldout_tokens_per_pass": built.measured,
        "default_tree": job.trees.default_tree,
        "training": training,
    })
    if job.also_v01:
        save_v01(run.heads, job.out / V01_DIR, base_model)  # the tuned base, after Medusa-2

    _print_report(before, after, built)
    if base_losses:
        print(f"base model's next-token loss on the held-out sequences: {base_losses['before']:.4f} -> "
              f"{base_losses['after']:.4f}; tuned base saved to {base_model}")
    print(f"saved heads to {job.out} (default tree {job.trees.default_tree}); {run.steps} steps, "
          f"{run.tokens:,} tokens, {training['wall_time_s']:.0f} s")
