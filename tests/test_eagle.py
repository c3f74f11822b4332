"""EAGLE: the draft layer, its dynamic tree, its cache kept in step, training it, its checkpoints.

Whatever the draft guesses, greedy EAGLE must write plain decoding's text. To make that test bite,
the tiny models get an EAGLE head *trained* here on their own greedy text (a second or two), so a
good share of its guesses are accepted and rejected alike; a random head would be rejected almost
always, and an identity test over it would prove little.
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from decoding import DecodeSettings, generate, load_model
from decoding.drafters import check_settings
from decoding.drafters.eagle import NAME as EAGLE
from decoding.drafters.eagle import EaglePart
from decoding.dynamic_tree import DraftTree, best_prefix, best_size, least_added_costs, rerank, verified_tree
from decoding.eagle_layer import EagleConfig, EagleHead, load_own, load_published
from decoding.errors import DecodingError
from decoding.kv_cache import new_cache
from decoding.medusa_modules import vocabulary_rows
from decoding.tiny import tiny_model
from decoding.trace import CostCurve
from decoding.training.train_eagle import (
    CHECKPOINT,
    EagleTrainingSettings,
    Sequence,
    batch_loss,
    chosen_targets,
    draft_rows,
    evaluate_eagle,
    fit_eagle,
    pack,
    unrolled_outputs,
)
from tests.test_lossless import reference_greedy

PROMPTS = ["It is a truth universally", "The quick brown fox jumps", "Medusa heads guess several",
           "a single man in possession of", "one forward pass checks them all"]
NEW_TOKENS = 40


# ----- a tiny EAGLE head trained on the tiny model's own text -----
# EAGLE-3's fused head on the 2-layer tiny models reads the inputs of layers 1 and 0 and the final state.
FUSED_LAYERS = [1, 0, -1]


@torch.no_grad()
def own_text(model, tokenizer, prompts: list[str], length: int, layers: list[int] | None = None) -> list[Sequence]:
    """The model's greedy continuations of `prompts`, with its states at every position (with
    `layers`, those layers' states side by side too, for a fused head)."""
    out = []
    for prompt in prompts:
        prompt_ids = torch.tensor(tokenizer(prompt).input_ids)
        ids = model.generate(prompt_ids[None], do_sample=False, max_new_tokens=length, min_new_tokens=length)[0]
        states = model(ids[None], output_hidden_states=True).hidden_states
        inputs = torch.cat([states[i][0] for i in layers], dim=-1) if layers else None
        out.append(Sequence(ids, states[-1][0].float(), answer_start=len(prompt_ids), inputs=inputs))
    return out


def train_tiny_eagle(model, tokenizer, epochs: int = 60, fused: bool = False) -> tuple[EagleHead, list[Sequence]]:
    """A head that has learnt the model's continuations of PROMPTS: a random model's next token
    follows no pattern a small draft could generalise from, but it can be learnt by heart, and
    that is all the identity tests need: guesses that are often, not always, right."""
    layers = FUSED_LAYERS if fused else None
    text = own_text(model, tokenizer, PROMPTS, NEW_TOKENS + 8, layers)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(model.config.hidden_size, model.config.vocab_size, feature_layers=layers), model)
    fit_eagle(head, model, text, text, EagleTrainingSettings(epochs=epochs, lr=3e-3, batch_tokens=512, unroll=3,
                                                            warmup_steps=5, patience=epochs, noise=0.0,
                                                            feature_weight=0.0 if fused else 1.0))
    return head.eval(), text


@pytest.fixture(scope="module")
def trained(tiny_dirs):
    """Tiny Llama and Qwen2 models in float32 and bfloat16, each with a trained EAGLE head; the
    Llama also with a fused EAGLE-3 head ("llama-fused")."""
    out = {}
    for arch, fused in (("llama", False), ("qwen2", False), ("llama-fused", True)):
        folder = tiny_dirs[arch.removesuffix("-fused")]
        base = load_model(folder, device="cpu", dtype="float32", drafters=("medusa", "eagle"), self_test=False)
        head, _ = train_tiny_eagle(base.model, base.tokenizer, fused=fused)
        for dtype in ("float32", "bfloat16"):
            lm = load_model(folder, device="cpu", dtype=dtype, drafters=("medusa", "eagle"), self_test=False)
            eagle = EagleHead(head.config, lm.model).to(lm.dtype).eval()
            eagle.load_state_dict(head.state_dict())
            lm.parts[EAGLE] = EaglePart(eagle, None, lm.model.get_output_embeddings())
            out[arch, dtype] = lm
    return out


def plain(lm, prompt: str) -> list[int]:
    return generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS)).tokens


@pytest.mark.parametrize("fused", [False, True])
def test_training_teaches_the_draft_what_comes_next(tiny_llama, fused):
    """Before training the draft's guesses are chance (1/320); after, most are right, at the
    second level too, where it reads its own guessed feature (the training-time test at work)."""
    model = tiny_llama.model
    torch.manual_seed(0)
    config = EagleConfig(model.config.hidden_size, model.config.vocab_size,
                         feature_layers=FUSED_LAYERS if fused else None)
    untrained = EagleHead(config, model).eval()
    head, text = train_tiny_eagle(model, tiny_llama.tokenizer, fused=fused)
    rows, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    before = evaluate_eagle(untrained, rows, embedding, text, depth=3)
    after = evaluate_eagle(head, rows, embedding, text, depth=3)
    assert before.top1[0] < 0.05
    assert after.top1[0] > 0.5 and after.acceptance[1] > 0.3 and after.chain_tokens_per_pass > 1.5


@settings(max_examples=18, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=st.sampled_from(["llama", "qwen2", "llama-fused"]), dtype=st.sampled_from(["float32", "bfloat16"]),
       prompt=st.sampled_from(PROMPTS), depth=st.integers(1, 8), top_k=st.integers(1, 10),
       nodes=st.one_of(st.none(), st.integers(1, 63)))
def test_eagle_writes_plain_decodings_text(trained, arch, dtype, prompt, depth, top_k, nodes):
    lm = trained[arch, dtype]
    trace = generate(lm, prompt, DecodeSettings(method="eagle", max_new_tokens=NEW_TOKENS, eagle_depth=depth,
                                                eagle_top_k=top_k, eagle_nodes=nodes))
    assert trace.tokens == plain(lm, prompt)
    if dtype == "float32":
        assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)


def test_eagle_guesses_are_accepted_and_rejected(trained):
    """Not a vacuous identity: rounds accept several guesses, and rounds reject some."""
    lm = trained["llama", "float32"]
    rounds = [r for p in PROMPTS for r in generate(lm, p, DecodeSettings(method="eagle", max_new_tokens=NEW_TOKENS,
                                                                         eagle_nodes=16)).rounds]
    accepted = [len(r.accepted_nodes) - 1 for r in rounds]
    assert sum(accepted) / len(rounds) > 1.0
    assert any(a < 5 for a in accepted)


@pytest.mark.parametrize("arch", ["llama", "llama-fused"])
def test_the_widest_tree_has_64_nodes(trained, arch):
    lm = trained[arch, "bfloat16"]
    trace = generate(lm, PROMPTS[0], DecodeSettings(method="eagle", max_new_tokens=24, eagle_nodes=63,
                                                    eagle_depth=6, eagle_top_k=10))
    assert max(r.tree_size for r in trace.rounds) == 64
    assert trace.tokens == generate(lm, PROMPTS[0], DecodeSettings(method="ar", max_new_tokens=24)).tokens


@torch.no_grad()
def from_scratch_first_guesses(lm, text: list[int], top_k: int) -> list[int]:
    """The draft's top guesses after `text`, from a fresh cache over the whole text at once."""
    features = lm.model(torch.tensor([text[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    part = lm.parts[EAGLE]
    cache = new_cache(part.head.layer_config)
    count = len(text) - 1
    mask = torch.zeros(count, count).masked_fill_(~torch.ones(count, count, dtype=torch.bool).tril(), -1e30)
    out = part.head(features[None], lm.model.get_input_embeddings()(torch.tensor([text[1:]])),
                    torch.arange(count)[None], cache, mask[None, None])[0, -1]
    return part.head.token_ids(part.lm_head(out).topk(top_k).indices).tolist()


def test_the_draft_cache_keeps_in_step_after_rejections(trained):
    """Each round's first guesses equal a draft run from scratch over the text written so far:
    the cache dropped the rejected guesses' rows and read the accepted tokens' true features."""
    lm = trained["llama", "float32"]
    prompt = "in want of a wife. The quick"  # not one it learnt: guesses are right now and then
    trace = generate(lm, prompt, DecodeSettings(method="eagle", max_new_tokens=NEW_TOKENS, eagle_top_k=4,
                                                eagle_nodes=8))
    text = lm.tokenizer(prompt).input_ids + [trace.prefill_token]
    rejected = 0
    for r in trace.rounds:
        first = [t for t, d in zip(r.drafted.tokens, r.drafted.depths, strict=True) if d == 1]
        assert first == from_scratch_first_guesses(lm, text, 4)
        rejected += len(r.accepted_nodes) - 1 < max(r.tree.depths)
        text += r.emitted_tokens
    assert rejected >= 2
    assert any(len(r.accepted_nodes) > 1 for r in trace.rounds)  # accepted guesses were read back too


# ----- the dynamic tree, by hand -----
def worked_example() -> DraftTree:
    """Depth 1: a (0.6), b (0.25). Expanding a: c (0.5), d (0.4) -> confidences 0.30, 0.24."""
    draft = DraftTree()
    draft.add_children(-1, [11, 12], [math.log(0.6), math.log(0.25)])
    assert draft.frontier(1, beam=1) == [0]
    draft.add_children(0, [13, 14], [math.log(0.5), math.log(0.4)])
    return draft


def test_the_dynamic_tree_by_hand():
    draft = worked_example()
    assert draft.expanded == [True, False, False, False]
    assert [round(math.exp(c), 3) for c in draft.log_confidences] == [0.6, 0.25, 0.3, 0.24]
    # Without a cost curve, as many as allowed, most confident first: a, c (below a), b.
    assert rerank(draft, None, 0.0, 3) == [0, 2, 1]
    tree, tokens, node_of = verified_tree(draft, [0, 2, 1], root=10)
    assert [list(p) for p in tree.paths] == [[0], [1], [0, 0]]
    assert tokens == [10, 11, 12, 13] and node_of == [1, 2, 3, -1]
    assert tree.parents == [-1, 0, 0, 1]


def test_the_cost_curve_decides_how_many_nodes_pay():
    flat = CostCurve([1, 2, 4], [1.0, 1.0, 1.0], 0.01, "cpu", "float32", 1, 128, "")
    steep = CostCurve([1, 2, 4], [1.0, 1.5, 3.0], 0.01, "cpu", "float32", 1, 128, "")
    confidences = [0.6, 0.3, 0.25, 0.24]
    assert best_size(confidences, flat, 0.0, 4) == 4  # every guess is free: take them all
    # Steep: 1 + 0.6 over 1.5 steps (1.07/step) beats the root alone (1.0) and 1.9 / 2.25 (0.84).
    assert best_size(confidences, steep, 0.0, 4) == 1
    assert best_size(confidences, steep, 0.0, 0) == 0


# ----- settings, refusals and checkpoints -----
def test_a_model_without_an_eagle_head_is_told_how_to_get_one(tiny_llama):
    bare = tiny_llama.with_part(EAGLE, None)
    with pytest.raises(DecodingError, match="train-eagle"):
        generate(bare, "abc", DecodeSettings(method="eagle"))


@pytest.mark.parametrize(("field", "value"), [("eagle_nodes", 0), ("eagle_nodes", 64), ("eagle_depth", 0),
                                              ("eagle_top_k", 17), ("eagle_top_k", 2.5)])
def test_eagle_settings_out_of_range_are_refused(field, value):
    with pytest.raises(DecodingError, match=field):
        check_settings(DecodeSettings(method="eagle", **{field: value}))


def test_gpt2_has_no_eagle_head():
    with pytest.raises(DecodingError, match="rotary"):
        EagleHead(EagleConfig(64, 320), tiny_model("gpt2"))


def _published(tmp_path, model, head: EagleHead, hidden: int | None = None, extra_layer: bool = False):
    """A checkpoint in the published EAGLE-1 layout: layers.0.* and fc.*, no input norm."""
    state = {("layers.0." + k.removeprefix("layer.") if k.startswith("layer.") else k): v.clone()
             for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    state.pop("layers.0.input_layernorm.weight", None)
    state["embed_tokens.weight"] = model.get_input_embeddings().weight.clone()
    if hidden is not None:
        state["fc.weight"] = torch.zeros(hidden, 2 * hidden)
    if extra_layer:
        state["layers.1.mlp.up_proj.weight"] = torch.zeros(1)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden or 64}))
    return tmp_path


def test_a_published_checkpoint_loads_and_guesses_as_it_was_saved(tmp_path):
    model = tiny_model("llama")
    torch.manual_seed(1)
    original = EagleHead(EagleConfig(64, 320, input_norm=False), model).eval()
    loaded = load_published(_published(tmp_path, model, original), model).eval()
    assert not loaded.config.input_norm and loaded.config.fc_bias
    x, e = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
    positions, mask = torch.arange(5)[None], torch.zeros(1, 1, 5, 5)
    assert torch.equal(original(x, e, positions, None, mask), loaded(x, e, positions, None, mask))


def test_a_published_checkpoint_for_another_model_is_refused(tmp_path):
    model = tiny_model("llama")
    head = EagleHead(EagleConfig(64, 320, input_norm=False), model)
    for name in "abc":
        (tmp_path / name).mkdir()
    with pytest.raises(DecodingError, match="another base model"):
        load_published(_published(tmp_path / "a", model, head, hidden=32), model)
    with pytest.raises(DecodingError, match="more than one draft layer"):
        load_published(_published(tmp_path / "b", model, head, extra_layer=True), model)
    with pytest.raises(DecodingError, match="no EAGLE weights"):
        load_published(tmp_path / "c", model)


def test_the_shipped_layout_round_trips(tmp_path, tiny_llama):
    rows = vocabulary_rows(tiny_llama.model.get_output_embeddings(), torch.arange(10))
    assert rows.weight.shape == (10, 64)
    head = EagleHead(EagleConfig(64, 320, draft_vocab_size=10), tiny_llama.model)
    head.draft_vocab.copy_(torch.arange(10, 20))
    head.save(tmp_path, extra={"accuracy": [0.5, 0.25]})
    loaded, meta = load_own(tmp_path, tiny_llama.model)
    assert torch.equal(loaded.draft_vocab, torch.arange(10, 20)) and meta["accuracy"] == [0.5, 0.25]


def test_best_prefix_reads_only_as_far_as_one_more_could_pay_and_cuts_as_best_size_does():
    """Read lazily, candidates past the point where none could pay are never made; the cut is
    the one `best_size` makes of them all, on flat, steep and stepped cost curves."""
    rng = random.Random(0)
    curves = [CostCurve([1, 2, 4, 16, 64], costs, 0.01, "cpu", "float32", 1, 128, "")
              for costs in ([1.0, 1.0, 1.0, 1.02, 1.2], [1.0, 1.3, 1.9, 5.5, 20.0], [1.0, 1.05, 1.05, 1.14, 2.6])]
    read_fewer = 0
    for _ in range(300):
        curve, draft_cost = rng.choice(curves), rng.choice([0.0, 0.05, 0.3])
        confidences = sorted((rng.random() ** 3 for _ in range(rng.randint(0, 63))), reverse=True)
        read: list[int] = []
        confidence = confidences.__getitem__  # sorted: each bounds every one after it
        cut = best_prefix(_reading(len(confidences), read), confidence, curve, draft_cost, 63, ceiling=confidence,
                          added_costs=least_added_costs(curve, 63))
        assert cut == list(range(best_size(confidences, curve, draft_cost, 63)))
        read_fewer += len(read) < len(confidences)
    assert read_fewer > 100  # on the steep curve most rounds stop early
    assert least_added_costs(curves[0], 3)[3] == math.inf  # no more can be added past the limit


def _reading(count: int, read: list[int]):
    """0 to count - 1, noting each one as it is read."""
    for i in range(count):
        read.append(i)
        yield i


def test_a_resumed_training_ends_where_an_uninterrupted_one_does(tiny_llama, tmp_path):
    """Stopped after its first epoch and resumed from the checkpoint, training ends with the very
    weights one run straight through ends with: the batches' order and the noise on the input
    states (drawn from torch's generator) both carry on from where they stopped."""
    model = tiny_llama.model
    text = own_text(model, tiny_llama.tokenizer, PROMPTS[:3], 24)
    config = EagleConfig(model.config.hidden_size, model.config.vocab_size)

    def train(folder, resume: bool = False, max_seconds: float = 0.0) -> list[dict]:
        folder.mkdir(exist_ok=True)
        torch.manual_seed(0)
        settings = EagleTrainingSettings(epochs=2, lr=3e-3, batch_tokens=32, unroll=2, warmup_steps=2, patience=2,
                                         noise=0.2, max_seconds=max_seconds)
        record, _ = fit_eagle(EagleHead(config, model), model, text, text, settings, folder, resume=resume)
        return record

    straight = train(tmp_path / "straight")
    assert len(train(tmp_path / "stopped", max_seconds=1e-9)) == 1  # it stops once its first epoch is done
    resumed = train(tmp_path / "stopped", resume=True)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]
    # The weights the last epoch ended with (not the epoch kept, which might be the first).
    ends = [torch.load(folder / CHECKPOINT, weights_only=False)["head"] for folder in (tmp_path / "straight",
                                                                                        tmp_path / "stopped")]
    assert ends[0].keys() == ends[1].keys()
    for name, weights in ends[0].items():
        assert torch.equal(ends[1][name], weights), name


def test_the_hard_loss_is_cross_entropy_on_the_token_the_base_model_chose(tiny_llama):
    """hard_weight 1: the loss is the draft's cross-entropy on t_{j+2}, the token the base model
    chose from f_{j+1}, over the positions that train, skipping tokens outside the draft vocabulary
    and positions whose t_{j+2} is past their sequence's end."""
    model = tiny_llama.model
    text = own_text(model, tiny_llama.tokenizer, PROMPTS[:2], 12)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(model.config.hidden_size, model.config.vocab_size, draft_vocab_size=64), model)
    head.draft_vocab.copy_(torch.randperm(model.config.vocab_size)[:64])
    batch = pack(text)
    chosen = chosen_targets(head, batch)
    vocab = head.draft_vocab.tolist()
    starts = [sum(len(s.tokens) for s in text[:i]) for i in range(len(text))]
    for number, sequence in enumerate(text):
        for j in range(len(sequence.tokens)):
            token = int(sequence.tokens[j + 2]) if j + 2 < len(sequence.tokens) else None
            expected = vocab.index(token) if token in vocab else -1
            assert int(chosen[starts[number] + j]) == expected, (number, j)
    assert (chosen >= 0).any() and (chosen[batch.target] == -1).any()
    rows, embedding = draft_rows(head, model), model.get_input_embeddings()
    with torch.no_grad():
        loss = batch_loss(head, rows, embedding, batch, EagleTrainingSettings(unroll=1, noise=0.0, hard_weight=1.0))
        log_q = torch.log_softmax(rows(unrolled_outputs(head, embedding, batch, 1, 0.0)[0]).float(), dim=-1)
    keep = batch.target & (chosen >= 0)
    assert torch.allclose(loss, -log_q[keep, chosen[keep]].mean())
