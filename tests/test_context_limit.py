"""Near the end of the context, Medusa writes exactly what plain decoding writes, to the last token.

Plain decoding stops when no position is left. A Medusa round needs one position per tree level,
so near the limit it verifies only the levels that fit (the root alone at the very end) instead
of stopping early. Every tree the project ships is tried, on a model whose context is 64
positions; GPT-2's learned position table would fail loudly if a node were placed beyond it.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from decoding import TREE_PRESETS, DecodeSettings, generate, load_model
from decoding.assets import EMBEDDED_MODELS_DIR as MODELS_DIR
from decoding.medusa_modules import HeadsConfig, MedusaHeads
from decoding.tiny import TOKENIZER_TEXT, tiny_config, tiny_tokenizer

CONTEXT = 64
NUM_HEADS = 5  # the embedded models' trees are five levels deep


def shipped_trees() -> dict[str, list[list[int]]]:
    """The presets and every tree shipped with an embedded model, each distinct tree once."""
    trees = dict(TREE_PRESETS)
    for config in sorted(MODELS_DIR.glob("*/medusa_config.json")):
        for name, choices in json.loads(config.read_text())["trees"].items():
            trees.setdefault(f"{config.parent.name}/{name}", choices)
    distinct: dict[str, list[list[int]]] = {}
    for name, choices in trees.items():
        if choices not in distinct.values():
            distinct[name] = choices
    return distinct


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def short_context(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"short-{request.param}")
    config = tiny_config(request.param, 320)
    config.update({"n_positions" if request.param == "gpt2" else "max_position_embeddings": CONTEXT,
                   "initializer_range": 0.25})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tiny_tokenizer(320).save_pretrained(path)
    heads = MedusaHeads(HeadsConfig(NUM_HEADS, 1, 64, 320))
    heads.init_from_lm_head(model.get_output_embeddings())
    heads.save(path)
    return load_model(str(path))


def prompt_leaving(lm, room: int) -> str:
    """The longest start of the tokenizer's own text that leaves at least `room` positions."""
    words = TOKENIZER_TEXT.split()
    fits = [n for n in range(1, len(words) + 1)
            if len(lm.tokenizer(" ".join(words[:n])).input_ids) <= CONTEXT - room]
    return " ".join(words[: max(fits)])


@pytest.mark.parametrize("room", [10, 4, 1])
def test_medusa_writes_what_plain_decoding_writes_up_to_the_context_limit(short_context, room):
    lm = short_context
    assert lm.context_length == CONTEXT
    prompt = prompt_leaving(lm, room)
    prompt_tokens = len(lm.tokenizer(prompt).input_ids)
    assert 1 <= CONTEXT - prompt_tokens <= 10
    plain = generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=64))
    # Every position up to the last is filled: the prefill's token, then one per position left.
    assert plain.stop_reason == "context_limit" and len(plain.tokens) == CONTEXT - prompt_tokens + 1
    for name, choices in shipped_trees().items():
        medusa = generate(lm, prompt, DecodeSettings(max_new_tokens=64, tree=choices))
        assert medusa.tokens == plain.tokens, name
        assert medusa.stop_reason == "context_limit", name
