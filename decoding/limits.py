"""What one visitor's run may ask of a shared page: the page's limits, and the messages past them.

A public page serves a whole class from one process. One visitor's 10,000-node tree or
20,000-character prompt must not take it down for everyone, so the page and its `/trace` API
refuse a run past `PAGE_LIMITS` before any model work; the CLI runs it (the machine is the user's
own) but warns. Whether a run fits in memory, whoever asks, is memory.py's question.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    # Training heads on the page (training/quick_heads.py): the most seconds of training, and how
    # much the frozen model reads to train on, once (its batched passes are the slow part: SmolLM2
    # on a 2-core CPU reads 150-450 answer tokens a second), in tokens and seconds, whichever ends first.
    train_seconds: float = 60.0
    train_tokens: int = 16_000
    train_read_seconds: float = 30.0


PAGE_LIMITS = PageLimits()


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


def training_problem(seconds: object, limits: PageLimits = PAGE_LIMITS) -> str | None:
    """Why a training of `seconds` is outside the page's range, or None."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and 1 <= seconds <= limits.train_seconds:
        return None
    return f"training runs from 1 to {limits.train_seconds:.0f} seconds on this page, not {seconds}"


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
