"""What one run may ask of a shared machine: the page's limits, and whether a run fits in memory.

A public page serves a whole class from one process. One visitor's 10,000-node tree or
20,000-character prompt must not take it down for everyone, so the page and its `/trace` API
refuse a run past `PAGE_LIMITS` before any model work; the CLI runs it (the machine is the user's
own) but warns. Whoever asks, a run whose estimated peak memory would not fit in what the
machine has free is refused before its first pass, with the numbers: being refused with a
reason beats being killed by the kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .errors import DecodingError


@dataclass(frozen=True)
class PageLimits:
    """What one visitor's run may ask for on the page and through `/trace`."""

    # Twice the paper's largest tree (mc_sim_7b_63, 64 nodes): every shipped tree fits, and the
    # page can still draw the tree and its mask on one screen.
    tree_nodes: int = 128
    # Characters of the tree editor's JSON read at all (128 paths of 5 ranks take about 3,000).
    # Generous, so that a pasted 10,000-path tree (about 110,000) is parsed in milliseconds and
    # refused by its node count, which says more than its length.
    tree_chars: int = 500_000
    # About 1,000 tokens of English: a prompt a class would paste, read by one prefill in a few
    # seconds on a CPU (a 20,000-character prompt took 20 s before its first round).
    prompt_chars: int = 4_000
    max_new_tokens: int = 256  # the page's slider goes this far
    # Seconds of decoding after which a run stops and shows what it wrote (a race applies it to
    # each lane's run).
    run_seconds: float = 60.0
    # Visitors waiting for the model at once; the next one is told the page is busy.
    queue_size: int = 16


PAGE_LIMITS = PageLimits()
# A run may use this share of the memory the machine has free: the rest is the estimate's margin
# and room for the server, the browser's requests and the other models in the cache.
MEMORY_SHARE = 0.7


def tree_problem(paths: int, limits: PageLimits = PAGE_LIMITS) -> str | None:
    """Why a tree of `paths` paths (nodes besides the root) is past the page's limit, or None."""
    if paths + 1 <= limits.tree_nodes:
        return None
    return (f"the tree has {paths + 1} nodes (root included); this page verifies at most {limits.tree_nodes} "
            f"in one pass (the paper's largest tree has 64): remove some paths")


def tree_text_problem(text: str, limits: PageLimits = PAGE_LIMITS) -> str | None:
    """Why the tree editor's text is too long to read at all, or None."""
    if len(text) <= limits.tree_chars:
        return None
    return (f"the tree's text is {len(text):,} characters; this page reads at most {limits.tree_chars:,} "
            f"(a {limits.tree_nodes}-node tree takes about 3,000)")


def prompt_problem(prompt: object, limits: PageLimits = PAGE_LIMITS) -> str | None:
    """Why a prompt is too long for the page, or None."""
    if not isinstance(prompt, str) or len(prompt) <= limits.prompt_chars:
        return None
    return (f"the prompt is {len(prompt):,} characters; this page reads at most {limits.prompt_chars:,} "
            "(about a page of text): shorten it")


def max_new_tokens_problem(max_new_tokens: int, limits: PageLimits = PAGE_LIMITS) -> str | None:
    """Why a run's token count is outside the page's one range (too few or too many alike), or None."""
    if 1 <= max_new_tokens <= limits.max_new_tokens:
        return None
    return f"max_new_tokens must be from 1 to {limits.max_new_tokens} on this page, not {max_new_tokens}"


def page_problems(prompt: object, max_new_tokens: int, tree_paths: int | None,
                  limits: PageLimits = PAGE_LIMITS) -> list[str]:
    """Every way a run is past the page's limits (none: an empty list). `tree_paths` is None for a
    run without a tree (plain decoding, or a drafter whose chain its own settings bound)."""
    problems = [prompt_problem(prompt, limits), max_new_tokens_problem(max_new_tokens, limits),
                None if tree_paths is None else tree_problem(tree_paths, limits)]
    return [problem for problem in problems if problem]


def check_page_limits(prompt: object, max_new_tokens: int, tree_paths: int | None,
                      limits: PageLimits = PAGE_LIMITS) -> None:
    """DecodingError with the first problem, if the run is past the page's limits."""
    problems = page_problems(prompt, max_new_tokens, tree_paths, limits)
    if problems:
        raise DecodingError(problems[0])


# ----------------------------------------------------------------------------- memory

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
