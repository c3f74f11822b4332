"""Multi-token prediction: the objective, train-base --mtp-depth, the drafter's caches kept in step,
its identity with plain decoding, and the published layouts (DeepSeek-V3, MiMo) on fakes.

Whatever the modules guess, greedy MTP must write plain decoding's text. To make that bite, the
tiny models' modules are *trained* here on their own greedy text, so that many guesses are
accepted and some rejected; random modules would be rejected always.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from decoding import DecodeSettings, generate, load_model
from decoding.drafters import make_drafter
from decoding.drafters.mtp import NAME, MTPDrafter, MTPPart
from decoding.errors import DecodingError
from decoding.medusa_modules import few_rows_projection
from decoding.mtp_modules import (
    DEEPSEEK_V3,
    MIMO,
    MTPConfig,
    MTPModules,
    load_mtp,
    loss_weight,
    mtp_logits,
    mtp_loss,
    mtp_targets,
)
from decoding.training.train_base import BaseTrainingSettings, train_base
from tests.test_lossless import reference_greedy

PROMPTS = ["It is a truth universally", "The quick brown fox jumps", "Medusa heads guess several",
           "a single man in possession of", "one forward pass checks them all"]
# Text the modules never read: there they guess wrong, and the verifier must reject.
UNSEEN = ["Zebras sleep standing in quiet harbours", "A prompt the modules never read"]
NEW_TOKENS = 40
DEPTH = 3


def with_modules(lm, modules: MTPModules):
    """`lm` drafting with `modules` (in its dtype), as loading would leave it."""
    modules = modules.to(lm.dtype).eval().requires_grad_(False)
    lm.parts[NAME] = MTPPart(modules, few_rows_projection(lm.model.get_output_embeddings()), None)
    return lm


@torch.no_grad()
def own_text(model, tokenizer, length: int) -> torch.Tensor:
    """The model's greedy continuations of PROMPTS, cut to one length: (len(PROMPTS), T)."""
    rows = []
    for prompt in PROMPTS:
        ids = torch.tensor(tokenizer(prompt).input_ids)[None]
        rows.append(model.generate(ids, do_sample=False, max_new_tokens=length, min_new_tokens=length)[0])
    shortest = min(len(r) for r in rows)
    return torch.stack([r[:shortest] for r in rows])


def train_tiny_mtp(model, tokenizer, depth: int = DEPTH, steps: int = 150) -> MTPModules:
    """Modules that learnt the frozen model's own continuations by heart (enough for identity tests)."""
    text = own_text(model, tokenizer, NEW_TOKENS + 10)
    with torch.no_grad():
        states = model(text, output_hidden_states=True).hidden_states[-1]
    torch.manual_seed(0)
    modules = MTPModules(MTPConfig(model.config.hidden_size, model.config.vocab_size, depth), model)
    optimizer = torch.optim.AdamW(modules.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = mtp_loss(modules, model, states, text)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return modules.eval()


@pytest.fixture(scope="module")
def trained(tiny_dirs):
    """Tiny Llama and Qwen2 models in float32 and bfloat16, each with MTP modules trained on its text."""
    out = {}
    for arch in ("llama", "qwen2"):
        base = load_model(tiny_dirs[arch], device="cpu", dtype="float32", drafters=(), self_test=False)
        modules = train_tiny_mtp(base.model, base.tokenizer)
        for dtype in ("float32", "bfloat16"):
            lm = load_model(tiny_dirs[arch], device="cpu", dtype=dtype, drafters=(), self_test=False)
            copy = MTPModules(modules.config, lm.model)
            copy.load_state_dict(modules.state_dict())
            out[arch, dtype] = with_modules(lm, copy)
    return out


# ----- the objective -----
def test_depth_k_reads_the_token_k_ahead_and_predicts_the_one_after(tiny_llama):
    """Module k's logits at position i change with token i+k and never with token i+k+1 (its
    target) or later: the objective is aligned, and causal."""
    model = tiny_llama.model
    torch.manual_seed(0)
    modules = MTPModules(MTPConfig(model.config.hidden_size, model.config.vocab_size, DEPTH), model).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 16))

    @torch.no_grad()
    def logits(ids):
        return mtp_logits(modules, model, model(ids, output_hidden_states=True).hidden_states[-1], ids)

    before = logits(ids)
    assert [x.shape[1] for x in before] == [16 - k - 1 for k in range(1, DEPTH + 1)]
    assert torch.equal(mtp_targets(ids, 2), ids[:, 3:])
    i = 4
    for k in range(1, DEPTH + 1):
        changed = ids.clone()
        changed[0, i + k + 1:] = (changed[0, i + k + 1:] + 1) % model.config.vocab_size
        assert torch.allclose(logits(changed)[k - 1][0, i], before[k - 1][0, i], atol=1e-5)
        changed = ids.clone()
        changed[0, i + k] = (changed[0, i + k] + 1) % model.config.vocab_size
        assert not torch.allclose(logits(changed)[k - 1][0, i], before[k - 1][0, i], atol=1e-5)


def test_training_teaches_every_depth(tiny_llama):
    model, tokenizer = tiny_llama.model, tiny_llama.tokenizer
    text = own_text(model, tokenizer, NEW_TOKENS + 10)
    states = model(text, output_hidden_states=True).hidden_states[-1].detach()
    torch.manual_seed(0)
    fresh = MTPModules(MTPConfig(model.config.hidden_size, model.config.vocab_size, DEPTH), model)
    _, before = mtp_loss(fresh, model, states, text)
    _, after = mtp_loss(train_tiny_mtp(model, tokenizer), model, states, text)
    assert all(a < b / 3 for a, b in zip(after, before, strict=True))
    assert loss_weight(0.0) == 0.3 and loss_weight(0.9) == 0.1  # DeepSeek-V3's schedule


def test_train_base_with_mtp_saves_modules_that_load_and_resumes(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n\n" * 400, encoding="utf-8")
    common = dict(corpus=str(corpus), vocab_size=300, hidden_size=32, layers=1, heads=2, intermediate_size=64,
                  seq_len=32, batch_size=4, warmup_steps=2, max_minutes=0, eval_every=5, eval_batches=1,
                  save_every=5, log_every=5, mtp_depth=2, out=tmp_path / "run", bf16=False)
    train_base(BaseTrainingSettings(max_steps=5, **common))
    train_base(BaseTrainingSettings(max_steps=10, resume=True, **common))
    log = json.loads((tmp_path / "run" / "training_log.json").read_text())
    assert log["steps"] == 10 and log["resumed_from_steps"] == [5]
    assert len(log["heldout_curve"][-1]["mtp_top1"]) == 2 and log["mtp_params"] > 0
    lm = load_model(tmp_path / "run", device="cpu", dtype="float32", drafters=(NAME,), self_test=False)
    assert lm.parts[NAME].accuracy == log["heldout_curve"][-1]["mtp_top1"]
    trace = generate(lm, "def add", DecodeSettings(method=NAME, max_new_tokens=12))
    assert trace.tokens == generate(lm, "def add", DecodeSettings(method="ar", max_new_tokens=12)).tokens


# ----- the drafter -----
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_rounds_guesses_are_what_the_modules_compute_over_the_whole_line(trained, arch):
    """The drafter's caches, crops and waiting states are kept in step: every round's chain equals
    the modules run from scratch over the text, the root and the guesses (teacher-forced on them),
    whatever was accepted the rounds before."""
    lm = trained[arch, "float32"]
    model = lm.model
    drafter = make_drafter(lm, DecodeSettings(method=NAME, max_new_tokens=64))
    rng = random.Random(0)
    text = lm.tokenizer(PROMPTS[0]).input_ids

    @torch.no_grad()
    def states(ids):
        return model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]

    drafter.begin(text, states(text))
    root = int(model(torch.tensor([text])).logits[0, -1].argmax())
    for _ in range(12):
        guesses = drafter.propose(root, None, DEPTH, with_probs=False).tokens[1:].tolist()
        line = text + [root] + guesses
        ids = torch.tensor([line])
        with torch.no_grad():
            logits = mtp_logits(lm.parts[NAME].modules, model, states(line)[None], ids)
        assert guesses == [int(logits[k][0, len(text) - 1].argmax()) for k in range(DEPTH)]
        written = [root] + guesses[:rng.randint(0, DEPTH)]
        drafter.advance(written, states(text + written)[len(text):])
        text = text + written
        root = rng.randrange(model.config.vocab_size)


@settings(max_examples=16, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=st.sampled_from(["llama", "qwen2"]), dtype=st.sampled_from(["float32", "bfloat16"]),
       prompt=st.sampled_from(PROMPTS + UNSEEN), modules=st.one_of(st.none(), st.integers(1, DEPTH)))
def test_mtp_writes_plain_decodings_text(trained, arch, dtype, prompt, modules):
    lm = trained[arch, dtype]
    trace = generate(lm, prompt, DecodeSettings(method=NAME, max_new_tokens=NEW_TOKENS, mtp_modules=modules))
    assert trace.tokens == generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=NEW_TOKENS)).tokens
    if dtype == "float32":
        assert trace.tokens == reference_greedy(lm, prompt, NEW_TOKENS)


def test_guesses_are_accepted_and_rejected_and_the_trace_names_the_module(trained):
    lm = trained["llama", "float32"]
    traces = [generate(lm, p, DecodeSettings(method=NAME, max_new_tokens=NEW_TOKENS, detailed_trace=True))
              for p in PROMPTS + UNSEEN]
    accepted = [[len(r.accepted_nodes) - 1 for r in t.rounds] for t in traces]
    seen = [a for run in accepted[:len(PROMPTS)] for a in run]
    unseen = [a for run in accepted[len(PROMPTS):] for a in run]
    assert sum(seen) / len(seen) > 2.0 and sum(unseen) / len(unseen) < 1.0
    assert any(a == 0 for a in unseen) and any(a == DEPTH for a in seen)
    rounds = traces[0].rounds
    assert rounds[0].node_origins[2].startswith("MTP module 2")
    assert traces[0].drafter.name == NAME and traces[0].drafter.parameters > 0


def test_more_modules_than_the_model_has_are_refused(trained):
    with pytest.raises(DecodingError, match="has 3 MTP module"):
        generate(trained["llama", "float32"], PROMPTS[0], DecodeSettings(method=NAME, max_new_tokens=4,
                                                                         mtp_modules=DEPTH + 1))


# ----- published layouts, on fakes built from configs -----
PUBLISHED_NAMES = {
    MIMO: ("model.mtp_layers.{k}.", {"token_norm": "token_layernorm", "hidden_norm": "hidden_layernorm",
                                      "proj": "input_proj", "out_norm": "final_layernorm"}),
    DEEPSEEK_V3: ("model.layers.{L_k}.", {"token_norm": "enorm", "hidden_norm": "hnorm", "proj": "eh_proj",
                                          "out_norm": "shared_head.norm"}),
}


def published_checkpoint(folder, lm, modules: MTPModules, layout: str):
    """A copy of `lm`'s checkpoint that keeps `modules` as extra weights, named as `layout` does."""
    prefix, renames = PUBLISHED_NAMES[layout]
    state = load_file(str(folder / "model.safetensors"))
    layers = lm.model.config.num_hidden_layers
    for key, value in modules.state_dict().items():
        if ".rotary." in key:
            continue
        _, k, part, *rest = key.split(".")
        name = ".".join(([renames[part]] if part in renames else []) + rest)  # the block's keep their names
        state[prefix.format(k=k, L_k=layers + int(k)) + name] = value.contiguous()
    if layout == DEEPSEEK_V3:  # it stores the shared embedding and head again per module
        state[f"model.layers.{layers}.embed_tokens.weight"] = lm.model.get_input_embeddings().weight.clone()
        state[f"model.layers.{layers}.shared_head.head.weight"] = lm.model.get_output_embeddings().weight.clone()
    return state


@pytest.mark.parametrize("layout", [MIMO, DEEPSEEK_V3])
def test_published_layouts_load_and_draft_as_they_were_saved(trained, tiny_dirs, tmp_path, layout):
    lm = trained["qwen2" if layout == MIMO else "llama", "float32"]
    arch = "qwen2" if layout == MIMO else "llama"
    source = lm.parts[NAME].modules
    one = MTPModules(MTPConfig(source.config.hidden_size, source.config.vocab_size, 1,
                               embedding_first=layout == DEEPSEEK_V3), lm.model)
    state = {k: v for k, v in source.state_dict().items() if k.startswith("depths.0.")}
    if layout == DEEPSEEK_V3:  # the projection reads [embedding; state]: its columns swap halves
        half = source.config.hidden_size
        w = state["depths.0.proj.weight"]
        state["depths.0.proj.weight"] = torch.cat([w[:, half:], w[:, :half]], dim=1)
    one.load_state_dict(state, strict=False)
    folder = tmp_path / layout
    folder.mkdir()
    for f in tiny_dirs[arch].iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    save_file(published_checkpoint(tiny_dirs[arch], lm, one, layout), str(folder / "model.safetensors"))

    loaded, _ = load_mtp(folder, lm.model)
    assert loaded.config.layout == layout and loaded.config.depth == 1
    for key, value in one.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    published = load_model(folder, device="cpu", dtype="float32", drafters=(NAME,), sources={NAME: folder},
                           self_test=False)
    for prompt in PROMPTS[:2]:
        ours = generate(lm, prompt, DecodeSettings(method=NAME, max_new_tokens=16, mtp_modules=1))
        theirs = generate(published, prompt, DecodeSettings(method=NAME, max_new_tokens=16))
        assert theirs.tokens == ours.tokens
        assert [r.accepted_nodes for r in theirs.rounds] == [r.accepted_nodes for r in ours.rounds]


def test_a_checkpoint_without_modules_is_refused_in_one_line(tiny_dirs, tiny_llama):
    with pytest.raises(DecodingError, match="no MTP modules in .*num_nextn_predict_layers"):
        load_mtp(tiny_dirs["llama"], tiny_llama.model)
    without = dataclasses.replace(tiny_llama, parts={})
    with pytest.raises(DecodingError, match="has no multi-token prediction modules"):
        generate(without, "hello", DecodeSettings(method=NAME, max_new_tokens=4))
    assert not MTPDrafter.available(without) and MTPDrafter.available(tiny_llama)  # the tiny models carry them


# ----- on the page -----
def test_learn_sets_the_modules_beside_medusa_and_tells_the_visitors_mtp_run(trained):
    from app.eagle_views import MTP_INVITATION, GuessingAccuracy, accuracy_table, after_medusa_values

    lm = trained["llama", "float32"]
    lm.parts[NAME].accuracy = [0.5, 0.25, 0.125]
    accuracy = GuessingAccuracy.of(lm)
    assert accuracy.mtp == [0.5, 0.25, 0.125]
    run = generate(lm, PROMPTS[0], DecodeSettings(method=NAME, max_new_tokens=NEW_TOKENS))
    table = accuracy_table(accuracy, None, None, run)
    assert "MTP module *d* (held-out)" in table and "your MTP run, top-1" in table and "| 3 |" in table
    said = after_medusa_values(run, None, accuracy)["after_medusa_mtp"]
    assert "**3 MTP modules**" in said and "50% / 25% / 12%" in said
    assert f"{run.mean_accepted:.2f} tokens per pass" in said
    assert after_medusa_values(None, None, GuessingAccuracy())["after_medusa_mtp"] == MTP_INVITATION


def test_a_deepseek_v3_checkpoint_with_its_mtp_layer_drafts_losslessly(tmp_path):
    """DeepSeek-V3's own architecture (multi-head latent attention, mixture of experts), built from
    a tiny config: its MTP layer, kept as decoder layer L of the checkpoint, loads as a module whose
    block is an MoE layer like the checkpoint's, and drafts without changing plain decoding's text."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from decoding.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer(320)
    config = DeepseekV3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                              moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                              n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=32,
                              qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=256,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, num_nextn_predict_layers=1)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(config).eval()
    folder = tmp_path / "deepseek"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    modules = MTPModules(MTPConfig(64, len(tokenizer), 1, embedding_first=True, layout=DEEPSEEK_V3), model)
    with torch.no_grad():  # its router's weight is torch.empty until the library's own init: set every one
        for parameter in modules.parameters():
            parameter.normal_(0, 0.05)
    assert "experts" in str(modules.depths[0].block.mlp.__class__.__name__).lower() or hasattr(
        modules.depths[0].block.mlp, "experts")
    state = load_file(str(folder / "model.safetensors"))
    for key, value in modules.state_dict().items():
        if ".rotary." in key:
            continue
        _, _, part, *rest = key.split(".")
        renames = PUBLISHED_NAMES[DEEPSEEK_V3][1]
        state[f"model.layers.2.{'.'.join(([renames[part]] if part in renames else []) + rest)}"] = value.contiguous()
    save_file(state, str(folder / "model.safetensors"))

    loaded, _ = load_mtp(folder, model)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in modules.state_dict().items())
    lm = load_model(folder, device="cpu", dtype="float32", drafters=(NAME,), self_test=False)
    for prompt in PROMPTS[:2]:
        trace = generate(lm, prompt, DecodeSettings(method=NAME, max_new_tokens=12))
        assert trace.tokens == generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=12)).tokens
