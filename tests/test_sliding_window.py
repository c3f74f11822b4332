"""Sliding-window attention past the window: Medusa, plain decoding and `generate()` agree.

A 16-token window and prompts longer than it, so every round verifies its tree where each node
must not see the keys that fell out of *its own* window, and compaction must keep exactly the
rows the window still needs. Mistral slides in every layer; Gemma 2 and 3 mix sliding and full
layers, and take one tree mask per layer type. A sliding-window model can be the draft model
too: its cache drops rejected guesses past the window.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, MistralConfig

from decoding import DecodeSettings, generate, load_model
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.drafters.draft_model import load_draft_model
from decoding.medusa_modules import HeadsConfig, MedusaHeads
from decoding.tiny import tiny_tokenizer
from test_drafters import assert_guesses_are_the_drafts_own
from test_lossless import oracle_heads, reference_greedy, with_heads

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
    model = windowed
    if heads == "mostly right":  # long accepted paths: rows kept across the window's edge
        model = with_heads(windowed, oracle_heads(windowed, prompt, num_heads=4, wrong_every=5))
    trace = generate(model, prompt, DecodeSettings(max_new_tokens=NEW_TOKENS, tree=tree))
    assert trace.tokens == reference_greedy(windowed, prompt, NEW_TOKENS)
    if heads == "mostly right":
        assert trace.mean_accepted > 2.0


@pytest.fixture(scope="module")
def mistral_drafting(tiny_llama, tmp_path_factory):
    """The tiny Llama with a draft model that is the same weights in a Mistral with a 16-token
    window: it guesses right while the text fits its window and goes wrong past it."""
    text = tiny_llama.model.config
    config = MistralConfig(num_hidden_layers=text.num_hidden_layers, vocab_size=text.vocab_size,
                           hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
                           num_attention_heads=text.num_attention_heads,
                           num_key_value_heads=text.num_key_value_heads,
                           max_position_embeddings=text.max_position_embeddings, sliding_window=WINDOW)
    draft = AutoModelForCausalLM.from_config(config)
    draft.load_state_dict(tiny_llama.model.state_dict())
    path = tmp_path_factory.mktemp("mistral-draft")
    draft.save_pretrained(path)
    return tiny_llama.with_part(DRAFT_MODEL, load_draft_model(tiny_llama, path))


@pytest.mark.parametrize("prompt", ["abc abc", "the quick brown fox"])  # the window fills in the run
def test_a_sliding_window_draft_model_keeps_in_step_past_the_window(mistral_drafting, prompt):
    """Greedy output is plain decoding's, and each round's guesses are the draft model's own
    greedy continuation computed from scratch: its cache, cropped after every rejection, never
    goes stale, before the window fills or after."""
    settings = DecodeSettings(method="draft-model", draft_tokens=4, max_new_tokens=NEW_TOKENS)
    trace = generate(mistral_drafting, prompt, settings)
    assert trace.tokens == reference_greedy(mistral_drafting, prompt, NEW_TOKENS)
    assert any(len(r.accepted_nodes) < 5 for r in trace.rounds), "the test needs rejected guesses"
    assert_guesses_are_the_drafts_own(mistral_drafting, trace, 4)
