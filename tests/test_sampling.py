"""Speculative sampling over the tree keeps the base model's distribution; typical acceptance
follows its own rule and, as the negative control shows, does not keep the distribution.

The acceptance functions are tested directly, with many draws. A table plays the model: a row
of logits after every prefix. One draw is one round over a fixed tree of guesses, followed by a
plain draw from the table for whatever the round left: the first two tokens after the root are
then compared, by a chi-square test, with the joint distribution worked out from the table by
hand. One small end-to-end run checks the same through `generate`.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from decoding import DecodeSettings, Tree, generate
from decoding.acceptance import speculative_accept, typical_accept
from decoding.drafters import DRAFTERS
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.drafters.eagle import NAME as EAGLE
from decoding.drafters.eagle import EaglePart
from decoding.drafters.mtp import NAME as MTP
from decoding.drafters.mtp import MTPPart
from decoding.eagle_layer import EagleConfig, EagleHead
from decoding.medusa_modules import MEDUSA, HeadsConfig, MedusaHeads, MedusaPart
from decoding.model import LoadedModel
from decoding.mtp_modules import MTPConfig, MTPModules

VOCAB = 5
TEMPERATURE, TOP_P = 0.9, 0.9
DRAWS = 5000  # enough: a sampler that forgets to zero a rejected guess scores ~700, the bar ~32
# Two guesses for the token after the root, and guesses below them: likely and unlikely ones
# (their probabilities under LOGITS, from `nucleus`: node 1 0.88, node 2 0.12, node 3 0.90,
# node 4 0.10, node 5 0.34).
TREE = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0]], num_heads=2)
NODE_TOKENS = [0, 1, 0, 0, 4, 2]  # the root, then nodes 1..5 in the tree's order


def _table() -> dict[tuple[int, ...], list[float]]:
    """Logits after every prefix of up to two tokens (the root not counted)."""
    generator = torch.Generator().manual_seed(11)
    prefixes = [p for n in range(3) for p in itertools.product(range(VOCAB), repeat=n)]
    return {p: (1.5 * torch.randn(VOCAB, generator=generator)).tolist() for p in prefixes}


LOGITS = _table()


def nucleus(logits: list[float], temperature: float = TEMPERATURE, top_p: float = TOP_P) -> list[float]:
    """Softmax at `temperature`, then only the most likely tokens until their mass reaches top_p,
    renormalised. Written out here, independently of `acceptance.sampling_distribution`."""
    weights = [math.exp(x / temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]
    kept, mass = [], 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        if mass >= top_p:
            break
        kept.append(token)
        mass += probs[token]
    return [probs[t] / mass if t in kept else 0.0 for t in range(len(probs))]


def expected_joint() -> dict[tuple[int, int], float]:
    return {(a, b): nucleus(LOGITS[()])[a] * nucleus(LOGITS[(a,)])[b]
            for a in range(VOCAB) for b in range(VOCAB)}


def tree_logits() -> torch.Tensor:
    """What a verify pass over TREE gives: row i is the table's row after the tokens down to node i."""
    prefixes = [tuple(NODE_TOKENS[n] for n in TREE.path_to(node)[1:]) for node in range(TREE.size)]
    return torch.tensor([LOGITS[p] for p in prefixes])


def first_two_tokens(accept, logits: torch.Tensor, generator: torch.Generator) -> tuple[int, int]:
    """One round over TREE with `accept`, then, if it wrote only one token, one plain draw."""
    verdict = accept(TREE, NODE_TOKENS, logits, generator)
    written = [NODE_TOKENS[n] for n in verdict.accepted_nodes[1:]] + [verdict.next_token]
    if len(written) == 1:  # the next round would choose the second token: draw it from the table
        written.append(int(torch.multinomial(torch.tensor(nucleus(LOGITS[tuple(written)])), 1,
                                             generator=generator)))
    return written[0], written[1]


def chi2_critical(dof: int, z: float = 4.26) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 4.26 is a one-sided p of about 1e-5."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: dict, probs: dict, draws: int) -> tuple[float, int]:
    """Pearson's statistic over cells with an expected count of at least 5 (the rest pooled)."""
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, p in probs.items():
        expected, observed = draws * p, counts.get(cell, 0)
        if expected >= 5:
            stat += (observed - expected) ** 2 / expected
            dof += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + observed, pooled_exp + expected
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return stat, dof


def count_draws(accept) -> dict[tuple[int, int], int]:
    generator = torch.Generator().manual_seed(0)
    logits = tree_logits()
    counts: dict[tuple[int, int], int] = {}
    for _ in range(DRAWS):
        pair = first_two_tokens(accept, logits, generator)
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def test_the_tree_has_likely_and_unlikely_guesses():
    """Otherwise the test below would exercise only acceptance, or only rejection."""
    root = nucleus(LOGITS[()])
    guessed = [root[NODE_TOKENS[1]], root[NODE_TOKENS[2]]]
    assert max(guessed) > 0.3 and min(guessed) < 0.3


def test_speculative_sampling_keeps_the_distribution():
    def accept(tree, tokens, logits, generator):
        return speculative_accept(tree, tokens, logits, TEMPERATURE, TOP_P, generator)

    stat, dof = chi_square(count_draws(accept), expected_joint(), DRAWS)
    assert stat < chi2_critical(dof), f"chi2 {stat:.1f} with {dof} dof"


def test_typical_acceptance_fails_the_same_test():
    """Negative control: the test above has the power to catch a scheme that changes the output."""
    def accept(tree, tokens, logits, generator):
        return typical_accept(tree, tokens, logits, TEMPERATURE, 0.3, 0.9, generator)

    stat, dof = chi_square(count_draws(accept), expected_joint(), DRAWS)
    assert stat > chi2_critical(dof)


def test_typical_acceptance_rule_by_hand():
    """p(x) > min(epsilon, delta * exp(-H)), with the thresholds worked out by hand below."""
    tree = Tree.from_choices([[0], [1], [0, 0]], num_heads=2)
    probs = torch.tensor([[0.7, 0.2, 0.1, 1e-9], [0.97, 0.01, 0.01, 0.01], [0.9, 0.05, 0.05, 1e-9],
                          [0.25, 0.25, 0.25, 0.25]])
    logits = probs.log()
    generator = torch.Generator().manual_seed(0)
    # Root row: H = 0.802 nats, 0.3 * exp(-H) = 0.135 < epsilon 0.15, so the bar is 0.135.
    # Node 1's row: H = 0.168 nats, 0.3 * exp(-H) = 0.254, so the bar is epsilon, 0.15.
    # The root's children guess tokens 1 (p = 0.2, passes) and 2 (p = 0.1, fails); node 3, under
    # node 1, guesses token 3 (p = 0.01, fails).
    assert typical_accept(tree, [0, 1, 2, 3], logits, 1.0, 0.15, 0.3, generator).accepted_nodes == [0, 1]
    # Node 3 guessing token 0 (p = 0.97) passes, and the longer path wins.
    assert typical_accept(tree, [0, 1, 2, 0], logits, 1.0, 0.15, 0.3, generator).accepted_nodes == [0, 1, 3]
    # At epsilon 0.05 both children of the root pass (0.2 and 0.1 > 0.05); equally long paths go
    # to the higher log-probability: token 0 (p = 0.7) over token 2 (p = 0.1).
    flat = Tree.from_choices([[0], [1]], num_heads=1)
    assert typical_accept(flat, [0, 2, 0], logits[:3], 1.0, 0.05, 0.3, generator).accepted_nodes == [0, 2]


# ----- end to end, small: the same property through `generate` on a real (tiny) model -----
WORDS = ["a", "b", "c", "d", "e", "f"]
SAMPLES = 300


@pytest.fixture(scope="module")
def word_model() -> LoadedModel:
    """A 6-token model: small enough to work out its exact distribution over two tokens."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.08)
    model = LlamaForCausalLM(config).eval()
    heads = MedusaHeads(HeadsConfig(2, 1, 32, len(WORDS)))
    heads.init_from_lm_head(model.lm_head)  # guesses that are often, not always, right
    common = dict(tokenizer=tokenizer, device=torch.device("cpu"), dtype=torch.float32, context_length=64,
                  eos_token_ids=frozenset())
    # A draft model: another model of the same shape, whose argmax is sometimes the base's.
    draft = LoadedModel(name="words draft", model=LlamaForCausalLM(config).eval(), trees={},
                        default_tree="", **common)
    # An EAGLE layer, random: its guesses are right now and then, and its trees differ each round.
    eagle = EaglePart(EagleHead(EagleConfig(32, len(WORDS)), model).eval(), None, model.lm_head)
    # Multi-token prediction modules, random too: over six words a chain is often right.
    mtp = MTPPart(MTPModules(MTPConfig(32, len(WORDS), depth=2), model).eval(), model.lm_head, None)
    parts = {MEDUSA: MedusaPart(heads.eval(), None, model.lm_head), DRAFT_MODEL: draft, EAGLE: eagle, MTP: mtp}
    return LoadedModel(name="words", model=model, trees={"full": [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]},
                       default_tree="full", parts=parts, **common)


PROMPT = "a b c a b"  # it repeats itself, so prompt lookup has something to copy


@pytest.mark.parametrize(("method", "top_k"), [*((name, 1) for name in DRAFTERS), ("draft-model", 3)])
def test_speculative_sampling_end_to_end(word_model, method, top_k):
    """Token 1 comes from the prefill, token 2 from a round over the drafter's guesses: whatever
    drafts them, the pair has the base model's distribution."""
    prompt_ids = word_model.tokenizer(PROMPT).input_ids
    probs = {}
    with torch.no_grad():
        for pair in itertools.product(range(len(WORDS)), repeat=2):
            rows = word_model.model(torch.tensor([prompt_ids + list(pair)])).logits[0].tolist()
            probs[pair] = (nucleus(rows[len(prompt_ids) - 1])[pair[0]] * nucleus(rows[len(prompt_ids)])[pair[1]])
    counts: dict[tuple[int, ...], int] = {}
    guessed = 0
    for seed in range(SAMPLES):
        settings = DecodeSettings(method=method, draft_top_k=top_k, max_new_tokens=2, acceptance="sample",
                                  temperature=TEMPERATURE, top_p=TOP_P, seed=seed, detailed_trace=False,
                                  eagle_nodes=4, eagle_top_k=2)
        trace = generate(word_model, PROMPT, settings)
        pair = tuple(trace.tokens)
        counts[pair] = counts.get(pair, 0) + 1
        guessed += trace.rounds[0].emitted_from_drafter[0]
    # Not a vacuous pass: a good share of the second tokens were the drafter's guesses.
    assert guessed >= SAMPLES // 30, f"only {guessed} of {SAMPLES} second tokens were guesses"
    stat, dof = chi_square(counts, probs, SAMPLES)
    assert stat < chi2_critical(dof), f"chi2 {stat:.1f} with {dof} dof"
