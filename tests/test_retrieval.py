"""The retrieval drafter: its suffix index finds what a brute-force search finds, its tree is the
most frequent continuations scored as the docstring says, what it learns of the base model moves
its cut, it is lossless on the verifier, and its rounds say where each guess was found."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.tree_figures import tree_figure
from app.views import drafting_text
from decoding import DecodeSettings, RunTrace, generate
from decoding.drafters import retrieval
from decoding.drafters.retrieval import Node, Trust, grow, recorded_answers
from decoding.suffix_index import MAX_MATCH, SuffixIndex, TextSoFar
from test_drafters import NEW_TOKENS, prompts, reference_greedy

NO_STOPS: frozenset[int] = frozenset()


def brute_force_match(texts: list[list[int]], context: list[int]) -> tuple[int, list[int]]:
    """The longest suffix of `context` (MAX_MATCH at most) inside one of `texts`, and the
    position after each occurrence, counted in the texts laid end to end with one gap between."""
    joined = [token for text in texts for token in (*text, None)]
    best, after = 0, []
    for length in range(1, min(MAX_MATCH, len(context)) + 1):
        found = [i + length for i in range(len(joined) - length + 1) if joined[i:i + length] == context[-length:]]
        if not found:
            break
        best, after = length, found
    return best, sorted(after)


@pytest.mark.parametrize("seed", range(200))
def test_the_suffix_index_finds_the_longest_match_and_every_occurrence(seed):
    rng = random.Random(seed)
    answers = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(rng.randrange(1, 6))]
    context = [rng.randrange(5) for _ in range(rng.randrange(1, 30))]
    length, after = SuffixIndex(answers).longest_match(context)
    # Positions count in the index's own tokens, which start with MAX_MATCH separators.
    assert (length, sorted((after - MAX_MATCH).tolist())) == brute_force_match(answers, context)


@pytest.mark.parametrize("seed", range(200))
def test_the_text_so_far_finds_its_own_end_earlier_on(seed):
    rng = random.Random(seed)
    context = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
    length, after = TextSoFar(context).longest_match(context)
    # Earlier occurrences only: the text's own end has nothing after it to copy.
    assert (length, sorted((after - MAX_MATCH).tolist())) == brute_force_match([context[:-1]], context)


def test_a_match_never_runs_from_one_answer_into_the_next():
    index = SuffixIndex([[1, 2], [3, 4]])
    assert index.longest_match([2, 3])[0] == 1  # "2 3" only spans the gap between the answers
    assert index.tokens[index.longest_match([2])[1]].tolist() == [-1]  # after "2": the gap, no guess


def test_the_tree_is_the_most_frequent_continuations_scored_by_laplaces_rule():
    # After "1": "2 3" three times, "2 4" once, "5" once; "3" never goes on past "2 3".
    index = SuffixIndex([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 5]])
    length, after = index.longest_match([9, 1])
    nodes = list(grow([(index, after)], depth=4, budget=10, stop_ids=NO_STOPS))
    by_tokens = {node.tokens: node for node in nodes}
    assert set(by_tokens) == {(2,), (5,), (2, 3), (2, 4)}
    assert by_tokens[(2,)].path == (0,) and by_tokens[(5,)].path == (1,)  # ranked by how often
    assert by_tokens[(2, 3)].path == (0, 0) and by_tokens[(2, 4)].path == (0, 1)
    assert by_tokens[(2,)].score == pytest.approx(4 / 6)  # 4 of the 5 times, one more in the count
    assert by_tokens[(2, 3)].score == pytest.approx(4 / 6 * 3 / 5)
    scores = [node.score for node in nodes]
    assert scores == sorted(scores, reverse=True)
    # Every prefix is a tree: a node's parent comes before it.
    seen = {()}
    for node in nodes:
        assert node.path[:-1] in seen
        seen.add(node.path)


@pytest.mark.parametrize("size", [40, 3000])  # counted in Python, and by numpy's sort past SMALL_COUNT
def test_the_continuations_are_the_most_frequent_next_tokens_with_every_place_they_followed(size):
    rng = random.Random(size)
    answers = [[rng.choice([1, 1, 1, 2, 3, 4, 5, 6, 7, 8]) for _ in range(12)] for _ in range(size // 12)]
    index = SuffixIndex(answers)
    text = TextSoFar([rng.choice([1, 2, 3, 9]) for _ in range(size // 4)] + [1])
    found = [(source, source.longest_match([1])[1]) for source in (index, text)]
    stops = frozenset([3])
    # By brute force: every occurrence of "1", the token after it, counted over both sources.
    after: dict[int, dict[str, set[int]]] = {}
    for source, positions in found:
        for position in positions.tolist():
            token = int(source.tokens[position])
            after.setdefault(token, {}).setdefault(source.where, set()).add(position + 1)
    expected = sorted(((token, places) for token, places in after.items() if token >= 0 and token not in stops),
                      key=lambda item: (-sum(map(len, item[1].values())), item[0]))
    for limit in (2, 100):
        got = retrieval.continuations(found, stops, limit)
        assert [token for token, _ in got] == [token for token, _ in expected[:limit]]
        for (_, where), (_, places) in zip(got, expected, strict=False):
            assert {source.where: set(positions.tolist()) for source, positions in where} == places
    tied = SuffixIndex([[1, 5], [1, 4]] * (size // 4))  # as often each: the lower token id first
    assert [token for token, _ in retrieval.continuations([(tied, tied.longest_match([1])[1])], NO_STOPS, 2)] == [4, 5]


def test_a_stop_token_ends_a_continuation():
    index = SuffixIndex([[1, 2, 7, 3]])
    nodes = list(grow([(index, index.longest_match([1])[1])], depth=4, budget=10, stop_ids=frozenset([7])))
    assert [node.tokens for node in nodes] == [(2,)]


def test_the_budget_keeps_the_best_nodes():
    index = SuffixIndex([[1, 2, 3, 4, 5]] * 3 + [[1, 6]] * 2 + [[1, 8]])
    after = index.longest_match([1])[1]
    everything = list(grow([(index, after)], depth=8, budget=100, stop_ids=NO_STOPS))
    kept = list(grow([(index, after)], depth=8, budget=3, stop_ids=NO_STOPS))
    assert [node.tokens for node in kept] == [node.tokens for node in everything[:3]]
    assert max(len(node.path) for node in grow([(index, after)], depth=2, budget=100, stop_ids=NO_STOPS)) == 2


def test_trust_learns_how_far_the_base_model_bears_the_scores_out():
    index, text = SuffixIndex([[1, 2]]), TextSoFar([1, 2, 1])
    recalled = Node((2,), (0,), [(index, np.array([1]))], score=0.5)
    copied = Node((2,), (0,), [(text, np.array([1]))], score=0.5)
    trust = Trust()
    assert trust.expected(recalled) == 0.5  # a run starts by taking the scores at their word
    for _ in range(20):
        trust.learn([recalled], accepted=(9,))  # never accepted
        trust.learn([copied], accepted=(2,))  # always
    assert trust.expected(recalled) < 0.05
    assert 0.9 < trust.expected(copied) < 1  # the scores undersold these: about twice as likely as scored
    assert trust.expected(dataclasses.replace(copied, score=0.9)) == 1.0  # never more than a certainty


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, arch=st.sampled_from(["llama", "qwen2", "gpt2"]), depth=st.integers(1, 12),
       nodes=st.one_of(st.none(), st.integers(1, 63)), right=st.booleans())
def test_retrieval_greedy_equals_generate(tiny_models, monkeypatch, prompt, arch, depth, nodes, right):
    """Whatever the past answers say (the model's own continuation, or another text), greedy
    output is plain decoding's."""
    lm = tiny_models[arch]
    expected = reference_greedy(lm, prompt, NEW_TOKENS)
    prompt_ids = lm.tokenizer(prompt).input_ids
    past = [prompt_ids + expected] * 3 if right else [[(t * 7 + 3) % len(lm.tokenizer) for t in prompt_ids + expected]]
    monkeypatch.setattr(retrieval, "recorded_index", lambda name: SuffixIndex(past))
    trace = generate(lm, prompt, DecodeSettings(method="retrieval", retrieval_depth=depth, retrieval_nodes=nodes,
                                                max_new_tokens=NEW_TOKENS))
    assert trace.tokens == expected
    if right and nodes:
        assert trace.mean_accepted > 1.5, "the model's own past answer is guessed right"


def test_a_traced_round_says_where_each_guess_was_found_and_the_hover_shows_it(tiny_llama, monkeypatch):
    prompt = "abc abc abc abc"
    monkeypatch.setattr(retrieval, "recorded_index", lambda name: None)
    trace = generate(tiny_llama, prompt, DecodeSettings(method="retrieval", max_new_tokens=20, retrieval_nodes=8))
    guessed = [r for r in trace.rounds if r.tree_size > 1]
    assert guessed, "a repeating prompt gives retrieval something to find in the text so far"
    rnd = guessed[0]
    assert len(rnd.node_origins) == rnd.tree_size and rnd.node_origins[0] == "base model"
    assert all("earlier in this text" in origin and "followed" in origin for origin in rnd.node_origins[1:])
    assert rnd.node_sources == ["base"] + ["retrieval"] * (rnd.tree_size - 1)
    assert RunTrace.from_json(trace.to_json()) == trace
    hovers = [text for figure_trace in tree_figure(trace.round_tree(rnd), rnd).data
              if figure_trace.hovertext for text in figure_trace.hovertext]
    assert any("earlier in this text" in text for text in hovers)
    assert "earlier in this text" in drafting_text(trace, rnd)  # the round's details say what it did
    assert "the text so far" in trace.drafter.description and "no recorded answers" in trace.drafter.description


def test_a_match_found_more_often_than_it_reads_is_read_from_an_even_sample(tiny_llama, monkeypatch):
    prompt_ids, answer = tiny_llama.tokenizer("abc abc").input_ids, reference_greedy(tiny_llama, "abc abc", 8)
    index = SuffixIndex([prompt_ids + answer] * 200)  # the text, 200 times over
    monkeypatch.setattr(retrieval, "recorded_index", lambda name: index)
    monkeypatch.setattr(retrieval, "MAX_OCCURRENCES", 16)
    settings = DecodeSettings(method="retrieval", max_new_tokens=8, retrieval_nodes=4)
    drafter = retrieval.RetrievalDrafter.create(tiny_llama, settings)
    context = prompt_ids + answer[:1]
    length, found, occurrences = drafter.match(context)
    _, everywhere = index.longest_match(context)
    ((source, read),) = [(source, positions) for source, positions in found if source is index]
    assert occurrences >= len(everywhere) > 16 and sum(len(positions) for _, positions in found) <= 16
    assert set(read.tolist()) <= set(everywhere.tolist())
    assert (read[0], read[-1]) == (everywhere[0], everywhere[-1]) and len(set(read.tolist())) == len(read)  # end to end
    trace = generate(tiny_llama, "abc abc", settings)
    said = [re.search(r"times: ([\d,]+), ([\d,]+) of them read", rnd.drafting_note) for rnd in trace.rounds]
    sampled = [(rnd, int(m[1].replace(",", "")), int(m[2])) for rnd, m in zip(trace.rounds, said, strict=True) if m]
    assert sampled, "a round whose match occurs 200 times says how many of them it read"
    for rnd, times, read_count in sampled:
        assert times > 16 >= read_count
        assert all(f"of the {read_count} places read" in origin for origin in rnd.node_origins[1:])


def test_without_a_fixed_size_the_cut_follows_the_cost_curve(tiny_llama, monkeypatch):
    """Guesses the base model never takes stop being verified once the run has learnt so."""
    prompt_ids = tiny_llama.tokenizer("abc abc abc").input_ids
    wrong = [[(t * 7 + 3) % len(tiny_llama.tokenizer) for t in prompt_ids * 10]]
    monkeypatch.setattr(retrieval, "recorded_index", lambda name: SuffixIndex(wrong))
    trace = generate(tiny_llama, "xyz", DecodeSettings(method="retrieval", max_new_tokens=40))
    sizes = [r.tree_size for r in trace.rounds]
    assert max(sizes) <= retrieval.MAX_NODES + 1
    assert sum(sizes[-5:]) <= sum(sizes[:5])


def test_recorded_answers_are_read_by_model_and_led_by_the_cue_to_answer(tmp_path):
    for name, model in (("a", "m1"), ("b", "m2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "recording.json").write_text(json.dumps({"model": model}))
        (tmp_path / name / "shard-00000.json").write_text(json.dumps(
            {"prompts": [[1, 2, 3, 4, 5, 6]], "answers": [[7, 8] if model == "m1" else [9]]}))
    assert recorded_answers("m1", tmp_path) == [[3, 4, 5, 6, 7, 8]]
    assert recorded_answers("nobody", tmp_path) == []
