"""EAGLE on the page, in words: what its draft did each round, and the Learn step "after Medusa".
Plain values from traces, and from the two describing fields of a loaded model (its heads' and
its EAGLE head's measured accuracy: `GuessingAccuracy.of`). No Gradio here.

EAGLE grows a new tree every round (EAGLE-2's dynamic tree): its draft layer guesses one step at
a time, expands only the most confident candidates of each depth, and the rerank keeps the most
confident of everything it drafted as the tree to verify. A round's trace holds that verified tree
(`RoundTrace.tree`) and every candidate drafted (`RoundTrace.drafted`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from decoding.drafters import available_drafters, drafter_class
from decoding.model import LoadedModel
from decoding.race import PLAIN, RaceResult
from decoding.stats import verify_cost
from decoding.trace import RoundTrace, RunTrace

from .lanes import EAGLE, MEDUSA, MTP
from .tokens import count, md_text

# ----------------------------------------------------------------------------- one round

def candidate_of(rnd: RoundTrace) -> dict[int, int]:
    """Each verified node's candidate in the round's draft (node -> index in `rnd.drafted`)."""
    if rnd.drafted is None:
        return {}
    return {node: i for i, node in enumerate(rnd.drafted.nodes) if node >= 0}


def step_prob(rnd: RoundTrace, candidate: int) -> float:
    """The draft's own probability of a candidate given its parent: its confidence over its
    parent's (a confidence is the product of these along the path)."""
    drafted = rnd.drafted
    parent = drafted.parents[candidate]
    above = drafted.confidences[parent] if parent >= 0 else 1.0
    return drafted.confidences[candidate] / above if above > 0 else 0.0


def node_prob(rnd: RoundTrace, node: int) -> float | None:
    """The draft's probability of verified node `node` given its parent (None where not drafted)."""
    candidate = candidate_of(rnd).get(node)
    return None if candidate is None else step_prob(rnd, candidate)


def kept_count(rnd: RoundTrace) -> int:
    return sum(1 for node in rnd.drafted.nodes if node >= 0) if rnd.drafted else 0


def confidence_lines(rnd: RoundTrace, candidate: int) -> list[str]:
    """A candidate's hover: how sure the draft was, and whether its children were drafted."""
    drafted = rnd.drafted
    expanded = ("expanded: among the most confident of its depth, so the draft guessed its children"
                if drafted.expanded[candidate] else "not expanded: the draft guessed no children after it")
    depth = drafted.depths[candidate]
    return [f"EAGLE's step-{depth} guess, {count(depth, 'token')} after the root",
            f"draft's probability of it: {step_prob(rnd, candidate):.2f} · "
            f"confidence (product along its path): {drafted.confidences[candidate]:.3f}",
            expanded]


def proposer_lines(rnd: RoundTrace, node: int) -> list[str]:
    """Who proposed a verified node of an EAGLE round, and how sure the draft was."""
    candidate = candidate_of(rnd).get(node)
    if candidate is None:
        return ["EAGLE's guess"]
    rank = sorted(rnd.drafted.confidences, reverse=True).index(rnd.drafted.confidences[candidate]) + 1
    return [*confidence_lines(rnd, candidate),
            f"kept by the rerank: the {_ordinal(rank)} most confident of {len(rnd.drafted.parents)} drafted"]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def drafting_text(rnd: RoundTrace) -> str:
    """What EAGLE's draft did this round, for the round's numbers."""
    drafted = rnd.drafted
    if drafted is None:
        return ""
    expanded, kept = sum(drafted.expanded), kept_count(rnd)
    keep = (f"kept the **{kept} most confident**" if kept else
            "kept **none**: by this machine's cost curve no guess was sure enough to pay for its place")
    passes = f"**{rnd.draft_passes} pass{'' if rnd.draft_passes == 1 else 'es'}**"
    grew = (f"expanding the {expanded} most confident" if expanded else
            "then stopped: another level was not likely enough to pay for its pass")
    return (f"EAGLE drafted **{len(drafted.parents)} candidates** in {passes} of its draft "
            f"layer (**{rnd.time_draft * 1e3:.1f} ms**), {grew}, and {keep} · ")


def lane_note(trace: RunTrace) -> str:
    """The EAGLE lane's settings in a few words: its tree's depth and mean size, as run."""
    settings, rounds = trace.settings, [rnd for rnd in trace.rounds if rnd.tree_size]
    size = f", {sum(r.tree_size for r in rounds) / len(rounds):.0f} nodes a round" if rounds else ""
    return f"dynamic tree, {settings.eagle_depth} deep{size}"


def mean_tree_size(trace: RunTrace) -> float:
    rounds = [rnd for rnd in trace.rounds if rnd.tree_size]
    return sum(r.tree_size for r in rounds) / len(rounds) if rounds else 0.0


# ----------------------------------------------------------------------------- Learn: after Medusa

@dataclass(frozen=True)
class GuessingAccuracy:
    """What a model's drafters are measured to guess right, per depth, on held-out answers.

    `medusa[d]`: head d + 1's top-1 guess right (whatever the heads before it guessed);
    `eagle[d]`: EAGLE's guess at depth d + 1 right, given its guesses before it were right.
    `mtp[d]`: MTP module d + 1's, likewise. Each is None where the model ships no such measurement.
    `offers_eagle`: whether the model can run EAGLE at all (None: not known)."""

    medusa: list[float] | None = None
    eagle: list[float] | None = None
    offers_eagle: bool | None = None
    mtp: list[float] | None = None

    @classmethod
    def of(cls, model: LoadedModel | None) -> GuessingAccuracy:
        """Read from a loaded model's describing fields (never from its heads themselves)."""
        if model is None:
            return cls()
        return cls(drafter_class(MEDUSA).held_out_accuracy(model), drafter_class(EAGLE).held_out_accuracy(model),
                   EAGLE in available_drafters(model), drafter_class(MTP).held_out_accuracy(model))


NO_ACCURACY = GuessingAccuracy()


def drafter_run(run: RunTrace | None, race: RaceResult | None, method: str) -> RunTrace | None:
    """The run of `method` the step tells: the last run if it was that drafter's, else the race's lane."""
    if run is not None and run.settings.method == method:
        return run
    if race is not None and method in race.lanes:
        return race.shown[method]
    return None


def eagle_run(run: RunTrace | None, race: RaceResult | None) -> RunTrace | None:
    return drafter_run(run, race, EAGLE)


def medusa_run(run: RunTrace | None, race: RaceResult | None) -> RunTrace | None:
    if race is not None and MEDUSA in race.lanes:
        return race.shown[MEDUSA]
    return run if run is not None and run.settings.method == MEDUSA else None


def top1_rates(trace: RunTrace | None) -> list[float]:
    """Per depth d, what held-out top-1 accuracy measures, in the visitor's run: of the rounds
    whose accepted path reached depth d - 1 (so the text at depth d is known), the share in which
    the drafter's first guess after that path's end was the right token. For Medusa that is head
    d's top-1 (any node of depth d - 1 has it as its rank-0 child); for EAGLE, its step d's top-1
    given the text before, as its held-out figure is measured."""
    right: Counter[int] = Counter()
    asked: Counter[int] = Counter()
    for rnd in trace.rounds if trace is not None else []:
        tree = trace.round_tree(rnd)
        if tree is None or not rnd.node_tokens:
            continue
        for depth, node in enumerate(rnd.accepted_nodes[:len(rnd.emitted_tokens)]):
            first = next((c for c in range(1, tree.size) if tree.parents[c] == node and tree.ranks[c] == 0), None)
            if first is None:  # the tree held no first guess there
                break
            asked[depth] += 1
            right[depth] += rnd.node_tokens[first] == rnd.emitted_tokens[depth]
    return [right[d] / asked[d] for d in range(len(asked)) if asked[d]]


def _rates(rates: list[float] | None, depths: int) -> list[str]:
    rates = rates or []
    return [f"{rates[d]:.0%}" if d < len(rates) else "—" for d in range(depths)]


def accuracy_table(accuracy: GuessingAccuracy, medusa: RunTrace | None, eagle: RunTrace | None,
                   mtp: RunTrace | None = None) -> str:
    """Per depth, side by side: held-out accuracy of Medusa's head, EAGLE's step and the MTP
    module, then how often each lane of the visitor's run went one token deeper (columns without
    data left out)."""
    columns = [("Medusa head *d* (held-out)", accuracy.medusa), ("EAGLE step *d* (held-out)", accuracy.eagle),
               ("MTP module *d* (held-out)", accuracy.mtp),
               ("your Medusa run, top-1", top1_rates(medusa) if medusa else None),
               ("your EAGLE run, top-1", top1_rates(eagle) if eagle else None),
               ("your MTP run, top-1", top1_rates(mtp) if mtp else None)]
    columns = [(name, rates) for name, rates in columns if rates]
    if not columns:
        return ""
    depths = max(len(rates) for _, rates in columns)
    rows = ["| *d* | " + " | ".join(name for name, _ in columns) + " |",
            "|--:|" + "--:|" * len(columns)]
    cells = [_rates(rates, depths) for _, rates in columns]
    rows += [f"| {d + 1} | " + " | ".join(column[d] for column in cells) + " |" for d in range(depths)]
    return "\n".join(rows)


INVITATION = ("*Pick **EAGLE** as the drafter and press **Run** (or tick the EAGLE lane and **Race**): this step "
              "then tells your own run, beside Medusa's heads.*")
NO_EAGLE = ("*This model ships no EAGLE draft head, so there is no EAGLE run to tell here; "
            "`python -m decoding train-eagle` trains one.*")
TABLE_NOTE = ("*Each column counts a guess right only where it was its drafter's first (top-1) guess; the runs' "
              "columns, over the rounds that got that far. Medusa's head d guesses from the root's state alone, "
              "so it falls with d; EAGLE's step d reads the text before it (held out: the true text), so its "
              "rate need not fall, and can rise where answers grow formulaic.*")
NO_TABLE = "*No measured accuracy ships with this model's drafters.*"


def _lane_sentence(race: RaceResult | None, lane: str) -> str:
    if race is None or lane not in race.lanes:
        return ""
    timing, plain, spread = race.timing(lane), race.timing(PLAIN), race.spread(lane)
    verify = verify_cost(plain, timing)
    return (f"{timing.tokens_per_pass:.2f} tokens per pass, a verify pass of {verify:.2f} plain steps and "
            f"drafting of {race.draft_cost(lane):.2f} a round: **{spread.median:.2f}×** plain decoding")


def _run_sentence(eagle: RunTrace, medusa: RunTrace | None) -> str:
    """The visitor's EAGLE run in a sentence, with Medusa's tokens per pass beside it."""
    deepest = max((len(rnd.accepted_nodes) - 1 for rnd in eagle.rounds), default=0)
    nodes = eagle.settings.eagle_nodes
    sized = "the cost curve chose how many" if nodes is None else f"at most {nodes} guesses, as set"
    reach = f"accepted up to {deepest} guess{'es' if deepest > 1 else ''} in a round" if deepest \
        else "accepted none of its guesses"
    beside = ""
    if medusa is not None:
        where = "the same prompt" if medusa.prompt == eagle.prompt else "its own run"
        beside = f"; Medusa's heads added {medusa.mean_accepted:.2f} on {where}"
    return (f"**In your run** ({md_text(eagle.model)}): EAGLE grew a new tree every round, "
            f"**{mean_tree_size(eagle):.1f} nodes** on average ({sized}), added "
            f"**{eagle.mean_accepted:.2f} tokens per pass** and {reach}{beside}.")


def after_medusa_values(run: RunTrace | None, race: RaceResult | None,
                        accuracy: GuessingAccuracy = NO_ACCURACY) -> dict[str, str]:
    """The "after Medusa" step's numbers: the measured accuracies side by side, and the
    visitor's EAGLE run (or race lane) beside Medusa's, where there is one."""
    eagle, medusa, mtp = eagle_run(run, race), medusa_run(run, race), drafter_run(run, race, MTP)
    table = accuracy_table(accuracy, medusa, eagle, mtp)
    said = []
    if eagle is None:
        said.append(NO_EAGLE if accuracy.offers_eagle is False else INVITATION)
    else:
        said.append(_run_sentence(eagle, medusa))
        lanes = [(name, _lane_sentence(race, lane)) for name, lane in (("EAGLE", EAGLE), ("Medusa", MEDUSA))]
        measured = [f"{name}: {sentence}" for name, sentence in lanes if sentence]
        if measured:
            said.append("In the race, " + "; ".join(measured) + ".")
    return {"after_medusa_table": table or NO_TABLE, "after_medusa_note": TABLE_NOTE if table else "",
            "after_medusa_run": " ".join(said), "after_medusa_mtp": mtp_sentence(accuracy, mtp)}


MTP_INVITATION = ("The embedded model **stdlib-mtp** was trained that way, with its MTP modules from the first "
                  "step: pick it, and **MTP** as the drafter.")


def mtp_sentence(accuracy: GuessingAccuracy, mtp: RunTrace | None) -> str:
    """The MTP paragraph's last words: the loaded model's modules, measured, and the visitor's MTP run."""
    if not accuracy.mtp:
        return MTP_INVITATION
    rates = " / ".join(f"{a:.0%}" for a in accuracy.mtp)
    said = [f"This model has **{count(len(accuracy.mtp), 'MTP module')}**, trained with it; held out, their "
            f"first guesses were right {rates} of the time (module 1 first; each given the text before it)."]
    if mtp is not None:
        said.append(f"**In your MTP run**: {mtp.mean_accepted:.2f} tokens per pass over "
                    f"{count(len(mtp.rounds), 'pass', 'passes')}.")
    else:
        said.append("Pick **MTP** as the drafter and press **Run** to see them draft.")
    return " ".join(said)
