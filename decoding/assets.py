"""Where the shipped files are, and the one reader of a heads config: no torch, no transformers.

`assets/` beside the package holds the embedded models (`models/NAME`, each with its heads), their
example and bench prompts (`prompts/`) and the page's texts. What needs only a path, or the
small JSON that describes a model's heads, imports this module and not the model code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_MODELS_DIR = ASSETS_DIR / "models"
PROMPTS_DIR = ASSETS_DIR / "prompts"
# The model's own answers, recorded as token ids: one folder per recording (training/recording.py).
RECORDINGS_DIR = ASSETS_DIR / "recordings"
RECORDINGS_ENV = "MEDUSA_PLAYGROUND_RECORDINGS"  # more recording folders, os.pathsep between them

# The project's own heads layout: this JSON (the heads' shape, plus what training recorded:
# trees, accuracies, the command) beside `medusa_heads.safetensors`.
HEADS_CONFIG = "medusa_config.json"


def read_heads_config(directory: Path) -> Any:
    """The parsed heads config in `directory`. Its readers check what they need of it
    (`checkpoints.py` all of it, with a one-line message for a broken file)."""
    return json.loads((directory / HEADS_CONFIG).read_text(encoding="utf-8"))


def recordings_of(model: str, folder: Path = RECORDINGS_DIR) -> list[Path]:
    """The folders of `model`'s recordings, in name order: a recording's manifest names its model.
    Beside `folder`'s, the recordings in the folders RECORDINGS_ENV lists (os.pathsep between them):
    a recording of your own (`python -m decoding record --out DIR`), read by the page without copying."""
    extra = [Path(p) for p in os.environ.get(RECORDINGS_ENV, "").split(os.pathsep) if p]
    manifests = sorted(folder.glob("*/recording.json")) + [p / "recording.json" for p in extra]
    return [m.parent for m in manifests
            if m.is_file() and json.loads(m.read_text(encoding="utf-8")).get("model") == model]
