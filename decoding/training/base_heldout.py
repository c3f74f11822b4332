"""What ``train-base`` measures on held-out text while it trains: the model's loss over fixed
windows, each multi-token prediction depth's loss and top-1, and the loss curve for the card."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import LlamaForCausalLM

from ..mtp_modules import MTPModules, mtp_logits, mtp_targets

if TYPE_CHECKING:
    from .train_base import BaseTrainingSettings


def heldout_windows(heldout: torch.Tensor, settings: BaseTrainingSettings) -> torch.Tensor:
    """Fixed, non-overlapping held-out windows (the same every evaluation, so comparable)."""
    n_windows = min(len(heldout) // settings.seq_len, settings.eval_batches * settings.batch_size)
    return heldout[: n_windows * settings.seq_len].view(n_windows, settings.seq_len)


@torch.no_grad()
def heldout_loss(model: LlamaForCausalLM, heldout: torch.Tensor, settings: BaseTrainingSettings) -> float:
    """The model's mean loss over the held-out windows."""
    windows = heldout_windows(heldout, settings)
    if len(windows) == 0:
        return float("nan")
    model.eval()
    losses = []
    for batch in windows.split(settings.batch_size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            losses.append(model(input_ids=batch, labels=batch).loss.float().item() * len(batch))
    model.train()
    return sum(losses) / len(windows)


@torch.no_grad()
def heldout_mtp(model: LlamaForCausalLM, modules: MTPModules, heldout: torch.Tensor,
                settings: BaseTrainingSettings) -> dict[str, list[float]]:
    """Each MTP depth's held-out loss and top-1: how often module k's first guess is the token
    k+1 ahead, given the text before it (what a round accepts when the guesses before were right)."""
    windows = heldout_windows(heldout, settings)
    losses, hits, count = [0.0] * modules.config.depth, [0] * modules.config.depth, [0] * modules.config.depth
    model.eval()
    modules.eval()
    for batch in windows.split(settings.batch_size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            states = model(input_ids=batch, output_hidden_states=True).hidden_states[-1]
            for k, logits in enumerate(mtp_logits(modules, model, states, batch)):
                target = mtp_targets(batch, k + 1)
                losses[k] += torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), target.flatten(), reduction="sum").item()
                hits[k] += int((logits.argmax(-1) == target).sum())
                count[k] += target.numel()
    model.train()
    modules.train()
    return {"mtp_loss": [loss / max(n, 1) for loss, n in zip(losses, count, strict=True)],
            "mtp_top1": [hit / max(n, 1) for hit, n in zip(hits, count, strict=True)]}


def plot_curve(log: dict[str, Any], path: Path) -> None:
    """Loss against tokens seen, train and held-out, as a PNG for the model card."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on the training machine
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    train = log["train_curve"]
    held = log["heldout_curve"]
    ax.plot([p["tokens"] / 1e6 for p in train], [p["loss"] for p in train], label="train", lw=1)
    ax.plot([p["tokens"] / 1e6 for p in held], [p["loss"] for p in held], "o-", label="held-out", ms=3)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(f"train-base: {log['params'] / 1e6:.2f}M-param Llama")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
