"""`python -m decoding bench`: plain decoding vs Medusa, measured side by side in one process.

Machines are noisy, so nothing is compared across runs: after a warm-up, every prompt is decoded
by AR and by Medusa (with and without detailed tracing) in alternating order, and the ratios come
from totals gathered in the same minutes. Several trees can be compared in one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from .generate import encode_prompt, generate, resolve_tree
from .model import MedusaModel
from .settings import DecodeSettings


@dataclass
class MethodTotals:
    tokens: int = 0
    seconds: float = 0.0
    round_seconds: float = 0.0  # the rounds alone: prefill left out
    trace_seconds: float = 0.0
    passes: int = 0
    rounds: int = 0
    round_tokens: int = 0
    verify_seconds: float = 0.0  # the rounds' base-model passes alone
    draft_accept_seconds: float = 0.0  # the heads' guesses, and choosing/keeping the tokens

    def add(self, trace) -> None:
        self.tokens += len(trace.tokens)
        self.seconds += trace.total_time
        self.round_seconds += trace.total_time - trace.time_prefill
        self.trace_seconds += sum(r.time_trace for r in trace.rounds)
        self.passes += trace.forward_passes
        self.rounds += len(trace.rounds)
        self.round_tokens += sum(r.accepted_length for r in trace.rounds)
        self.verify_seconds += sum(r.time_verify for r in trace.rounds)
        self.draft_accept_seconds += sum(r.time_draft + r.time_accept for r in trace.rounds)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def seconds_per_round(self) -> float:
        return self.round_seconds / self.rounds if self.rounds else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.round_tokens / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": self.seconds, "forward_passes": self.passes,
                "tokens_per_second": self.tokens_per_second, "mean_accepted": self.mean_accepted,
                "seconds_per_round": self.seconds_per_round}


@dataclass
class TreeResult:
    tree: str
    tree_size: int
    medusa: MethodTotals = field(default_factory=MethodTotals)
    untraced: MethodTotals = field(default_factory=MethodTotals)
    identical: bool = True


def _in_ar_steps(seconds: float, rounds: int, ar: MethodTotals) -> float:
    """Seconds spent over `rounds` rounds, as a cost per round in plain decoding steps."""
    return seconds / (rounds * ar.seconds_per_round) if rounds and ar.seconds_per_round else 0.0


@torch.inference_mode()
def transformers_generate(mm: MedusaModel, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """The library's own greedy `generate` on the same input: the peer our plain decoding must match.

    Returns the new tokens and the seconds taken (prefill included, as in our traces).
    """
    ids = torch.tensor([encode_prompt(mm, prompt)], device=mm.device)
    stop = sorted(mm.eos_token_ids)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop or None,
                              pad_token_id=stop[0] if stop else 0)
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

    ar = MethodTotals()
    library = MethodTotals()
    library_identical = True
    if compare_generate:
        transformers_generate(mm, prompts[0], warm.max_new_tokens)
    # Each tree's own name and size, after pruning to the heads in use.
    results = [TreeResult(t.name, t.size) for t in (resolve_tree(mm, s) for s in medusa_settings)]
    for i, prompt in enumerate(tqdm(prompts, desc="bench", disable=not progress)):
        # Alternate the order so neither method always runs on a warmer (or hotter) machine.
        plan = ["ar", "medusa"] if i % 2 == 0 else ["medusa", "ar"]
        outputs: dict[str, list[int]] = {}
        for step in plan:
            if step == "ar":
                ar_trace = generate(mm, prompt, ar_settings)
                ar.add(ar_trace)
                outputs["ar"] = ar_trace.tokens
                if compare_generate:
                    tokens, seconds = transformers_generate(mm, prompt, settings.max_new_tokens)
                    library.tokens += len(tokens)
                    library.seconds += seconds
                    library_identical &= tokens == ar_trace.tokens
                continue
            for s, result in zip(medusa_settings, results):
                traced = generate(mm, prompt, s)
                plain = generate(mm, prompt, replace(s, detailed_trace=False))
                result.medusa.add(traced)
                result.untraced.add(plain)
                outputs[result.tree] = traced.tokens
        for result in results:
            result.identical &= outputs[result.tree] == outputs["ar"]

    rows = []
    for r in results:
        rows.append({
            "tree": r.tree, "tree_size": r.tree_size,
            # Tokens per second, not total seconds: the runs may stop at different lengths
            # (an end-of-text token in a sampled run).
            "speedup": r.medusa.tokens_per_second / ar.tokens_per_second if ar.tokens_per_second else 0.0,
            "mean_accepted": r.medusa.mean_accepted,
            # Per-round costs in plain steps, from untraced rounds so recording is not counted.
            # A round (draft + verify + accept): speedup ≈ mean_accepted / round_cost.
            "round_cost": _in_ar_steps(r.untraced.round_seconds, r.untraced.rounds, ar),
            # Its parts. With free drafting and accepting, speedup would be mean_accepted / verify_cost.
            "verify_cost": _in_ar_steps(r.untraced.verify_seconds, r.untraced.rounds, ar),
            "draft_accept_cost": _in_ar_steps(r.untraced.draft_accept_seconds, r.untraced.rounds, ar),
            "identical": r.identical if settings.acceptance == "greedy" else None,
            # Measured directly: time spent recording details over the time spent decoding.
            "trace_overhead": r.medusa.trace_seconds / (r.medusa.seconds - r.medusa.trace_seconds),
            # The same, as the difference of two noisy totals: a cross-check, not the figure.
            "trace_overhead_by_difference": (r.medusa.seconds - r.untraced.seconds) / r.untraced.seconds
            if r.untraced.seconds else 0.0,
            "medusa": r.medusa.to_dict(), "medusa_untraced": r.untraced.to_dict(),
        })
    first = rows[0]
    return {
        "model": mm.name, "device": str(mm.device), "dtype": str(mm.dtype).removeprefix("torch."),
        "prompts": len(prompts), "max_new_tokens": settings.max_new_tokens,
        "acceptance": settings.acceptance,
        "speedup": first["speedup"], "mean_accepted": first["mean_accepted"],
        "identical": first["identical"], "trace_overhead": first["trace_overhead"],
        "ar": ar.to_dict(), "medusa": first["medusa"], "trees": rows,
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
        "round cost: one Medusa round in AR steps, and two of its parts: the verify pass, and "
        "drafting + accepting; speedup ≈ accepted/pass ÷ round cost",
        "",
        f"{'tree':<16}{'nodes':>6}{'tok/s':>9}{'speedup':>9}{'accepted/pass':>15}"
        f"{'round cost':>12}{'verify':>8}{'draft+acc':>10}{'passes':>8}{'trace cost':>12}{'identical':>11}",
    ]
    for row in report["trees"]:
        m = row["medusa"]
        same = "-" if row["identical"] is None else ("yes" if row["identical"] else "NO")
        lines.append(
            f"{row['tree']:<16}{row['tree_size']:>6}{m['tokens_per_second']:>9.1f}"
            f"{row['speedup']:>8.2f}x{row['mean_accepted']:>15.2f}{row['round_cost']:>7.2f} steps"
            f"{row['verify_cost']:>8.2f}{row['draft_accept_cost']:>10.2f}{m['forward_passes']:>8}"
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
