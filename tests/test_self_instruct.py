"""Questions the chat model writes itself (self-instruct), and the saved question list of `self-distill`.

The shipped prompts (assets/prompts/: the bench and example sets) must stay unseen by training,
so no question that matches or nearly matches one of them may be kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from decoding.errors import DecodingError
from decoding.training import recorded_run
from decoding.training import self_instruct as si

NOUNS = {"animal": ["otter", "heron"], "food": ["bread", "soup"], "artifact": ["kettle"]}


def test_requests_are_seeded_and_name_a_topic_and_a_style():
    first, again, other = si.requests(40, 3, NOUNS), si.requests(40, 3, NOUNS), si.requests(40, 4, NOUNS)
    assert first == again and first != other
    assert all(r.startswith(f"Write a numbered list of {si.PER_REQUEST} different ") for r in first)
    topics = NOUNS["animal"] + NOUNS["food"] + NOUNS["artifact"] + si.CODE_TOPICS
    assert all(any(t in r for t in topics) for r in first)


def test_list_items_that_are_questions_or_requests_are_kept():
    reply = ("Sure, here are five questions:\n\n1. How do otters keep warm in cold water?\n"
             "2) Why do herons stand on one leg?\n[3] What is a kettle?\n- Write a short poem about soup.\n"
             "* Bread\n4. Provide a list of [1] things:\n5. `print(x)` does what?\n"
             "Note: Why would anyone ask this?\n6. 3. Why do kettles whistle?\n7. 5.1.4: What is a heron?")
    assert si.list_questions(reply) == ["How do otters keep warm in cold water?", "Why do herons stand on one leg?",
                                        "What is a kettle?", "Write a short poem about soup.",
                                        "Why do kettles whistle?", "What is a heron?"]


def test_shipped_prompts_are_read_from_text_and_json_files():
    shipped = si.shipped_prompts()
    for name in ("bench_chat_smollm2.txt", "bench_smollm2.txt", "smollm2.txt"):
        lines = (si.PROMPTS_DIR / name).read_text(encoding="utf-8").splitlines()
        assert {line for line in lines if line.strip()} <= set(shipped)
    stdlib = json.loads((si.PROMPTS_DIR / "bench_stdlib.json").read_text(encoding="utf-8"))
    assert stdlib[0] in shipped


def test_repeats_and_near_copies_of_shipped_prompts_are_dropped():
    protected = ["Why is the sky blue?", "What is the best way to learn a new language?"]
    questions = ["How do herons fish?", "how do herons fish", "Why is the sky so blue?", "WHY IS THE SKY BLUE",
                 "What's the best way to learn a new language?", "Why is the sea salty?"]
    assert si.keep_unseen(questions, protected) == ["How do herons fish?", "Why is the sea salty?"]


def test_no_shipped_bench_question_survives_the_filter():
    bench = (si.PROMPTS_DIR / "bench_chat_smollm2.txt").read_text(encoding="utf-8").splitlines()
    assert si.keep_unseen(bench + [q.rstrip("?") + " ?" for q in bench], si.shipped_prompts()) == []


def test_questions_come_in_rounds_until_enough_are_found(monkeypatch):
    """Each round asks for what is still missing; repeats across rounds count once."""
    asked: list[int] = []

    def replies(model, tokenizer, texts, batch_size, seed):
        asked.append(len(texts))
        return [f"1. How does item {seed}-{i} work?\n2. How does item 0-0 work?" for i in range(len(texts))]

    monkeypatch.setattr(si, "sample_replies", replies)
    questions = si.self_instruct_questions(None, None, 9, seed=0, protected=[], nouns=NOUNS)
    assert len(questions) == 9 == len(set(questions))
    # 2 * 9 / 5 requests, rounded up, give 4 new questions (one item repeats); then 2 for the 5
    # missing, 2 for 3, 1 for 1.
    assert asked == [4, 2, 2, 1]
    assert questions[:5] == ["How does item 0-0 work?", "How does item 0-1 work?", "How does item 0-2 work?",
                             "How does item 0-3 work?", "How does item 1-0 work?"]


def test_a_round_that_finds_nothing_new_ends_the_search(monkeypatch):
    monkeypatch.setattr(si, "sample_replies", lambda *a: ["1. Why is the sea salty?"] * len(a[2]))
    assert si.self_instruct_questions(None, None, 50, protected=[], nouns=NOUNS) == ["Why is the sea salty?"]


def _distill_args(out: Path, source: str = "templates", count: int = 5, seed: int = 0) -> argparse.Namespace:
    return argparse.Namespace(out=out, instructions_source=source, instructions=count, seed=seed)


def test_self_distill_saves_its_questions_and_a_resumed_run_answers_the_same(monkeypatch, tmp_path):
    made: list[int] = []

    def build(count, seed):
        made.append(seed)
        return [f"Question {seed}-{i}?" for i in range(count)]

    monkeypatch.setattr(recorded_run, "build_instructions", build)
    first = recorded_run._instructions(_distill_args(tmp_path), None, None)
    again = recorded_run._instructions(_distill_args(tmp_path), None, None)
    assert first == again == [f"Question 0-{i}?" for i in range(5)] and made == [0]
    saved = json.loads((tmp_path / recorded_run.INSTRUCTIONS_FILE).read_text())
    assert saved == {"source": "templates", "count": 5, "seed": 0, "instructions": first}
    with pytest.raises(DecodingError, match="other questions"):
        recorded_run._instructions(_distill_args(tmp_path, seed=1), None, None)
    with pytest.raises(DecodingError, match="other questions"):
        recorded_run._instructions(_distill_args(tmp_path, source="self-instruct"), None, None)


def test_self_distill_asks_the_model_for_self_instruct_questions(monkeypatch, tmp_path):
    monkeypatch.setattr(recorded_run, "self_instruct_questions",
                        lambda model, tokenizer, count, seed: [f"Why {seed}-{i}?" for i in range(count)])
    assert recorded_run._instructions(_distill_args(tmp_path, "self-instruct", 3, 7), "m", "t") == [
        "Why 7-0?", "Why 7-1?", "Why 7-2?"]
