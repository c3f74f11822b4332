"""Prompt files: the example prompts shipped with each embedded model, and the bench's inputs.

A `.txt` file holds one prompt per line. Code needs newlines and indentation inside a prompt, so
a `.json` file holds a list of strings instead. `assets/prompts/<model>.txt|json` are the
examples the app offers for embedded model `<model>`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .assets import EMBEDDED_MODELS_DIR, HEADS_CONFIG, PROMPTS_DIR, read_heads_config
from .errors import DecodingError


def read_prompts(path: Path | str) -> list[str]:
    """The prompts in `path`: lines of a .txt file, or the strings of a .json list."""
    if not isinstance(path, str | Path):
        raise DecodingError(f"a prompts file is a path, not {type(path).__name__}")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DecodingError(f"cannot read prompts file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise DecodingError(f"prompts file {path} is not UTF-8 text (byte {e.start} is not): "
                            "save it as UTF-8") from e
    if path.suffix == ".json":
        try:
            prompts = json.loads(text)
        except json.JSONDecodeError as e:
            raise DecodingError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}") from e
        except RecursionError:
            raise DecodingError(f"{path} is nested too deeply: it must hold a JSON list of strings") from None
        except ValueError:  # what is left: a number too long for Python to turn into an int
            raise DecodingError(f"{path} holds a number of more than {sys.get_int_max_str_digits()} digits: "
                                "it must hold a JSON list of strings") from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise DecodingError(f"{path} must hold a JSON list of strings")
        prompts = [p for p in prompts if p.strip()]
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise DecodingError(f"{path} holds no prompts (.txt: one per line; .json: a list of strings)")
    return prompts


def shipped_prompts(name: str) -> list[str]:
    """`assets/prompts/<name>.json` or `.txt`; none if neither exists.

    `<model>` holds an embedded model's examples for the app; `bench_<model>` more prompts of the
    same kind, for benchmarks. None of them occurs in the model's training text.
    """
    for suffix in (".json", ".txt"):
        path = PROMPTS_DIR / f"{name}{suffix}"
        if path.is_file():
            return read_prompts(path)
    return []


def prompt_set(model: str) -> str:
    """The name of an embedded model's prompt files: its own, or the set its heads config names.

    Two models of one corpus share their prompts (`"prompt_set": "stdlib"`), so the same
    examples and bench inputs compare them, and no copy of the files can drift.
    """
    directory = EMBEDDED_MODELS_DIR / model
    if (directory / HEADS_CONFIG).is_file():
        return read_heads_config(directory).get("prompt_set", model)
    return model


def example_prompts(model: str) -> list[str]:
    """The example prompts shipped for embedded model `model`."""
    return shipped_prompts(prompt_set(model))

