"""What the training commands share: the command line that reproduces a run, and settings from
parsed flags. Its own module, so that each command's module imports it and none imports cli.py.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import fields
from typing import TypeVar

# Namespace entries the command dispatcher adds that are not flags.
NOT_FLAGS = ("func", "command")
# Flags that are on unless negated (argparse.BooleanOptionalAction): written `--no-X` when off.
NEGATABLE = ("bf16", "sampled", "reads_root", "fused")
S = TypeVar("S")


def command_line(command: str, args: argparse.Namespace) -> str:
    """The reproducible command for these arguments, every flag spelled out."""
    parts = ["python", "-m", "decoding", command]
    for key, value in vars(args).items():
        if key in NOT_FLAGS or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                parts.append(flag)
            elif key in NEGATABLE:
                parts.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            if value:
                parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def settings_from(cls: type[S], args: argparse.Namespace) -> S:
    """Settings of type `cls` from the parsed flags that share its field names."""
    given = vars(args)
    return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})
