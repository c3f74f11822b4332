"""Heads load to identical weights from every published layout; wrong layouts get a clear error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from decoding import DecodingError, load_model
from decoding.cli import main
from decoding.medusa_modules import HeadsConfig, MedusaHeads, TransposedLinear, heads_count, medusa_part
from test_lossless import with_heads

NUM_HEADS = 5  # the published v0.1 config says 2; the weights say 5, and the weights win


@pytest.fixture()
def reference_heads(tiny_llama):
    c = medusa_part(tiny_llama).heads.config
    heads = MedusaHeads(HeadsConfig(NUM_HEADS, 1, c.hidden_size, c.vocab_size))
    torch.manual_seed(7)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn_like(p))
    return heads


def published_state(heads: MedusaHeads) -> dict[str, torch.Tensor]:
    """The v0.1 key names: `{i}.0.linear.weight`, `{i}.0.linear.bias`, `{i}.1.weight`."""
    return {k.removeprefix("heads."): v.clone() for k, v in heads.state_dict().items()}


def assert_same_heads(loaded: MedusaHeads, expected: MedusaHeads) -> None:
    assert loaded.num_heads == expected.num_heads
    a, b = loaded.state_dict(), expected.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key].float(), b[key].float()), key


def write_v01(directory, heads, base_dir, suffix):
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "base_model_name_or_path": str(base_dir), "medusa_num_heads": 2, "medusa_num_layers": 1,
    }))
    state = published_state(heads)
    if suffix == ".pt":
        torch.save(state, directory / "medusa_lm_head.pt")
    else:
        save_file(state, str(directory / "medusa_lm_head.safetensors"))


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_v01_heads_directory(tmp_path, tiny_dirs, reference_heads, suffix):
    write_v01(tmp_path / "heads", reference_heads, tiny_dirs["llama"], suffix)
    lm = load_model(str(tmp_path / "heads"))
    assert_same_heads(medusa_part(lm).heads, reference_heads)
    assert heads_count(lm) == NUM_HEADS


def test_v01_heads_given_separately(tmp_path, tiny_dirs, reference_heads):
    write_v01(tmp_path / "heads", reference_heads, "unused", ".pt")
    lm = load_model(str(tiny_dirs["llama"]), heads=str(tmp_path / "heads"))
    assert_same_heads(medusa_part(lm).heads, reference_heads)


def test_v10_whole_model_layout(tmp_path, tiny_dirs, reference_heads):
    target = tmp_path / "v10"
    shutil.copytree(tiny_dirs["llama"], target)
    for name in ("medusa_heads.safetensors", "medusa_config.json"):
        (target / name).unlink()
    weights = target / "model.safetensors"
    state = load_file(str(weights))
    state.update({f"medusa_head.{k}": v for k, v in published_state(reference_heads).items()})
    save_file(state, str(weights), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config.update(medusa_num_heads=NUM_HEADS, medusa_num_layers=1)
    (target / "config.json").write_text(json.dumps(config))
    lm = load_model(str(target))
    assert_same_heads(medusa_part(lm).heads, reference_heads)


def test_shared_lm_head_variant(tmp_path, tiny_dirs, reference_heads):
    """"Version 2" heads have no projection of their own: they reuse the base lm_head."""
    state = {k: v for k, v in published_state(reference_heads).items() if ".linear." in k}
    (tmp_path / "heads").mkdir()
    save_file(state, str(tmp_path / "heads" / "medusa_lm_head.safetensors"))
    (tmp_path / "heads" / "config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_dirs["llama"])}))
    lm = load_model(str(tmp_path / "heads"))
    heads = medusa_part(lm).heads
    assert heads.config.shared_lm_head and heads_count(lm) == NUM_HEADS
    hidden = torch.randn(heads.config.hidden_size)
    lm_head = lm.model.get_output_embeddings()
    expected = lm_head(reference_heads.heads[2][0](hidden))
    torch.testing.assert_close(heads(hidden, lm_head=lm_head)[2], expected)


def test_own_layout_round_trip(tmp_path, reference_heads):
    reference_heads.save(tmp_path, extra={"trees": {"t": [[0]]}})
    loaded, meta = MedusaHeads.load(tmp_path)
    assert_same_heads(loaded, reference_heads)
    assert meta["trees"] == {"t": [[0]]}


def test_directory_without_heads_is_refused(tmp_path, tiny_dirs):
    target = tmp_path / "plain"
    shutil.copytree(tiny_dirs["llama"], target)
    (target / "medusa_heads.safetensors").unlink()
    (target / "medusa_config.json").unlink()
    with pytest.raises(DecodingError, match="no Medusa heads found"):
        load_model(str(target))


def test_wrong_key_layout_is_refused(tmp_path, tiny_dirs):
    (tmp_path / "heads").mkdir()
    save_file({"something.else": torch.zeros(2)}, str(tmp_path / "heads" / "medusa_lm_head.safetensors"))
    (tmp_path / "heads" / "config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_dirs["llama"])}))
    with pytest.raises(DecodingError, match="no Medusa head weights"):
        load_model(str(tmp_path / "heads"))


def test_heads_for_another_model_are_refused(tmp_path, tiny_dirs):
    heads = MedusaHeads(HeadsConfig(2, 1, 48, 320))
    heads.save(tmp_path)
    with pytest.raises(DecodingError, match="hidden size 48"):
        load_model(str(tiny_dirs["llama"]), heads=str(tmp_path))


def test_unknown_model_is_refused():
    with pytest.raises(DecodingError, match="unknown model"):
        load_model("/no/such/model/dir")
    with pytest.raises(DecodingError, match="could not fetch"):
        load_model("no-such-owner/no-such-model")  # offline here: the hub cannot be reached


@pytest.mark.parametrize("bias", [False, True])
def test_the_transposed_draft_projection_is_the_same_product(bias):
    linear = torch.nn.Linear(16, 50, bias=bias)
    x = torch.randn(3, 16)
    torch.testing.assert_close(TransposedLinear(linear)(x), linear(x))


# ----- broken or mismatched heads: one line from the command line, exit status 2 -----
def own_heads_copy(tmp_path, tiny_dirs):
    target = tmp_path / "model"
    shutil.copytree(tiny_dirs["llama"], target)
    return target


def cut_in_half(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def rewrite_config(path, change):
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def v01_heads(tmp_path, tiny_dirs, heads, suffix=".pt"):
    write_v01(tmp_path / "heads", heads, tiny_dirs["llama"], suffix)
    return tmp_path / "heads"


def random_heads(num_heads, hidden, vocab):
    return MedusaHeads(HeadsConfig(num_heads, 1, hidden, vocab))


BROKEN_HEADS = {
    "own weights truncated": lambda d: cut_in_half(d / "medusa_heads.safetensors"),
    "own weights empty": lambda d: (d / "medusa_heads.safetensors").write_bytes(b""),
    "own weights missing": lambda d: (d / "medusa_heads.safetensors").unlink(),
    "own config garbage": lambda d: (d / "medusa_config.json").write_text("{not json"),
    "own config not an object": lambda d: (d / "medusa_config.json").write_text("[1, 2]"),
    "own config without vocab_size": lambda d: rewrite_config(d / "medusa_config.json",
                                                              lambda c: c.pop("vocab_size")),
    "own config with a text num_heads": lambda d: rewrite_config(d / "medusa_config.json",
                                                                 lambda c: c.update(num_heads="four")),
    "own config and weights disagree": lambda d: rewrite_config(d / "medusa_config.json",
                                                                lambda c: c.update(num_heads=7)),
    "own trees not a mapping": lambda d: rewrite_config(d / "medusa_config.json", lambda c: c.update(trees=[1])),
}


@pytest.mark.parametrize("case", list(BROKEN_HEADS))
def test_broken_own_heads_exit_2_with_one_line(capsys, tmp_path, tiny_dirs, case):
    model = own_heads_copy(tmp_path, tiny_dirs)
    BROKEN_HEADS[case](model)
    assert_one_line_error(capsys, ["--model", str(model)])


@pytest.mark.parametrize("case", ["v0.1 .pt truncated", "v0.1 safetensors truncated", "v0.1 wrong hidden size",
                                  "v0.1 wrong vocabulary", "v0.1 without config.json", "v0.1 config garbage",
                                  "v0.1 .pt holding a list"])
def test_broken_v01_heads_exit_2_with_one_line(capsys, tmp_path, tiny_dirs, case):
    hidden, vocab = 64, 320  # the tiny llama's
    heads = {"v0.1 wrong hidden size": random_heads(3, 48, vocab),
             "v0.1 wrong vocabulary": random_heads(3, hidden, 300)}.get(case, random_heads(3, hidden, vocab))
    directory = v01_heads(tmp_path, tiny_dirs, heads, ".safetensors" if "safetensors" in case else ".pt")
    weights = next(directory.glob("medusa_lm_head.*"))
    if "truncated" in case:
        cut_in_half(weights)
    elif case == "v0.1 without config.json":
        (directory / "config.json").unlink()
    elif case == "v0.1 config garbage":
        (directory / "config.json").write_text("][")
    elif case == "v0.1 .pt holding a list":
        torch.save([1, 2, 3], weights)
    err = assert_one_line_error(capsys, ["--model", str(directory)])
    if "wrong" in case:
        assert "hidden size 48 and vocabulary 320" in err or "hidden size 64 and vocabulary 300" in err
    # The same heads given beside their base model are checked the same way.
    if case in ("v0.1 wrong hidden size", "v0.1 wrong vocabulary", "v0.1 .pt truncated"):
        assert_one_line_error(capsys, ["--model", str(tiny_dirs["llama"]), "--heads", str(directory)])


def test_missing_heads_directory_is_named(capsys, tiny_dirs):
    err = assert_one_line_error(capsys, ["--model", str(tiny_dirs["llama"]), "--heads", "/nonexistent"])
    assert "/nonexistent: no such directory" in err and "hub" not in err


def assert_one_line_error(capsys, argv: list[str]) -> str:
    code = main(["generate", "--prompt", "It is", "--max-new-tokens", "4", *argv])
    err = capsys.readouterr().err.strip()
    # Loading progress bars may come first; the error is one line, and the last.
    last = err.splitlines()[-1]
    assert code == 2 and "Traceback" not in err and last.startswith("error: "), err
    assert err.count("error: ") == 1, err
    return last


@pytest.mark.parametrize("gpu_gb, offered", [
    (24, {"medusa-vicuna-7b-v1.3", "medusa-1.0-vicuna-7b-v1.5", "medusa-1.0-zephyr-7b-beta"}),
    (40, {"medusa-vicuna-7b-v1.3", "medusa-1.0-vicuna-7b-v1.5", "medusa-1.0-zephyr-7b-beta",
          "medusa-vicuna-13b-v1.3"}),
    (80, {"medusa-vicuna-7b-v1.3", "medusa-1.0-vicuna-7b-v1.5", "medusa-1.0-zephyr-7b-beta",
          "medusa-vicuna-13b-v1.3", "medusa-vicuna-33b-v1.3"}),
])
def test_published_models_are_offered_where_their_weights_fit(monkeypatch, gpu_gb, offered):
    """A 24 GB GPU gets the 7B models, not the 13B (26 GB of weights) or the 33B (65 GB)."""
    from types import SimpleNamespace

    from decoding import MODEL_REGISTRY, available_models, embedded_models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=gpu_gb * 1e9))
    names = available_models()
    assert names[: len(embedded_models())] == embedded_models()
    assert set(names) & set(MODEL_REGISTRY) == offered


def test_the_draft_projection_follows_the_heads(tiny_llama):
    """It is cached per model; a copy with other heads computes its own, for its heads."""
    ours = medusa_part(tiny_llama).lm_head
    other = medusa_part(with_heads(tiny_llama, MedusaHeads(HeadsConfig(2, 1, 64, 320, shared_lm_head=True,
                                                                       draft_vocab_size=8))))
    assert "lm_head" not in vars(other)  # computed on first use, for these heads
    assert other.lm_head(torch.zeros(1, 64)).shape == (1, 8)  # the rows of its own draft vocabulary
    assert medusa_part(tiny_llama).lm_head is ours
