"""The app's API endpoint `/trace`, called through gradio_client against a launched app, and the
checks the page applies to what a visitor types (bad input becomes a message, never a crash)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from gradio_client import Client

from app.handlers import cache, switch_model, write_json
from app.inputs import RunRequest, decode_settings, format_choices, race_lanes
from app.layout import DEFAULT_PROMPTS, build_demo, example_rows, launch_options
from app.models import ModelCache, describe, offered_models, require_offered
from decoding.errors import DecodingError
from decoding.prompts import example_prompts
from decoding.tiny import make_tiny_model_dir
from decoding.trace import RunTrace
from scripts.screenshots import free_port


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


def test_only_the_documented_endpoint_is_public(client):
    api = client.view_api(print_info=False, return_format="dict")
    assert list(api["named_endpoints"]) == ["/trace"]
    assert not api["unnamed_endpoints"]


def test_trace_endpoint_returns_a_whole_run(client):
    data = client.predict("It is a truth universally", 12, api_name="/trace")
    trace = RunTrace.from_dict(data)
    assert len(trace.tokens) == 12 and trace.stop_reason == "max_new_tokens"
    assert trace.forward_passes == 1 + len(trace.rounds)
    assert trace.tree is not None and trace.tree.size == len(trace.rounds[0].node_tokens)
    assert all(r.accepted_nodes[0] == 0 for r in trace.rounds)
    assert data["text"] == trace.text


def test_trace_refuses_a_model_the_page_does_not_offer(client, tmp_path_factory):
    # A real, loadable model directory, but not one the page offers: refused before any loading.
    other = str(make_tiny_model_dir(tmp_path_factory.mktemp("other-model")))
    for name in (other, "gpt2", "../assets/models/austen"):
        with pytest.raises(Exception, match="not offered here"):
            client.predict("It is", 4, "greedy", "default", 0, name, api_name="/trace")
    assert other not in cache.loaded()


@pytest.mark.parametrize("method", ["draft-model", "prompt-lookup", "ar"])
def test_trace_endpoint_runs_each_drafter_the_model_offers(client, method):
    data = client.predict("It is a truth universally acknowledged, It is a truth", 10, "greedy", "default", 0, "",
                          1.0, -1, method, 3, 5, api_name="/trace")
    trace = RunTrace.from_dict(data)
    assert trace.settings.method == method and len(trace.tokens) == 10
    if method == "ar":
        assert trace.tree is None and trace.drafter is None
        return
    assert trace.drafter.name == method and trace.tree.name == ("chain-3" if method == "draft-model" else "chain-5")
    assert all(source == method for rnd in trace.rounds for source in rnd.node_sources[1:])
    assert trace.settings.draft_tokens == (3 if method == "draft-model" else None)


@pytest.mark.parametrize("method, lengths, message", [
    ("nonsense", (4, 10), "offers no drafter 'nonsense': choose one of ar, medusa, draft-model, prompt-lookup"),
    ("draft-model", (0, 10), "draft_tokens must be a whole number from 1 to 64"),
    ("prompt-lookup", (4, 65), "lookup_tokens must be a whole number from 1 to 64"),
    ("prompt-lookup", (4, 2.5), "lookup_tokens must be a whole number, not 2.5"),
])
def test_the_trace_endpoint_refuses_a_drafter_or_length_it_cannot_run(client, method, lengths, message):
    with pytest.raises(Exception, match=re.escape(message)):
        client.predict("It is", 4, "greedy", "default", 0, "", 1.0, -1, method, *lengths, api_name="/trace")


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
    (("It is", 8, "greedy", "default", 0, "no-such-model"), "not offered here"),
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
    with pytest.warns(UserWarning, match="not offered here"):
        dropdown, current, *_ = switch_model("/no/such/model", tiny_model_dir, "medusa")
    assert dropdown == current == tiny_model_dir


# ----------------------------------------------------------------------------- the page's checks

@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return cache.get(tiny_model_dir)


def _settings(model, tree_text: str, num_heads: int, **overrides):
    values = dict(prompt="It is", model=model.name, max_new_tokens=16, preset=model.default_tree,
                  tree_text=tree_text, num_heads=num_heads)
    return decode_settings(model, RunRequest(**(values | overrides)))


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


def test_only_the_drafters_a_model_has_are_accepted(model):
    without_draft = dataclasses.replace(model, draft=None)
    with pytest.raises(DecodingError, match="offers no drafter 'draft-model': choose one of ar, medusa, prompt-lookup"):
        decode_settings(without_draft, RunRequest(prompt="It is", model=model.name, method="draft-model"))
    with pytest.raises(DecodingError, match="offers no drafter 'draft-model'"):
        race_lanes(without_draft, RunRequest(prompt="It is", model=model.name, lanes=("medusa", "draft-model")))
    with pytest.raises(DecodingError, match="tick at least one drafter"):
        race_lanes(model, RunRequest(prompt="It is", model=model.name, lanes=()))
    # Ticked in any order, the lanes run in the order the model offers them.
    assert race_lanes(model, RunRequest(prompt="It is", model=model.name, lanes=("prompt-lookup", "medusa"))) == [
        "medusa", "prompt-lookup"]


def test_a_half_edited_tree_blocks_medusa_but_not_the_other_drafters(model):
    for method in ("draft-model", "prompt-lookup"):
        settings = _settings(model, "[[0], [0", model.num_heads, method=method, draft_tokens=3.0)
        assert settings.method == method and settings.tree == "default" and settings.draft_tokens == 3
    with pytest.raises(DecodingError, match="malformed"):
        decode_settings(model, RunRequest(prompt="It is", model=model.name, preset=model.default_tree,
                                          tree_text="[[0], [0"), ["prompt-lookup", "medusa"])


def test_switching_models_offers_the_new_models_drafters(client, tiny_model_dir):
    *_, method, lanes = switch_model(tiny_model_dir, tiny_model_dir, "draft-model")
    assert method.value == "draft-model" and [name for _, name in method.choices] == [
        "medusa", "draft-model", "prompt-lookup"]
    assert lanes.value == ["medusa", "draft-model", "prompt-lookup"]


def test_each_example_prompt_comes_with_its_model():
    """Picking an example also picks the model it was written for (prose or code)."""
    rows = example_rows(["austen", "/a/model/without/examples"])
    assert [prompt for prompt, _ in rows] == example_prompts("austen")
    assert {model for _, model in rows} == {"austen"}


def test_without_shipped_examples_the_first_model_gets_default_prompts():
    assert example_rows(["/nowhere"]) == [(prompt, "/nowhere") for prompt in DEFAULT_PROMPTS]


def test_the_model_menu_names_each_embedded_model_by_its_card():
    assert describe("austen") == "austen: a 6.9M-parameter Llama trained from scratch on Jane Austen"
    assert describe("/some/local/dir") == "/some/local/dir"


def test_the_page_defaults_are_the_engines():
    from decoding import DecodeSettings

    request, engine = RunRequest(prompt="x", model="m"), DecodeSettings()
    assert (request.temperature, request.epsilon, request.delta, request.max_new_tokens) == (
        engine.temperature, engine.epsilon, engine.delta, engine.max_new_tokens)


def test_downloads_share_one_folder_and_old_ones_are_pruned(tmp_path, monkeypatch):
    import app.handlers as handlers

    monkeypatch.setattr(handlers, "DOWNLOADS", tmp_path)
    monkeypatch.setattr(handlers, "KEEP_DOWNLOADS", 3)
    paths = [write_json("medusa_trace.json", {"run": i}) for i in range(5)]
    assert all(p.startswith(str(tmp_path)) and p.endswith("medusa_trace.json") for p in paths)
    assert len(list(tmp_path.iterdir())) == 3
    assert write_json("medusa_trace.json", {"run": 4}) == paths[-1]  # same content, same file


def test_the_model_cache_keeps_the_last_two_and_loads_outside_its_lock(monkeypatch):
    import threading

    cache = ModelCache(keep=2)
    started, release = threading.Event(), threading.Event()

    def slow_load(name):
        if name == "slow":
            started.set()
            release.wait(5)
        return f"model {name}"

    monkeypatch.setattr(cache, "_load", slow_load)
    cache.get("a")
    loader = threading.Thread(target=cache.get, args=("slow",))
    loader.start()
    started.wait(5)
    assert cache.get("a") == "model a"  # answered while "slow" is still loading
    release.set()
    loader.join(5)
    assert cache.loaded() == ["a", "slow"]
    cache.get("a")
    cache.get("b")
    assert cache.loaded() == ["a", "b"]  # "slow" was the least recently used: evicted


def test_on_a_gpu_the_cache_keeps_one_model_and_drops_it_before_loading_the_next(monkeypatch):
    import torch

    import app.models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cache = ModelCache()
    assert cache.keep == app.models.KEEP_MODELS_ON_GPU == 1
    in_memory_while_loading = {}

    def load(name):
        in_memory_while_loading[name] = cache.loaded()
        return f"model {name}"

    monkeypatch.setattr(cache, "_load", load)
    cache.get("a")
    cache.get("b")
    assert in_memory_while_loading == {"a": [], "b": []}  # "a" was gone before "b" loaded
    assert cache.loaded() == ["b"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ModelCache().keep == app.models.KEEP_MODELS == 2


def test_the_page_offers_what_the_engine_can_load(monkeypatch):
    monkeypatch.delenv("MEDUSA_PLAYGROUND_MODEL", raising=False)
    offered = offered_models()
    assert require_offered(offered[0]) == offered[0]
    with pytest.raises(DecodingError, match="not offered here"):
        require_offered("/etc")


def test_a_model_that_is_not_fetched_is_named_with_the_command_that_gets_it(monkeypatch):
    import app.models
    import decoding.fetch
    import decoding.loading
    from app.layout import model_note

    monkeypatch.delenv("MEDUSA_PLAYGROUND_MODEL", raising=False)
    # Every module's name: loading decides whether the shipped smollm2 heads can load, the page
    # which models to name as missing.
    for module in (decoding.fetch, decoding.loading, app.models):
        monkeypatch.setattr(module, "is_fetched", lambda name: False)
    assert "python -m decoding fetch smollm2" in model_note()
    with pytest.raises(DecodingError, match="python -m decoding fetch smollm2"):
        require_offered("smollm2")


def test_error_toasts_show_a_typed_tag_as_text(client):
    with pytest.raises(Exception, match="&lt;img src=x&gt;"):
        client.predict("It is", 4, "<img src=x>", api_name="/trace")
