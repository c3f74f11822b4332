"""`python -m decoding bench`: plain decoding vs each drafter, measured side by side in one process.

Machines are noisy, so nothing is compared across runs: after a warm-up, every prompt is decoded
by plain (AR) decoding and by every lane (a drafter with its settings: Medusa with each tree asked
for, EAGLE, a draft model, prompt lookup), with and without detailed tracing, in alternating order, as
one heat of `measure.py` (the page's race measures with the same function), and the ratios come
from totals gathered in the same minutes. A machine other programs kept busy meanwhile is named
in the report. Every figure (speedup, round cost and its
parts, trace cost) is computed by `stats.py`, the definitions the page uses, so the table and the
page print the same numbers under the same names.

With `compare_transformers`, the library's own decoders run on the same inputs beside ours: plain
`generate`, assisted generation with the same draft model and draft length, and prompt lookup with
the same lengths. They are the peers our lanes must match in output and speed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedModel

from .baseline import OWN, describe, fastest_plain
from .drafters import check_settings, drafter_class, make_drafter
from .dynamic_tree import DYNAMIC_TREE
from .loops import encode_prompt, generate
from .machine_load import MachineLoad
from .measure import busy_note, combined, run_heat, timed_run
from .model import LoadedModel, padding_id
from .settings import DEFAULT_METHOD, PLAIN, WARM_UP_TOKENS, DecodeSettings
from .stats import Timing, draft_cost, recording_overhead, rest_of_round_cost, round_cost, speedup, verify_cost
from .trace import RunTrace


@dataclass
class LibraryRuns:
    """The library's own runs of one decoder (`generate` arguments in `options`), and whether
    they wrote the same tokens as ours."""

    options: dict
    tokens: int = 0
    seconds: float = 0.0
    identical: bool = True

    def run(self, lm: LoadedModel, prompt: str, max_new_tokens: int, ours: list[int]) -> None:
        tokens, seconds = transformers_generate(lm, prompt, max_new_tokens, self.options)
        self.tokens += len(tokens)
        self.seconds += seconds
        self.identical &= tokens == ours

    def figures(self) -> dict:
        return {"tokens": self.tokens, "seconds": self.seconds,
                "tokens_per_second": self.tokens / self.seconds if self.seconds else 0.0,
                "identical": self.identical}


@dataclass
class LaneRuns:
    """One lane's runs: traced as the page records them, and untraced (nothing recorded); and,
    when compared, the library's own runs of the same decoder (None where it has none)."""

    settings: DecodeSettings
    tree: str
    tree_size: int
    traced: list[RunTrace] = field(default_factory=list)
    untraced: list[RunTrace] = field(default_factory=list)
    identical: bool = True
    library: LibraryRuns | None = None

    @property
    def drafter(self) -> str:
        return self.settings.method

    @property
    def label(self) -> str:
        return f"{self.drafter} {self.tree}"


def method_figures(timing: Timing) -> dict:
    """One method's totals as the report prints them."""
    return {"tokens": timing.tokens, "seconds": timing.seconds, "forward_passes": timing.passes,
            "tokens_per_second": timing.tokens_per_second, "mean_accepted": timing.tokens_per_pass,
            "seconds_per_round": timing.seconds_per_round}


def lane_figures(runs: LaneRuns, ar: Timing, acceptance: str, baseline: Timing | None = None) -> dict:
    """One lane's row of the report, every figure defined in `stats.py`.

    The speedup and tokens per pass come from the traced runs (the page's figures); the round
    costs from the untraced ones, so that recording is not counted: speedup ≈ mean_accepted /
    round_cost, and with free drafting it would be mean_accepted / verify_cost. Round costs are in
    steps of plain decoding in the lane's own dtype (`ar`); the speedup is over `baseline`, the
    fastest plain decoding measured (`ar` itself unless another variant was faster: baseline.py).
    """
    traced, untraced = Timing.of(runs.traced), Timing.of(runs.untraced)
    clock = traced.seconds + traced.recording_seconds  # the engine's clock, recording included
    row = {
        "drafter": runs.drafter, "tree": runs.tree, "tree_size": runs.tree_size, "label": runs.label,
        "speedup": speedup(baseline or ar, traced),
        "speedup_same_dtype": speedup(ar, traced),
        "mean_accepted": traced.tokens_per_pass,
        "round_cost": round_cost(ar, untraced),
        "verify_cost": verify_cost(ar, untraced),
        # The rest of the round: drafting, accepting and bookkeeping; and the drafting alone.
        "rest_cost": rest_of_round_cost(ar, untraced),
        "draft_cost": draft_cost(ar, untraced),
        "identical": runs.identical if acceptance == "greedy" else None,
        "trace_overhead": recording_overhead(traced),
        # The same, as the difference of two noisy totals: a cross-check, not the figure.
        "trace_overhead_by_difference": (clock - untraced.seconds) / untraced.seconds if untraced.seconds else 0.0,
        "traced": method_figures(traced), "untraced": method_figures(untraced),
    }
    if runs.library is not None:
        row["transformers"] = runs.library.figures()
    return row


def library_options(lm: LoadedModel, settings: DecodeSettings) -> dict | None:
    """transformers' own version of a lane's decoder, as `generate` arguments; None if it has none
    (each drafter says what its own is: see `Drafter.library_options`)."""
    if settings.method == PLAIN:
        return {}
    return drafter_class(settings.method).library_options(lm, check_settings(settings))


@contextmanager
def assistant_settings(assistant: PreTrainedModel | None, values: dict) -> Iterator[None]:
    """Set generation settings on the assistant model for one call, then put the old ones back."""
    if assistant is None:
        yield
        return
    config = assistant.generation_config
    old = {name: getattr(config, name, None) for name in values}
    config.update(**values)
    try:
        yield
    finally:
        config.update(**old)


@torch.inference_mode()
def transformers_generate(lm: LoadedModel, prompt: str, max_new_tokens: int,
                          options: dict | None = None) -> tuple[list[int], float]:
    """The library's own greedy `generate` on the same input, plain or with `library_options`.

    Returns the new tokens and the seconds taken (prefill included, as in our traces).
    """
    options = options or {}
    ids = torch.tensor([encode_prompt(lm, prompt)], device=lm.device)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=sorted(lm.eos_token_ids) or None,
                              pad_token_id=padding_id(lm.tokenizer, lm.eos_token_ids),
                              **options.get("generation", {}))
    assistant = options.get("assistant_model")
    extra = {"assistant_model": assistant} if assistant is not None else {}
    with assistant_settings(assistant, options.get("assistant", {})):
        if lm.device.type == "cuda":
            torch.cuda.synchronize(lm.device)
        start = time.perf_counter()
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **extra)
        if lm.device.type == "cuda":
            torch.cuda.synchronize(lm.device)
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


def make_lanes(lm: LoadedModel, settings: DecodeSettings, drafters: list[str], trees: list,
               compare: bool) -> list[LaneRuns]:
    """One lane per drafter, once per tree for one that takes a tree (Medusa); each named by its
    tree after pruning, and, with `compare`, given the library's version of its decoder where
    there is one."""
    lanes = []
    for method in drafters:
        for tree in trees if drafter_class(method).takes_tree else [settings.tree]:
            lane_settings = check_settings(replace(settings, method=method, tree=tree))
            drafter = make_drafter(lm, lane_settings)
            name = DYNAMIC_TREE if drafter.tree is None else drafter.tree.name
            options = library_options(lm, lane_settings) if compare else None
            library = None if options is None else LibraryRuns(options)
            lanes.append(LaneRuns(lane_settings, name, drafter.max_tree_nodes, library=library))
    return lanes


def run_bench(lm: LoadedModel, prompts: list[str], settings: DecodeSettings, trees: list,
              progress: bool = True, compare_transformers: bool = False,
              drafters: list[str] | None = None, rivals: dict[str, LoadedModel] | None = None) -> dict:
    """Decode every prompt with AR and with every lane; return totals and ratios.

    With `compare_transformers`, transformers' own greedy decoders run beside ours on the same
    inputs (plain generate; assisted generation and prompt lookup for those lanes), so neither
    the baseline nor the drafters are shown against a slow implementation. With `rivals` (the same
    model in other plain-decoding variants, `baseline.plain_rivals`), their plain decoding runs beside
    each heat too, and every speedup counts against the fastest plain decoding (`baseline.fastest_plain`).
    """
    compare = compare_transformers and settings.acceptance == "greedy"
    ar_settings = replace(settings, method=PLAIN)
    lanes = make_lanes(lm, settings, drafters or [DEFAULT_METHOD], trees, compare)
    plain_library = LibraryRuns(options={}) if compare else None
    libraries = [lib for lib in [plain_library, *(lane.library for lane in lanes)] if lib is not None]
    # Warm-up: first calls pay for allocations and lazy initialisation; keep that out of the figures.
    warm_tokens = min(WARM_UP_TOKENS, settings.max_new_tokens)
    for s in [ar_settings] + [lane.settings for lane in lanes]:
        generate(lm, prompts[0], replace(s, max_new_tokens=warm_tokens))
    rivals = rivals or {}
    for rival in rivals.values():
        generate(rival, prompts[0], replace(ar_settings, max_new_tokens=warm_tokens))
    rival_runs: dict[str, list[RunTrace]] = {name: [] for name in rivals}
    for library in libraries:
        transformers_generate(lm, prompts[0], warm_tokens, library.options)

    ar_runs: list[RunTrace] = []
    loads: list[MachineLoad] = []
    for i, prompt in enumerate(tqdm(prompts, desc="bench", disable=not progress)):
        plan = {"ar": ar_settings}
        for n, lane in enumerate(lanes):
            plan[f"{n} traced"] = lane.settings
            plan[f"{n} untraced"] = replace(lane.settings, detailed_trace=False)
        names = list(plan)
        # Alternate the order so neither plain decoding nor the lanes always run on a warmer machine.
        heat = run_heat(lm, prompt, plan, names if i % 2 == 0 else names[1:] + names[:1])
        loads.append(heat.load)
        ar_trace = heat.runs["ar"]
        ar_runs.append(ar_trace)
        for n, lane in enumerate(lanes):
            lane.traced.append(heat.runs[f"{n} traced"])
            lane.untraced.append(heat.runs[f"{n} untraced"])
            lane.identical &= lane.traced[-1].tokens == ar_trace.tokens
        # Other implementations beside each heat, not in it: their figures are their own.
        for name, rival in rivals.items():
            rival_runs[name].append(timed_run(rival, prompt, ar_settings))
        if plain_library is not None:
            plain_library.run(lm, prompt, settings.max_new_tokens, ar_trace.tokens)
        for lane in lanes:
            if lane.library is not None:
                lane.library.run(lm, prompt, settings.max_new_tokens, lane.traced[-1].tokens)

    ar = Timing.of(ar_runs)
    plain = {OWN: ar} | {name: Timing.of(runs) for name, runs in rival_runs.items()}
    fastest = fastest_plain(plain)
    rows = [lane_figures(lane, ar, settings.acceptance, plain[fastest]) for lane in lanes]
    first = rows[0]
    dtype = str(lm.dtype).removeprefix("torch.")
    return {
        "model": lm.name, "device": str(lm.device), "dtype": dtype, "dtype_reason": lm.dtype_reason,
        "attention": "gathered" if lm.gathered_attention else "library",
        "prompts": len(prompts), "max_new_tokens": settings.max_new_tokens,
        "acceptance": settings.acceptance,
        "speedup": first["speedup"], "mean_accepted": first["mean_accepted"],
        "identical": first["identical"], "trace_overhead": first["trace_overhead"],
        "baseline": describe(rivals.get(fastest, lm)),
        "ar": method_figures(ar), "lanes": rows, "load": combined(loads).to_dict(),
        "plain_rivals": {describe(rivals[name]): method_figures(plain[name]) for name in rival_runs},
        **({"cost_curve": dataclasses.asdict(lm.cost_curve)} if lm.cost_curve else {}),
        **({"transformers_generate": plain_library.figures()} if plain_library is not None else {}),
    }


def _library_lines(report: dict) -> list[str]:
    """The peer check, when the bench ran transformers' own decoders beside ours."""
    library = report.get("transformers_generate")
    if not library:
        return []
    ratio = report["ar"]["tokens_per_second"] / library["tokens_per_second"]
    same = "yes" if library["identical"] else "NO"
    lines = [f"transformers' generate(do_sample=False): {library['tokens_per_second']:.1f} tok/s on the same "
             f"inputs; our plain decoding runs at {ratio:.2f}x its speed; same tokens: {same}"]
    for row in report["lanes"]:
        peer = row.get("transformers")
        if peer:
            ours = row["untraced"]["tokens_per_second"]  # the decoder alone, nothing recorded
            name = drafter_class(row["drafter"]).library_name
            lines.append(f"transformers' {name}: {peer['tokens_per_second']:.1f} tok/s; "
                         f"our {row['label']} runs at {ours / peer['tokens_per_second']:.2f}x its speed; "
                         f"same tokens: {'yes' if peer['identical'] else 'NO'}")
    return lines


def _load_lines(report: dict) -> list[str]:
    """How busy the machine was while the bench measured, said where it was busy."""
    load = report.get("load")
    note = busy_note(MachineLoad(load["others"], load["cores"], load["threads"], load["seconds"])) if load else ""
    return [f"⚠ {note}"] if note else []


def _rival_lines(report: dict) -> list[str]:
    """The other plain decodings timed beside each heat, and which one the speedups count against."""
    rivals = report.get("plain_rivals") or {}
    lines = [f"AR as {name}: {figures['tokens_per_second']:.1f} tok/s, "
             f"{figures['seconds_per_round'] * 1e3:.2f} ms a step" for name, figures in rivals.items()]
    return [*lines, f"speedups count against {report['baseline']}, the fastest"] if rivals else []


def _curve_lines(report: dict) -> list[str]:
    """What a T-token pass cost here, the curve `--tree auto` chose by."""
    curve = report.get("cost_curve")
    if not curve:
        return []
    points = ", ".join(f"T={size} {cost:.2f}" for size, cost in zip(curve["sizes"], curve["costs"], strict=True))
    return [f"a T-token pass here, in one-token steps ({curve['threads']} threads, measured {curve['measured_at']}, "
            f"repeats within {curve.get('spread', 0.0):.0%}): {points}; the heads' drafting {curve['draft_cost']:.2f}"]


def format_table(report: dict) -> str:
    """The human-readable form of `run_bench`'s report."""
    ar = report["ar"]
    lines = [
        f"model {report['model']} on {report['device']} ({report['dtype']}, {report['attention']} attention), "
        f"{report['prompts']} prompts x {report['max_new_tokens']} new tokens, "
        f"acceptance {report['acceptance']}",
        *([report["dtype_reason"]] if report["dtype_reason"] else []),
        f"AR: {ar['tokens_per_second']:.1f} tok/s, {ar['forward_passes']} passes for {ar['tokens']} tokens, "
        f"{ar['seconds_per_round'] * 1e3:.2f} ms a step",
        *_load_lines(report),
        *_rival_lines(report),
        *_curve_lines(report),
        *_library_lines(report),
        "round cost: one round in AR steps, and its two parts: the verify pass, and the rest "
        "(drafting, accepting, bookkeeping), of which the drafting alone; speedup ≈ accepted/pass ÷ round cost",
        "",
        f"{'drafter':<26}{'nodes':>6}{'tok/s':>9}{'speedup':>9}{'accepted/pass':>15}"
        f"{'round cost':>12}{'verify':>8}{'rest':>8}{'drafting':>10}{'passes':>8}{'trace cost':>12}{'identical':>11}",
    ]
    for row in report["lanes"]:
        m = row["traced"]
        same = "-" if row["identical"] is None else ("yes" if row["identical"] else "NO")
        lines.append(
            f"{row['label']:<26}{row['tree_size']:>6}{m['tokens_per_second']:>9.1f}"
            f"{row['speedup']:>8.2f}x{row['mean_accepted']:>15.2f}{row['round_cost']:>7.2f} steps"
            f"{row['verify_cost']:>8.2f}{row['rest_cost']:>8.2f}{row['draft_cost']:>10.3f}{m['forward_passes']:>8}"
            f"{row['trace_overhead']:>11.1%}{same:>11}"
        )
    if any(row["identical"] is False for row in report["lanes"]):
        lines += ["", differing_output_note(report["dtype"], report["attention"], report["device"])]
    return "\n".join(lines)


def differing_output_note(dtype: str, attention: str, device: str) -> str:
    """Why greedy Medusa may not equal plain decoding, for a table that shows it did not."""
    if dtype == "float32" or (attention == "gathered" and device == "cpu"):
        return (f"NO in {dtype} with {attention} attention means greedy output differed from plain "
                "decoding's: that is a bug, please report the prompt.")
    return (f"NO in {dtype} with the {attention} attention: a verify pass over many tokens rounds "
            "differently from a one-token step, so where the two best tokens nearly tie the choice can "
            "flip. The tree logic is the same; on a CPU --attention gathered makes every pass round "
            "alike, and --dtype float32 checks losslessness anywhere.")
