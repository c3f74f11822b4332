"""Whether a run fits in memory: an upper estimate of what it needs, against what is free.

Whoever asks (the page, the API, the CLI), a run whose estimated peak memory would not fit in
what the machine has free is refused before its first pass, with the numbers: being refused with
a reason beats being killed by the kernel.
"""

from __future__ import annotations

import os

import torch

from .errors import DecodingError

# A run may use this share of the memory the machine has free: the rest is the estimate's margin
# and room for the server, the browser's requests and the other models in the cache.
MEMORY_SHARE = 0.7


def run_memory_bytes(config: object, tree_nodes: int, context: int, element_bytes: int) -> int:
    """An upper estimate of the memory a run needs beyond the model's weights, in bytes.

    `config` is the base model's (transformers) config, `tree_nodes` the tokens of one verify pass
    (1 for plain decoding), `context` the most tokens in the cache (prompt, output and tree),
    `element_bytes` the size of one number in the model's dtype. What grows with the tree: the
    logits of every node, in the model's dtype and again in float32 for acceptance and the trace;
    one layer's attention scores (every head, every node, every visible key); the attention mask
    and the trace's copy of the tree's mask (a Python list of lists); the activations of one layer.
    What grows with the context: the KV cache of every layer.
    """
    layers = getattr(config, "num_hidden_layers", 1)
    heads = getattr(config, "num_attention_heads", 1)
    hidden = getattr(config, "hidden_size", 1)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    vocab = getattr(config, "vocab_size", 1)
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    t, keys = tree_nodes, context + tree_nodes
    kv_cache = layers * 2 * kv_heads * head_dim * keys * element_bytes
    logits = t * vocab * (element_bytes + 2 * 4)  # as computed, then float32 twice (probabilities)
    # One layer's attention scores three times over (scores, mask added, softmax), and the float mask.
    attention = 3 * heads * t * keys * 4 + t * keys * 4
    tree_masks = t * t * (1 + 4 + 8)  # bool mask, int copy, the trace's list of lists
    activations = t * (4 * hidden + 3 * intermediate) * 4
    return kv_cache + logits + attention + tree_masks + activations


def free_memory_bytes(device: torch.device) -> int | None:
    """What `device` has free now, in bytes, or None where that cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # other Unix systems: free pages only (an underestimate: the page cache counts as used)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gigabytes(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.0f} MB"


def check_fits(config: object, device: torch.device, dtype: torch.dtype, tree_nodes: int, context: int) -> None:
    """DecodingError, with the numbers, if a run would need more memory than the device has free."""
    element_bytes = torch.empty((), dtype=dtype).element_size()
    need = run_memory_bytes(config, tree_nodes, context, element_bytes)
    free = free_memory_bytes(device)
    if free is None or need <= MEMORY_SHARE * free:
        return
    shape = f"a {tree_nodes}-node tree" if tree_nodes > 1 else "plain decoding"
    raise DecodingError(
        f"this run would need about {gigabytes(need)} of memory ({shape} over up to {context:,} tokens of "
        f"context), but {device.type} has {gigabytes(free)} free: use a smaller tree, a shorter prompt "
        "or fewer new tokens")
