"""What a pass over T tokens costs on this machine, measured on the loaded model, and cached.

Medusa's bet is that a forward pass is bound by reading the weights, so checking T guesses costs
about one pass. Whether that holds depends on the hardware: on a GPU, or a CPU with bfloat16
matrix units, a 16-token pass costs 1.1-1.2 one-token steps; on a CPU doing float32 it may cost
1.4-2. The best tree is the one whose expected tokens per pass, divided by what its pass costs
*here*, is largest (Sequoia's hardware-aware choice, Chen et al. 2024; see `tree_choice.py`).

So we time it: after the same cached prefix, a pass over each tree size T, interleaved round by
round so a busy machine slows every size alike, and the median of each over the median one-token
step. The trees timed are prefixes of the paper's 63-node tree, so the pass runs exactly the code
a verify pass runs (mask, positions, the chosen attention). The Medusa heads' drafting is timed
too, as one more cost per round. Five repeats of each size take about 5 s for SmolLM2 on a
2-core CPU; the curve is cached per machine, model, dtype, attention and thread count, so a later
load reads it back.

A shared machine can be many times slower for a moment while another job runs, and a curve
measured then would steer every later run on it. The median shrugs off one slow repeat, but not
a machine that stays busy; so each curve records how well most of its repeats agreed, a noisy
one is measured once more, and only a quiet one is cached (the run uses the quieter of the two
either way).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from .atomic import write_atomically
from .features import FINAL_STATE
from .fetch import cache_root
from .kv_cache import compact_cache, new_cache
from .machine_load import BUSY_CORES, LoadMeter
from .medusa_modules import heads_count, medusa_part
from .model import LoadedModel
from .passes import decode_one_token, draft, run_model, verify_tree
from .trace import CostCurve
from .tree import MC_SIM_7B_63, Tree

CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64)
PAST = 128  # cached tokens before each timed pass: a prompt and the start of an answer
REPEATS = 5
CACHE_SUBDIR = "cost_curves"
# Part of the cache key: raised when what a cached curve means changes, so curves measured before
# are measured again (2: the lm_head's one row through the packed kernel; 3: a curve records the
# load it was measured under, and one measured while other programs held cores is not cached;
# 4: the exact attention's chunked products, a one-row step through the faster kernel).
CURVE_VERSION = 4
# A curve where most repeats of some size disagree by more than this (see `disagreement`) was
# measured while something else ran: it is not cached.
NOISY_SPREAD = 0.25


def is_rough(curve: CostCurve) -> bool:
    """Whether the curve was measured on a busy machine: its repeats far apart, or other programs
    holding cores meanwhile (which can slow every repeat alike, so agreeing repeats do not prove
    a quiet machine). A rough curve is used, and said to be rough, but never cached."""
    busy = curve.other_cores is not None and curve.other_cores >= BUSY_CORES
    return curve.spread > NOISY_SPREAD or busy


def _curve_tree(size: int) -> Tree:
    """A `size`-node tree (root included): the first size - 1 paths of the paper's tree. Its
    paths are sorted by length, so every prefix of the list is itself a tree."""
    return Tree.from_choices(MC_SIM_7B_63[: size - 1], num_heads=4, name=f"curve-{size}")


def disagreement(times: list[float]) -> float:
    """The narrowest range that holds most (a majority) of `times`, over their median: small
    when most repeats agree, however far one of them strays."""
    ordered = sorted(times)
    most = len(ordered) // 2 + 1
    narrowest = min(ordered[i + most - 1] - ordered[i] for i in range(len(ordered) - most + 1))
    return narrowest / statistics.median(ordered)


def _time(device: torch.device, run) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


@torch.inference_mode()
def measure_cost_curve(lm: LoadedModel, sizes: tuple[int, ...] = CURVE_SIZES, past: int = PAST,
                       repeats: int = REPEATS) -> CostCurve:
    """Time a T-token verify pass for each T in `sizes` (1 is the plain step) after `past` tokens."""
    sizes = tuple(sorted({1, *(s for s in sizes if 1 <= s <= len(MC_SIM_7B_63) + 1)}))
    past = max(1, min(past, lm.context_length - max(sizes) - 1))
    generator = torch.Generator().manual_seed(0)
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    prefix = torch.randint(0, vocab, (past,), generator=generator).tolist()
    tokens = torch.randint(0, vocab, (max(sizes),), generator=generator).to(lm.device)
    cache = new_cache(lm.model.config, for_trees=True)
    reads = FINAL_STATE if medusa_part(lm) is not None else ()
    _, hidden = run_model(lm, prefix, cache, last_only=True, hidden_layers=reads)
    trees = {size: _curve_tree(size) for size in sizes if size > 1}

    def one_pass(size: int) -> float:
        if size == 1:
            seconds = _time(lm.device, lambda: decode_one_token(lm, int(tokens[0]), cache))
        else:
            seconds = _time(lm.device, lambda: verify_tree(lm, trees[size], tokens[:size], cache, hidden_layers=()))
        compact_cache(cache, past, [])  # drop the pass's rows: every pass sees the same prefix
        return seconds

    for size in sizes:  # warm-up: first calls allocate and pick kernels
        one_pass(size)
    meter = LoadMeter()
    seconds: dict[int, list[float]] = {size: [] for size in sizes}
    for repeat in range(repeats):
        order = sizes[repeat % len(sizes):] + sizes[: repeat % len(sizes)]
        for size in order:
            seconds[size].append(one_pass(size))
    load = meter.stop()
    step = statistics.median(seconds[1])
    spread = max(disagreement(times) for times in seconds.values())
    return CostCurve(
        sizes=list(sizes), costs=[round(statistics.median(seconds[s]) / step, 4) for s in sizes],
        step_seconds=step, device=str(lm.device), dtype=str(lm.dtype).removeprefix("torch."),
        threads=torch.get_num_threads(), past=past,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        draft_cost=round(_draft_seconds(lm, hidden[-1] if hidden is not None else None, repeats) / step, 4),
        spread=round(spread, 4),
        other_cores=None if load.others is None else round(load.others, 2),
    )


def _draft_seconds(lm: LoadedModel, hidden: torch.Tensor | None, repeats: int) -> float:
    """The median time the heads take to guess for the paper's tree: Medusa's drafting per round."""
    part = medusa_part(lm)
    if part is None or hidden is None:
        return 0.0
    # The paper's tree, cut to the heads there are and to the ranks their vocabulary has.
    guessable = part.heads.config.draft_vocab_size or part.heads.config.vocab_size
    tree = Tree.pruned([path for path in MC_SIM_7B_63 if max(path) < guessable], part.num_heads, "curve-draft")
    draft(lm, part, hidden, tree, root=0, with_probs=False)
    return statistics.median(_time(lm.device, lambda: draft(lm, part, hidden, tree, root=0, with_probs=False))
                             for _ in range(repeats))


# ----- the cache ------------------------------------------------------------------------------------
def _processor() -> str:
    """The processor's model name: a curve measured on one machine says nothing of another."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def curve_key(lm: LoadedModel) -> str:
    """What a cached curve must match to be reused: machine, model, arithmetic and threads."""
    identity = {
        "processor": _processor(), "device": str(lm.device), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "model": lm.name,
        "parameters": sum(p.numel() for p in lm.model.parameters()),
        "dtype": str(lm.dtype), "attention": lm.model.config._attn_implementation,
        "heads": heads_count(lm), "sizes": list(CURVE_SIZES), "past": PAST, "version": CURVE_VERSION,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def _cacheable(lm: LoadedModel) -> bool:
    """Models known by name (embedded, fetched, registry, hub id). A model loaded from a folder
    path may change under the same path, and tests load hundreds from temporary folders."""
    return not Path(lm.name).is_absolute() and not lm.name.startswith(".")


def _well_formed(curve: CostCurve) -> bool:
    numbers = [*curve.costs, curve.step_seconds, curve.draft_cost, curve.spread]
    return (len(curve.sizes) == len(curve.costs) >= 2 and curve.sizes[0] == 1
            and all(isinstance(s, int) for s in curve.sizes) and curve.sizes == sorted(curve.sizes)
            and all(isinstance(x, int | float) and x >= 0 for x in numbers))


def quiet_cost_curve(lm: LoadedModel) -> CostCurve:
    """The curve measured now, and once more if the machine was busy: the quieter of the two."""
    curve = measure_cost_curve(lm)
    if is_rough(curve):
        curve = min(curve, measure_cost_curve(lm), key=lambda c: (is_rough(c), c.other_cores or 0.0, c.spread))
    return curve


def cached_cost_curve(lm: LoadedModel, remeasure: bool = False) -> CostCurve:
    """The model's cost curve from the cache if this machine measured it before, else measured now.

    A cache file that is unreadable, not a curve, or a rough curve is ignored and measured again;
    a rough measurement is used but not written (`is_rough`).
    """
    path = cache_root() / CACHE_SUBDIR / f"{curve_key(lm)}.json"
    if not remeasure and _cacheable(lm) and path.is_file():
        try:
            cached = CostCurve(**json.loads(path.read_text(encoding="utf-8")))
            if _well_formed(cached) and not is_rough(cached):
                return cached
        except (OSError, ValueError, TypeError):
            pass
    curve = quiet_cost_curve(lm)
    if _cacheable(lm) and not is_rough(curve):
        text = json.dumps(dataclasses.asdict(curve), indent=1)
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return curve


def model_cost_curve(lm: LoadedModel, remeasure: bool = False) -> CostCurve:
    """The loaded model's cost curve, measured (or read from the cache) on first use and kept."""
    if lm.cost_curve is None or remeasure:
        lm.cost_curve = cached_cost_curve(lm, remeasure)
    return lm.cost_curve
