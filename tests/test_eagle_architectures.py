"""EAGLE on families whose layers differ from Llama's: rotary by layer type (Gemma 3, OLMo 3), partial
rotary and an older cache argument (GPT-NeoX), sliding windows (Mistral, Starcoder2, and the mixes of
Gemma 3 and OLMo 3, with a 16-token window that a 40-token run crosses).

Each tiny model gets a fused (EAGLE-3) head trained on its own text, so guesses are accepted and
rejected alike, and greedy EAGLE must write plain decoding's tokens in float32 and bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding import DecodeSettings, generate, load_model
from decoding.drafters.eagle import NAME as EAGLE
from decoding.drafters.eagle import EaglePart
from decoding.eagle_layer import EagleHead
from decoding.tiny import OTHER_ARCHITECTURES, make_tiny_model_dir
from tests.test_eagle import NEW_TOKENS, PROMPTS, train_tiny_eagle


@pytest.fixture(scope="module")
def eagles(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle-architectures")
    out = {}
    for arch in OTHER_ARCHITECTURES:
        folder = make_tiny_model_dir(root / arch, arch=arch)
        base = load_model(folder, device="cpu", dtype="float32", drafters=("eagle",), self_test=False)
        head, _ = train_tiny_eagle(base.model, base.tokenizer, epochs=40, fused=True)
        for dtype in ("float32", "bfloat16"):
            lm = load_model(folder, device="cpu", dtype=dtype, drafters=("eagle",))
            eagle = EagleHead(head.config, lm.model).to(lm.dtype).eval()
            eagle.load_state_dict(head.state_dict())
            lm.parts[EAGLE] = EaglePart(eagle, None, lm.model.get_output_embeddings())
            out[arch, dtype] = lm
    return out


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=st.sampled_from(OTHER_ARCHITECTURES), dtype=st.sampled_from(["float32", "bfloat16"]),
       prompt=st.sampled_from(PROMPTS), depth=st.integers(1, 6), nodes=st.one_of(st.none(), st.integers(1, 63)))
def test_eagle_writes_plain_decodings_text_in_every_family(eagles, arch, dtype, prompt, depth, nodes):
    lm = eagles[arch, dtype]
    drafted = generate(lm, prompt, DecodeSettings(method="eagle", max_new_tokens=NEW_TOKENS, eagle_depth=depth,
                                                  eagle_nodes=nodes))
    assert drafted.tokens == generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS)).tokens


@pytest.mark.parametrize("arch", OTHER_ARCHITECTURES)
def test_the_trained_heads_guesses_are_accepted(eagles, arch):
    """Not a vacuous identity: in every family the draft's guesses are often accepted."""
    lm = eagles[arch, "float32"]
    rounds = [r for p in PROMPTS for r in generate(lm, p, DecodeSettings(method="eagle", max_new_tokens=NEW_TOKENS,
                                                                         eagle_nodes=8)).rounds]
    accepted = sum(len(r.accepted_nodes) - 1 for r in rounds)
    assert accepted / len(rounds) > 0.5, f"{arch}: {accepted} guesses accepted in {len(rounds)} rounds"
    assert torch.is_tensor(lm.parts[EAGLE].head.fuse.weight)
