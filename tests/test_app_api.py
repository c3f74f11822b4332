"""The app's API endpoint `/trace`, called through gradio_client against a launched app, and the
checks the page applies to what a visitor types (bad input becomes a message, never a crash)."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from types import SimpleNamespace

import pytest
from gradio_client import Client

from app.inputs import RunRequest, decode_settings, describe_tree, format_choices, race_lanes
from app.layout import DEFAULT_PROMPTS, build_demo, example_rows, launch_options
from app.model_thread import THREAD_NAME
from app.models import ModelCache, describe, offered_models, require_offered
from app.sidebar import switch_model
from app.store import cache, write_json
from app.views import LEARN_FIGURES, STATS_FIGURES
from app_helpers import on_a_new_thread
from decoding.drafters import DRAFTERS
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.drafters.medusa_heads import medusa_tree, named_tree
from decoding.errors import DecodingError
from decoding.limits import PAGE_LIMITS
from decoding.medusa_modules import heads_count
from decoding.prompts import example_prompts
from decoding.settings import DecodeSettings
from decoding.tiny import make_tiny_model_dir
from decoding.trace import RunTrace
from scripts.screenshots import free_port


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="module")
def demo(tiny_model_dir):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
        demo = build_demo()
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(),
                    quiet=True, **launch_options())
        try:
            yield demo
        finally:
            demo.close()


@pytest.fixture(scope="module")
def client(demo):
    return Client(demo.local_url, verbose=False)


def call_trace(client: Client, prompt: str, **settings: object) -> dict:
    """A `/trace` call as a client writes it: the prompt, then the settings it changes, by name."""
    return client.predict(prompt, settings, api_name="/trace")


def test_runs_and_races_mark_no_visible_panel_pending(demo):
    """Gradio ticks a timer on every animation frame for each output it marks pending, shown or
    not; the model's events mark only a State, so the browser idles while runs are measured."""
    config = demo.get_config_file()
    kinds = {c["id"]: c["type"] for c in config["components"]}
    button = {c["props"].get("elem_id"): c["id"] for c in config["components"] if c["type"] == "button"}
    model_events = [d for d in config["dependencies"] if d["backend_fn"]
                    and {target for target, _ in d["targets"]} & {button["run-button"], button["race-button"]}]
    assert len(model_events) == 2  # Run and Race (the prompt's Enter runs the same as Run)
    for event in model_events:
        assert len(event["outputs"]) > 1 and event["show_progress_on"]
        assert {kinds[target] for target in event["show_progress_on"]} == {"state"}


def test_only_the_documented_endpoint_is_public(client):
    api = client.view_api(print_info=False, return_format="dict")
    assert list(api["named_endpoints"]) == ["/trace"]
    assert not api["unnamed_endpoints"]


def test_trace_endpoint_returns_a_whole_run(client):
    data = call_trace(client, "It is a truth universally", max_new_tokens=12)
    trace = RunTrace.from_dict(data)
    assert len(trace.tokens) == 12 and trace.stop_reason == "max_new_tokens"
    assert trace.forward_passes == 1 + len(trace.rounds)
    assert trace.tree is not None and trace.tree.size == len(trace.rounds[0].node_tokens)
    assert all(r.accepted_nodes[0] == 0 for r in trace.rounds)
    assert data["text"] == trace.text
    # it looked at the machine's load first and ran on the cores left free (measure.stream_on_free_cores)
    assert trace.load is not None and 1 <= trace.load.threads <= trace.threads_before


def test_trace_refuses_a_model_the_page_does_not_offer(client, tmp_path_factory):
    # A real, loadable model directory, but not one the page offers: refused before any loading.
    other = str(make_tiny_model_dir(tmp_path_factory.mktemp("other-model")))
    for name in (other, "gpt2", "../assets/models/austen"):
        with pytest.raises(Exception, match="not offered here"):
            call_trace(client, "It is", max_new_tokens=4, model=name)
    assert other not in cache.loaded()


@pytest.mark.parametrize("method", ["draft-model", "prompt-lookup", "ar"])
def test_trace_endpoint_runs_each_drafter_the_model_offers(client, method):
    data = call_trace(client, "It is a truth universally acknowledged, It is a truth", max_new_tokens=10, method=method,
                 draft_tokens=3, lookup_tokens=5)
    trace = RunTrace.from_dict(data)
    assert trace.settings.method == method and len(trace.tokens) == 10
    if method == "ar":
        assert trace.tree is None and trace.drafter is None
        return
    assert trace.drafter.name == method and trace.tree.name == ("chain-3" if method == "draft-model" else "chain-5")
    assert all(source == method for rnd in trace.rounds for source in rnd.node_sources[1:])
    assert trace.settings.options.get("draft_tokens") == (3 if method == "draft-model" else None)


@pytest.mark.parametrize("method, lengths, message", [
    ("nonsense", {}, "offers no drafter 'nonsense': choose one of ar, medusa, eagle, mtp, draft-model"),
    ("draft-model", {"draft_tokens": 0}, "draft_tokens must be a whole number from 1 to 64"),
    ("prompt-lookup", {"lookup_tokens": 65}, "lookup_tokens must be a whole number from 1 to 64"),
    ("prompt-lookup", {"lookup_tokens": 2.5}, "lookup_tokens must be a whole number, not 2.5"),
])
def test_the_trace_endpoint_refuses_a_drafter_or_length_it_cannot_run(client, method, lengths, message):
    with pytest.raises(Exception, match=re.escape(message)):
        call_trace(client, "It is", max_new_tokens=4, method=method, **lengths)


def test_the_trace_endpoint_grows_eagles_tree_as_asked(client):
    """Depth, top-k and the verified size reach the EAGLE drafter: with 4 guesses fixed, every
    round verifies the root and exactly 4 guesses at most 2 levels deep; 0 asks for as many as pay."""
    prompt = "It is a truth universally acknowledged, It is a truth"
    data = call_trace(client, prompt, max_new_tokens=10, method="eagle", eagle_depth=2, eagle_top_k=3, eagle_nodes=4)
    trace = RunTrace.from_dict(data)
    settings = trace.settings
    assert (settings.eagle_depth, settings.eagle_top_k, settings.eagle_nodes) == (2, 3, 4)
    assert trace.rounds and all(rnd.tree.size == 5 and max(map(len, rnd.tree.choices)) <= 2 for rnd in trace.rounds)
    auto = RunTrace.from_dict(call_trace(client, prompt, max_new_tokens=6, method="eagle", eagle_depth=2,
                                         eagle_top_k=3, eagle_nodes=None))
    assert auto.settings.eagle_nodes is None and auto.settings.eagle_depth == 2


@pytest.mark.parametrize("eagle, message", [
    ({"eagle_depth": 0}, "eagle_depth must be a whole number from 1 to 16, not 0"),
    ({"eagle_top_k": 17}, "eagle_top_k must be a whole number from 1 to 16, not 17"),
    ({"eagle_nodes": 64}, "eagle_nodes must be a whole number from 1 to 63"),
    ({"eagle_nodes": -1}, "eagle_nodes must be a whole number from 1 to 63"),
    ({"eagle_nodes": 2.5}, "eagle_nodes must be a whole number, not 2.5"),
])
def test_the_trace_endpoint_refuses_an_eagle_tree_it_cannot_grow(client, eagle, message):
    with pytest.raises(Exception, match=re.escape(message)):
        call_trace(client, "It is", max_new_tokens=4, method="eagle", **eagle)


def test_trace_endpoint_takes_a_custom_tree_and_fewer_heads(client):
    data = call_trace(client, "It is a truth", max_new_tokens=6, tree="[[0], [0, 0], [1]]", num_heads=2)
    assert data["tree"]["choices"] == [[0], [1], [0, 0]]
    assert data["settings"]["options"] == {"num_heads": 2}


@pytest.mark.parametrize("prompt, settings, message", [
    ("", {}, "prompt is empty"),
    ("It is", {"max_new_tokens": 0}, "max_new_tokens must be from 1 to"),
    ("It is", {"tree": "[[0], [0"}, "malformed"),
    ("It is", {"tree": "[[0, 0]]"}, "has no parent"),
    ("It is", {"tree": 5}, "tree must be a tree's name or a choices list as JSON text, not 5"),
    ("It is", {"acceptance": "sometimes"}, "acceptance must be one of"),
    ("It is", {"model": "no-such-model"}, "not offered here"),
    ("It is", {"top_p": 0}, "top_p must be a number from"),
    ("It is", {"seed": -1}, "seed must be a whole number from 0"),
    ("It is", {"max_new_tokens": 4, "num_head": 2}, "/trace has no setting 'num_head': it takes model, method, tree"),
    ("It is", [4], "settings must be an object of settings by name"),
])
def test_bad_input_comes_back_as_a_message(client, prompt, settings, message):
    with pytest.raises(Exception, match=re.escape(message) if "(" in message else message):
        client.predict(prompt, settings, api_name="/trace")


def test_the_app_still_answers_after_errors(client):
    assert len(call_trace(client, "Mr. Darcy", max_new_tokens=4)["tokens"]) == 4


def test_concurrent_visitors_take_turns_and_none_is_lost(client):
    jobs = [client.submit(f"Visitor {i} says", {"max_new_tokens": 6}, api_name="/trace") for i in range(3)]
    results = [job.result(timeout=120) for job in jobs]
    assert [r["prompt"] for r in results] == [f"Visitor {i} says" for i in range(3)]
    assert all(len(r["tokens"]) == 6 for r in results)


def test_a_model_that_cannot_load_keeps_the_previous_one(client, tiny_model_dir):
    # Outside a page request, gr.Warning falls back to a Python warning.
    with pytest.warns(UserWarning, match="not offered here"):
        updates = switch_model("/no/such/model", tiny_model_dir, "medusa")
    assert updates == {"model": tiny_model_dir, "current_model": tiny_model_dir}


# ----------------------------------------------------------------------------- the page's checks

@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return cache.get(tiny_model_dir)


def _settings(model, tree_text: str, num_heads: int, **overrides):
    values = dict(prompt="It is", model=model.name, max_new_tokens=16, preset=model.default_tree,
                  tree_text=tree_text, num_heads=num_heads)
    return decode_settings(model, RunRequest.of(**(values | overrides)))


def test_an_unedited_preset_is_passed_by_name(model):
    """The editor shows a preset cut to the model's heads; that text runs as the preset by name."""
    shown = named_tree(model, model.default_tree).choices
    assert all(len(path) <= heads_count(model) for path in shown)
    text = format_choices(shown)
    assert json.loads(text) == shown
    assert _settings(model, text, heads_count(model)).tree == model.default_tree


def test_an_edited_tree_is_cut_to_the_heads_in_use(model):
    settings = _settings(model, "[[0], [0, 0], [0, 0, 0], [1]]", 2)
    assert medusa_tree(model, settings.tree, settings.num_heads).choices == [[0], [1], [0, 0]]
    assert settings.num_heads == 2


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
        _settings(model, tree_text, overrides.pop("num_heads", heads_count(model)), **overrides)


def test_only_the_drafters_a_model_has_are_accepted(model):
    without_draft = model.with_part(DRAFT_MODEL, None)
    with pytest.raises(DecodingError,
                       match="offers no drafter 'draft-model': choose one of ar, medusa, eagle, mtp, prompt-lookup"):
        decode_settings(without_draft, RunRequest.of(prompt="It is", model=model.name, method="draft-model"))
    with pytest.raises(DecodingError, match="offers no drafter 'draft-model'"):
        race_lanes(without_draft, RunRequest.of(prompt="It is", model=model.name, lanes=("medusa", "draft-model")))
    with pytest.raises(DecodingError, match="tick at least one drafter"):
        race_lanes(model, RunRequest.of(prompt="It is", model=model.name, lanes=()))
    # Ticked in any order, the lanes run in the order the model offers them.
    assert race_lanes(model, RunRequest.of(prompt="It is", model=model.name, lanes=("prompt-lookup", "medusa"))) == [
        "medusa", "prompt-lookup"]


def test_a_half_edited_tree_blocks_medusa_but_not_the_other_drafters(model):
    for method in ("draft-model", "prompt-lookup"):
        settings = _settings(model, "[[0], [0", heads_count(model), method=method, draft_tokens=3.0)
        assert settings.method == method and settings.tree == "default" and settings.draft_tokens == 3
    with pytest.raises(DecodingError, match="malformed"):
        decode_settings(model, RunRequest.of(prompt="It is", model=model.name, preset=model.default_tree,
                                          tree_text="[[0], [0"), ["prompt-lookup", "medusa"])


def test_switching_models_offers_the_new_models_drafters(client, tiny_model_dir):
    updates = switch_model(tiny_model_dir, tiny_model_dir, "draft-model")
    method, lanes = updates["method"], updates["lanes"]
    # The tiny model carries heads, an EAGLE layer and a draft model: every registered drafter runs on it.
    assert method.value == "draft-model" and [name for _, name in method.choices] == list(DRAFTERS)
    # Every drafter is offered; Medusa alone is ticked, so a first race is short (the rest on request).
    assert [name for _, name in lanes.choices] == list(DRAFTERS)
    assert lanes.value == ["medusa"]
    assert [value for _, value in updates["train_heads"].choices] == ["1", "2", "3", "4", "all"]


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

    request, engine = RunRequest.of(prompt="x", model="m"), DecodeSettings()
    assert (request.temperature, request.epsilon, request.delta, request.max_new_tokens) == (
        engine.temperature, engine.epsilon, engine.delta, engine.max_new_tokens)


def test_downloads_share_one_folder_and_old_ones_are_pruned(tmp_path, monkeypatch):
    import app.store as store

    monkeypatch.setattr(store, "DOWNLOADS", tmp_path)
    monkeypatch.setattr(store, "KEEP_DOWNLOADS", 3)
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

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cache = ModelCache()
    in_memory_while_loading = {}

    def load(name):
        in_memory_while_loading[name] = cache.loaded()
        return f"model {name}"

    monkeypatch.setattr(cache, "_load", load)
    cache.get("a")
    cache.get("b")
    assert in_memory_while_loading == {"a": [], "b": []}  # "a" was gone before "b" loaded
    assert cache.loaded() == ["b"]

def test_on_a_cpu_the_cache_keeps_two_models(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cache = ModelCache()
    monkeypatch.setattr(cache, "_load", lambda name: f"model {name}")
    for name in ("a", "b", "c"):
        cache.get(name)
    assert cache.loaded() == ["b", "c"]  # the least recently used went first


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
    from app.models import model_note

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
        call_trace(client, "It is", max_new_tokens=4, tree="<img src=x>")


# ----------------------------------------------------------------------------- the server's protection

def ten_thousand_path_tree() -> str:
    """The tree that took the server down: 10,000 paths, three deep at most."""
    paths = [[i] for i in range(64)] + [[i, j] for i in range(64) for j in range(64)]
    paths += [[i, j, k] for i in range(64) for j in range(64) for k in range(2)]
    return json.dumps(paths[:10_000])


def test_a_ten_thousand_node_tree_and_a_long_prompt_are_refused_at_once_and_others_are_served(client):
    started = time.perf_counter()
    huge_tree = client.submit("It is", {"max_new_tokens": 8, "tree": ten_thousand_path_tree()}, api_name="/trace")
    long_prompt = client.submit("It is a truth " * 1500, {"max_new_tokens": 8}, api_name="/trace")
    other = client.submit("Mr. Darcy", {"max_new_tokens": 4}, api_name="/trace")
    with pytest.raises(Exception, match="the tree has 10001 nodes .*at most 128"):
        huge_tree.result(timeout=60)
    with pytest.raises(Exception, match="the prompt is 21,000 characters; this page reads at most 4,000"):
        long_prompt.result(timeout=60)
    assert len(other.result(timeout=60)["tokens"]) == 4
    assert time.perf_counter() - started < 30  # generous: refusing takes milliseconds, running them minutes
    assert len(call_trace(client, "Mr. Bingley", max_new_tokens=4)["tokens"]) == 4


def test_too_few_and_too_many_tokens_get_one_limit_in_one_message_and_one_log_line(client, capfd, caplog):
    messages = []
    for tokens in (-5, 0, 10**9):
        capfd.readouterr()
        caplog.clear()
        with pytest.raises(Exception) as refused:
            call_trace(client, "It is", max_new_tokens=tokens)
        messages.append(str(refused.value).replace(str(tokens), "N"))
        time.sleep(0.2)  # the server logs as it sends the refusal
        printed = capfd.readouterr()
        assert "Traceback" not in printed.out + printed.err
        assert [record.getMessage() for record in caplog.records if "refused" in record.getMessage()] == [
            f"refused: max_new_tokens must be from 1 to {PAGE_LIMITS.max_new_tokens} on this page, not {tokens}"]
    assert len(set(messages)) == 1 and f"from 1 to {PAGE_LIMITS.max_new_tokens}" in messages[0]


def test_the_page_refuses_a_huge_tree_before_building_it(model, monkeypatch):
    import decoding.tree

    def never(*args, **kwargs):
        raise AssertionError("the tree was built")

    monkeypatch.setattr(decoding.tree.Tree, "from_choices", never)
    status = describe_tree(model, model.default_tree, ten_thousand_path_tree(), 2)
    assert status.startswith("⚠ the tree has 10001 nodes")
    with pytest.raises(DecodingError, match="10001 nodes"):
        _settings(model, ten_thousand_path_tree(), 2)
    with pytest.raises(DecodingError, match="this page reads at most 500,000"):
        _settings(model, " " * 600_000 + "[[0]]", 2)


def test_every_page_run_has_the_pages_time_limit(model):
    assert _settings(model, "", 2).time_limit == PAGE_LIMITS.run_seconds
    with pytest.raises(DecodingError, match="20,000 characters"):
        _settings(model, "", 2, prompt="x" * 20_000)


def test_the_page_queue_is_bounded(demo):
    assert demo._queue.max_size == PAGE_LIMITS.queue_size


def _page_and_values(model_dir: str, **request):
    """A handlers.Page whose components are named by strings, and the values of a request."""
    from app import handlers

    fields = {f.name: f.name for f in dataclasses.fields(handlers.Page)}
    page = handlers.Page(**fields | {"request": {f.name: f.name for f in dataclasses.fields(RunRequest)},
                                     "stats_plots": {name: name for name in STATS_FIGURES},
                                     "learn_plots": {name: name for name in LEARN_FIGURES},
                                     "step_mds": [], "steps": []})
    values = dataclasses.asdict(RunRequest.of(model=model_dir, **request)) | {"projector": False, "width": 1280}
    return page, values



def test_the_app_loads_runs_races_and_traces_on_one_thread_whichever_thread_asks(tiny_model_dir, monkeypatch):
    """Once more threads than cores have run torch, its OpenMP workers sleep between passes
    (app/model_thread.py): every load, warm-up, run, race step and /trace call runs the model on
    the one model thread, though each step here comes from a new thread."""
    from app import api, handlers, models

    ran_on = []

    def loaded_and_watched(*args, **kwargs):
        ran_on.append(("load", threading.current_thread().name))
        model = load_model(*args, **kwargs)
        model.model.register_forward_pre_hook(lambda *_: ran_on.append(("pass", threading.current_thread().name)))
        return model

    load_model = models.load_model
    monkeypatch.setattr(models, "load_model", loaded_and_watched)
    fresh = ModelCache(keep=1)
    for module in (handlers, api):
        monkeypatch.setattr(module, "cache", fresh)
    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    page, values = _page_and_values(tiny_model_dir, prompt="It is a truth", max_new_tokens=8, races=1)
    on_a_new_thread(models.warm_up, on_a_new_thread(fresh.get, tiny_model_dir))  # as the page's start-up does
    for work in (handlers.run_drafter, handlers.run_race):
        steps, updates = work(page, values), []
        while (update := on_a_new_thread(next, steps, None)) is not None:
            updates.append(update)
        assert "run_state" in updates[-1]
    assert len(on_a_new_thread(api.trace_api, "It is a truth", {"max_new_tokens": 8})["tokens"]) == 8
    kinds = {kind for kind, _ in ran_on}
    threads = {name for _, name in ran_on}
    assert kinds == {"load", "pass"} and len(threads) == 1, threads
    (thread,) = threads
    assert thread.startswith(THREAD_NAME) and thread != threading.current_thread().name


def test_a_page_stops_asking_what_the_model_does_while_its_own_run_or_race_runs(tiny_model_dir, monkeypatch):
    """The first update of a page's own run or race turns its waiting timer off (each tick is a
    request to the process being timed); the update after it turns the timer on again."""
    from app import handlers

    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    page, values = _page_and_values(tiny_model_dir, prompt="It is a truth", max_new_tokens=8, races=1)
    for work in (handlers.run_drafter, handlers.run_race):
        updates = list(work(page, values))
        assert updates[0]["waiting_timer"].active is False
        assert all("waiting_timer" not in update for update in updates[1:])
        values |= {key: updates[-1][key] for key in ("run_state", "race_state") if key in updates[-1]}
    values |= {"run_state": values.get("run_state"), "race_state": values.get("race_state")}
    assert handlers.after_run(page, values, "this page")["waiting_timer"].active is True
    # The visitor pressed Race again before this run's after-work came: the timer stays off.
    handlers.BOARD.post("this page", "race")
    try:
        assert handlers.after_run(page, values, "this page")["waiting_timer"].active is False
        assert handlers.after_run(page, values, "another page")["waiting_timer"].active is True
    finally:
        handlers.BOARD.clear("this page")

@pytest.mark.parametrize("request_fields, message", [
    (dict(prompt=""), "the prompt is empty"),
    # The race reads the Playground's tree only when told to race it (else: the fastest here).
    (dict(prompt="It is", tree_text="[[0], [0", race_tree="playground"), "the tree JSON is malformed"),
    (dict(prompt="It is", tree_text=ten_thousand_path_tree(), race_tree="playground"), "the tree has 10001 nodes"),
    (dict(prompt="x" * 20_000), "the prompt is 20,000 characters"),
])
def test_a_run_the_page_refuses_says_why_on_its_status_line_not_as_an_error_on_every_panel(
        tiny_model_dir, monkeypatch, request_fields, message):
    from app import handlers

    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    page, values = _page_and_values(tiny_model_dir, **request_fields)
    with pytest.warns(UserWarning, match=message):  # the toast, outside a page request
        updates = list(handlers.run_drafter(page, values))
    assert set(updates[-1]) == {"tabs", "summary"}  # the last run's figures stay, the status line says why
    assert updates[-1]["summary"].startswith("⚠ **Not run:**")
    with pytest.warns(UserWarning, match=message):
        updates = list(handlers.run_race(page, values))
    assert set(updates[-1]) == {"tabs", "race_status"} and "Not raced" in updates[-1]["race_status"]


def test_slow_figures_are_redrawn_less_often_while_a_run_streams(tiny_model_dir, monkeypatch):
    """Building the figures holds the run up, so they may take only FIGURES_SHARE of its time:
    a tree that takes long to draw is drawn on the first round, rarely, and at the end."""
    from app import handlers

    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += 0.1  # every look at the clock: a tenth of a second later
        return clock[0]

    drawn = []

    def slow_figures(page, trace, index, look):
        drawn.append(index)
        clock[0] += 1.0  # a big tree's figures: a second to build
        return {}

    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    monkeypatch.setattr(handlers, "time", SimpleNamespace(perf_counter=perf_counter, time=time.time))
    monkeypatch.setattr(handlers, "round_updates", slow_figures)
    monkeypatch.setattr(handlers, "FIGURES_EVERY", 0.2)
    page, values = _page_and_values(tiny_model_dir, prompt="It is a truth", max_new_tokens=64)
    runs = [u["run_state"] for u in handlers.run_drafter(page, values) if "run_state" in u]
    rounds = len(runs[-1].rounds)
    assert rounds >= 16
    # Every 10 s of this clock (1 s of drawing / FIGURES_SHARE), not every 0.2 s.
    assert drawn[0] == 0 and drawn[-1] == rounds - 1 and len(drawn) <= 2 + rounds * 0.2 / 10 + 1



def _timed_run(tiny_model_dir, monkeypatch, build_seconds: float, round_seconds: float = 0.15):
    """A 64-token run on the tiny model whose rounds take `round_seconds` each and whose figures
    take `build_seconds` to build, on a fake clock: (the updates sent, the rounds drawn, seconds)."""
    from app import handlers

    clock = [0.0]
    drawn = []
    real_stream = handlers.stream_on_free_cores

    def slow_stream(*args, **kwargs):
        for trace in real_stream(*args, **kwargs):
            clock[0] += round_seconds
            yield trace

    def figures(page, trace, index, look):
        drawn.append(index)
        clock[0] += build_seconds
        return {page.tree_plot: f"round {index}"}

    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    monkeypatch.setattr(handlers, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=time.time))
    monkeypatch.setattr(handlers, "stream_on_free_cores", slow_stream)
    monkeypatch.setattr(handlers, "round_updates", figures)
    page, values = _page_and_values(tiny_model_dir, prompt="It is a truth", max_new_tokens=64)
    return list(handlers.run_drafter(page, values)), drawn, clock[0]


def test_a_big_trees_figures_are_drawn_on_the_first_round_and_the_last_only(tiny_model_dir, monkeypatch):
    """On a small CPU the browser drawing the figures takes the cores the run needs
    (handlers.BROWSER_COST): figures that take 0.2 s to build, as a 64-node tree's do on a 2-core
    CPU, are drawn on the first round and at the end of a run of several seconds, never in
    between, while the token stream updates at most every STREAM_EVERY seconds and always at the end."""
    from app import handlers

    updates, drawn, seconds = _timed_run(tiny_model_dir, monkeypatch, build_seconds=0.2)
    rounds = len(updates[-1]["run_state"].rounds)
    assert 16 <= rounds and seconds < 0.2 * (1 + handlers.BROWSER_COST) / handlers.FIGURES_SHARE
    assert drawn == [0, rounds - 1]
    assert updates[-1]["tree_plot"] == f"round {rounds - 1}" and "stopped" in updates[-1]["summary"]
    texts = [u for u in updates if "stream_box" in u]
    assert len(texts) <= seconds / handlers.STREAM_EVERY + 2 and "data-ended" in texts[-1]["stream_box"]


def test_a_small_trees_figures_still_follow_the_run(tiny_model_dir, monkeypatch):
    """Figures that are quick to build are redrawn every FIGURES_EVERY seconds as the run goes,
    and on the last round."""
    from app import handlers

    updates, drawn, seconds = _timed_run(tiny_model_dir, monkeypatch, build_seconds=0.005)
    rounds = len(updates[-1]["run_state"].rounds)
    assert drawn[0] == 0 and drawn[-1] == rounds - 1 and updates[-1]["tree_plot"] == f"round {rounds - 1}"
    assert seconds / handlers.FIGURES_EVERY - 1 <= len(drawn) <= seconds / handlers.FIGURES_EVERY + 2


def test_the_race_races_the_fastest_tree_unless_told_to_race_the_playgrounds(model):
    """The Playground shows every head; the race's Medusa lane runs the fastest tree here, and a
    half-edited Playground tree does not block it."""
    from app.inputs import race_request

    request = RunRequest.of(prompt="It is", model=model.name, preset="every-head", tree_text="[[0], [0")
    raced = race_request(request)
    assert raced.preset == "auto" and raced.tree_text == ""
    assert race_request(dataclasses.replace(request, race_tree="playground")) == dataclasses.replace(
        request, race_tree="playground")
    with pytest.raises(DecodingError, match="race's tree"):
        race_request(dataclasses.replace(request, race_tree="biggest"))


def test_the_acceptance_controls_come_from_the_settings_declarations_and_reach_the_run(model):
    """Every number the acceptance rules read has a control whose range, step and label are its
    declaration's (top_p among them); the page's values reach the engine's settings; an empty
    seed is the engine's unset one, and a negative one is refused, not taken for "random"."""
    from app.sidebar import acceptance_controls, acceptance_settings
    from decoding.settings import COMMON_SETTINGS

    controls = acceptance_settings()
    for name in ("temperature", "top_p", "epsilon", "delta"):
        setting, slider = COMMON_SETTINGS[name], controls[name]
        assert slider.label == setting.title and slider.step == setting.page_step
        assert setting.low <= slider.minimum < slider.maximum <= setting.high
    assert controls["seed"].value == ""  # empty: a fresh seed (a number box would show and send 0)
    shown = {name for name, update in acceptance_controls("sample").items() if update["visible"]}
    assert shown == {"temperature", "top_p", "seed"}
    sampled = _settings(model, "", 2, acceptance="sample", temperature=0.7, top_p=0.8, seed=None)
    assert (sampled.temperature, sampled.top_p, sampled.seed) == (0.7, 0.8, None)
    assert _settings(model, "", 2, acceptance="sample", seed="").seed is None
    assert _settings(model, "", 2, acceptance="sample", seed="5").seed == 5
    with pytest.raises(DecodingError, match="seed must be a whole number from 0"):
        _settings(model, "", 2, acceptance="sample", seed=-1)


def test_trace_takes_top_p_and_the_engines_tree_default(model):
    from app.inputs import trace_request

    request = trace_request("It is", {"acceptance": "sample", "top_p": 0.5, "seed": 3, "num_heads": None})
    settings = decode_settings(model, dataclasses.replace(request, model=model.name))
    assert (settings.top_p, settings.seed, settings.tree) == (0.5, 3, DecodeSettings().tree)
