"""Saving what training makes: checkpoints written atomically, and models in the dtype asked for.

Training runs for minutes to hours and may be killed at any moment, so nothing a later
`--resume` reads is ever half-written: every file goes to a temporary name first and is renamed
into place (a rename within one folder is atomic), so the file there is always the old one whole
or the new one whole.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..atomic import write_atomically

SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def save_state(path: Path, state: dict[str, Any]) -> None:
    """A training state (tensors, counters, logs) saved with torch.save, atomically."""
    write_atomically(path, lambda tmp: torch.save(state, tmp))


def load_state(path: Path) -> dict[str, Any]:
    """A state saved by `save_state`; tensors only, no pickled code (`weights_only`)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def save_model_as(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, directory: Path,
                  dtype: str) -> None:
    """Save model and tokenizer (if one is given) with the weights in `dtype` ("float32" or "bfloat16").

    A converted copy: the model itself keeps its dtype, so training can go on in float32.
    Copying the module (not just its tensors) keeps tied embeddings tied: they are saved once.
    """
    copy.deepcopy(model).to(SAVE_DTYPES[dtype]).save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
