"""In bfloat16, greedy output of every drafter must still be plain decoding's, token for token.

bfloat16 logits are coarse, so near-ties are everywhere, and the library's attention sums a
T-token pass in another order than a one-token step: the verify pass then picks another token
than plain decoding would. Gathered attention (decoding/attention.py) gives each row the step's
own arithmetic. The oracle here is our own plain decoding in the same dtype and attention: that
is the text Medusa promises to reproduce. The models are initialised narrowly (near-ties), and
`test_the_library_attention_parts_in_bfloat16` shows the same tests fail without the fix.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, Gemma2Config

from decoding import DecodeSettings, DecodingError, generate, load_model
from decoding.drafters import DRAFTERS, available_drafters, drafter_class
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.drafters.eagle import NAME as EAGLE
from decoding.drafters.eagle import EaglePart
from decoding.drafters.mtp import NAME as MTP
from decoding.drafters.mtp import MTPPart
from decoding.eagle_layer import EagleConfig, EagleHead
from decoding.kv_cache import new_cache
from decoding.medusa_modules import HeadsConfig, MedusaHeads, few_rows_projection
from decoding.mtp_modules import MTPConfig, MTPModules
from decoding.passes import decode_one_token, run_model, tree_inputs
from decoding.tiny import tiny_config, tiny_tokenizer
from decoding.tree import Tree
from test_lossless import OracleHeads, trees, with_heads

VOCAB = 320
NEW_TOKENS = 32
# Narrow weights: the two best logits are often a bfloat16 rounding step apart.
INIT_STD = 0.05
PROMPTS = ["It is a truth universally", "The quick brown fox jumps over the lazy dog. The quick",
           "Medusa heads guess several tokens ahead", "a single man in possession of a good fortune"]
ARCHITECTURES = ("llama", "qwen2", "gpt2", "gemma2")


def _config(arch: str):
    if arch == "gemma2":  # sliding and full layers, attention logit soft-capping
        return Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16,
                            max_position_embeddings=512, eos_token_id=0, bos_token_id=0, pad_token_id=0)
    return tiny_config(arch, VOCAB)


def _save(arch: str, path) -> str:
    config = _config(arch)
    config.initializer_range = INIT_STD
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tiny_tokenizer(VOCAB).save_pretrained(path)
    hidden = config.get_text_config().hidden_size
    heads = MedusaHeads(HeadsConfig(4, 1, hidden, VOCAB))
    heads.init_from_lm_head(model.get_output_embeddings())
    heads.save(path)
    return str(path)


@pytest.fixture(scope="module")
def bf16_dirs(tmp_path_factory):
    return {arch: _save(arch, tmp_path_factory.mktemp(f"bf16-{arch}")) for arch in ARCHITECTURES}


def _load(path: str, attention: str):
    lm = load_model(path, device="cpu", dtype="bfloat16", attention=attention, drafters=("medusa", "eagle"))
    lm.parts[DRAFT_MODEL] = lm  # the model drafts for itself: long, mostly right chains, wrong at near-ties
    # An untrained EAGLE layer over the model, where its layers allow one (not gpt2's): its guesses
    # are right now and then, its trees vary.
    torch.manual_seed(0)
    with contextlib.suppress(DecodingError):
        eagle = EagleHead(EagleConfig(lm.model.config.get_text_config().hidden_size, VOCAB), lm.model)
        lm.parts[EAGLE] = EaglePart(eagle.to(lm.dtype).eval(), None, lm.model.get_output_embeddings())
    with contextlib.suppress(DecodingError):  # and two untrained MTP modules, likewise
        modules = MTPModules(MTPConfig(lm.model.config.get_text_config().hidden_size, VOCAB, depth=2), lm.model)
        lm.parts[MTP] = MTPPart(modules.to(lm.dtype).eval(), few_rows_projection(lm.model.get_output_embeddings()),
                                  None)
    return lm


@pytest.fixture(scope="module")
def gathered(bf16_dirs):
    return {arch: _load(path, "auto") for arch, path in bf16_dirs.items()}


@pytest.fixture(scope="module")
def library(bf16_dirs):
    return {arch: _load(path, "library") for arch, path in bf16_dirs.items()}


def plain(lm, prompt: str) -> list[int]:
    return generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS)).tokens


def oracle(lm, prompt: str, wrong_every: int) -> OracleHeads:
    """Heads that guess plain decoding's own continuation (and a wrong token now and then)."""
    prompt_ids = lm.tokenizer(prompt).input_ids
    sequence = prompt_ids + generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS + 6)).tokens
    with torch.no_grad():
        states = lm.model(torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0].float()
    futures = [sequence[t + 2: t + 6] for t in range(len(sequence))]
    return OracleHeads(states, futures, VOCAB, 4, wrong_every)


def speculative(lm, prompt: str, method: str, tree=None, wrong_every: int = 5) -> list[int]:
    if method != "medusa":
        return generate(lm, prompt, DecodeSettings(method=method, max_new_tokens=NEW_TOKENS, draft_tokens=6)).tokens
    return generate(with_heads(lm, oracle(lm, prompt, wrong_every)), prompt,
                    DecodeSettings(max_new_tokens=NEW_TOKENS, tree=tree)).tokens


def test_auto_attention_gathers_in_bfloat16_on_a_cpu(gathered, library):
    assert all(lm.gathered_attention and lm.dtype == torch.bfloat16 for lm in gathered.values())
    assert not any(lm.gathered_attention for lm in library.values())


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.sampled_from(PROMPTS), choices=trees(max_depth=4, max_rank=6, max_nodes=63),
       arch=st.sampled_from(ARCHITECTURES), wrong_every=st.integers(2, 9))
def test_medusa_in_bfloat16_writes_plain_decodings_text(gathered, prompt, choices, arch, wrong_every):
    lm = gathered[arch]
    assert speculative(lm, prompt, "medusa", choices, wrong_every) == plain(lm, prompt)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("method", [name for name in DRAFTERS if name != "medusa"])  # Medusa: the tests above
def test_every_drafter_in_bfloat16_writes_plain_decodings_text(gathered, arch, method):
    lm = gathered[arch]
    if method not in available_drafters(lm):
        pytest.skip(drafter_class(method).missing(lm))
    for prompt in PROMPTS:
        assert speculative(lm, prompt, method) == plain(lm, prompt)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_paper_tree_in_bfloat16_writes_plain_decodings_text(gathered, arch):
    lm = gathered[arch]
    for prompt in PROMPTS:
        assert speculative(lm, prompt, "medusa", "mc_sim_7b_63") == plain(lm, prompt)


def test_the_library_attention_parts_in_bfloat16(library):
    """The control: the same runs through the library's attention do part from plain decoding, so
    the tests above would fail without gathered attention."""
    parted = sum(speculative(lm, prompt, method, "mc_sim_7b_63") != plain(lm, prompt)
                 for lm in library.values() for prompt in PROMPTS for method in ("medusa", "draft-model"))
    assert parted >= 2


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_tree_node_gets_the_bits_of_a_step(gathered, arch):
    """Each node's logits in one verify pass equal, bit for bit, a step after its own path."""
    lm = gathered[arch]
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]], num_heads=3)
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, VOCAB, (21,), generator=generator).tolist()
    nodes = torch.randint(0, VOCAB, (tree.size,), generator=generator)
    cache = new_cache(lm.model.config, for_trees=True)
    run_model(lm, prefix, cache)
    mask, positions = tree_inputs(lm, tree, cache)
    with torch.inference_mode():
        tree_logits, _ = run_model(lm, nodes, cache, mask, positions)
    for node in range(tree.size):
        step_cache = new_cache(lm.model.config, for_trees=True)
        path = nodes[tree.path_to(node)].tolist()
        with torch.inference_mode():
            run_model(lm, prefix, step_cache)
            for token in path:
                logits = decode_one_token(lm, token, step_cache)
        assert torch.equal(tree_logits[node], logits), f"node {node}"
