"""What protects a shared machine from one run: the page's limits, the memory estimate before any
pass, the time limit, and the CLI's warnings past the page's limits."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from app_helpers import carries
from decoding import DecodeSettings, DecodingError, generate
from decoding import memory as memory
from decoding.cli import main
from decoding.drafters import check_settings
from decoding.limits import PAGE_LIMITS, check_page_limits, max_new_tokens_problem, page_problems, tree_problem
from decoding.memory import run_memory_bytes

# SmolLM2-135M's shape: the default model of the page.
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
                          intermediate_size=1536, vocab_size=49152)


def wide_tree(paths: int) -> list[list[int]]:
    """`paths` distinct paths, two deep: 64 first-level guesses, then 64 under each."""
    first = [[i] for i in range(64)]
    second = [[i, j] for i in range(64) for j in range(64)]
    return (first + second)[:paths]


def test_a_ten_thousand_node_tree_is_estimated_at_gigabytes_and_the_papers_tree_at_megabytes():
    # The 10,000-node tree grew the server to 24 GB before the kernel killed it.
    huge = run_memory_bytes(SMOLLM2, tree_nodes=10_001, context=300, element_bytes=4)
    paper = run_memory_bytes(SMOLLM2, tree_nodes=64, context=300, element_bytes=4)
    assert huge > 15e9
    assert paper < 200e6


def test_the_page_limits_name_each_problem():
    assert page_problems("hi", 64, 63) == []
    assert page_problems("hi", 64, None) == []
    problems = page_problems("x" * 20_000, 10_000, 10_000)
    assert len(problems) == 3
    # Each names what was asked for and the page's limit.
    assert carries(problems[0], 20_000, PAGE_LIMITS.prompt_chars)
    assert carries(problems[1], 10_000, PAGE_LIMITS.max_new_tokens)
    assert carries(problems[2], 10_001, PAGE_LIMITS.tree_nodes)
    with pytest.raises(DecodingError, match="20,000"):
        check_page_limits("x" * 20_000, 8, None)


def test_a_run_that_would_not_fit_in_memory_is_refused_before_any_pass(tiny_llama, monkeypatch):
    monkeypatch.setattr(memory, "free_memory_bytes", lambda device: 1_000)
    with pytest.raises(DecodingError, match=r"would need about .* but cpu has .* free"):
        generate(tiny_llama, "hello", DecodeSettings(max_new_tokens=4))
    with pytest.raises(DecodingError, match="would need about"):
        generate(tiny_llama, "hello", DecodeSettings(method="ar", max_new_tokens=4))


def test_a_run_that_fits_is_not_refused(tiny_llama, monkeypatch):
    monkeypatch.setattr(memory, "free_memory_bytes", lambda device: 10**12)
    assert len(generate(tiny_llama, "hello", DecodeSettings(max_new_tokens=4)).tokens) == 4


@pytest.mark.parametrize("method", ["medusa", "ar"])
def test_a_run_stops_at_its_time_limit_with_what_it_wrote(tiny_llama, method):
    trace = generate(tiny_llama, "hello", DecodeSettings(method=method, max_new_tokens=64, time_limit=1e-9))
    assert trace.stop_reason == "time_limit"
    assert trace.rounds == [] and len(trace.tokens) == 1  # the prefill's token only
    unlimited = generate(tiny_llama, "hello", DecodeSettings(method=method, max_new_tokens=8))
    assert unlimited.stop_reason == "max_new_tokens"


def test_a_time_limit_must_be_positive():
    with pytest.raises(DecodingError, match="time_limit"):
        check_settings(DecodeSettings(time_limit=0))


def test_the_cli_runs_past_the_page_limits_but_warns(capsys, tiny_dirs):
    argv = ["generate", "--model", str(tiny_dirs["llama"]), "--prompt", "hello", "--json", "--max-new-tokens"]
    assert main([*argv, "3", "--tree", json.dumps(wide_tree(130))]) == 0
    out, err = capsys.readouterr()
    assert f"warning: {tree_problem(130)}" in err  # what the page would refuse, said
    assert len(json.loads(out)["tree"]["parents"]) == 131
    assert main([*argv, "300", "--method", "ar"]) == 0
    assert f"warning: {max_new_tokens_problem(300)}" in capsys.readouterr().err
    assert main([*argv, "3"]) == 0
    assert "warning" not in capsys.readouterr().err
