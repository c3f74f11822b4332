"""What is chosen by measuring this machine: the dtype, the cost curve (and its cache), the tree."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from decoding import DecodeSettings, generate, load_model, precision
from decoding import cost_curve as cost_curve_module
from decoding.cost_curve import cached_cost_curve, curve_key, measure_cost_curve, model_cost_curve
from decoding.errors import DecodingError
from decoding.loading import resolve_attention, resolve_dtype
from decoding.medusa_modules import heads_count, medusa_part, with_heads
from decoding.trace import CostCurve
from decoding.tree_choice import choose_tree
from decoding.tree_choice import optimal_choices as grown

FLAT = CostCurve(sizes=[1, 2, 4, 8, 16, 32, 64], costs=[1.0, 1.0, 1.01, 1.02, 1.05, 1.1, 1.2], step_seconds=0.05,
                 device="cpu", dtype="bfloat16", threads=2, past=128, measured_at="2026-12-01T00:00:00+00:00")
STEEP = replace(FLAT, costs=[1.0, 1.3, 1.65, 1.8, 2.4, 3.3, 5.6])


# ----- the tree, by a worked example -------------------------------------------------------------
# Two heads, two ranks. Nodes by expected acceptance (product of accuracies along the path):
#   [0] 0.6, [1] 0.2, [0,0] 0.6*0.5 = 0.30, [0,1] 0.6*0.1 = 0.06, [1,0] 0.2*0.5 = 0.10, [1,1] 0.02
ACCURACY = [[0.6, 0.2], [0.5, 0.1]]


def test_auto_picks_by_tokens_per_pass_over_the_rounds_cost():
    # c(T): 1 node 1.0 (+ root: T=2) ... the costs below make the sums easy to check by hand.
    curve = CostCurve(sizes=[1, 2, 3, 4, 5], costs=[1.0, 1.1, 1.2, 1.5, 2.0], step_seconds=0.1,
                      device="cpu", dtype="float32", threads=1, past=16, measured_at="x", draft_cost=0.1)
    # n=1: [0]            1.6  / (1.1 + 0.1) = 1.333
    # n=2: + [0,0]        1.9  / (1.2 + 0.1) = 1.462   <- best
    # n=3: + [1]          2.1  / (1.5 + 0.1) = 1.3125
    # n=4: + [1,0]        2.2  / (2.0 + 0.1) = 1.048
    choice = choose_tree(ACCURACY, curve)
    assert choice.nodes == 2 and choice.choices == [[0], [0, 0]]
    assert choice.expected_tokens == pytest.approx(1.9)
    assert choice.pass_cost == pytest.approx(1.2) and choice.draft_cost == pytest.approx(0.1)
    assert choice.estimated_speedup == pytest.approx(1.9 / 1.3)
    assert choice.name == "auto: optimal-2"


def test_a_flat_curve_buys_a_big_tree_and_a_steep_one_a_small_tree():
    accuracy = [[0.49, 0.12, 0.06, 0.04], [0.30, 0.10, 0.06, 0.04], [0.20, 0.08, 0.05, 0.04]]
    big, small = choose_tree(accuracy, FLAT), choose_tree(accuracy, STEEP)
    assert big.nodes > 3 * small.nodes
    assert big.choices == grown(accuracy, big.nodes)  # the paper's optimal tree of that size


def test_every_head_carries_the_fastest_trees_top_path_down_to_the_last_head():
    """On a steep curve the fastest tree reads head 1 alone; every-head adds the top-1 path down to
    the last head, and picks its size by the same rule."""
    accuracy = [[0.49, 0.12, 0.06, 0.04], [0.30, 0.10, 0.06, 0.04], [0.20, 0.08, 0.05, 0.04]]
    fastest = choose_tree(accuracy, STEEP)
    every = choose_tree(accuracy, STEEP, reach=3)
    assert max(len(p) for p in fastest.choices) < 3 <= max(len(p) for p in every.choices)
    assert [0, 0] in every.choices and [0, 0, 0] in every.choices
    assert set(map(tuple, grown(accuracy, every.optimal_nodes))) <= set(map(tuple, every.choices))
    assert every.nodes == len(every.choices) and every.name.startswith("every-head: optimal-")
    # by hand for the two-head table: n=1 is [0] + [0,0]: 1.9 / (1.2 + 0.1), the same tree as auto's n=2
    curve = CostCurve(sizes=[1, 2, 3, 4, 5], costs=[1.0, 1.1, 1.2, 1.5, 2.0], step_seconds=0.1,
                      device="cpu", dtype="float32", threads=1, past=16, measured_at="x", draft_cost=0.1)
    choice = choose_tree(ACCURACY, curve, reach=2)
    assert choice.choices == [[0], [0, 0]] and choice.optimal_nodes == 1
    assert choice.estimated_speedup == pytest.approx(1.9 / 1.3)


def test_the_trees_chosen_here_are_named_alike_for_every_model_and_never_added_to_its_trees(tiny_llama):
    from decoding.drafters.medusa_heads import CHOSEN_TREES, named_tree, tree_names

    accuracy = [[0.49, 0.12, 0.06, 0.04], [0.30, 0.10, 0.06, 0.04], [0.20, 0.08, 0.05, 0.04], [0.1] * 4]
    lm = replace(with_heads(tiny_llama, medusa_part(tiny_llama).heads, accuracy), cost_curve=STEEP,
                 trees=dict(tiny_llama.trees))
    presets = dict(lm.trees)
    assert tree_names(lm)[:2] == ["auto", "every-head"] == list(CHOSEN_TREES)
    every = named_tree(lm, "every-head")
    assert every.max_depth == heads_count(lm)
    assert named_tree(lm, "every-head", 2).max_depth == 2
    assert lm.trees == presets and lm.default_tree in presets  # nothing of this machine's written into the model
    trace = generate(lm, "It is", DecodeSettings(tree="every-head", max_new_tokens=6))
    assert trace.tree.name == every.name and max(trace.tree.depths) == heads_count(lm)


def test_the_curve_interpolates_between_measured_sizes():
    assert FLAT.cost(1) == 1.0 and FLAT.cost(64) == 1.2 and FLAT.cost(100) == 1.2
    assert FLAT.cost(24) == pytest.approx(1.05 + (1.1 - 1.05) / 2)


# ----- the curve: measured on the model, and cached ---------------------------------------------
def test_the_curve_is_measured_on_the_loaded_model(tiny_llama):
    curve = measure_cost_curve(tiny_llama, sizes=(1, 4, 16), repeats=2)
    assert curve.sizes == [1, 4, 16] and curve.costs[0] == 1.0
    assert all(cost > 0 for cost in curve.costs) and curve.step_seconds > 0 and curve.draft_cost > 0
    assert curve.dtype == "float32" and curve.threads == torch.get_num_threads()
    trace = generate(tiny_llama, "It is", DecodeSettings(method="ar", max_new_tokens=4))
    assert len(trace.tokens) == 4


@pytest.fixture
def named(tiny_llama, monkeypatch, tmp_path):
    """The tiny model under a name (so its curve is cached) and a fresh cache folder."""
    monkeypatch.setenv("MEDUSA_PLAYGROUND_CACHE", str(tmp_path))
    calls = []

    def fake_measure(lm):
        calls.append(lm.name)
        return replace(STEEP, measured_at=f"call {len(calls)}")

    monkeypatch.setattr(cost_curve_module, "measure_cost_curve", fake_measure)
    lm = replace(tiny_llama, name="tiny-named", cost_curve=None)
    return lm, calls, tmp_path / "cost_curves" / f"{curve_key(lm)}.json"


def test_a_measured_curve_is_written_and_read_back(named):
    lm, calls, path = named
    first = cached_cost_curve(lm)
    assert path.is_file() and not path.with_name(path.name + ".tmp").exists()  # renamed into place
    assert CostCurve(**json.loads(path.read_text())) == first
    assert cached_cost_curve(lm) == first and calls == ["tiny-named"]  # read back, not measured
    assert cached_cost_curve(lm, remeasure=True).measured_at == "call 2"


@pytest.mark.parametrize("garbage", ["{not json", '{"sizes": [1]}', json.dumps({**STEEP.__dict__, "costs": ["x"] * 7})])
def test_a_corrupt_cache_file_is_ignored_and_measured_again(named, garbage):
    lm, calls, path = named
    path.parent.mkdir(parents=True)
    path.write_text(garbage)
    assert cached_cost_curve(lm).measured_at == "call 1"
    assert CostCurve(**json.loads(path.read_text())).measured_at == "call 1"


def test_the_cache_key_changes_with_what_changes_the_costs(named, monkeypatch):
    lm, _, _ = named
    assert curve_key(lm) == curve_key(replace(lm))
    assert curve_key(lm) != curve_key(replace(lm, name="other"))
    assert curve_key(lm) != curve_key(replace(lm, dtype=torch.bfloat16))
    before = curve_key(lm)
    monkeypatch.setattr(cost_curve_module, "CURVE_VERSION", cost_curve_module.CURVE_VERSION + 1)
    assert curve_key(lm) != before  # curves cached before a change of what they mean are measured again


@pytest.mark.parametrize("step_times, spread", [
    ((1.0, 1.02, 5.0), 0.02 / 1.02),  # one slow repeat: the other two agree, and the median is theirs
    ((1.0, 2.0, 4.0), 1.0 / 2.0),  # no two agree: the machine was busy throughout
])
def test_the_spread_says_how_well_most_repeats_of_a_size_agree(tiny_llama, monkeypatch, step_times, spread):
    # Warm-up (sizes 1, 4); three repeats in rotating order, (1, 4), (4, 1), (1, 4); then the
    # heads' drafting. The 4-token pass takes 2 s every time.
    first, second, third = step_times
    seconds = iter([9.0, 9.0, first, 2.0, 2.0, second, third, 2.0, 0.1, 0.1, 0.1])

    def fake_time(device, run):
        run()
        return next(seconds)

    monkeypatch.setattr(cost_curve_module, "_time", fake_time)
    curve = measure_cost_curve(tiny_llama, sizes=(1, 4), repeats=3)
    assert curve.step_seconds == sorted(step_times)[1] and curve.costs == [1.0, round(2.0 / curve.step_seconds, 4)]
    assert curve.spread == pytest.approx(spread, abs=1e-4)


def test_a_curve_measured_on_a_busy_machine_is_measured_again_and_not_cached(named, monkeypatch):
    lm, _, path = named
    curves = iter([replace(STEEP, spread=3.0, measured_at="busy"), replace(STEEP, spread=1.5, measured_at="less busy")])
    monkeypatch.setattr(cost_curve_module, "measure_cost_curve", lambda lm: next(curves))
    assert cached_cost_curve(lm).measured_at == "less busy"  # the quieter of the two is used
    assert not path.exists()
    quiet = replace(STEEP, spread=0.1, measured_at="quiet")
    monkeypatch.setattr(cost_curve_module, "measure_cost_curve", lambda lm: quiet)
    assert cached_cost_curve(lm).measured_at == "quiet" and path.is_file()  # the next load measures again


def test_a_curve_whose_repeats_agree_while_other_programs_held_cores_is_rough_too(named, monkeypatch):
    """A neighbour holding a core can slow every repeat alike: agreeing repeats do not prove quiet."""
    lm, _, path = named
    crowded = replace(STEEP, spread=0.02, other_cores=1.2, measured_at="crowded")
    curves = iter([crowded, replace(crowded, other_cores=0.8, measured_at="less crowded")])
    monkeypatch.setattr(cost_curve_module, "measure_cost_curve", lambda lm: next(curves))
    assert cached_cost_curve(lm).measured_at == "less crowded" and not path.exists()
    assert not cost_curve_module.is_rough(replace(STEEP, other_cores=0.1))


def test_the_curve_records_the_load_it_was_measured_under(tiny_llama, monkeypatch):
    from decoding import machine_load

    busy = iter(range(0, 10_000, 3))  # the kernel: 3 busy CPU seconds a tick, none of them ours
    monkeypatch.setattr(machine_load, "_busy_cpu_seconds", lambda: float(next(busy)))
    monkeypatch.setattr(machine_load, "_own_cpu_seconds", lambda: 0.0)
    curve = measure_cost_curve(tiny_llama, sizes=(1, 2), repeats=3)
    assert curve.other_cores is not None and curve.other_cores > 0 and cost_curve_module.is_rough(curve)


def test_a_noisy_curve_in_the_cache_is_measured_again(named):
    lm, calls, path = named
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**STEEP.__dict__, "spread": 2.0, "measured_at": "busy"}))
    assert cached_cost_curve(lm).measured_at == "call 1" and calls == ["tiny-named"]


def test_models_loaded_from_a_path_are_measured_not_cached(tiny_llama, monkeypatch, tmp_path):
    monkeypatch.setenv("MEDUSA_PLAYGROUND_CACHE", str(tmp_path))
    monkeypatch.setattr(cost_curve_module, "measure_cost_curve", lambda lm: STEEP)
    model_cost_curve(replace(tiny_llama, cost_curve=None))
    assert not (tmp_path / "cost_curves").exists()


def test_auto_tree_runs_on_measured_heads_and_falls_back_without_them(tiny_llama, monkeypatch):
    monkeypatch.setattr(cost_curve_module, "measure_cost_curve", lambda lm: FLAT)
    heads = medusa_part(tiny_llama).heads
    with_table = replace(with_heads(tiny_llama, heads, [[0.5, 0.2, 0.1]] * 4), cost_curve=None)
    trace = generate(with_table, "It is", DecodeSettings(max_new_tokens=8))
    assert trace.settings.tree.startswith("auto: optimal-") and trace.cost_curve == FLAT
    without = replace(with_heads(tiny_llama, heads, None), cost_curve=None)
    assert generate(without, "It is", DecodeSettings(max_new_tokens=8)).settings.tree == tiny_llama.default_tree


# ----- the dtype --------------------------------------------------------------------------------
def _stub_curves(monkeypatch, float32: CostCurve, bfloat16: CostCurve) -> None:
    """Every model counts as big enough to time, and each dtype measures the curve given."""
    import decoding.loading as loading

    monkeypatch.setattr(loading, "fits_in_caches", lambda model: False)
    monkeypatch.setattr(cost_curve_module, "cached_cost_curve",
                        lambda lm, remeasure=False: float32 if lm.dtype == torch.float32 else bfloat16)


# A steep float32 curve with a faster step, a flat bfloat16 one with a slower step (an AMX Xeon's
# shape): with heads that guess well, bfloat16's trees write faster; plain decoding is float32's.
FAST_STEP_STEEP = replace(STEEP, step_seconds=0.036)
SLOW_STEP_FLAT = replace(FLAT, step_seconds=0.044)


@pytest.fixture(scope="module")
def measured_heads(tiny_dirs, tmp_path_factory):
    """The tiny llama with heads that say how often each guess was right (as trained heads do)."""
    import shutil

    from decoding.assets import HEADS_CONFIG

    path = tmp_path_factory.mktemp("measured") / "llama"
    shutil.copytree(tiny_dirs["llama"], path)
    config = json.loads((path / HEADS_CONFIG).read_text())
    config["accuracy"] = [[0.6, 0.15, 0.05]] * config["num_heads"]
    (path / HEADS_CONFIG).write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(("float32", "bfloat16", "dtype"), [(FAST_STEP_STEEP, SLOW_STEP_FLAT, torch.bfloat16),
                                                            (FLAT, replace(STEEP, step_seconds=0.08), torch.float32)])
def test_auto_dtype_is_the_one_whose_best_lane_decodes_fastest(measured_heads, monkeypatch, float32, bfloat16, dtype):
    _stub_curves(monkeypatch, float32, bfloat16)
    lm = load_model(measured_heads, drafters=("medusa", "eagle"))
    assert medusa_part(lm).accuracy is not None
    assert lm.dtype == dtype and next(medusa_part(lm).heads.parameters()).dtype == dtype
    assert lm.gathered_attention == (dtype == torch.bfloat16)  # exact attention where it is needed
    assert "Medusa on auto: optimal-" in lm.dtype_reason and "writes a token every" in lm.dtype_reason
    assert lm.cost_curve is (float32 if dtype == torch.float32 else bfloat16)  # the chosen dtype's own curve
    trace = generate(lm, "It is", DecodeSettings(max_new_tokens=6, tree="cpu-12"))
    assert trace.dtype == str(dtype).removeprefix("torch.") and trace.dtype_reason == lm.dtype_reason


def test_without_heads_auto_dtype_is_the_faster_plain_step(tiny_dirs, monkeypatch):
    _stub_curves(monkeypatch, replace(FLAT, step_seconds=0.05), replace(FLAT, step_seconds=0.03))
    lm = load_model(str(tiny_dirs["llama"]), drafters=())
    assert lm.dtype == torch.bfloat16 and "plain decoding writes a token every 30.0 ms" in lm.dtype_reason


def test_the_choice_names_both_plain_steps_and_the_faster():
    def estimated(dtype, step, per_token, lane):
        return precision.DecodingEstimate(dtype, step, per_token, lane)

    estimates = {torch.float32: estimated(torch.float32, 0.036, 0.030, "Medusa on auto: optimal-4"),
                 torch.bfloat16: estimated(torch.bfloat16, 0.044, 0.025, "Medusa on auto: optimal-16")}
    original = precision.estimate
    try:
        precision.estimate = lambda lm: estimates[lm]
        dtype, reason = precision.choose_cpu_dtype({torch.float32: torch.float32, torch.bfloat16: torch.bfloat16})
    finally:
        precision.estimate = original
    assert dtype == torch.bfloat16
    assert reason == ("bfloat16: measured here, Medusa on auto: optimal-16 writes a token every 25.0 ms in bfloat16 "
                      "against 30.0 ms (Medusa on auto: optimal-4) in float32; plain decoding's step is 36.0 ms in "
                      "float32 and 44.0 ms in bfloat16, the fastest in float32")


@pytest.mark.parametrize("asked", ["float32", "bfloat16", torch.float32, torch.bfloat16])
def test_a_dtype_asked_for_is_not_measured(tiny_dirs, monkeypatch, asked):
    monkeypatch.setattr(precision, "estimate", lambda lm: pytest.fail("measured"))
    lm = load_model(str(tiny_dirs["llama"]), dtype=asked, drafters=("medusa", "eagle"))
    assert str(lm.dtype).removeprefix("torch.") == str(asked).removeprefix("torch.") and lm.dtype_reason == ""


def test_a_model_that_fits_the_caches_stays_float32_without_timing(tiny_dirs, monkeypatch):
    monkeypatch.setattr(precision, "estimate", lambda lm: pytest.fail("measured"))
    lm = load_model(str(tiny_dirs["llama"]), drafters=("medusa",))
    assert lm.dtype == torch.float32 and "caches" in lm.dtype_reason


def test_dtype_and_attention_names_are_checked():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) is None  # measured after loading
    with pytest.raises(DecodingError, match="unknown dtype"):
        resolve_dtype("float8", cpu)
    with pytest.raises(DecodingError, match="attention must be one of"):
        resolve_attention("flash", cpu, torch.float32)
    assert resolve_attention("auto", cpu, torch.float32) is None
    assert resolve_attention("auto", torch.device("cuda"), torch.bfloat16) is None


@pytest.fixture(scope="module")
def tiny_falcon(tmp_path_factory):
    """A Falcon: its layers call their own attention kernels, not a registered attention function."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from decoding.tiny import tiny_tokenizer

    config = AutoConfig.for_model("falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  vocab_size=320, max_position_embeddings=512, eos_token_id=0, bos_token_id=0)
    config.initializer_range = 0.25
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    path = tmp_path_factory.mktemp("falcon")
    model.save_pretrained(path)
    tiny_tokenizer(320).save_pretrained(path)
    return path


def test_a_model_whose_attention_cannot_be_gathered_stays_float32_or_says_why(tiny_falcon, monkeypatch, capsys):
    from decoding.cli import main

    _stub_curves(monkeypatch, FAST_STEP_STEEP, SLOW_STEP_FLAT)  # a model that can gather takes bfloat16 (above)
    lm = load_model(str(tiny_falcon), drafters=["prompt-lookup"])
    assert lm.dtype == torch.float32 and not lm.may_part_from_plain and "falcon" in lm.dtype_reason
    asked = load_model(str(tiny_falcon), dtype="bfloat16", drafters=["prompt-lookup"])
    assert not asked.gathered_attention and asked.may_part_from_plain and "falcon" in asked.dtype_reason
    with pytest.raises(DecodingError, match="falcon"):
        load_model(str(tiny_falcon), dtype="bfloat16", attention="gathered", drafters=["prompt-lookup"])
    argv = ["generate", "--model", str(tiny_falcon), "--prompt", "It is", "--max-new-tokens", "4",
            "--method", "prompt-lookup", "--dtype", "bfloat16"]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "falcon" in warnings[0]
