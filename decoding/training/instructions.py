"""Thousands of varied chat instructions, built offline, for self-distilling a chat model.

Medusa heads learn to guess what *this* model writes next, so they are trained on the model's own
answers (self-distillation). The answers are only as varied as the questions, and no instruction
data set installs offline, so the questions are built here: templates ("Explain ...", "Write a
short poem about ...", "Write a Python function that ...") filled with common English nouns from
WordNet (Debian's `wordnet-base`; the most frequently tagged senses, grouped by WordNet's
lexicographer files so that animals get animal questions) and with Python standard-library
module names. Seeded, so the same call gives the same list.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict
from pathlib import Path

from ..errors import DecodingError

WORDNET_DIR = Path("/usr/share/wordnet")
# WordNet noun lexicographer files (ss_type 1): the number after "%1:" in a sense key.
NOUN_GROUPS = {"act": 4, "animal": 5, "artifact": 6, "attribute": 7, "body": 8, "cognition": 9,
               "communication": 10, "event": 11, "feeling": 12, "food": 13, "group": 14,
               "location": 15, "object": 17, "person": 18, "phenomenon": 19, "plant": 20,
               "process": 22, "substance": 27, "time": 28}
MIN_TAG_COUNT = 4  # senses tagged fewer times than this in WordNet's corpus are too obscure

ANY_NOUN = [
    "Explain what {x} is.", "What is {x}?", "Tell me about {x}.", "Write a short poem about {x}.",
    "Write a haiku about {x}.", "Give me three interesting facts about {x}.",
    "Describe {x} to a ten-year-old.", "Write a short story about {x}.",
    "Write a paragraph about {x}.", "Why is {x} important?", "What is the history of {x}?",
    "Write a limerick about {x}.", "Summarize what people should know about {x}.",
]
BY_GROUP = {
    "animal": ["What does a {x} eat?", "Where does the {x} live?", "How does a {x} raise its young?",
               "Describe the behavior of the {x}."],
    "artifact": ["What is a {x} used for?", "How does a {x} work?", "Who invented the {x}?",
                 "How do you take care of a {x}?"],
    "food": ["How do you make {x}?", "Is {x} healthy?", "Suggest a recipe that uses {x}.",
             "Where does {x} come from?"],
    "plant": ["How do you grow {x}?", "Where does the {x} grow?", "What are the uses of {x}?"],
    "person": ["What does a {x} do?", "How do you become a {x}?", "Describe a day in the life of a {x}."],
    "act": ["How can I get better at {x}?", "Give me tips for {x}.", "What are the benefits of {x}?"],
    "location": ["Describe {x}.", "What would you see in {x}?", "Plan a day trip to {x}."],
    "feeling": ["How can someone cope with {x}?", "Write a poem about {x}.", "What causes {x}?"],
    "phenomenon": ["What causes {x}?", "Explain {x} in simple terms.", "How do scientists study {x}?"],
    "substance": ["What is {x} made of?", "What is {x} used for?", "Is {x} dangerous?"],
    "cognition": ["Explain the idea of {x}.", "How do you teach {x}?", "Why do people study {x}?"],
}
PAIRS = ["What is the difference between {x} and {y}?", "Compare {x} and {y}.",
         "Write a short story that involves {x} and {y}."]
PYTHON_MODULE = ["What does the Python {m} module do?", "Show an example of using Python's {m} module.",
                 "When should I use the {m} module in Python?"]
PYTHON_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a text",
    "returns the largest item in a list", "merges two sorted lists", "computes a factorial",
    "removes duplicates from a list", "checks whether a string is a palindrome",
    "returns the Fibonacci numbers below n", "converts Celsius to Fahrenheit",
    "reads a CSV file and returns its rows", "finds the most common letter in a string",
    "sorts a list of dictionaries by a key", "flattens a nested list", "computes the average of a list",
    "counts the vowels in a word", "capitalizes every word in a sentence", "checks if two words are anagrams",
    "returns the greatest common divisor of two numbers", "generates a random password",
    "converts a number to binary", "finds the second smallest number in a list",
    "splits a list into chunks of size n", "checks whether a year is a leap year",
    "returns the n-th triangular number", "counts the lines in a file", "transposes a matrix",
    "implements binary search", "validates an email address", "returns the union of two sets",
]
PYTHON_TASK = ["Write a Python function that {t}.", "How do I write a Python function that {t}?"]


def read_wordnet_nouns(wordnet_dir: Path = WORDNET_DIR) -> dict[str, list[str]]:
    """Common nouns by group: lemmas of frequently tagged senses, from WordNet's `cntlist.rev`."""
    path = wordnet_dir / "cntlist.rev"
    if not path.is_file():
        raise DecodingError(f"WordNet is missing ({path}): install Debian's wordnet-base")
    number_to_group = {n: g for g, n in NOUN_GROUPS.items()}
    nouns: dict[str, set[str]] = defaultdict(set)
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, count = line.split()
        lemma, _, sense = key.partition("%")
        parts = sense.split(":")
        if parts[0] != "1" or int(count) < MIN_TAG_COUNT or not lemma.isalpha():
            continue
        group = number_to_group.get(int(parts[1]))
        if group:
            nouns[group].add(lemma.replace("_", " "))
    return {group: sorted(words) for group, words in nouns.items()}


def python_modules() -> list[str]:
    """Public standard-library modules, for questions about Python."""
    return sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m.isidentifier())


def build_instructions(count: int, seed: int = 0, wordnet_dir: Path = WORDNET_DIR) -> list[str]:
    """`count` distinct instructions, a seeded mix of the template families above."""
    rng = random.Random(seed)
    nouns = read_wordnet_nouns(wordnet_dir)
    every_noun = sorted({n for words in nouns.values() for n in words})
    modules = python_modules()
    makers = [
        (0.40, lambda: rng.choice(ANY_NOUN).format(x=rng.choice(every_noun))),
        (0.25, lambda: _group_question(rng, nouns)),
        (0.08, lambda: rng.choice(PAIRS).format(x=rng.choice(every_noun), y=rng.choice(every_noun))),
        (0.12, lambda: rng.choice(PYTHON_MODULE).format(m=rng.choice(modules))),
        (0.15, lambda: rng.choice(PYTHON_TASK).format(t=rng.choice(PYTHON_TASKS))),
    ]
    weights = [w for w, _ in makers]
    seen: set[str] = set()
    out: list[str] = []
    for _ in range(count * 20):
        if len(out) == count:
            break
        text = rng.choices(makers, weights)[0][1]()
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def _group_question(rng: random.Random, nouns: dict[str, list[str]]) -> str:
    group = rng.choice(sorted(g for g in BY_GROUP if nouns.get(g)))
    return rng.choice(BY_GROUP[group]).format(x=rng.choice(nouns[group]))
