"""What the training commands share: the command line that reproduces a run, settings from parsed
flags, and the base model they read. Its own module, so that each command's module imports it and
none imports another command's.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import fields
from typing import TypeVar

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

# Namespace entries the command dispatcher adds that are not flags.
NOT_FLAGS = ("func", "command")
# Flags that are on unless negated (argparse.BooleanOptionalAction): written `--no-X` when off.
NEGATABLE = ("bf16", "sampled", "reads_root")
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


def base_directory(name: str) -> str:
    """A fetched wheel model's cache directory by name, or the name itself (folder or hub id)."""
    from ..fetch import WHEEL_MODELS, fetched_dir

    return str(fetched_dir(name)) if name in WHEEL_MODELS else name


def load_base(name: str, threads: int | None) -> tuple[object, PreTrainedModel]:
    """The base model a training command reads (its tokenizer too), in float32 with packed layers."""
    if threads:
        torch.set_num_threads(threads)
    from ..packed_linear import pack_linear_layers

    source = base_directory(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval().requires_grad_(False)
    # The same packed layers decoding uses on a CPU: the recorded states are the ones it will see.
    pack_linear_layers(model)
    return tokenizer, model
