"""Medusa greedy output must be token-for-token what plain greedy decoding writes.

Like minGPT's check of its GPT-2 against the reference, the reference here is the library's own
`model.generate(do_sample=False)`; we only claim to match it. Hypothesis varies the prompt, the
tree and the heads; the architectures are real transformers classes built from configs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding import DecodeSettings, generate
from decoding import medusa_modules as decoding_heads
from decoding.medusa_modules import HeadsConfig, MedusaHeads, medusa_part
from decoding.model import LoadedModel

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


def reference_greedy(lm, prompt: str, new_tokens: int) -> list[int]:
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    out = lm.model.generate(ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, ids.shape[1]:].tolist()


def with_heads(lm: LoadedModel, heads: MedusaHeads) -> LoadedModel:
    """The model with other heads: a copy, so the shared fixture keeps its own (and the copy
    computes its own draft projection for them)."""
    return decoding_heads.with_heads(lm, heads)


def random_heads(lm, seed: int, noise: float) -> MedusaHeads:
    """Heads initialised as the reference does (a copy of lm_head), then perturbed at random."""
    c = medusa_part(lm).heads.config
    heads = MedusaHeads(HeadsConfig(c.num_heads, c.num_layers, c.hidden_size, c.vocab_size))
    heads.init_from_lm_head(lm.model.get_output_embeddings())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(noise * torch.randn(p.shape, generator=generator))
    return heads.eval()


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, choices=trees(), head_seed=st.integers(0, 2**16), noise=st.sampled_from([0.0, 0.05, 0.5]),
       arch=st.sampled_from(["llama", "qwen2", "gpt2"]))
def test_medusa_greedy_equals_generate(tiny_models, prompt, choices, head_seed, noise, arch):
    lm = tiny_models[arch]
    trace = generate(with_heads(lm, random_heads(lm, head_seed, noise)), prompt,
                     DecodeSettings(max_new_tokens=NEW_TOKENS, tree=choices))
    assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)
    assert len(trace.tokens) == NEW_TOKENS and trace.stop_reason == "max_new_tokens"
    # Every round accepted a path of the tree and the output grew by exactly that much.
    for r in trace.rounds:
        assert r.accepted_nodes[0] == 0 and len(r.accepted_nodes) >= 1


def test_ar_baseline_equals_generate(tiny_models):
    for lm in tiny_models.values():
        trace = generate(lm, "It is a truth", DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS))
        assert trace.tokens == reference_greedy(lm, "It is a truth", NEW_TOKENS)
        assert trace.forward_passes == NEW_TOKENS and trace.mean_accepted == 1.0


class OracleHeads(torch.nn.Module):
    """Heads wired to the model: they look up the true greedy future of the nearest known state.

    Random heads are almost always wrong, which only exercises rejection. These are right most of
    the time — and wrong on purpose at every `wrong_every`-th position, where they put the true
    token at rank 1 instead of 0 — so long acceptances, runner-up acceptances and rejections
    all happen in one run.
    """

    def __init__(self, states: torch.Tensor, futures: list[list[int]], vocab: int, num_heads: int,
                 wrong_every: int) -> None:
        super().__init__()
        self.states, self.futures, self.wrong_every = states, futures, wrong_every
        self.config = HeadsConfig(num_heads, 0, states.shape[-1], vocab)
        self.num_heads = num_heads
        self.guess_vocab_size = vocab
        self.origin = "wired to the true future (a test oracle)"

    def token_ids(self, guesses: torch.Tensor) -> torch.Tensor:
        return guesses  # no draft vocabulary: a guess is a token id

    def forward(self, hidden: torch.Tensor, lm_head=None, num_heads: int | None = None,
                root_embedding: torch.Tensor | None = None) -> torch.Tensor:
        position = int((self.states - hidden).norm(dim=-1).argmin())
        count = num_heads or self.num_heads
        logits = torch.zeros(count, self.config.vocab_size)
        for k, token in enumerate(self.futures[position][:count]):
            logits[k, token] = 10.0
            if (position + k) % self.wrong_every == 0:
                logits[k, (token + 1) % self.config.vocab_size] = 20.0  # a wrong top-1 guess
        return logits


def oracle_heads(lm, prompt: str, num_heads: int, wrong_every: int) -> OracleHeads:
    prompt_ids = lm.tokenizer(prompt).input_ids
    sequence = prompt_ids + reference_greedy(lm, prompt, NEW_TOKENS + num_heads + 2)
    with torch.no_grad():
        hidden = lm.model(torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0]
    # Head k at position t guesses token t+1+k (k = 1..K): the lm_head already covers t+1.
    futures = [sequence[t + 2 : t + 2 + num_heads] for t in range(len(sequence))]
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    return OracleHeads(hidden, futures, vocab, num_heads, wrong_every)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "cpu-12", "chain-3"])
def test_lossless_with_heads_that_are_mostly_right(tiny_models, arch, tree):
    lm = tiny_models[arch]
    prompt = "It is a truth universally"
    trace = generate(with_heads(lm, oracle_heads(lm, prompt, num_heads=4, wrong_every=5)), prompt,
                     DecodeSettings(max_new_tokens=NEW_TOKENS, tree=tree))
    assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)
    lengths = [r.accepted_length for r in trace.rounds]
    depth = min(4, trace.tree and max(trace.tree.depths))
    assert max(lengths) == depth + 1  # whole paths accepted: every guess plus the bonus token
    assert trace.mean_accepted > 2.0
    if tree != "chain-3":  # only trees with runner-up nodes can accept a rank-1 guess
        ranks = {trace.tree.ranks[n] for r in trace.rounds for n in r.accepted_nodes[1:]}
        assert 1 in ranks
