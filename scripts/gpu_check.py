"""The checks that need a GPU, in one command of a few minutes: run it whenever one is at hand.

    python -m scripts.gpu_check --out DIR            # on the GPU machine (see README, "On a GPU")
    python -m scripts.gpu_check --smoke --out DIR    # the same steps, tiny, on any machine

1. The engine's tests on CUDA (the fixtures load their tiny models on the default device).
2. The cost curve of a 7B-shaped Llama built from a config (random weights, bfloat16): what a
   T-token verify pass costs in one-token steps, T = 1..256, with the library's attention and
   with gathered attention (decoding/attention.py), and what gathering costs there.
3. How often Medusa parts from plain decoding in bfloat16 on the GPU, with each attention: a
   GPU's matrix kernels choose their tiling by row count, so a verify pass may round differently
   from a step even with the keys gathered. The drafter is the model itself (draft-model: long,
   mostly right chains), on narrow random models where near-ties are common, and on the 7B shape.

Writes DIR/gpu_check.json and prints a summary. Nothing here is run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from decoding import DecodeSettings, generate
from decoding.attention import GATHERED
from decoding.cost_curve import measure_cost_curve
from decoding.drafters.draft_model import NAME as DRAFT_MODEL
from decoding.model import LoadedModel
from decoding.tiny import tiny_config, tiny_tokenizer

ENGINE_TESTS = ["tests/test_lossless.py", "tests/test_drafters.py", "tests/test_sampling.py",
                "tests/test_kv_cache.py", "tests/test_context_limit.py", "tests/test_sliding_window.py"]
SEVEN_B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
SMOKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=320, max_position_embeddings=1024)


def run_engine_tests(out: Path) -> dict:
    start = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *ENGINE_TESTS],
                          capture_output=True, text=True)
    (out / "engine_tests.log").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    return {"returncode": done.returncode, "summary": last, "seconds": round(time.time() - start, 1)}


def wrap(model, tokenizer, device: torch.device, name: str) -> LoadedModel:
    """A base model without heads, for plain decoding and the draft-model drafter (itself)."""
    lm = LoadedModel(name=name, model=model, tokenizer=tokenizer, device=device, dtype=model.dtype,
                     context_length=model.config.max_position_embeddings, trees={}, default_tree="",
                     eos_token_ids=frozenset())
    lm.parts[DRAFT_MODEL] = lm
    return lm


def random_model(config: LlamaConfig, device: torch.device, attention: str | None, seed: int = 0):
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval().requires_grad_(False)
    if attention:
        model.set_attn_implementation(attention)
    return model


def parting(lm: LoadedModel, prompts: list[str], new_tokens: int, draft_tokens: int) -> dict:
    """How many answers Medusa-style verification (a self-drafted chain) wrote differently from
    plain decoding, and at which token each first parted."""
    first_parted = []
    for prompt in prompts:
        plain = generate(lm, prompt, DecodeSettings(method="ar", max_new_tokens=new_tokens)).tokens
        drafted = generate(lm, prompt, DecodeSettings(method="draft-model", max_new_tokens=new_tokens,
                                                      draft_tokens=draft_tokens)).tokens
        if drafted != plain:
            # The two may differ in length (one stopped sooner): compare the positions both wrote.
            first_parted.append(next(i for i, (a, b) in enumerate(zip(plain, drafted, strict=False)) if a != b))
    return {"answers": len(prompts), "parted": len(first_parted), "first_parted_at": first_parted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device: check the script runs")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__}
    if not args.skip_tests:
        report["engine_tests"] = run_engine_tests(args.out)
        print("engine tests:", report["engine_tests"]["summary"], flush=True)

    shape = SMOKE if args.smoke else SEVEN_B
    tokenizer = tiny_tokenizer(320)
    sizes = (1, 2, 4, 8, 16, 32, 64) if args.smoke else (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    report["cost_curves"] = {}
    for label, attention in (("library", None), ("gathered", GATHERED)):
        model = random_model(LlamaConfig(**shape), device, attention)
        lm = wrap(model, tokenizer, device, f"llama-{shape['hidden_size']}x{shape['num_hidden_layers']}")
        curve = measure_cost_curve(lm, sizes=sizes, past=512 if not args.smoke else 64, repeats=5)
        report["cost_curves"][label] = asdict(curve)
        print(f"{label:>8}: step {curve.step_seconds * 1e3:.2f} ms; "
              + ", ".join(f"T={s} {c:.2f}" for s, c in zip(curve.sizes, curve.costs, strict=True)), flush=True)
        if not args.smoke:  # the 7B shape: 20 answers of random text, full of near-ties
            prompts = [f"{i} {i * 7} {i * 13}" for i in range(20)]
            report.setdefault("parting_7b", {})[label] = parting(lm, prompts, 64, 4)
        del model, lm
        if device.type == "cuda":
            torch.cuda.empty_cache()

    report["parting_tiny"] = {}
    prompts = [f"It is a truth {i}" for i in range(12 if args.smoke else 40)]
    for label, attention in (("library", None), ("gathered", GATHERED)):
        config = tiny_config("llama", 320)
        config.initializer_range = 0.05  # narrow: near-ties everywhere
        lm = wrap(random_model(config, device, attention), tokenizer, device, "tiny-llama")
        report["parting_tiny"][label] = parting(lm, prompts, 48, 6)
    for where in ("parting_tiny", "parting_7b"):
        for label, figures in report.get(where, {}).items():
            print(f"{where} {label}: {figures['parted']} of {figures['answers']} answers parted", flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    return 0 if report.get("engine_tests", {}).get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
