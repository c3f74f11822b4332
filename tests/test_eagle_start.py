"""A fresh EAGLE head starts where Medusa's heads start: its draft layer returns the text's feature."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from decoding.tiny import tiny_model
from decoding.training.eagle_start import new_eagle_head
from decoding.training.train_eagle import EagleTrainingSettings, Sequence


def _text(model, length: int = 24, layers: list[int] | None = None) -> Sequence:
    ids = torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        states = model(ids[None], output_hidden_states=True).hidden_states
    inputs = torch.cat([states[i][0] for i in layers], dim=-1) if layers else None
    return Sequence(ids, states[-1][0], answer_start=4, inputs=inputs)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("fused", [False, True])
def test_an_untrained_head_returns_the_feature_it_reads(arch, fused):
    model = tiny_model(arch).eval()
    layers = [1, 0, -1] if fused else None
    text = _text(model, layers=layers)
    head = new_eagle_head(model, [text], EagleTrainingSettings(draft_vocab_size=64), layers)
    n = len(text.tokens)
    embeddings = model.get_input_embeddings()(text.tokens)[None]
    mask = torch.zeros(1, 1, n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    with torch.no_grad():
        out = head(head.text_features(text.text_states)[None], embeddings, torch.arange(n)[None],
                   DynamicCache(config=head.layer_config), mask)[0]
    torch.testing.assert_close(out, text.features, rtol=0, atol=1e-6)


def test_a_random_start_is_not_the_identity_and_an_unknown_start_is_refused():
    model = tiny_model("llama").eval()
    text = _text(model)
    settings = EagleTrainingSettings(draft_vocab_size=64)
    head = new_eagle_head(model, [text], dataclasses.replace(settings, start="random"))
    hidden = model.config.hidden_size
    assert head.fc.weight.abs().sum() > 0 and not torch.equal(head.fc.weight[:, hidden:], torch.eye(hidden))
    with pytest.raises(ValueError, match="identity, random"):
        new_eagle_head(model, [text], dataclasses.replace(settings, start="medusa"))
