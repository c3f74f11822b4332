"""The last holes an outside battery found: each bad input gets the project's one-line error (or,
where the input is good, what the documentation promises), never a raw Python exception."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from decoding import DecodeSettings, DecodingError, RunTrace, generate, load_model
from decoding.cli import main
from decoding.drafters import DRAFTERS, available_drafters, check_settings, register
from decoding.drafters.draft_model import load_draft_model
from decoding.drafters.eagle import NAME as EAGLE
from decoding.eagle_layer import EAGLE_DIR, EagleConfig, EagleHead
from decoding.medusa_modules import HeadsConfig, MedusaHeads, heads_count
from decoding.prompts import read_prompts
from decoding.tiny import tiny_tokenizer

LONG_NUMBER = "1" + "0" * 5000  # past Python's 4300-digit limit for turning text into an int


# ----- 1. JSON that Python's own parser cannot turn into values -----

def test_a_prompts_file_holding_a_number_too_long_is_refused_in_one_line(capsys, tiny_dirs, tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(f'[{LONG_NUMBER}, "a prompt"]')
    with pytest.raises(DecodingError, match="a number of more than 4300 digits"):
        read_prompts(path)
    code = main(["bench", "--model", str(tiny_dirs["llama"]), "--prompts", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "more than 4300 digits" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text, message", [
    (LONG_NUMBER, "more than 4300 digits"),
    ('{"prompt_tokens": [' + LONG_NUMBER + "]}", "more than 4300 digits"),
    ("[" * 100_000, "nested too deeply"),
    ("{", "the JSON is malformed"),
    (None, "JSON text"),
])
def test_a_trace_that_cannot_be_read_as_json_is_refused(text, message):
    with pytest.raises(DecodingError, match=message):
        RunTrace.from_json(text)


def test_a_trace_whose_parts_have_the_wrong_shape_is_refused():
    trace = {"model": "m", "device": "cpu", "dtype": "float32", "settings": 5, "prompt": "", "prompt_tokens": []}
    with pytest.raises(DecodingError, match="not a trace"):
        RunTrace.from_dict(trace)
    with pytest.raises(DecodingError, match="not a trace"):
        RunTrace.from_dict({**trace, "settings": {}, "rounds": [{"no_such_field": 1}]})


# ----- 2. misuses of the public functions -----

@pytest.mark.parametrize("call, message", [
    (lambda lm: load_model(sources=["eagle"]), "sources must map drafter names"),
    (lambda lm: DecodeSettings(options=5), "options must be a dict"),
    (lambda lm: register(5), "register takes a Drafter subclass"),
    (lambda lm: register(type("Nameless", (DRAFTERS["prompt-lookup"],), {"name": ""})), "needs a name"),
    (lambda lm: check_settings(None), "settings must be a DecodeSettings"),
    (lambda lm: load_draft_model(lm, None), "draft model: a directory or a hub id"),
    (lambda lm: available_drafters(None), "a loaded model"),
])
def test_misuses_get_the_projects_error_naming_what_was_expected(tiny_llama, call, message):
    with pytest.raises(DecodingError, match=message):
        call(tiny_llama)


# ----- 3. sources["medusa"] replaces the shipped heads -----

def test_the_medusa_heads_named_in_sources_are_read_and_a_folder_without_them_refused(tiny_dirs, tiny_llama, tmp_path):
    folder = tiny_dirs["llama"]
    text = tiny_llama.model.config
    two = MedusaHeads(HeadsConfig(2, 1, text.hidden_size, text.vocab_size))
    two.init_from_lm_head(tiny_llama.model.get_output_embeddings())
    two.save(tmp_path / "two-heads")
    lm = load_model(folder, device="cpu", dtype="float32", sources={"medusa": str(tmp_path / "two-heads")})
    assert heads_count(lm) == 2 and heads_count(tiny_llama) == 4  # the entry's heads, not the shipped four
    assert set(lm.parts) == set(tiny_llama.parts)  # the other drafters' shipped parts stay
    (tmp_path / "empty").mkdir()
    with pytest.raises(DecodingError, match="no Medusa heads found in"):
        load_model(folder, device="cpu", dtype="float32", sources={"medusa": tmp_path / "empty"})
    with pytest.raises(DecodingError, match="Medusa heads .*not a directory"):
        load_model(folder, device="cpu", dtype="float32", sources={"medusa": str(tmp_path / "missing")})
    with pytest.raises(DecodingError, match="given twice"):
        load_model(folder, heads=folder, sources={"medusa": str(tmp_path / "two-heads")})


# ----- 4. a drafter option given as None takes its drafter's default -----

@pytest.mark.parametrize("method, setting", [pytest.param(name, s, id=s.name) for name, cls in DRAFTERS.items()
                                             for s in cls.settings])
def test_a_drafter_option_left_none_takes_its_default(method, setting):
    checked = check_settings(DecodeSettings(method=method, **{setting.name: None}))
    assert checked.options[setting.name] == setting.default


def test_a_draft_model_run_with_draft_tokens_none_runs_at_the_default_length(tiny_llama):
    unset = generate(tiny_llama, "It is", DecodeSettings(method="draft-model", max_new_tokens=8, draft_tokens=None))
    default = generate(tiny_llama, "It is", DecodeSettings(method="draft-model", max_new_tokens=8))
    assert unset.settings.draft_tokens == 4 and unset.tokens == default.tokens


# ----- 5. an EAGLE head for a saved Apertus model -----

def test_an_eagle_head_builds_for_a_saved_apertus_model_and_writes_plain_decodings_text(tmp_path):
    config = AutoConfig.for_model("apertus", vocab_size=320, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  max_position_embeddings=512, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 10000.0},
                                  eos_token_id=0, bos_token_id=0, pad_token_id=0, initializer_range=0.25)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(tmp_path)  # leaves the config's dtype as the name it wrote: "float32"
    tiny_tokenizer(320).save_pretrained(tmp_path)
    EagleHead(EagleConfig(64, 320), model).save(tmp_path / EAGLE_DIR)
    lm = load_model(tmp_path, device="cpu", dtype="float32", drafters=("eagle",))
    assert EAGLE in lm.parts
    drafted = generate(lm, "It is", DecodeSettings(method="eagle", max_new_tokens=12, eagle_nodes=8))
    assert drafted.tokens == generate(lm, "It is", DecodeSettings(method="ar", max_new_tokens=12)).tokens


def test_a_tree_with_a_five_thousand_digit_rank_is_refused_in_one_line():
    from decoding.tree import read_choices

    with pytest.raises(DecodingError, match="far too long to be a rank"):
        read_choices("[[" + "9" * 5000 + "]]")
