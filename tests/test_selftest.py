"""Architectures that cannot verify a tree in one pass are refused, with the reason."""

from __future__ import annotations

import pytest
import torch
from transformers import BloomConfig, BloomForCausalLM, MambaConfig, MambaForCausalLM

from decoding import DecodingError, load_model
from decoding.model import LoadedModel
from decoding.selftest import check_tree_attention
from decoding.tiny import tiny_tokenizer


def test_tiny_models_pass_the_self_test(tiny_models):
    for lm in tiny_models.values():
        check_tree_attention(lm)  # raises if tree logits differ from linear decoding


def test_alibi_model_is_refused_at_load(tmp_path):
    config = BloomConfig(vocab_size=320, hidden_size=32, n_layer=2, n_head=4)
    BloomForCausalLM(config).save_pretrained(tmp_path)
    tiny_tokenizer(320).save_pretrained(tmp_path)
    with pytest.raises(DecodingError, match="ALiBi"):
        load_model(str(tmp_path))


def test_self_test_itself_catches_alibi(tiny_llama):
    """Bypass the load-time name check: the tree-vs-linear comparison alone must refuse Bloom."""
    torch.manual_seed(0)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=320, hidden_size=32, n_layer=2, n_head=4,
                                         initializer_range=0.3)).eval()
    lm = LoadedModel(
        name="tiny-bloom", model=bloom, tokenizer=tiny_llama.tokenizer,
        device=torch.device("cpu"), dtype=torch.float32, context_length=512, trees={},
        default_tree="cpu-12", eos_token_ids=frozenset(),
    )
    with pytest.raises(DecodingError, match="cannot use Medusa tree attention"):
        check_tree_attention(lm)


def test_broken_position_handling_is_caught(tiny_llama, monkeypatch):
    """A model that ignores position ids gives wrong tree logits; the self-test must notice."""
    forward = tiny_llama.model.forward

    def forward_without_positions(input_ids=None, attention_mask=None, position_ids=None, cache=None, **kwargs):
        return forward(input_ids=input_ids, attention_mask=attention_mask, cache=cache, **kwargs)

    monkeypatch.setattr(tiny_llama.model, "forward", forward_without_positions)
    with pytest.raises(DecodingError, match="position ids"):
        check_tree_attention(tiny_llama)


def test_a_recurrent_model_is_refused_with_the_reason(tmp_path):
    """Mamba keeps a running state, not a key/value row per token. It is refused for plain
    decoding too, and the reason given is the cache, not Medusa's trees."""
    MambaForCausalLM(MambaConfig(vocab_size=320, hidden_size=32, num_hidden_layers=2, state_size=8)).save_pretrained(
        tmp_path)
    tiny_tokenizer(320).save_pretrained(tmp_path)
    for with_heads in (True, False):  # as for Medusa, and as for `--method ar`
        with pytest.raises(DecodingError, match="linear_attention layers.*one key/value row per token") as refused:
            load_model(str(tmp_path), drafters=None if with_heads else ())
        assert "plain decoding included" in str(refused.value) and "Medusa" not in str(refused.value)


def test_an_engine_bug_is_not_blamed_on_the_architecture(tiny_llama, monkeypatch):
    """Only a real mismatch says "cannot use Medusa tree attention"; a bug here must surface as itself."""
    import decoding.selftest

    def broken_compaction(*args):
        raise IndexError("a bug in the engine")

    monkeypatch.setattr(decoding.selftest, "compact_cache", broken_compaction)
    with pytest.raises(IndexError, match="a bug in the engine"):
        check_tree_attention(tiny_llama)
