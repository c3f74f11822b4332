"""What the page keeps on the server between requests: the loaded models and the files offered
for download. No figures and no events here: the handlers and the `/trace` endpoint share these.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from .models import ModelCache

# One cache for every visitor and the API: a model is loaded once and shared (see ModelCache).
cache = ModelCache()

DOWNLOADS = Path(tempfile.gettempdir()) / "medusa-playground-downloads"
KEEP_DOWNLOADS = 32


def write_json(name: str, data: dict) -> str:
    """A file for a download button: DOWNLOADS/<content hash>/<name>, the oldest pruned, so a
    long-running server keeps at most KEEP_DOWNLOADS of them."""
    text = json.dumps(data, indent=1)
    folder = DOWNLOADS / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    old = sorted(DOWNLOADS.iterdir(), key=lambda p: p.stat().st_mtime)[:-KEEP_DOWNLOADS]
    for stale in old:
        for file in stale.iterdir():
            file.unlink(missing_ok=True)
        stale.rmdir()
    return str(path)
