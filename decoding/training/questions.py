"""Tens of thousands of varied questions for recording a chat model's answers, built offline.

The drafters learn from the model's answers, and the answers are only as varied as the questions.
No instruction data set installs offline, but a few conversation corpora ship inside packages on
the package index, and the template instructions (`instructions.py`) add topics and tasks:

| source | what is taken | licence |
|---|---|---|
| `chitchat-dataset==0.9.0` (BYU PCC lab, 7,168 open-domain chats) | every message that asks a question | MIT |
| `chatterbot-corpus==1.3.3` (English) | the opening line of each conversation | BSD-3-Clause |
| templates (`instructions.py`: WordNet nouns, Python modules) | explain / write / code requests | WordNet's, PSF |
| self-instruct (`self_instruct.py`, optional) | questions the model itself wrote, sampled | the model's |

Every question that matches or nearly matches a shipped prompt (`assets/prompts/`, the bench and
example sets, which must stay unseen) is dropped, and repeats are dropped. The list is built once
(`python -m decoding questions`), saved with each question's source, and committed: a recording
answers a saved list, so it can resume and be repeated on any machine.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

import yaml

from ..errors import DecodingError
from .instructions import build_instructions
from .self_instruct import MAX_CHARS, keep_unseen, shipped_prompts

CHITCHAT = "chitchat-dataset==0.9.0"
CHATTERBOT = "chatterbot-corpus==1.3.3"
MIN_WORDS = 5  # shorter chat questions ("what about you?") lean on a conversation we do not have
QUESTIONS_FILE = Path(__file__).resolve().parents[2] / "assets" / "questions" / "chat.json"


def download_wheel(requirement: str, into: Path) -> Path:
    """`pip download` one wheel (no dependencies) into `into`; a DecodingError says why not."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--retries", "2",
               "--disable-pip-version-check", "-q", "-d", str(into), requirement]
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise DecodingError(f"could not download {requirement} from the package index: "
                            f"{(result.stderr.strip().splitlines() or ['no wheel'])[-1]}")
    return wheels[0]


def chitchat_questions(dataset: dict) -> list[str]:
    """Every message of the chit-chat dataset that asks a question of some length, in order."""
    out = []
    for conversation in dataset.values():
        for turn in conversation["messages"]:
            for message in turn:
                text = " ".join(message["text"].split())
                if text.endswith("?") and len(text.split()) >= MIN_WORDS and len(text) <= MAX_CHARS:
                    out.append(text)
    return out


def chatterbot_openings(documents: Iterable[dict]) -> list[str]:
    """The first line of each chatterbot conversation (what a user says to a bot)."""
    out = []
    for document in documents:
        for conversation in document.get("conversations") or []:
            first = conversation[0] if conversation and isinstance(conversation[0], str) else ""
            if len(first.split()) >= 3 and len(first) <= MAX_CHARS:
                out.append(" ".join(first.split()))
    return out


def read_packages(into: Path) -> dict[str, list[str]]:
    chitchat = download_wheel(CHITCHAT, into / "chitchat")
    with zipfile.ZipFile(chitchat) as archive:
        dataset = json.loads(archive.read("chitchat_dataset/dataset.json"))
    chatterbot = download_wheel(CHATTERBOT, into / "chatterbot")
    with zipfile.ZipFile(chatterbot) as archive:
        names = sorted(n for n in archive.namelist() if "/data/english/" in n and n.endswith(".yml"))
        documents = [yaml.safe_load(archive.read(n)) for n in names]
    return {CHITCHAT: chitchat_questions(dataset), CHATTERBOT: chatterbot_openings(documents)}


def build_questions(templates: int, seed: int = 0, written: list[str] | None = None) -> list[dict[str, str]]:
    """Every package question, `templates` template instructions and the questions the model
    `written` itself (self_instruct.py), unseen, without repeats, shuffled, each with its source."""
    with tempfile.TemporaryDirectory() as tmp:
        by_source = read_packages(Path(tmp))
    by_source["templates"] = build_instructions(templates, seed)
    if written:
        by_source["self-instruct"] = written
    tagged = [(text, source) for source, texts in by_source.items() for text in texts]
    kept = set(keep_unseen([text for text, _ in tagged], shipped_prompts()))
    seen: set[str] = set()
    out = []
    for text, source in tagged:
        if text in kept and text not in seen:
            seen.add(text)
            out.append({"text": text, "source": source})
    random.Random(seed).shuffle(out)  # sources mixed, so any prefix of the list is a fair sample
    return out


def read_questions(path: Path = QUESTIONS_FILE) -> list[str]:
    if not path.is_file():
        raise DecodingError(f"{path}: no such questions file (write one with `python -m decoding questions`)")
    return [q["text"] for q in json.loads(path.read_text(encoding="utf-8"))["questions"]]
