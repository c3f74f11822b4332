"""`python -m decoding bench`: plain decoding vs Medusa, measured side by side in one process.

Machines are noisy, so nothing is compared across runs: after a warm-up, every prompt is decoded
by AR and by Medusa (with and without detailed tracing) in alternating order, and the ratios come
from totals gathered in the same minutes. Several trees can be compared in one run. Every figure
(speedup, round cost and its parts, trace cost) is computed by `stats.py`, the definitions the
page uses, so the table and the page print the same numbers under the same names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from .drafters import resolve_tree
from .generate import encode_prompt, generate
from .model import MedusaModel, padding_id
from .settings import DecodeSettings
from .stats import Timing, recording_overhead, rest_of_round_cost, round_cost, speedup, verify_cost
from .trace import RunTrace


@dataclass
class TreeRuns:
    """One tree's runs: traced as the page records them, and untraced (nothing recorded)."""

    tree: str
    tree_size: int
    traced: list[RunTrace] = field(default_factory=list)
    untraced: list[RunTrace] = field(default_factory=list)
    identical: bool = True


def method_figures(timing: Timing) -> dict:
    """One method's totals as the report prints them."""
    return {"tokens": timing.tokens, "seconds": timing.seconds, "forward_passes": timing.passes,
            "tokens_per_second": timing.tokens_per_second, "mean_accepted": timing.tokens_per_pass,
            "seconds_per_round": timing.seconds_per_round}


def tree_figures(runs: TreeRuns, ar: Timing, acceptance: str) -> dict:
    """One tree's row of the report, every figure defined in `stats.py`.

    The speedup and tokens per pass come from the traced runs (the page's figures); the round
    costs from the untraced ones, so that recording is not counted: speedup ≈ mean_accepted /
    round_cost, and with free drafting it would be mean_accepted / verify_cost.
    """
    traced, untraced = Timing.of(runs.traced), Timing.of(runs.untraced)
    clock = traced.seconds + traced.recording_seconds  # the engine's clock, recording included
    return {
        "tree": runs.tree, "tree_size": runs.tree_size,
        "speedup": speedup(ar, traced),
        "mean_accepted": traced.tokens_per_pass,
        "round_cost": round_cost(ar, untraced),
        "verify_cost": verify_cost(ar, untraced),
        # The rest of the round: drafting, accepting and bookkeeping (the key keeps its old name).
        "draft_accept_cost": rest_of_round_cost(ar, untraced),
        "identical": runs.identical if acceptance == "greedy" else None,
        "trace_overhead": recording_overhead(traced),
        # The same, as the difference of two noisy totals: a cross-check, not the figure.
        "trace_overhead_by_difference": (clock - untraced.seconds) / untraced.seconds if untraced.seconds else 0.0,
        "medusa": method_figures(traced), "medusa_untraced": method_figures(untraced),
    }


@torch.inference_mode()
def transformers_generate(mm: MedusaModel, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """The library's own greedy `generate` on the same input: the peer our plain decoding must match.

    Returns the new tokens and the seconds taken (prefill included, as in our traces).
    """
    ids = torch.tensor([encode_prompt(mm, prompt)], device=mm.device)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=sorted(mm.eos_token_ids) or None,
                              pad_token_id=padding_id(mm.tokenizer, mm.eos_token_ids))
    if mm.device.type == "cuda":
        torch.cuda.synchronize(mm.device)
    start = time.perf_counter()
    out = mm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    if mm.device.type == "cuda":
        torch.cuda.synchronize(mm.device)
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


def run_bench(mm: MedusaModel, prompts: list[str], settings: DecodeSettings,
              trees: list, progress: bool = True, compare_generate: bool = False) -> dict:
    """Decode every prompt with AR and with Medusa for each tree; return totals and ratios.

    With `compare_generate`, transformers' own `generate(do_sample=False)` runs beside plain
    decoding, on the same inputs, so the baseline is shown not to be a slow one.
    """
    ar_settings = replace(settings, method="ar")
    medusa_settings = [replace(settings, method="medusa", tree=t) for t in trees]
    # Warm-up: first calls pay for allocations and lazy initialisation; keep that out of the figures.
    warm = replace(settings, max_new_tokens=min(8, settings.max_new_tokens))
    generate(mm, prompts[0], replace(warm, method="ar"))
    for s in medusa_settings:
        generate(mm, prompts[0], replace(s, max_new_tokens=warm.max_new_tokens))

    ar_runs: list[RunTrace] = []
    library_tokens, library_seconds, library_identical = 0, 0.0, True
    if compare_generate:
        transformers_generate(mm, prompts[0], warm.max_new_tokens)
    # Each tree's own name and size, after pruning to the heads in use.
    results = [TreeRuns(t.name, t.size) for t in (resolve_tree(mm, s) for s in medusa_settings)]
    for i, prompt in enumerate(tqdm(prompts, desc="bench", disable=not progress)):
        # Alternate the order so neither method always runs on a warmer (or hotter) machine.
        plan = ["ar", "medusa"] if i % 2 == 0 else ["medusa", "ar"]
        outputs: dict[str, list[int]] = {}
        for step in plan:
            if step == "ar":
                ar_trace = generate(mm, prompt, ar_settings)
                ar_runs.append(ar_trace)
                outputs["ar"] = ar_trace.tokens
                if compare_generate:
                    tokens, seconds = transformers_generate(mm, prompt, settings.max_new_tokens)
                    library_tokens += len(tokens)
                    library_seconds += seconds
                    library_identical &= tokens == ar_trace.tokens
                continue
            for s, result in zip(medusa_settings, results):
                traced = generate(mm, prompt, s)
                result.traced.append(traced)
                result.untraced.append(generate(mm, prompt, replace(s, detailed_trace=False)))
                outputs[result.tree] = traced.tokens
        for result in results:
            result.identical &= outputs[result.tree] == outputs["ar"]

    ar, library = Timing.of(ar_runs), Timing(tokens=library_tokens, seconds=library_seconds)
    rows = [tree_figures(r, ar, settings.acceptance) for r in results]
    first = rows[0]
    return {
        "model": mm.name, "device": str(mm.device), "dtype": str(mm.dtype).removeprefix("torch."),
        "prompts": len(prompts), "max_new_tokens": settings.max_new_tokens,
        "acceptance": settings.acceptance,
        "speedup": first["speedup"], "mean_accepted": first["mean_accepted"],
        "identical": first["identical"], "trace_overhead": first["trace_overhead"],
        "ar": method_figures(ar), "medusa": first["medusa"], "trees": rows,
        **({"transformers_generate": {"tokens": library.tokens, "seconds": library.seconds,
                                      "tokens_per_second": library.tokens_per_second,
                                      "identical_to_ar": library_identical}}
           if compare_generate and settings.acceptance == "greedy" else {}),
    }


def _library_line(report: dict) -> list[str]:
    """The peer check's line, when the bench ran transformers' own generate beside plain decoding."""
    library = report.get("transformers_generate")
    if not library:
        return []
    ratio = report["ar"]["tokens_per_second"] / library["tokens_per_second"]
    same = "yes" if library["identical_to_ar"] else "NO"
    return [f"transformers' generate(do_sample=False): {library['tokens_per_second']:.1f} tok/s on the same "
            f"inputs; our plain decoding runs at {ratio:.2f}x its speed; same tokens: {same}"]


def format_table(report: dict) -> str:
    """The human-readable form of `run_bench`'s report."""
    ar = report["ar"]
    lines = [
        f"model {report['model']} on {report['device']} ({report['dtype']}), "
        f"{report['prompts']} prompts x {report['max_new_tokens']} new tokens, "
        f"acceptance {report['acceptance']}",
        f"AR: {ar['tokens_per_second']:.1f} tok/s, {ar['forward_passes']} passes for {ar['tokens']} tokens, "
        f"{ar['seconds_per_round'] * 1e3:.2f} ms a step",
        *_library_line(report),
        "round cost: one Medusa round in AR steps, and its two parts: the verify pass, and the rest "
        "(drafting, accepting, bookkeeping); speedup ≈ accepted/pass ÷ round cost",
        "",
        f"{'tree':<16}{'nodes':>6}{'tok/s':>9}{'speedup':>9}{'accepted/pass':>15}"
        f"{'round cost':>12}{'verify':>8}{'rest':>8}{'passes':>8}{'trace cost':>12}{'identical':>11}",
    ]
    for row in report["trees"]:
        m = row["medusa"]
        same = "-" if row["identical"] is None else ("yes" if row["identical"] else "NO")
        lines.append(
            f"{row['tree']:<16}{row['tree_size']:>6}{m['tokens_per_second']:>9.1f}"
            f"{row['speedup']:>8.2f}x{row['mean_accepted']:>15.2f}{row['round_cost']:>7.2f} steps"
            f"{row['verify_cost']:>8.2f}{row['draft_accept_cost']:>8.2f}{m['forward_passes']:>8}"
            f"{row['trace_overhead']:>11.1%}{same:>11}"
        )
    if any(row["identical"] is False for row in report["trees"]):
        lines += ["", differing_output_note(report["dtype"])]
    return "\n".join(lines)


def differing_output_note(dtype: str) -> str:
    """Why greedy Medusa may not equal plain decoding, for a table that shows it did not."""
    if dtype == "float32":
        return ("NO in float32 means Medusa's greedy output differed from plain decoding's: "
                "that is a bug, please report the prompt.")
    return (f"NO in {dtype}: a verify pass over many tokens rounds differently from a one-token "
            "step, so where the two best tokens nearly tie the choice can flip. The tree logic is "
            "the same; check losslessness with --dtype float32.")
