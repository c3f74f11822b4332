"""Sliding-window attention past the window: Medusa, plain decoding and `generate()` agree.

A 16-token window and prompts longer than it, so every round verifies its tree where each node
must not see the keys that fell out of *its own* window, and compaction must keep exactly the
rows the window still needs. Mistral slides in every layer; Gemma 2 and 3 mix sliding and full
layers, and take one tree mask per layer type.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, MistralConfig

from decoding import DecodeSettings, generate, load_model
from decoding.heads import HeadsConfig, MedusaHeads
from decoding.tiny import tiny_tokenizer
from test_lossless import oracle_heads, reference_greedy

WINDOW = 16
NEW_TOKENS = 48
VOCAB = 320
PROMPTS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "The quick brown fox jumps over the lazy dog. Medusa heads guess several tokens ahead",
]
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, sliding_window=WINDOW)
# Initialisations at which the output does depend on the window: with it left out of the tree mask,
# these very tests fail (Gemma's logits ignore old keys at Mistral's wider 0.25).
CONFIGS = {
    "mistral": lambda: MistralConfig(num_hidden_layers=2, initializer_range=0.25, **SIZES),
    "gemma2": lambda: Gemma2Config(num_hidden_layers=4, head_dim=16, initializer_range=0.15, **SIZES),
    "gemma3": lambda: Gemma3TextConfig(num_hidden_layers=4, head_dim=16, sliding_window_pattern=2,
                                       initializer_range=0.15, **SIZES),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def windowed(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[request.param]())
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tiny_tokenizer(VOCAB).save_pretrained(path)
    heads = MedusaHeads(HeadsConfig(4, 1, 64, VOCAB))
    heads.init_from_lm_head(model.get_output_embeddings())
    heads.save(path)
    return load_model(str(path))


def test_the_models_slide_and_the_prompts_pass_the_window(windowed):
    mixed = not isinstance(windowed.model.config, MistralConfig)
    expected = {"sliding_attention", "full_attention"} if mixed else {"sliding_attention"}
    assert set(windowed.layer_types) == expected
    assert windowed.context_length == 512  # the window is not a limit on the context
    for prompt in PROMPTS:
        assert len(windowed.tokenizer(prompt).input_ids) > WINDOW


@pytest.mark.parametrize("prompt", PROMPTS)
def test_plain_decoding_equals_generate_past_the_window(windowed, prompt):
    trace = generate(windowed, prompt, DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS))
    assert trace.tokens == reference_greedy(windowed, prompt, NEW_TOKENS)


@pytest.mark.parametrize("tree", ["cpu-12", "mc_sim_7b_63", [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0],
                                                             [0, 0, 0, 0], [2, 0], [0, 2], [1, 1], [0, 1, 0]]])
@pytest.mark.parametrize("heads", ["untrained", "mostly right"])
def test_medusa_equals_generate_past_the_window(windowed, tree, heads):
    prompt = PROMPTS[0]
    original = windowed.heads
    if heads == "mostly right":  # long accepted paths: rows kept across the window's edge
        windowed.heads = oracle_heads(windowed, prompt, num_heads=4, wrong_every=5)
    try:
        trace = generate(windowed, prompt, DecodeSettings(max_new_tokens=NEW_TOKENS, tree=tree))
    finally:
        windowed.heads = original
    assert trace.tokens == reference_greedy(windowed, prompt, NEW_TOKENS)
    if heads == "mostly right":
        assert trace.mean_accepted > 2.0
