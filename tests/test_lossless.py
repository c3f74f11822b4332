"""Medusa greedy output must be token-for-token what plain greedy decoding writes.

Like minGPT's check of its GPT-2 against the reference, the reference here is the library's own
`model.generate(do_sample=False)`; we only claim to match it. Hypothesis varies the prompt, the
tree and the heads; the architectures are real transformers classes built from configs.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding import DecodeSettings, generate
from decoding.heads import HeadsConfig, MedusaHeads

NEW_TOKENS = 48

prompts = st.text(alphabet="abcdefghij klmnopqrstuvwxyz,.ABC", min_size=1, max_size=40).filter(str.strip)


@st.composite
def trees(draw, max_depth: int = 4, max_rank: int = 4, max_nodes: int = 24) -> list[list[int]]:
    """Random valid Medusa trees: random paths, closed under taking prefixes."""
    raw = draw(st.lists(
        st.lists(st.integers(0, max_rank - 1), min_size=1, max_size=max_depth),
        min_size=1, max_size=max_nodes,
    ))
    closed = {tuple(p[:i]) for p in raw for i in range(1, len(p) + 1)}
    return [list(p) for p in sorted(closed, key=lambda p: (len(p), p))]


def reference_greedy(mm, prompt: str, new_tokens: int) -> list[int]:
    ids = mm.tokenizer(prompt, return_tensors="pt").input_ids
    out = mm.model.generate(ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, ids.shape[1]:].tolist()


def random_heads(mm, seed: int, noise: float) -> MedusaHeads:
    """Heads initialised as the reference does (a copy of lm_head), then perturbed at random."""
    c = mm.heads.config
    heads = MedusaHeads(HeadsConfig(c.num_heads, c.num_layers, c.hidden_size, c.vocab_size))
    heads.init_from_lm_head(mm.model.get_output_embeddings())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(noise * torch.randn(p.shape, generator=generator))
    return heads.eval()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, choices=trees(), head_seed=st.integers(0, 2**16), noise=st.sampled_from([0.0, 0.05, 0.5]),
       arch=st.sampled_from(["llama", "qwen2", "gpt2"]))
def test_medusa_greedy_equals_generate(tiny_models, prompt, choices, head_seed, noise, arch):
    mm = tiny_models[arch]
    original = mm.heads
    mm.heads = random_heads(mm, head_seed, noise)
    try:
        trace = generate(mm, prompt, DecodeSettings(max_new_tokens=NEW_TOKENS, tree=choices))
    finally:
        mm.heads = original
    assert trace.tokens == reference_greedy(mm, prompt, NEW_TOKENS)
    assert len(trace.tokens) == NEW_TOKENS and trace.stop_reason == "max_new_tokens"
    # Every round accepted a path of the tree and the output grew by exactly that much.
    for r in trace.rounds:
        assert r.accepted_nodes[0] == 0 and len(r.accepted_nodes) >= 1


def test_ar_baseline_equals_generate(tiny_models):
    for mm in tiny_models.values():
        trace = generate(mm, "It is a truth", DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS))
        assert trace.tokens == reference_greedy(mm, "It is a truth", NEW_TOKENS)
        assert trace.forward_passes == NEW_TOKENS and trace.mean_accepted == 1.0
