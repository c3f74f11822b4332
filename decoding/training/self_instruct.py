"""Questions like the ones people type, written by the chat model itself (self-instruct).

The template questions of `instructions.py` ("Explain what X is.", filled from WordNet) are all
alike, and heads trained on the answers to them guess worse on the questions visitors type (0.3
tokens per pass fewer, measured on SmolLM2). So the model is asked to write the questions: "Write
a numbered list of 5 different questions a curious person might ask about <topic>", for WordNet
topics and a few styles (how-to, why, advice, explain, short writing tasks, simple code), sampled
so that they vary. The list items that are questions or requests are kept, deduplicated, and
every one that matches or nearly matches a shipped prompt (`assets/prompts/`: the bench and
example sets, which must stay unseen) is dropped.

Seeded: the same call on the same machine gives the same list; `self-distill` saves the list it
answers beside its shards, so a resumed run answers the same questions whatever the sampling did.
"""

from __future__ import annotations

import difflib
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..loops import chat_prompt_ids
from ..model import padding_id, stop_token_ids
from .batches import cut_at_stop, pad_batch
from .instructions import read_wordnet_nouns

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "assets" / "prompts"
# A numbered list, not one question: a 135M model asked for "one question" mostly answers it, or
# comments on it; asked for a list, it writes questions (tried on SmolLM2: most list items are
# usable questions, most single replies were not), and a list of five costs one prompt.
PER_REQUEST = 5
REQUEST = "Write a numbered list of " + str(PER_REQUEST) + " different {style}."
STYLES = [
    "questions a curious person might ask about {x}", "questions a child might ask about {x}",
    "'how do I' questions about {x}", "'why' questions about {x}", "requests for advice about {x}",
    "questions asking to explain something about {x}", "questions a student might ask about {x}",
    "questions people type into a chatbot about {x}",
    "short writing tasks (a poem, a story, an email) about {x}",
]
CODE_STYLES = ["simple Python coding requests about {x}", "beginner questions about {x} in Python"]
CODE_TOPICS = ["lists", "strings", "files", "numbers", "dates", "dictionaries", "loops", "sorting",
               "text", "recursion", "classes", "errors", "functions", "sets", "JSON", "web pages"]
CODE_SHARE = 0.12  # about the share of Python questions among the template instructions
# A list item counts as a request when it is a question or starts like an instruction.
IMPERATIVES = {"write", "explain", "describe", "give", "tell", "create", "compose", "suggest", "list",
               "help", "show", "compare", "summarize", "recommend", "plan", "draft", "make", "share"}
NEAR_MATCH = 0.8  # difflib ratio above which a question counts as a copy of a shipped prompt
MIN_WORDS, MAX_CHARS = 4, 200
SAMPLING = {"temperature": 0.7, "top_p": 0.95}  # at 0.9, SmolLM2 rambles more than it asks
MAX_REPLY_TOKENS = 110  # five short questions; a longer reply has stopped listing them
NUMBERING = re.compile(r"^(?:\d+(?:\.\d+)*[.:)]\s*)+")
LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|\[\d+\]|[-*•])\s+(.*\S)\s*$")


def requests(count: int, seed: int, nouns: dict[str, list[str]]) -> list[str]:
    """`count` seeded requests for a list of questions, each naming a topic and a style."""
    rng = random.Random(seed)
    every_noun = sorted({n for words in nouns.values() for n in words})
    out = []
    for _ in range(count):
        if rng.random() < CODE_SHARE:
            style = rng.choice(CODE_STYLES).format(x=rng.choice(CODE_TOPICS))
        else:
            style = rng.choice(STYLES).format(x=rng.choice(every_noun))
        out.append(REQUEST.format(style=style))
    return out


def list_questions(reply: str) -> list[str]:
    """The usable questions and requests among a reply's list items."""
    out = []
    for line in reply.splitlines():
        match = LIST_ITEM.match(line)
        # A sub-list's own number may follow the marker ("1. 3. Why ...", "1. 5.1.4: What ...").
        item = NUMBERING.sub("", match.group(1)).strip().strip('"“”*').strip() if match else ""
        words = item.split()
        if len(words) < MIN_WORDS or len(item) > MAX_CHARS or any(c in item for c in "[]<>`|"):
            continue
        if item.endswith("?") or (words[0].lower() in IMPERATIVES and item.endswith(".")):
            out.append(item)
    return out


def normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def shipped_prompts(prompts_dir: Path = PROMPTS_DIR) -> list[str]:
    """Every prompt in the shipped prompt files: text files a line each, JSON files every string."""
    out: list[str] = []
    for path in sorted(prompts_dir.iterdir()):
        if path.suffix == ".txt":
            out += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        elif path.suffix == ".json":
            out += list(_strings(json.loads(path.read_text(encoding="utf-8"))))
    return out


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def keep_unseen(questions: Iterable[str], protected: Sequence[str]) -> list[str]:
    """The questions in order, without repeats and without any that (nearly) match a protected one."""
    protected_norm = [normalized(p) for p in protected]
    seen: set[str] = set()
    out = []
    for question in questions:
        key = normalized(question)
        if not key or key in seen or _near_any(key, protected_norm):
            continue
        seen.add(key)
        out.append(question)
    return out


def _near_any(key: str, protected: Sequence[str]) -> bool:
    for other in protected:
        if key in other or other in key:
            return True
        matcher = difflib.SequenceMatcher(None, key, other)
        if matcher.real_quick_ratio() >= NEAR_MATCH and matcher.ratio() >= NEAR_MATCH:
            return True
    return False


@torch.inference_mode()
def sample_replies(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                   batch_size: int, seed: int) -> list[str]:
    """The model's sampled reply to each text, through its chat template, a batch at a time."""
    torch.manual_seed(seed)
    stop_ids = stop_token_ids(model.generation_config)
    pad_id = padding_id(tokenizer, stop_ids)
    config = GenerationConfig(max_new_tokens=MAX_REPLY_TOKENS, do_sample=True, top_k=0, **SAMPLING,
                              eos_token_id=sorted(stop_ids) or None, pad_token_id=pad_id)
    replies = []
    for start in tqdm(range(0, len(texts), batch_size), desc="self-instruct", unit="batch"):
        ids, mask = pad_batch([chat_prompt_ids(tokenizer, t) for t in texts[start : start + batch_size]],
                              pad_id, side="left")
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        replies += [tokenizer.decode(cut_at_stop(row, stop_ids), skip_special_tokens=True)
                    for row in out[:, ids.shape[1]:].tolist()]
    return replies


def self_instruct_questions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, count: int, seed: int = 0,
                            batch_size: int = 32, protected: Sequence[str] | None = None,
                            nouns: dict[str, list[str]] | None = None) -> list[str]:
    """`count` distinct, unseen questions the model wrote, fewer only if it stops finding new ones."""
    nouns = read_wordnet_nouns() if nouns is None else nouns
    protected = shipped_prompts() if protected is None else protected
    questions: list[str] = []
    # Rounds of requests, each sized for what is still missing (about half the items are kept:
    # some are no question, some repeat), until enough are found or a round finds nothing new.
    for round_seed in range(seed * 1000, seed * 1000 + 20):
        missing = count - len(questions)
        if missing <= 0:
            break
        texts = requests(math.ceil(2 * missing / PER_REQUEST), round_seed, nouns)
        replies = sample_replies(model, tokenizer, texts, batch_size, round_seed)
        found = keep_unseen(questions + [q for r in replies for q in list_questions(r)], protected)
        if len(found) == len(questions):
            break
        questions = found
    return questions[:count]
