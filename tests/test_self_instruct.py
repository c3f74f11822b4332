"""Questions for a recording: those the chat model writes itself (self-instruct), those of the
package corpora and templates, and the saved list `record` answers.

The shipped prompts (assets/prompts/: the bench and example sets) must stay unseen by training,
so no question that matches or nearly matches one of them may be kept.
"""

from __future__ import annotations

import json

from decoding.training import questions
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


def _chat(*texts: str) -> dict:
    return {"c": {"messages": [[{"text": t} for t in texts]]}}


def test_package_questions_keep_whole_questions_of_some_length():
    dataset = _chat("Hello", "How are you?", "What did you study at university last year?", "I like  it there. "
                    "Do   you enjoy living in a big city?")
    assert questions.chitchat_questions(dataset) == [
        "What did you study at university last year?", "I like it there. Do you enjoy living in a big city?"]
    documents = [{"conversations": [["What is your favourite book?", "Dune."], ["Hi", "Hello"], [7, "x"]]}, {}]
    assert questions.chatterbot_openings(documents) == ["What is your favourite book?"]


def test_the_question_list_mixes_its_sources_drops_shipped_prompts_and_repeats(monkeypatch):
    shipped = questions.shipped_prompts()[0]
    monkeypatch.setattr(questions, "read_packages", lambda into: {
        "chitchat": ["Where do you usually go hiking on weekends?", shipped],
        "chatterbot": ["Where do you usually go hiking on weekends?", "Tell me about your favourite food."]})
    monkeypatch.setattr(questions, "build_instructions",
                        lambda count, seed: [f"Explain topic {i}." for i in range(count)])
    built = questions.build_questions(3, seed=1, written=["Why is the sea salty at all?"])
    assert sorted((q["source"], q["text"]) for q in built) == [
        ("chatterbot", "Tell me about your favourite food."),
        ("chitchat", "Where do you usually go hiking on weekends?"),
        ("self-instruct", "Why is the sea salty at all?"), ("templates", "Explain topic 0."),
        ("templates", "Explain topic 1."), ("templates", "Explain topic 2.")]
    assert built == questions.build_questions(3, seed=1, written=["Why is the sea salty at all?"])  # seeded


def test_the_shipped_question_list_is_large_varied_and_unseen():
    saved = json.loads(questions.QUESTIONS_FILE.read_text())
    texts = [q["text"] for q in saved["questions"]]
    assert len(texts) >= 20_000 and len(set(texts)) == len(texts)
    assert {q["source"] for q in saved["questions"]} >= {"templates", questions.CHITCHAT, questions.CHATTERBOT}
    protected = {si.normalized(p) for p in si.shipped_prompts()}
    assert not protected & {si.normalized(t) for t in texts}
