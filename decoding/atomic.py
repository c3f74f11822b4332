"""Files written whole or not at all: a temporary file beside the target, renamed into place.

A rename within one folder is atomic, so whoever reads the file (a resumed training run, a later
load reading a cached cost curve) sees the old file whole or the new one whole, never half.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` to a temporary file beside `path`, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
