"""Borrowing a GPU on a Hugging Face ZeroGPU Space; a no-op everywhere else.

On a Space the `spaces` package exists and `spaces.GPU` lends a GPU for the length of one call
(it does nothing on other hardware). It must be imported before torch touches CUDA, which is why
`app.py` imports this module before anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable

try:
    import spaces
except ImportError:
    spaces = None

# ZeroGPU Spaces say so in SPACES_ZERO_GPU; there a model may be moved to CUDA at start-up but
# cannot run outside a decorated call.
ON_ZERO_GPU = spaces is not None and os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def gpu(fn: Callable, duration: int = 60) -> Callable:
    """`fn` run on a borrowed GPU (for at most `duration` seconds) where `spaces` exists."""
    return spaces.GPU(duration=duration)(fn) if spaces is not None else fn
