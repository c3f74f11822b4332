"""Every speedup counts against the fastest plain decoding measured in the same run: bench's and
the page's race through the same functions (decoding/baseline.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.race_views import lane_table
from decoding import DecodeSettings, load_model
from decoding.baseline import OWN, describe, fastest_plain, plain_rivals, rival_run
from decoding.bench import run_bench
from decoding.race import race
from decoding.stats import Timing, speedup


@pytest.fixture(scope="module")
def rival(tiny_dirs):
    """The tiny llama again, for plain decoding alone: a stand-in for another dtype's variant."""
    return load_model(str(tiny_dirs["llama"]), dtype="float32", attention="library", drafters=())


def test_a_big_model_on_a_cpu_has_a_rival_in_each_other_variant(tiny_dirs, monkeypatch):
    monkeypatch.setattr("decoding.precision.fits_in_caches", lambda model: False)
    path = str(tiny_dirs["llama"])
    float32 = load_model(path, dtype="float32", drafters=())
    assert {name: lm.dtype for name, lm in plain_rivals(float32).items()} == {"bfloat16": torch.bfloat16}
    exact = load_model(path, dtype="bfloat16", attention="gathered", drafters=())
    rivals = plain_rivals(exact)  # its own plain decoding runs the exact attention: the library's may be faster
    assert sorted(rivals) == ["bfloat16", "float32"] and not any(lm.gathered_attention for lm in rivals.values())
    assert describe(exact) == "plain decoding in bfloat16, exact attention"
    assert describe(rivals["float32"]) == "plain decoding in float32"


def test_a_model_that_fits_the_caches_has_no_rival(tiny_llama):
    assert plain_rivals(tiny_llama) == {}


def test_the_fastest_plain_decoding_is_the_one_with_most_tokens_a_second():
    slow, fast = Timing(tokens=10, rounds=10, seconds=2.0), Timing(tokens=10, rounds=10, seconds=1.0)
    assert fastest_plain({OWN: slow, "ar@bfloat16": fast}) == "ar@bfloat16"
    assert fastest_plain({OWN: fast, "ar@bfloat16": slow}) == OWN


def test_the_race_times_each_rival_in_every_heat_and_counts_against_the_fastest(tiny_llama, rival):
    lm = replace(tiny_llama, plain_rivals={"bfloat16": rival})
    frames = list(race(lm, "It is a truth", DecodeSettings(max_new_tokens=8), ["medusa"], races=3))
    measured = [f.measuring for f in frames if f.phase == "measuring"]
    assert measured.count(rival_run("bfloat16")) == 3 and measured.count("medusa") == 3
    result = frames[-1].result
    assert all(set(runs) == {rival_run("bfloat16")} for runs in result.rivals)
    timings = {name: Timing.of(result.plain_runs(i)[name] for i in range(3)) for name in (OWN, rival_run("bfloat16"))}
    assert result.baseline == fastest_plain(timings)
    base = [result.plain_runs(i)[result.baseline] for i in range(3)]
    assert result.speedups("medusa") == [speedup(Timing.of(plain), Timing.of(runs["medusa"]))
                                         for plain, runs in zip(base, result.races, strict=True)]
    assert result.baseline_name in lane_table(result)
    assert "timed beside it" in lane_table(result)


def test_bench_counts_against_the_fastest_plain_decoding_and_lists_the_others(tiny_llama, rival):
    report = run_bench(tiny_llama, ["It is", "It was"], DecodeSettings(max_new_tokens=6), ["default"],
                       progress=False, rivals={"bfloat16": rival})
    rates = {"plain decoding in float32 (own)": report["ar"]["tokens_per_second"],
             **{name: figures["tokens_per_second"] for name, figures in report["plain_rivals"].items()}}
    assert list(report["plain_rivals"]) == ["plain decoding in float32"]
    fastest = max(rates, key=rates.get)
    assert report["baseline"] == fastest.removesuffix(" (own)")
    lane = report["lanes"][0]
    assert lane["speedup"] == pytest.approx(lane["traced"]["tokens_per_second"] / max(rates.values()), rel=1e-6)



def test_whether_a_model_fits_the_caches_does_not_change_when_its_layers_are_packed(tiny_dirs, monkeypatch):
    from decoding import precision

    monkeypatch.setattr(precision, "MIN_TIMED_BYTES", 1)  # every model counts as big
    path = str(tiny_dirs["llama"])
    for lm in (load_model(path, dtype="float32", drafters=()), load_model(path, dtype="float32", pack_linear=False,
                                                                          drafters=()),
               load_model(path, dtype="bfloat16", attention="gathered", drafters=())):
        assert not precision.fits_in_caches(lm.model)
