"""The app's API endpoint `/trace`, called through gradio_client against a launched app, and the
checks the page applies to what a visitor types (bad input becomes a message, never a crash)."""

from __future__ import annotations

import json

import pytest
from gradio_client import Client

from app.models import describe
from app.screenshots import free_port
from app.ui import (DEFAULT_PROMPTS, build_demo, cache, decode_settings, example_rows, format_choices,
                    launch_options, switch_model)
from decoding import DecodingError, RunTrace
from decoding.prompts import example_prompts
from decoding.tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
        demo = build_demo()
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(),
                    quiet=True, **launch_options())
        try:
            yield Client(demo.local_url, verbose=False)
        finally:
            demo.close()


def test_trace_endpoint_is_named_and_returns_a_whole_run(client):
    assert "/trace" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    data = client.predict("It is a truth universally", 12, api_name="/trace")
    trace = RunTrace.from_dict(data)
    assert len(trace.tokens) == 12 and trace.stop_reason == "max_new_tokens"
    assert trace.forward_passes == 1 + len(trace.rounds)
    assert trace.tree is not None and trace.tree.size == len(trace.rounds[0].node_tokens)
    assert all(r.accepted_nodes[0] == 0 for r in trace.rounds)
    assert data["text"] == trace.text


def test_trace_endpoint_takes_a_custom_tree_and_fewer_heads(client):
    data = client.predict("It is a truth", 6, "greedy", "[[0], [0, 0], [1]]", 2, api_name="/trace")
    assert data["tree"]["choices"] == [[0], [1], [0, 0]]
    assert data["settings"]["num_heads"] == 2


@pytest.mark.parametrize("args, message", [
    (("", 8), "prompt is empty"),
    (("It is", 0), "max_new_tokens must be between"),
    (("It is", 8, "greedy", "[[0], [0"), "malformed"),
    (("It is", 8, "greedy", "[[0, 0]]"), "has no parent"),
    (("It is", 8, "sometimes"), "acceptance must be one of"),
    (("It is", 8, "greedy", "default", 0, "no-such-model"), "no-such-model"),
])
def test_bad_input_comes_back_as_a_message(client, args, message):
    with pytest.raises(Exception, match=message):
        client.predict(*args, api_name="/trace")


def test_the_app_still_answers_after_errors(client):
    assert len(client.predict("Mr. Darcy", 4, api_name="/trace")["tokens"]) == 4


def test_concurrent_visitors_take_turns_and_none_is_lost(client):
    jobs = [client.submit(f"Visitor {i} says", 6, api_name="/trace") for i in range(3)]
    results = [job.result(timeout=120) for job in jobs]
    assert [r["prompt"] for r in results] == [f"Visitor {i} says" for i in range(3)]
    assert all(len(r["tokens"]) == 6 for r in results)


def test_a_model_that_cannot_load_keeps_the_previous_one(client, tiny_model_dir):
    # Outside a page request, gr.Warning falls back to a Python warning.
    with pytest.warns(UserWarning, match="no/such/model"):
        dropdown, current, *_ = switch_model("/no/such/model", tiny_model_dir)
    assert dropdown == current == tiny_model_dir


# ----------------------------------------------------------------------------- the page's checks

@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return cache.get(tiny_model_dir)


def _settings(model, tree_text: str, num_heads: int, **overrides):
    values = dict(max_new_tokens=16, acceptance="greedy", temperature=0.7, epsilon=0.09, delta=0.3,
                  seed=-1, preset=model.default_tree, tree_text=tree_text, num_heads=num_heads)
    values.update(overrides)
    return decode_settings(model, *values.values())


def test_an_unedited_preset_is_passed_by_name(model):
    text = format_choices(model.trees[model.default_tree])
    assert json.loads(text) == model.trees[model.default_tree]
    assert _settings(model, text, model.num_heads).tree == model.default_tree


def test_an_edited_tree_is_cut_to_the_heads_in_use(model):
    settings = _settings(model, "[[0], [0, 0], [0, 0, 0], [1]]", 2)
    assert settings.tree == [[0], [1], [0, 0]] and settings.num_heads == 2


@pytest.mark.parametrize("tree_text, overrides, message", [
    ("[[0], [0", {}, "malformed"),
    ("[[0], [0, 0, 0, 0, 0, 0]]", {}, "has no parent|deep"),
    ('"chain"', {}, "non-empty list"),
    ("[[0]]", {"num_heads": 9}, "heads"),
    ("[[0]]", {"max_new_tokens": 100_000}, "max_new_tokens"),
    ("[[0]]", {"acceptance": "typical", "temperature": 0.0}, "temperature"),
])
def test_bad_settings_raise_a_readable_error(model, tree_text, overrides, message):
    with pytest.raises(DecodingError, match=message):
        _settings(model, tree_text, overrides.pop("num_heads", model.num_heads), **overrides)


def test_round_numbers_agree_with_the_tree_even_when_the_run_ends_mid_round():
    from app_helpers import SMALL_CHOICES, make_run

    from app.ui import round_info

    run = make_run(SMALL_CHOICES, accepted_leaves=[6])
    assert "accepted **3 guess(es)** · added **4 token(s)**: 3 from heads + 1 from" in round_info(run, 0)
    last = run.rounds[0]
    last.emitted_tokens, last.emitted_texts, last.emitted_from_heads = (
        last.emitted_tokens[:2], last.emitted_texts[:2], last.emitted_from_heads[:2])
    assert "accepted **3 guess(es)** · added **2 token(s)** (cut at the end of the run)" in round_info(run, 0)


def test_each_example_prompt_comes_with_its_model():
    """Picking an example also picks the model it was written for (prose or code)."""
    rows = example_rows(["austen", "/a/model/without/examples"])
    assert [prompt for prompt, _ in rows] == example_prompts("austen")
    assert {model for _, model in rows} == {"austen"}


def test_without_shipped_examples_the_first_model_gets_default_prompts():
    assert example_rows(["/nowhere"]) == [[prompt, "/nowhere"] for prompt in DEFAULT_PROMPTS]


def test_the_model_menu_names_each_embedded_model_by_its_card():
    assert describe("austen") == "austen: a 6.9M-parameter Llama trained from scratch on Jane Austen"
    assert describe("/some/local/dir") == "/some/local/dir"
