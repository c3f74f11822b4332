"""Texts of the page: the Learn walkthrough (assets/explainer) and the fixed texts (assets/texts).

Each step file starts with a `# Title` line, a `<!-- label: Short -->` line (the step's name in
the step bar, where long titles would collide), a `<!-- shows: VIEW -->` line naming the live
view it explains and, if the step draws a figure of its own, a `<!-- figure: NAME -->` line;
the rest is Markdown in which `{{name}}` is replaced by a number from the run
(see `explainer_values`). Until a run exists, numbers show as "—". Every token quoted from a run
is escaped (`md_code`): model output never becomes Markdown or HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from decoding.assets import ASSETS_DIR
from decoding.measure import busy_note
from decoding.race import PLAIN, RaceResult
from decoding.stats import Timing, rest_of_round_cost, round_cost, verify_cost
from decoding.trace import CostCurve, RunTrace
from decoding.training.quick_heads import TrainedHeads

from .charts import acceptance_by_depth, rough_curve_reason
from .drafter_costs import drafter_comparison
from .eagle_views import NO_ACCURACY, GuessingAccuracy, after_medusa_values
from .lanes import MEDUSA
from .models import heads_recipe
from .tokens import count, md_code, md_text
from .training_views import training_step_values
from .tree_layout import leaf_count

EXPLAINER_DIR = ASSETS_DIR / "explainer"
TEXTS_DIR = ASSETS_DIR / "texts"
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
COMMENT = re.compile(r"<!--\s*(\w+):\s*(.*?)\s*-->\n?")
MISSING = "—"
# Steps each token beyond the first adds to a pass. Under FLAT_PER_TOKEN the curve reads "nearly
# flat" (bfloat16 on this project's CPU: 64 tokens cost 1.54 steps, 0.009 a token; a 7B model on a
# GPU less still); float32 here adds 0.02-0.05 a token ("rising"); over STEEP_PER_TOKEN, "steep".
FLAT_PER_TOKEN = 0.015
STEEP_PER_TOKEN = 0.5


@dataclass(frozen=True)
class Step:
    title: str
    label: str
    shows: str  # the view this step points at: "race", "stream", "tree", "mask", "stats", ...
    template: str
    figure: str = ""  # a figure drawn in the step itself: "cost-curve" (see charts.cost_curve_figure)


def load_steps(directory: Path = EXPLAINER_DIR) -> list[Step]:
    """The walkthrough's steps, in file-name order."""
    steps = []
    for path in sorted(directory.glob("*.md")):
        lines = path.read_text(encoding="utf-8").strip().splitlines()
        title = lines[0].lstrip("#").strip()
        body = "\n".join(lines[1:])
        notes = dict(COMMENT.findall(body))
        template = f"### {title}\n\n" + COMMENT.sub("", body).strip()
        steps.append(Step(title, notes.get("label", title), notes.get("shows", ""), template,
                          notes.get("figure", "")))
    return steps


@cache
def load_text(name: str) -> str:
    """A fixed text of the page: assets/texts/<name> (Markdown or HTML)."""
    return (TEXTS_DIR / name).read_text(encoding="utf-8").strip()


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every {{name}}; names the run cannot fill yet show as a dash."""
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), MISSING), template)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _quoted(texts: list[str]) -> str:
    return " ".join(md_code(t) for t in texts) or MISSING


HEADS_TRAINING = {
    "medusa-2": "the Medusa-2 way: the heads and the base model were tuned together",
    "medusa-1": "the Medusa-1 way: the heads alone, with the base model frozen",
    "medusa-1-root": ("the Medusa-1 way, with the base model frozen; each head also reads the token the "
                      "base model just chose (its embedding), which a one-block head cannot work out "
                      "from the hidden state alone"),
}


def run_values(run: RunTrace) -> dict[str, str]:
    """Numbers from a Medusa run: passes, tokens, the tree and its best round."""
    values = {
        "model": md_text(run.model),
        "device": run.device,
        "acceptance": run.settings.acceptance,
        "new_tokens": str(len(run.tokens)),
        "passes": str(run.forward_passes),
        "rounds": str(len(run.rounds)),
        "round_tokens": str(sum(r.accepted_length for r in run.rounds)),
        "mean_accepted": f"{run.mean_accepted:.2f}",
        "ar_passes": str(len(run.tokens)),
        "saved_passes": str(len(run.tokens) - run.forward_passes),
    }
    recipe = heads_recipe(run.model)
    if recipe:
        values["heads_training"] = HEADS_TRAINING[recipe]
    if run.tree is not None:
        tree = run.tree
        values |= {
            "tree_name": f"*{md_text(tree.name)}*",  # a name, not a token: spaces stay spaces
            "tree_nodes": str(tree.size),
            "tree_candidates": count(leaf_count(tree.parents), "candidate path"),
            "tree_depth_tokens": count(max(tree.depths), "token"),
            "tree_heads": f"{max(tree.depths)} of its {count(run.settings.num_heads, 'head')}"
                          if run.settings.num_heads else count(max(tree.depths), "head"),
        }
    if run.rounds:
        best = max(run.rounds, key=lambda r: r.accepted_length)
        values |= {
            "best_round": str(best.index + 1),
            "best_accepted": count(best.accepted_length, "token"),
            "best_guesses": count(sum(best.emitted_from_drafter), "guess", "guesses"),
            "best_text": _quoted(best.emitted_texts),
        }
        if best.guesses and best.node_texts and run.tree is not None:
            tree = run.round_tree(best)
            first_level = [n for n in range(tree.size) if tree.depths[n] == 1]
            values["best_head1_guesses"] = _quoted([best.node_texts[n] for n in first_level])
    for depth, overall, reached in acceptance_by_depth(run)[:2]:
        values[f"head{depth}_rate"] = f"{overall:.0%}"
        values[f"head{depth}_reached_rate"] = f"{reached:.0%}"
    return values


def divided_as_printed(numerator: float, denominator: float) -> str:
    """numerator ÷ denominator as the text writes it: of the two figures as printed (2 decimals),
    so that a reader who divides them gets the printed result."""
    shown = round(denominator, 2)
    return f"{round(numerator, 2) / shown:.2f}" if shown else MISSING


def medusa_race(race: RaceResult) -> dict[str, RunTrace]:
    """The race whose Medusa speedup is the median: Learn reasons from this one race throughout,
    so its figures divide into each other as written."""
    return race.races[race.median_index(MEDUSA)]


def race_values(race: RaceResult) -> dict[str, str]:
    """Numbers only measured races give: Medusa's time per round and tokens per pass over every
    race (the totals the Stats tab divides too, so both give one ceiling), and its median speedup
    and range."""
    ar, medusa = race.timing(PLAIN), race.timing(MEDUSA)
    cost, verify, spread = round_cost(ar, medusa), verify_cost(ar, medusa), race.spread(MEDUSA)
    busy = busy_note(race.load, race.threads_before)
    return {
        "races": str(spread.count),
        "ar_ms_per_pass": _ms(ar.seconds_per_round),
        "medusa_ms_per_round": _ms(medusa.seconds_per_round),
        "race_tokens_per_pass": f"{medusa.tokens_per_pass:.2f}",
        "round_cost": f"{cost:.2f}",
        "predicted_speedup": divided_as_printed(medusa.tokens_per_pass, cost),
        "verify_cost": f"{verify:.2f}",
        "rest_cost": f"{rest_of_round_cost(ar, medusa):.2f}",
        "ceiling_speedup": divided_as_printed(medusa.tokens_per_pass, verify),
        "speedup": f"{spread.median:.2f}",
        "speedup_range": f"{spread.low:.2f}–{spread.high:.2f}",
        "race_busy": f" {busy}" if busy else "",
    }


# The two step times of step 1 are told apart where they differ by more than this share.
STEPS_DIFFER = 0.1


def two_steps(curve: CostCurve | None, race: RaceResult | None) -> str:
    """Why step 1's two step times differ, where they do: the curve's was timed when the model
    loaded, on a made-up prefix; the race's over real answers, on the machine as it was then."""
    if curve is None or race is None or PLAIN not in race.lanes:
        return ""
    step = Timing.of(medusa_race(race)[PLAIN] if MEDUSA in race.lanes else race.shown[PLAIN]).seconds_per_round
    if not step or abs(step / curve.step_seconds - 1) <= STEPS_DIFFER:
        return ""
    load = race.load
    why = (f"other programs kept {load.others:.1f} of the {load.cores} cores busy while the race ran"
           if load is not None and load.busy else
           "the machine's load changed between the two, and the race's answer grows its cache with every token")
    return (f" The curve above timed one step at {_ms(curve.step_seconds)} ms when the model loaded; the "
            f"race's steps took {step / curve.step_seconds:.1f}× as long: {why}. Each figure here is divided "
            "only by steps from its own measurement.")


def measured_curve(run: RunTrace | None, race: RaceResult | None) -> CostCurve | None:
    """The cost of a T-token pass on the loaded model, as the engine measured it: from the last
    run, else from any run of the last race (it is the model's, whichever drafter ran)."""
    traces = [run] if run is not None else []
    if race is not None:
        traces += [trace for runs in race.races for trace in runs.values()]
    return next((trace.cost_curve for trace in traces if trace.cost_curve is not None), None)


def _steps(cost: float) -> str:
    return f"{cost:.2f} step{'' if f'{cost:.2f}' == '1.00' else 's'}"


def _passes_of_several(curve: CostCurve) -> list[tuple[int, float]]:
    """The curve's (tokens, cost in steps) of the passes over more than one token."""
    return [(size, cost) for size, cost in zip(curve.sizes, curve.costs, strict=True) if size > 1]


CURVE_SHAPES = {  # by `curve_shape`
    "flat": "nearly flat: checking many guesses costs about one pass, the regime Medusa is built for",
    "steep": "steep: almost every extra token costs a step of its own, so only the smallest trees can pay",
    "rising": "rising: each extra guess costs real time here, so small trees win",
}


def curve_shape(curve: CostCurve) -> str:
    """"flat", "rising" or "steep" (a key of CURVE_SHAPES): what each token beyond the first adds
    to a pass, in steps, up to the largest pass the curve timed."""
    points = _passes_of_several(curve)
    largest, cost = points[-1] if points else (2, 1.0)
    per_token = (cost - 1) / (largest - 1)
    return "flat" if per_token < FLAT_PER_TOKEN else "steep" if per_token > STEEP_PER_TOKEN else "rising"


def curve_values(curve: CostCurve | None, tree_nodes: int | None) -> dict[str, str]:
    """What the measured cost curve says, in words: the pass costs it found, and where it is
    flat or steep. Without a curve, that it was not measured (never a number it did not see)."""
    points = _passes_of_several(curve) if curve is not None else []
    if not points:
        return {"cost_curve": "This run did not time passes of different sizes on this machine, so the "
                              "figure is empty; the Race tab's round costs measure the same thing.",
                "curve_tree_cost": ""}
    sampled = points if len(points) <= 4 else [points[0], points[len(points) // 3],
                                               points[2 * len(points) // 3], points[-1]]
    said = [f"over {size} tokens {cost:.2f}" for size, cost in sampled]
    said[0] = f"a pass over {count(sampled[0][0], 'token')} cost {sampled[0][1]:.2f} one-token steps"
    listed = said[0] if len(said) < 2 else ", ".join(said[:-1]) + " and " + said[-1]
    shape = CURVE_SHAPES[curve_shape(curve)]
    values = {"cost_curve": (f"On this machine ({md_text(curve.device)}, {md_text(curve.dtype)}, {curve.threads} "
                             f"thread{'s' if curve.threads != 1 else ''}; one step {curve.step_seconds * 1e3:.1f} ms), "
                             f"measured on the loaded model, {listed}: the curve is **{shape}**."
                             f"{_rough(curve)}"),
              "curve_tree_cost": ""}
    if tree_nodes:
        values["curve_tree_cost"] = (f" The curve in step 1 puts a {tree_nodes}-token pass at "
                                     f"{_steps(curve.cost(tree_nodes))}.")
    return values


def _rough(curve: CostCurve) -> str:
    reason = rough_curve_reason(curve)
    return f" **Measured on a busy machine** ({reason}): these costs are rough." if reason else ""


def walkthrough_run(run: RunTrace | None, race: RaceResult | None) -> RunTrace | None:
    """The Medusa run the walkthrough reads: the last run if it used the heads, else the race's
    median Medusa lane, else none (the steps explain the heads, not another drafter)."""
    if run is not None and run.settings.method == MEDUSA:
        return run
    if race is not None and MEDUSA in race.lanes:
        return medusa_race(race)[MEDUSA]
    return None


def explainer_values(run: RunTrace | None, race: RaceResult | None,
                     accuracy: GuessingAccuracy = NO_ACCURACY, trained: TrainedHeads | None = None) -> dict[str, str]:
    medusa = walkthrough_run(run, race)
    values = {"two_steps": "", "race_busy": ""}  # sentences said only where they apply
    if medusa is not None and medusa.tree is not None:
        values |= run_values(medusa)
    if race is not None and MEDUSA in race.lanes:
        values |= race_values(race)
    values["drafter_comparison"] = drafter_comparison(race)
    values |= after_medusa_values(run, race, accuracy)
    values |= training_step_values(trained, run)
    tree_nodes = medusa.tree.size if medusa is not None and medusa.tree is not None else None
    if run is None and race is None:
        values |= {"cost_curve": "Press **Run** to see what a pass costs on this machine.", "curve_tree_cost": ""}
    else:
        curve = measured_curve(run, race)
        values |= curve_values(curve, tree_nodes) | {"two_steps": two_steps(curve, race)}
    return values


def render_steps(steps: list[Step], run: RunTrace | None, race: RaceResult | None,
                 accuracy: GuessingAccuracy = NO_ACCURACY, trained: TrainedHeads | None = None) -> list[str]:
    """Each step's Markdown with the run's numbers in it (the drafters' measured accuracy, and what
    the visitor's own training bought)."""
    values = explainer_values(run, race, accuracy, trained)
    return [fill(step.template, values) for step in steps]
