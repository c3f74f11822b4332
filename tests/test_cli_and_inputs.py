"""The CLI and the Python API: clear messages for bad input, JSON output as documented."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from decoding import DecodeSettings, DecodingError, RoundTrace, RunSettings, RunTrace, generate, load_model
from decoding.cli import main
from decoding.drafters import check_settings
from decoding.medusa_modules import heads_count, medusa_part
from decoding.trace import RENAMED_ROUND_FIELDS

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("prompt, settings, message", [
    ("", {}, "prompt is empty"),
    ("   \n", {}, "prompt is empty"),
    ("word " * 600, {}, "shorten it"),
    ("hello", {"max_new_tokens": 0}, "from 1 to"),
    ("hello", {"max_new_tokens": 10**7}, "from 1 to"),
    ("hello", {"tree": [[0], [0, 0, 0]]}, "no parent"),
    ("hello", {"tree": "nope"}, "unknown tree"),
    ("hello", {"num_heads": 9}, "cannot use 9"),
    ("hello", {"acceptance": "magic"}, "acceptance must be"),
    ("hello", {"acceptance": "sample", "temperature": 0}, "temperature"),
])
def test_bad_input_is_a_clear_error(tiny_llama, prompt, settings, message):
    with pytest.raises(DecodingError, match=message):
        generate(tiny_llama, prompt, DecodeSettings(**settings))


def test_cli_generate_json(capsys, tiny_dirs):
    code, out, _ = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), "--prompt", "It is",
                           "--max-new-tokens", "12", "--tree", "[[0],[0,0],[1]]", "--json")
    assert code == 0
    data = json.loads(out)
    for key in ("tokens", "text", "rounds", "mean_accepted", "forward_passes", "tokens_per_second"):
        assert key in data
    assert len(data["tokens"]) == 12 and data["forward_passes"] == 1 + len(data["rounds"])
    assert RunTrace.from_dict(data).tokens == data["tokens"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "x", "--max-new-tokens", "-3"], "from 1 to"),
    (["--prompt", "x", "--tree", "[[0], [0, 5, 0]]"], "no parent"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, tiny_dirs, argv, message):
    code, out, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), *argv)
    assert code == 2 and message in err and "Traceback" not in err


def _without_tokenizer(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "no-tokenizer"
    shutil.copytree(model_dir, target)
    for path in target.glob("tokenizer*"):
        path.unlink()
    return target


@pytest.mark.parametrize("case", ["prompt not UTF-8", "no tokenizer", "no such device",
                                  "prompts .txt not UTF-8", "prompts .json not UTF-8"])
def test_cli_inputs_that_once_crashed_exit_2_with_one_line(capsys, tiny_dirs, tmp_path, case):
    """Each of these once ended in a traceback. Python keeps command-line bytes that are not UTF-8
    as lone surrogates, so "caf\udce9" is what `--prompt $'caf\xe9'` arrives as."""
    model, prompt, rest = str(tiny_dirs["llama"]), "It is", []
    if case == "prompt not UTF-8":
        prompt, message = "caf\udce9", "not valid UTF-8"
    elif case == "no tokenizer":
        model, message = str(_without_tokenizer(tiny_dirs["llama"], tmp_path)), "could not load a tokenizer"
    elif case == "no such device":
        import torch

        if torch.backends.mps.is_available():
            pytest.skip("this machine has an MPS device")
        rest, message = ["--device", "mps"], "no mps device"
    else:
        path = tmp_path / ("p.txt" if ".txt" in case else "p.json")
        path.write_bytes(b"caf\xe9\n" if ".txt" in case else b'["caf\xe9"]')
        code, _, err = run_cli(capsys, "bench", "--model", model, "--prompts", str(path))
        assert code == 2 and err.startswith("error: ") and "not UTF-8" in err and len(err.splitlines()) == 1
        return
    code, _, err = run_cli(capsys, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "2", *rest)
    last = err.strip().splitlines()[-1]  # loading may draw progress bars above it
    assert code == 2 and last.startswith("error: ") and message in last and "Traceback" not in err


def test_cli_unknown_model(capsys):
    code, _, err = run_cli(capsys, "generate", "--model", "/nowhere/model", "--prompt", "x")
    assert code == 2 and "unknown model" in err


def test_cli_malformed_tree_json(capsys, tiny_dirs):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(tiny_dirs["llama"]), "--prompt", "x", "--tree", "[[0],"])
    assert exit_info.value.code == 2
    assert "the tree JSON is malformed" in capsys.readouterr().err


def test_cli_bench_json(capsys, tiny_dirs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("It is a truth\nThe quick brown fox\n")
    code, out, _ = run_cli(capsys, "bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompts),
                           "--max-new-tokens", "16", "--tree", "chain-3", "cpu-12", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["identical"] is True and report["speedup"] > 0 and "trace_overhead" in report
    assert report["ar"]["tokens_per_second"] > 0 and report["lanes"][0]["traced"]["tokens_per_second"] > 0
    assert [row["tree"] for row in report["lanes"]] == ["chain-3", "cpu-12"]
    for row in report["lanes"]:  # a round's cost in plain steps, from untraced rounds
        assert row["round_cost"] == pytest.approx(
            row["untraced"]["seconds_per_round"] / report["ar"]["seconds_per_round"])
        # Its two parts are both measured, neither left at zero (their sum is the round by definition).
        assert 0 < row["verify_cost"] and 0 < row["rest_cost"]
        # The drafting is measured on its own, a part of the rest.
        assert 0 < row["draft_cost"] < row["rest_cost"]
    assert report["ar"]["tokens"] == 2 * 16 and report["ar"]["forward_passes"] == 2 * 16


def test_cli_bench_compares_with_transformers_generate(capsys, tiny_dirs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("It is a truth\nThe quick brown fox\n")
    code, out, _ = run_cli(capsys, "bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompts),
                           "--max-new-tokens", "12", "--tree", "chain-3", "--compare-generate", "--json")
    assert code == 0
    library = json.loads(out)["transformers_generate"]
    # The library wrote the same greedy tokens as our plain decoding, on the same inputs.
    assert library["identical"] is True and library["tokens"] == 2 * 12
    assert library["tokens_per_second"] > 0
    code, out, _ = run_cli(capsys, "bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompts),
                           "--max-new-tokens", "12", "--tree", "chain-3", "--compare-generate")
    assert "transformers' generate(do_sample=False)" in out and "same tokens: yes" in out


def test_cli_bench_races_every_drafter_against_transformers(capsys, tiny_dirs, tmp_path):
    """One table, a lane per drafter; the peer check runs the library's assisted generation and
    prompt lookup with the same draft model and lengths, and both write the same greedy tokens."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("It is a truth It is a truth\nThe quick brown fox\n")
    argv = ["bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompts), "--max-new-tokens", "12",
            "--tree", "chain-3", "--drafter", "medusa", "draft-model", "prompt-lookup", "--draft-tokens", "3",
            "--lookup-tokens", "5", "--compare-transformers"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert code == 0
    lanes = {row["drafter"]: row for row in json.loads(out)["lanes"]}
    assert [lanes[d]["label"] for d in lanes] == ["medusa chain-3", "draft-model chain-3", "prompt-lookup chain-5"]
    for drafter in ("draft-model", "prompt-lookup"):
        row = lanes[drafter]
        assert row["identical"] is True and row["speedup"] > 0 and row["untraced"]["forward_passes"] > 0
        assert row["transformers"]["identical"] is True and row["transformers"]["tokens"] == 2 * 12
    assert "transformers" not in lanes["medusa"]  # the library has no Medusa to compare with
    code, out, _ = run_cli(capsys, *argv)
    assert "draft-model chain-3" in out and "prompt-lookup chain-5" in out
    assert "transformers' assisted generation" in out and "transformers' prompt lookup" in out


def fake_run(method: str, tokens: int, seconds: float) -> RunTrace:
    """A finished run that wrote `tokens` tokens in `seconds`, one round per token."""
    settings = RunSettings(method=method, max_new_tokens=64, acceptance="sample", temperature=1.0, top_p=1.0,
                           epsilon=0.09, delta=0.3, seed=0, tree=None, num_heads=None)
    rounds = [RoundTrace(index=i, position=i, emitted_tokens=[7], emitted_texts=["x"], emitted_from_drafter=[False],
                         time_draft=0.0, time_verify=0.0, time_accept=0.0, t_end=0.0) for i in range(tokens - 1)]
    return RunTrace(model="m", device="cpu", dtype="float32", settings=settings, prompt="p", prompt_tokens=[1],
                    rounds=rounds, prefill_token=7, stop_reason="eos", total_time=seconds)


def test_bench_speedup_is_a_ratio_of_tokens_per_second(tiny_llama, monkeypatch):
    """Plain decoding writes 40 tokens in 2 s (20/s); Medusa stops at an end-of-text token after
    10 tokens in 0.25 s (40/s): 2x, not the 8x that total seconds would claim."""
    import decoding.bench
    import decoding.measure

    def fake_generate(lm, prompt, settings):
        return fake_run("ar", 40, 2.0) if settings.method == "ar" else fake_run("medusa", 10, 0.25)

    monkeypatch.setattr(decoding.measure, "generate", fake_generate)  # every timed run of bench's heats
    report = decoding.bench.run_bench(tiny_llama, ["p"], DecodeSettings(acceptance="sample"), ["chain-3"],
                                      progress=False)
    assert report["speedup"] == pytest.approx(2.0)


def test_bench_table_explains_differing_output_by_dtype():
    from decoding.bench import format_table

    row = {"label": "medusa optimal-8", "tree_size": 9, "speedup": 1.5, "mean_accepted": 2.5, "round_cost": 1.6,
           "verify_cost": 1.3, "rest_cost": 0.2, "draft_cost": 0.1, "trace_overhead": 0.04, "identical": True,
           "traced": {"tokens_per_second": 100.0, "forward_passes": 10}}
    report = {"model": "m", "device": "cpu", "dtype": "bfloat16", "attention": "library", "dtype_reason": "",
              "prompts": 1, "max_new_tokens": 8, "acceptance": "greedy",
              "ar": {"tokens_per_second": 80.0, "forward_passes": 8, "tokens": 8, "seconds_per_round": 0.003},
              "lanes": [row]}
    assert "nearly tie" not in format_table(report)
    row["identical"] = False
    assert "NO in bfloat16" in format_table(report) and "--attention gathered" in format_table(report)
    report["attention"] = "gathered"  # every pass rounds alike on a CPU: a difference is a bug
    assert "a bug" in format_table(report)
    report.update(dtype="float32", attention="library")
    assert "a bug" in format_table(report)


def test_cli_bench_reads_multiline_prompts_from_json(capsys, tiny_dirs, tmp_path):
    """Code prompts need newlines and indentation: a .json prompt file keeps them."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["def f(x):\n    return", "class A:\n    "]))
    code, out, _ = run_cli(capsys, "bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompts),
                           "--max-new-tokens", "8", "--tree", "chain-3", "--json")
    assert code == 0
    assert json.loads(out)["prompts"] == 2


def test_cli_bench_reads_several_prompt_files_in_turn(capsys, tiny_dirs, tmp_path):
    """`--prompts A B`: a model's example prompts and its bench prompts, one run over both."""
    lines, code_prompts = tmp_path / "a.txt", tmp_path / "b.json"
    lines.write_text("It is a truth\nThe quick brown fox\n")
    code_prompts.write_text(json.dumps(["def f(x):\n    return"]))
    code, out, _ = run_cli(capsys, "bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(lines),
                           str(code_prompts), "--max-new-tokens", "4", "--tree", "chain-3", "--json")
    assert code == 0
    assert json.loads(out)["prompts"] == 3


@pytest.mark.parametrize("name, content, message", [
    ("p.json", "[\"a\",", "is not valid JSON"),
    ("p.json", "{\"prompt\": \"a\"}", "JSON list of strings"),
    ("p.json", "[1, 2]", "JSON list of strings"),
    ("p.json", "[\"  \"]", "holds no prompts"),
    ("p.txt", "\n\n", "holds no prompts"),
    ("missing.txt", None, "cannot read prompts file"),
])
def test_cli_bad_prompt_files_are_a_clear_error(capsys, tiny_dirs, tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    code, _, err = run_cli(capsys, "bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(path))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_module_entry_point_runs_as_a_process(tiny_dirs):
    """`python -m decoding` itself, in a fresh process, as a user would run it."""
    result = subprocess.run(
        [sys.executable, "-m", "decoding", "generate", "--model", str(tiny_dirs["gpt2"]),
         "--prompt", "Hello", "--max-new-tokens", "8", "--method", "ar", "--json"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["tokens"]) == 8


def test_trace_json_round_trip(tiny_llama):
    trace = generate(tiny_llama, "It is a truth", DecodeSettings(max_new_tokens=20))
    again = RunTrace.from_json(trace.to_json())
    assert again == trace
    assert again.mean_accepted == trace.mean_accepted and again.text == trace.text
    # What the UI draws from comes straight from the trace: check it is self-consistent.
    assert trace.tree is not None and len(trace.tree.mask) == trace.tree.size
    for r in trace.rounds:
        assert len(r.node_tokens) == trace.tree.size
        accepted_guesses = [r.node_tokens[n] for n in r.accepted_nodes[1:]]
        assert r.emitted_tokens[: len(accepted_guesses)] == accepted_guesses[: len(r.emitted_tokens)]
        # Greedy: each accepted node's token is the base model's argmax at its parent.
        for node in r.accepted_nodes[1:]:
            parent = trace.tree.parents[node]
            assert r.node_tokens[node] == r.base_argmax_tokens[parent]


def test_a_trace_saved_under_the_old_field_names_still_reads(tiny_llama):
    trace = generate(tiny_llama, "It is a truth", DecodeSettings(max_new_tokens=12))
    saved = trace.to_dict()
    for rnd in saved["rounds"]:
        for old, new in RENAMED_ROUND_FIELDS.items():
            rnd[old] = rnd.pop(new)
    assert "heads_topk_tokens" in saved["rounds"][0] and "guesses" not in saved["rounds"][0]
    assert RunTrace.from_dict(saved) == trace


def test_plain_decoding_runs_on_a_model_without_heads(capsys, tiny_dirs, tmp_path):
    target = tmp_path / "no-heads"
    shutil.copytree(tiny_dirs["llama"], target)
    for name in ("medusa_heads.safetensors", "medusa_config.json"):
        (target / name).unlink()
    for method in ("ar", "prompt-lookup", "draft-model"):  # only Medusa needs heads
        code, out, _ = run_cli(capsys, "generate", "--model", str(target), "--prompt", "It is", "--method", method,
                               "--max-new-tokens", "6", "--json")
        assert code == 0 and len(json.loads(out)["tokens"]) == 6
    # Medusa itself still says what is missing.
    code, _, err = run_cli(capsys, "generate", "--model", str(target), "--prompt", "It is")
    assert code == 2 and "no Medusa heads found" in err


def test_a_model_loaded_without_heads_refuses_medusa_clearly(tiny_dirs):
    lm = load_model(str(tiny_dirs["gpt2"]), drafters=("eagle", "draft-model", "prompt-lookup"))
    assert medusa_part(lm) is None and heads_count(lm) == 0
    assert generate(lm, "It is", DecodeSettings(method="ar", max_new_tokens=3)).tokens
    with pytest.raises(DecodingError, match="without Medusa heads"):
        generate(lm, "It is", DecodeSettings(max_new_tokens=3))


@pytest.mark.parametrize("settings, message", [
    ({"temperature": "1"}, "temperature must be a number, not '1'"),
    ({"temperature": None}, "temperature must be a number, not None"),
    ({"top_p": "x"}, "top_p must be a number"),
    ({"epsilon": None}, "epsilon must be a number"),
    ({"delta": [0.3]}, "delta must be a number"),
    ({"seed": "3"}, "seed must be a whole number, not '3'"),
    ({"seed": 1.5}, "seed must be a whole number, not 1.5"),
    ({"seed": True}, "seed must be a whole number, not True"),
    ({"num_heads": 2.5}, "num_heads must be a whole number, not 2.5"),
    ({"num_heads": "2"}, "num_heads must be a whole number"),
    ({"max_new_tokens": None}, "max_new_tokens must be a whole number, not None"),
])
def test_settings_of_the_wrong_type_are_a_clear_error(settings, message):
    with pytest.raises(DecodingError, match=re.escape(message)):
        check_settings(DecodeSettings(**settings))


def test_numbers_of_any_numeric_type_are_taken_and_recorded_as_plain_ones(tiny_llama):
    numpy = pytest.importorskip("numpy")
    settings = DecodeSettings(max_new_tokens=numpy.int64(5), seed=numpy.uint32(7), temperature=numpy.float32(0.5),
                              num_heads=numpy.int8(2), acceptance="sample")
    trace = generate(tiny_llama, "It is", settings)
    assert len(trace.tokens) == 5 and trace.settings.seed == 7 and trace.settings.num_heads == 2
    assert RunTrace.from_json(trace.to_json()) == trace  # plain ints and floats: the JSON takes them


@pytest.mark.parametrize("prompt, message", [
    (123, "must be text (a str), not int"), (b"It is", "must be text (a str), not bytes"),
    (["It is"], "must be text (a str), not list"), (None, "must be text (a str), not NoneType"),
])
def test_a_prompt_that_is_not_text_is_named_so(tiny_llama, prompt, message):
    with pytest.raises(DecodingError, match=re.escape(message)):
        generate(tiny_llama, prompt, DecodeSettings(max_new_tokens=2))


def test_a_missing_model_or_settings_is_a_clear_error(tiny_llama):
    with pytest.raises(DecodingError, match="settings must be a DecodeSettings, not NoneType"):
        generate(tiny_llama, "It is", None)
    with pytest.raises(DecodingError, match="a model from load_model"):
        generate(None, "It is", DecodeSettings(max_new_tokens=2))


def test_load_model_takes_a_path_for_the_model_as_for_the_heads(tiny_dirs):
    lm = load_model(tiny_dirs["gpt2"], heads=tiny_dirs["gpt2"], self_test=False, drafters=("medusa", "eagle"))
    assert lm.name == str(tiny_dirs["gpt2"]) and medusa_part(lm) is not None


@pytest.mark.parametrize("seed", [str(2**70), "-1"])
def test_a_seed_out_of_range_is_a_clear_error(capsys, tiny_dirs, seed):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), "--prompt", "x",
                           "--acceptance", "sample", "--seed", seed)
    assert code == 2 and f"seed must be a whole number from 0 to {2**64 - 1}" in err and "Traceback" not in err


def test_help_does_not_import_torch():
    """`--help` must answer before the seconds it takes to import torch and transformers. (A
    command's own help lists its drafters' flags, which the drafters declare: it imports them.)"""
    probe = ("import sys\nfrom decoding.cli import main\n"
             "for argv in (['--help'], ['fetch', '--help']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_corpus_command_writes_the_split_train_heads_reads(capsys, tmp_path):
    source = tmp_path / "book.txt"
    source.write_text("\n\n".join(f"Paragraph {i} of a small book." for i in range(400)))
    code, out, _ = run_cli(capsys, "corpus", "--corpus", str(source), "--out", str(tmp_path / "corpus"))
    assert code == 0
    train, heldout = (tmp_path / "corpus" / "train.txt").read_text(), (tmp_path / "corpus" / "heldout.txt").read_text()
    assert "Paragraph 0 of" in train and "Paragraph 399 of" in heldout and "Paragraph 399" not in train


def test_peer_check_holds_the_library_to_our_draft_length(tiny_llama):
    """transformers reads the draft length from the assistant's own generation config and by
    default varies it; the peer check sets it there, held constant, for the call only."""
    from decoding.bench import assistant_settings, library_options

    options = library_options(tiny_llama, DecodeSettings(method="draft-model", draft_tokens=3))
    assistant = options["assistant_model"]
    before = assistant.generation_config.to_dict()
    with assistant_settings(assistant, options["assistant"]):
        config = assistant.generation_config
        assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule) == (3, "constant")
        assert not config.assistant_confidence_threshold  # never stops drafting early
    assert assistant.generation_config.to_dict() == before
    assert library_options(tiny_llama, DecodeSettings(method="draft-model", draft_top_k=2)) is None


def test_a_one_token_run_reports_no_mean_over_passes_it_did_not_make(capsys, tiny_dirs):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["llama"]), "--prompt", "It is",
                           "--max-new-tokens", "1")
    summary = err.strip().splitlines()[-1]
    assert code == 0 and "1 token in 1 pass," in summary and "mean" not in summary
