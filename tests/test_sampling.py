"""Speculative sampling over the tree keeps the base model's distribution; typical acceptance
follows its own rule (and, as the negative control shows, does not keep the distribution)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from decoding import DecodeSettings, Tree, generate
from decoding.acceptance import speculative_accept, typical_accept
from decoding.heads import HeadsConfig, MedusaHeads
from decoding.loading import MedusaModel

WORDS = ["a", "b", "c", "d", "e", "f"]
TEMPERATURE, TOP_P = 0.9, 0.95
SAMPLES = 1500
FIRST_TOKENS = 3  # token 1 comes from prefill; tokens 2 and 3 pass through the tree


def chi2_critical(dof: int, z: float = 4.26) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 4.26 is a one-sided p of about 1e-5."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.fixture(scope="module")
def word_model() -> MedusaModel:
    """A 6-token model: small enough to work out its exact joint distribution over 3 tokens."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.08)
    model = LlamaForCausalLM(config).eval()
    heads = MedusaHeads(HeadsConfig(2, 1, 32, len(WORDS)))
    heads.init_from_lm_head(model.lm_head)  # guesses that are often, not always, right
    return MedusaModel(
        name="words", model=model, tokenizer=tokenizer, heads=heads.eval(), device=torch.device("cpu"),
        dtype=torch.float32, context_length=64, trees={"full": [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]},
        default_tree="full", eos_token_ids=frozenset(),
    )


def exact_distribution(mm: MedusaModel, prompt_ids: list[int]) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) under plain sampling, from the model's own (temperature, top-p) distributions."""
    from decoding.acceptance import sampling_distribution

    probs: dict[tuple[int, ...], float] = {}
    with torch.no_grad():
        for seq in itertools.product(range(len(WORDS)), repeat=FIRST_TOKENS):
            ids = torch.tensor([prompt_ids + list(seq)])
            rows = sampling_distribution(mm.model(ids).logits[0], TEMPERATURE, TOP_P)
            p = 1.0
            for i, token in enumerate(seq):
                p *= rows[len(prompt_ids) - 1 + i, token].item()
            probs[seq] = p
    return probs


def empirical_counts(mm: MedusaModel, settings: DecodeSettings) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(SAMPLES):
        settings.seed = seed
        key = tuple(generate(mm, "a b c", settings).tokens[:FIRST_TOKENS])
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_square(counts, probs) -> tuple[float, int]:
    """Pearson's statistic over cells with an expected count of at least 5 (the rest pooled)."""
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, p in probs.items():
        expected, observed = SAMPLES * p, counts.get(cell, 0)
        if expected >= 5:
            stat += (observed - expected) ** 2 / expected
            dof += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + observed, pooled_exp + expected
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return stat, dof


def test_speculative_sampling_matches_plain_sampling(word_model):
    probs = exact_distribution(word_model, word_model.tokenizer("a b c").input_ids)
    settings = DecodeSettings(max_new_tokens=FIRST_TOKENS, acceptance="sample",
                              temperature=TEMPERATURE, top_p=TOP_P, detailed_trace=False)
    counts = empirical_counts(word_model, settings)
    stat, dof = chi_square(counts, probs)
    assert stat < chi2_critical(dof), f"chi2 {stat:.1f} with {dof} dof"


def test_typical_acceptance_fails_the_same_test(word_model):
    """Negative control: the test above has the power to catch a scheme that changes the output."""
    probs = exact_distribution(word_model, word_model.tokenizer("a b c").input_ids)
    settings = DecodeSettings(max_new_tokens=FIRST_TOKENS, acceptance="typical", temperature=TEMPERATURE,
                              top_p=TOP_P, epsilon=0.3, delta=0.9, detailed_trace=False)
    counts = empirical_counts(word_model, settings)
    stat, dof = chi_square(counts, probs)
    assert stat > chi2_critical(dof)


def test_speculative_accept_first_token_is_exact():
    """One verify step, many draws: the token after the root has exactly the root's distribution,
    whether or not it was among the guesses."""
    tree = Tree.from_choices([[0], [1], [0, 0]], num_heads=2)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0], [0.0, 3.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0] * 4])
    node_tokens = [0, 1, 0, 2]  # node 1 guesses token 1, node 2 token 0, node 3 (under 1) token 2
    generator = torch.Generator().manual_seed(0)
    draws = 20000
    counts = torch.zeros(4)
    for _ in range(draws):
        verdict = speculative_accept(tree, node_tokens, logits, 1.0, 1.0, generator)
        first = node_tokens[verdict.accepted_nodes[1]] if len(verdict.accepted_nodes) > 1 else verdict.next_token
        counts[first] += 1
    expected = torch.softmax(logits[0], dim=-1)
    assert torch.allclose(counts / draws, expected, atol=0.015)


def test_typical_acceptance_rule_by_hand():
    # Root row: p = [0.7, 0.2, 0.1, 0.0...]: entropy H; threshold = min(eps, delta * exp(-H)).
    tree = Tree.from_choices([[0], [1], [0, 0]], num_heads=2)
    probs = torch.tensor([[0.7, 0.2, 0.1, 1e-9], [0.97, 0.01, 0.01, 0.01], [0.9, 0.05, 0.05, 1e-9],
                          [0.25, 0.25, 0.25, 0.25]])
    logits = probs.log()
    entropy = -(probs * probs.log()).sum(-1)
    generator = torch.Generator().manual_seed(0)
    eps, delta = 0.15, 0.3
    bar_root = min(eps, delta * math.exp(-entropy[0].item()))
    bar_1 = min(eps, delta * math.exp(-entropy[1].item()))
    # Children of the root guess tokens 1 (p=0.2) and 2 (p=0.1); node 3 under node 1 guesses token 3.
    assert 0.2 > bar_root and not 0.1 > bar_root  # node 1 passes, node 2 fails
    verdict = typical_accept(tree, [0, 1, 2, 3], logits, 1.0, eps, delta, generator)
    assert not 0.01 > bar_1  # node 3's token 3 has p = 0.01 under node 1: it fails
    assert verdict.accepted_nodes == [0, 1]
    # Now make node 3 guess token 0 (p = 0.97): it passes and the longer path wins.
    verdict = typical_accept(tree, [0, 1, 2, 0], logits, 1.0, eps, delta, generator)
    assert verdict.accepted_nodes == [0, 1, 3]
    # Ties in length go to the higher summed log-probability: both children pass at eps = 0.05.
    flat = Tree.from_choices([[0], [1]], num_heads=1)
    verdict = typical_accept(flat, [0, 2, 0], logits[:3], 1.0, 0.05, delta, generator)
    assert verdict.accepted_nodes == [0, 2]  # p(token 0) = 0.7 beats p(token 2) = 0.1
