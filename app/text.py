"""The Learn walkthrough: Markdown steps in assets/explainer, filled in with this run's numbers.

Each step file starts with a `# Title` line, a `<!-- label: Short -->` line (the step's name in
the step bar, where long titles would collide) and a `<!-- shows: VIEW -->` line naming the live
view it explains; the rest is Markdown in which `{{name}}` is replaced by a number from the run
(see `explainer_values`). Until a run exists, numbers show as "—".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from decoding.trace import RunTrace

from .figures import acceptance_by_depth, pass_cost_ratio, round_cost_parts, seconds_per_pass, speedup
from .tokens import visible
from .tree_layout import leaf_count

EXPLAINER_DIR = Path(__file__).resolve().parent.parent / "assets" / "explainer"
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
COMMENT = re.compile(r"<!--\s*(\w+):\s*(.*?)\s*-->\n?")
MISSING = "—"


@dataclass(frozen=True)
class Step:
    title: str
    label: str
    shows: str  # the view this step points at: "race", "stream", "tree", "mask", "stats", ...
    template: str


def load_steps(directory: Path = EXPLAINER_DIR) -> list[Step]:
    """The walkthrough's steps, in file-name order."""
    steps = []
    for path in sorted(directory.glob("*.md")):
        lines = path.read_text(encoding="utf-8").strip().splitlines()
        title = lines[0].lstrip("#").strip()
        body = "\n".join(lines[1:])
        notes = dict(COMMENT.findall(body))
        template = f"### {title}\n\n" + COMMENT.sub("", body).strip()
        steps.append(Step(title, notes.get("label", title), notes.get("shows", ""), template))
    return steps


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every {{name}}; names the run cannot fill yet show as a dash."""
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), MISSING), template)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _quoted(texts: list[str]) -> str:
    return " ".join(f"`{visible(t)}`" for t in texts) or MISSING


def run_values(run: RunTrace) -> dict[str, str]:
    """Numbers from a Medusa run: passes, tokens, the tree and its best round."""
    values = {
        "model": run.model,
        "device": run.device,
        "acceptance": run.settings.acceptance,
        "new_tokens": str(len(run.tokens)),
        "passes": str(run.forward_passes),
        "rounds": str(len(run.rounds)),
        "mean_accepted": f"{run.mean_accepted:.2f}",
        "ar_passes": str(len(run.tokens)),
        "saved_passes": str(len(run.tokens) - run.forward_passes),
        "medusa_time": f"{run.total_time:.2f}",
    }
    if run.tree is not None:
        tree = run.tree
        values |= {
            "tree_name": tree.name,
            "tree_nodes": str(tree.size),
            "tree_candidates": str(leaf_count(tree.parents)),
            "tree_depth": str(max(tree.depths)),
        }
    if run.rounds:
        best = max(run.rounds, key=lambda r: r.accepted_length)
        values |= {
            "best_round": str(best.index + 1),
            "best_accepted": str(best.accepted_length),
            "best_guesses": str(sum(best.emitted_from_heads)),
            "best_text": _quoted(best.emitted_texts),
            "verify_ms": _ms(sum(r.time_verify for r in run.rounds) / len(run.rounds)),
        }
        if best.heads_topk_tokens and best.node_texts and run.tree is not None:
            first_level = [n for n in range(run.tree.size) if run.tree.depths[n] == 1]
            values["best_head1_guesses"] = _quoted([best.node_texts[n] for n in first_level])
    for depth, overall, _ in acceptance_by_depth(run)[:2]:
        values[f"head{depth}_rate"] = f"{overall:.0%}"
    return values


def race_values(ar: RunTrace, medusa: RunTrace) -> dict[str, str]:
    """Numbers only a measured race gives: time per pass and the wall-clock speedup."""
    cost = pass_cost_ratio(ar, medusa)
    verify, draft_accept = round_cost_parts(ar, medusa)
    return {
        "ar_time": f"{ar.total_time:.2f}",
        "medusa_time": f"{medusa.total_time:.2f}",
        "ar_passes": str(ar.forward_passes),
        "ar_ms_per_pass": _ms(seconds_per_pass(ar)),
        "medusa_ms_per_pass": _ms(seconds_per_pass(medusa)),
        "pass_cost": f"{cost:.2f}",
        "predicted_speedup": f"{medusa.mean_accepted / cost:.2f}" if cost else MISSING,
        "verify_cost": f"{verify:.2f}",
        "draft_accept_cost": f"{draft_accept:.2f}",
        "ceiling_speedup": f"{medusa.mean_accepted / verify:.2f}" if verify else MISSING,
        "speedup": f"{speedup(ar, medusa):.2f}",
    }


def explainer_values(run: RunTrace | None, ar: RunTrace | None) -> dict[str, str]:
    values = run_values(run) if run is not None and run.tree is not None else {}
    if run is not None and ar is not None:
        values |= race_values(ar, run)
    return values


def render_steps(steps: list[Step], run: RunTrace | None, ar: RunTrace | None) -> list[str]:
    """Each step's Markdown with the run's numbers in it."""
    values = explainer_values(run, ar)
    return [fill(step.template, values) for step in steps]
