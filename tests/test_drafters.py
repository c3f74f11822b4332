"""Every drafter behind one loop: greedy output equals plain decoding whatever is guessed, the
draft model's cache keeps in step with the text, and prompt lookup matches the way transformers'
own prompt lookup decoding does.

The lossless check follows test_lossless.py: the reference is the library's own
`generate(do_sample=False)`. Draft models are copies of the base model with noise added, so that
their guesses range from nearly always right to nearly always wrong.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from decoding import DecodeSettings, DecodingError, RunTrace, generate
from decoding.drafters import Drafter, check_settings
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.drafters.draft_model import load_draft_model
from decoding.drafters.prompt_lookup import copy_origins, find_continuation
from decoding.loading import load_model
from decoding.model import LoadedModel
from decoding.tiny import tiny_model

NEW_TOKENS = 40
prompts = st.text(alphabet="abcdefghij klmnop,.", min_size=1, max_size=40).filter(str.strip)


def reference_greedy(lm: LoadedModel, prompt: str, new_tokens: int) -> list[int]:
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    out = lm.model.generate(ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, ids.shape[1]:].tolist()


def noisy_draft(lm: LoadedModel, directory, noise: float, seed: int) -> LoadedModel:
    """The base model (read again from its directory) with noise on every weight, as a draft."""
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn(p.shape, generator=generator))
    return dataclasses.replace(lm, name="noisy draft", model=model, parts={}, _token_texts={})


def assert_guesses_are_the_drafts_own(lm: LoadedModel, trace: RunTrace, length: int) -> None:
    """Each round's greedy guesses are the draft model's own greedy continuation of the text so
    far, computed from scratch by transformers' `generate`: the cache it keeps never goes stale."""
    written = trace.prompt_tokens + [trace.prefill_token]
    for rnd in trace.rounds:
        ids = torch.tensor([written])
        draft = lm.parts[DRAFT_MODEL].model
        expected = draft.generate(ids, do_sample=False, max_new_tokens=length, min_new_tokens=length)
        assert [g[0] for g in rnd.guesses] == expected[0, ids.shape[1]:].tolist()
        written += rnd.emitted_tokens


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, arch=st.sampled_from(["llama", "qwen2", "gpt2"]), length=st.integers(1, 7),
       top_k=st.integers(1, 3), noise=st.sampled_from([0.0, 0.02, 0.3]), seed=st.integers(0, 2**16))
def test_draft_model_greedy_equals_generate(tiny_models, tiny_dirs, prompt, arch, length, top_k, noise, seed):
    lm = tiny_models[arch]
    run_mm = lm.with_part(DRAFT_MODEL, noisy_draft(lm, tiny_dirs[arch], noise, seed))
    trace = generate(run_mm, prompt, DecodeSettings(method="draft-model", draft_tokens=length, draft_top_k=top_k,
                                                    max_new_tokens=NEW_TOKENS))
    assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, arch=st.sampled_from(["llama", "qwen2", "gpt2"]), length=st.integers(1, 12),
       ngram=st.integers(1, 4), repeats=st.integers(1, 3))
def test_prompt_lookup_greedy_equals_generate(tiny_models, prompt, arch, length, ngram, repeats):
    lm = tiny_models[arch]
    prompt = " ".join([prompt] * repeats)  # a prompt that repeats itself gives lookup something to copy
    trace = generate(lm, prompt, DecodeSettings(method="prompt-lookup", lookup_tokens=length,
                                                lookup_ngram=ngram, max_new_tokens=NEW_TOKENS))
    assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)


def test_drafters_guess_and_get_accepted(tiny_llama, tiny_dirs):
    """A draft model that is the base model itself is always right: every guess is accepted."""
    exact = tiny_llama.with_part(DRAFT_MODEL, noisy_draft(tiny_llama, tiny_dirs["llama"], 0.0, 0))
    trace = generate(exact, "abc abc abc", DecodeSettings(method="draft-model", draft_tokens=3, max_new_tokens=33))
    assert trace.mean_accepted == 4.0
    assert all(r.draft_passes == 3 for r in trace.rounds)
    assert trace.tokens == reference_greedy(tiny_llama, "abc abc abc", 33)


@pytest.mark.parametrize("top_k", [1, 3])
def test_draft_model_cache_keeps_in_step(tiny_llama, tiny_dirs, top_k):
    """Each round's greedy guesses are exactly the draft model's own greedy continuation of the
    text so far, computed from scratch: the cache it keeps (cropped after rejections, and after a
    runner-up was taken instead of its greedy guess) never goes stale."""
    noisy = tiny_llama.with_part(DRAFT_MODEL, noisy_draft(tiny_llama, tiny_dirs["llama"], 0.05, 1))
    trace = generate(noisy, "the quick brown fox", DecodeSettings(method="draft-model", draft_tokens=4,
                                                                  draft_top_k=top_k, max_new_tokens=40))
    accepted = [len(r.accepted_nodes) - 1 for r in trace.rounds]
    assert 0 < sum(accepted) < 4 * len(trace.rounds), "the test needs both accepted and rejected guesses"
    if top_k > 1:
        runners_up = [n for r in trace.rounds for n in r.accepted_nodes if trace.tree.ranks[n] > 0]
        assert runners_up, "the test needs a round that took a runner-up"
    assert_guesses_are_the_drafts_own(noisy, trace, 4)


@pytest.mark.parametrize("stop", [None, 3])
@pytest.mark.parametrize("ngram", [1, 2, 3])
@pytest.mark.parametrize("seed", range(30))
def test_lookup_matches_transformers(ngram, seed, stop):
    """The same guesses as transformers' PromptLookupCandidateGenerator, on random token strings
    small enough in alphabet to repeat, with a stop token among them or without."""
    generator = torch.Generator().manual_seed(seed)
    length = int(torch.randint(2, 40, (1,), generator=generator))
    sequence = torch.randint(0, 4, (length,), generator=generator).tolist()
    theirs = PromptLookupCandidateGenerator(None if stop is None else torch.tensor([stop]), num_output_tokens=5,
                                            max_matching_ngram_size=ngram, max_length=1000)
    candidates, _ = theirs.get_candidates(torch.tensor([sequence]))
    expected = candidates[0, len(sequence):].tolist()
    stop_ids = frozenset() if stop is None else frozenset([stop])
    assert find_continuation(sequence, ngram, 5, stop_ids)[0] == expected


def test_draft_model_stops_guessing_at_an_end_of_text(tiny_llama, tiny_dirs):
    """Past a guessed end of text there is nothing to guess: the chain ends there."""
    plain = generate(tiny_llama, "abc", DecodeSettings(method="ar", max_new_tokens=8))
    first, second = plain.tokens[1], plain.tokens[2]
    assert first != second, "the test needs two different tokens"
    exact = noisy_draft(tiny_llama, tiny_dirs["llama"], 0.0, 0)
    draft = dataclasses.replace(exact, eos_token_ids=frozenset([second]))  # the base does not stop there
    run_mm = tiny_llama.with_part(DRAFT_MODEL, draft)
    trace = generate(run_mm, "abc", DecodeSettings(method="draft-model", draft_tokens=5, max_new_tokens=8))
    assert trace.rounds[0].draft_passes == 2 and trace.rounds[0].tree_size == 3
    assert trace.tokens == plain.tokens


def test_lookup_by_hand():
    # "1 2" occurred first at 0 followed by 3 4; the longest n-gram wins over a later 1-gram.
    assert find_continuation([1, 2, 3, 4, 2, 9, 1, 2], 2, 3) == ([3, 4, 2], 2)
    assert find_continuation([5, 6, 7], 2, 3) == ([], None)
    assert find_continuation([7, 8, 7], 3, 4) == ([8, 7], 1)  # only what was written can be copied
    assert find_continuation([1, 2, 0, 5, 1, 2], 2, 4, frozenset([5])) == ([0], 2)  # cut before a stop token
    assert find_continuation([1, 2, 5, 1, 2], 2, 4, frozenset([5])) == ([], None)


def test_trace_says_who_proposed_each_node(tiny_llama):
    trace = generate(tiny_llama, "abc abc abc abc", DecodeSettings(method="prompt-lookup", max_new_tokens=20))
    guessed = [r for r in trace.rounds if r.tree_size > 1]
    assert guessed, "a repeating prompt gives prompt lookup something to copy"
    for rnd in guessed:
        assert rnd.node_sources == ["base"] + ["prompt-lookup"] * (rnd.tree_size - 1)
        # The round says where it copied from, and its guesses are what the text holds there.
        start = int(re.search(r"from position (\d+)", rnd.drafting_note).group(1))
        text = trace.prompt_tokens + trace.tokens
        guesses = rnd.node_tokens[1:]
        assert 0 <= start < rnd.position and text[start:start + len(guesses)] == guesses
        assert rnd.node_origins == copy_origins(start, len(guesses))
        assert trace.round_tree(rnd).size == rnd.tree_size
    assert trace.drafter.name == "prompt-lookup" and trace.drafter.parameters == 0
    assert trace.tree.name == "chain-10"
    assert RunTrace.from_json(trace.to_json()) == trace


def test_draft_model_trace_reports_its_memory(tiny_llama):
    trace = generate(tiny_llama, "abc", DecodeSettings(method="draft-model", max_new_tokens=12))
    draft = tiny_llama.parts[DRAFT_MODEL].model
    assert trace.drafter.parameters == sum(p.numel() for p in draft.parameters())
    assert trace.drafter.weight_bytes == 4 * trace.drafter.parameters  # float32
    assert trace.drafter.cache_bytes > 0
    assert all(r.time_draft > 0 and r.draft_passes >= 1 for r in trace.rounds)
    assert RunTrace.from_json(trace.to_json()) == trace


def test_shipped_draft_is_loaded(tiny_dirs):
    lm = load_model(str(tiny_dirs["qwen2"]))
    draft = lm.parts[DRAFT_MODEL]
    assert draft.tokenizer is lm.tokenizer and draft.model.config.num_hidden_layers == 1
    assert DRAFT_MODEL not in load_model(str(tiny_dirs["qwen2"]), drafters=("medusa", "eagle")).parts


def test_draft_model_must_share_the_vocabulary(tiny_llama, tmp_path):
    tiny_model("llama", vocab_size=100).save_pretrained(tmp_path / "other")
    with pytest.raises(DecodingError, match="must share the base model's tokenizer"):
        load_draft_model(tiny_llama, tmp_path / "other")
    with pytest.raises(DecodingError, match="not a directory and not a hub id"):
        load_draft_model(tiny_llama, tmp_path / "missing")


def test_no_draft_model_is_a_clear_error(tiny_llama):
    bare = tiny_llama.with_part(DRAFT_MODEL, None)
    with pytest.raises(DecodingError, match="has no draft model"):
        generate(bare, "abc", DecodeSettings(method="draft-model"))


@pytest.mark.parametrize("field", ["draft_tokens", "lookup_tokens", "lookup_ngram"])
@pytest.mark.parametrize("value", [0, 65, 2.5, True])
def test_draft_limits_are_checked(field, value):
    with pytest.raises(DecodingError, match=field):
        check_settings(DecodeSettings(**{field: value}))


def test_draft_model_stops_guessing_past_its_context(tiny_llama):
    """A draft model that reads fewer positions than the base: past them, plain decoding steps."""
    short = dataclasses.replace(tiny_llama.parts[DRAFT_MODEL], context_length=24)
    run_mm = tiny_llama.with_part(DRAFT_MODEL, short)
    trace = generate(run_mm, "abc", DecodeSettings(method="draft-model", max_new_tokens=40))
    assert trace.tokens == reference_greedy(tiny_llama, "abc", 40)
    assert trace.rounds[-1].tree_size == 1 and trace.rounds[0].tree_size > 1


def test_available_drafters(tiny_llama):
    from decoding import available_drafters
    from decoding.drafters import DRAFTERS

    assert available_drafters(tiny_llama) == list(DRAFTERS)  # it carries heads, an EAGLE layer and a draft model
    bare = dataclasses.replace(tiny_llama, parts={})
    # Those that draft with something of their own are gone; those that read only text stay.
    loads_nothing = [name for name, cls in DRAFTERS.items() if cls.load.__func__ is Drafter.load.__func__]
    assert available_drafters(bare) == loads_nothing and len(loads_nothing) < len(DRAFTERS)
    assert "prompt-lookup" in available_drafters(bare)
