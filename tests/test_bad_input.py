"""Bad input gets the project's own one-line error, never a traceback: what an outside battery of
bad CLI inputs and misuses of the public functions found."""

from __future__ import annotations

import json

import numpy
import pytest
import torch

from decoding import DecodeSettings, DecodingError, RunTrace, Tree, load_model
from decoding.attention import _plan_rows
from decoding.cli import main
from decoding.drafters import check_settings
from decoding.loops import autoregressive_decode, speculative_decode
from decoding.prompts import read_prompts

DEEP = "[" * 50_000 + "]" * 50_000


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_a_tree_nested_too_deep_is_refused_in_one_line(capsys, tiny_dirs):
    code, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), "--prompt", "x", "--tree", DEEP)
    assert code == 2 and "nested too deeply" in err and "Traceback" not in err


def test_a_prompts_file_nested_too_deep_is_refused(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(DEEP)
    with pytest.raises(DecodingError, match="nested too deeply"):
        read_prompts(path)
    (tmp_path / "p.txt").write_text("a\nb\n")
    assert read_prompts(str(tmp_path / "p.txt")) == ["a", "b"]  # a path given as text reads too
    with pytest.raises(DecodingError, match="a path"):
        read_prompts(3)


@pytest.mark.parametrize("values", [dict(temperature=1e-40), dict(top_p=1e-300), dict(temperature=float("nan"))])
@pytest.mark.parametrize("acceptance", ["sample", "typical"])
def test_sampling_numbers_too_small_to_sample_with_are_refused(values, acceptance):
    with pytest.raises(DecodingError, match="must be a number"):
        check_settings(DecodeSettings(acceptance=acceptance, **values))


@pytest.mark.parametrize("threads", ["100000", str(10**12), "0"])
def test_a_thread_count_past_the_cores_is_refused(capsys, tiny_dirs, threads):
    code, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), "--prompt", "x", "--threads", threads)
    assert code == 2 and "--threads must be from 1 to" in err


@pytest.mark.parametrize("decode", [autoregressive_decode, speculative_decode])
@pytest.mark.parametrize("tokens", [0, -1])
def test_each_decoder_refuses_no_tokens_to_write(tiny_llama, decode, tokens):
    with pytest.raises(DecodingError, match="max_new_tokens must be a whole number from 1"):
        next(decode(tiny_llama, "It is", DecodeSettings(max_new_tokens=tokens)))


@pytest.mark.parametrize("call, message", [
    (lambda: load_model(dtype=["float32"]), "unknown dtype"),
    (lambda: load_model(sources={"eagle": 123}), "a name, a directory or a hub id"),
    (lambda: load_model(drafters="eagle"), "a list of drafter names"),
    (lambda: Tree.from_choices([[0]], "4"), "num_heads must be a whole number"),
    (lambda: RunTrace.from_dict({}), "not a trace"),
    (lambda: RunTrace.from_dict([]), "a JSON object"),
    (lambda: check_settings(DecodeSettings(tree=numpy.array([[0]]))), "tree must be a name or a list of paths"),
])
def test_misuses_of_the_public_functions_get_the_projects_error(call, message):
    with pytest.raises(DecodingError, match=message):
        call()


def test_gathered_attention_leaves_a_row_that_sees_no_key_alone():
    visible = torch.tensor([[True, False, False], [False, False, False], [True, True, False]])
    plan = _plan_rows(visible)
    assert plan.blind_rows and plan.valid[1].sum() == 0 and plan.valid[[0, 2]].sum(-1).tolist() == [1, 2]


def test_a_seeded_auto_tree_run_says_which_tree_and_how_to_pin_it(capsys, tiny_dirs):
    code, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), "--prompt", "It is",
                        "--max-new-tokens", "4", "--acceptance", "sample", "--seed", "1")
    assert code == 0
    pinned = err.split("--tree '")[1].split("'")[0]
    assert isinstance(json.loads(pinned), list)
