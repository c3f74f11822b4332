"""Hand-made traces for the app's tests: no model, fully predictable, built like the engine's.

`make_tree` derives parents, depths and the ancestor mask from a choices list with plain Python
(independently of `decoding.tree`), and `make_run` fakes greedy rounds on it: each round accepts
a chosen path, whose tokens then equal the base model's argmax at their parents, as greedy
acceptance requires. `on_a_new_thread` calls a handler the way Gradio's pool may: from any thread.
"""

from __future__ import annotations

import random
import re
import threading
from collections import Counter

from decoding.drafters.prompt_lookup import NOTHING_TO_COPY, copy_note, copy_origins
from decoding.race import RaceResult
from decoding.trace import DraftedTree, DrafterInfo, RoundTrace, RunSettings, RunTrace, TreeTrace

WORDS = [" the", " of", " and", " to", " a", " her", " was", " in", " it", " she", " not", " be",
         ",", ".", "\n", " Elizabeth", " Darcy", " said", " had", " very", " with", " for"]


def make_tree(choices: list[list[int]], name: str = "test") -> TreeTrace:
    paths = sorted((tuple(p) for p in choices), key=lambda p: (len(p), p))
    index = {p: i + 1 for i, p in enumerate(paths)}
    parents = [-1] + [index.get(p[:-1], 0) for p in paths]
    n = len(parents)
    mask = [[0] * n for _ in range(n)]
    for node in range(n):
        walk = node
        while walk >= 0:
            mask[node][walk] = 1
            walk = parents[walk]
    depths = [0] + [len(p) for p in paths]
    return TreeTrace(choices=[list(p) for p in paths], parents=parents, depths=depths,
                     ranks=[0] + [p[-1] for p in paths], mask=mask, name=name)


def path_nodes(tree: TreeTrace, leaf: int) -> list[int]:
    path = [leaf]
    while tree.parents[path[-1]] >= 0:
        path.append(tree.parents[path[-1]])
    return path[::-1]


def make_round(tree: TreeTrace, index: int, accepted: list[int], t_start: float,
               rng: random.Random, root_token: int) -> RoundTrace:
    n = tree.size
    num_heads = max(tree.depths)
    top_k = max(tree.ranks) + 1
    argmax = [rng.randrange(len(WORDS)) for _ in range(n)]
    tokens = [root_token] + [rng.randrange(len(WORDS)) for _ in range(n - 1)]
    for node in accepted[1:]:
        tokens[node] = argmax[tree.parents[node]]
    for node in range(1, n):  # a rejected child must differ from its parent's argmax
        if node not in accepted and tokens[node] == argmax[tree.parents[node]]:
            tokens[node] = (tokens[node] + 1) % len(WORDS)
    emitted = [tokens[node] for node in accepted[1:]] + [argmax[accepted[-1]]]
    heads_probs = [[round(0.6 / (r + 1), 3) for r in range(top_k)] for _ in range(num_heads)]
    return RoundTrace(
        index=index, position=10 + index, emitted_tokens=emitted,
        emitted_texts=[WORDS[t] for t in emitted],
        emitted_from_drafter=[True] * (len(emitted) - 1) + [False],
        time_draft=0.001, time_verify=0.004, time_accept=0.0005, t_end=t_start + 0.0055,
        root_token=root_token,
        guesses=[[rng.randrange(len(WORDS)) for _ in range(top_k)] for _ in range(num_heads)],
        guess_probs=heads_probs,
        node_tokens=tokens, node_sources=["base"] + ["medusa"] * (n - 1), node_texts=[WORDS[t] for t in tokens],
        node_base_probs=[None] + [round(rng.random(), 3) for _ in range(n - 1)],
        base_argmax_tokens=argmax, base_argmax_texts=[WORDS[t] for t in argmax],
        base_argmax_probs=[round(0.3 + 0.7 * rng.random(), 3) for _ in range(n)],
        accepted_nodes=accepted, next_token=emitted[-1], next_text=WORDS[emitted[-1]],
    )


def settings(method: str = "medusa", max_new_tokens: int = 32, tree: str | None = "test") -> RunSettings:
    return RunSettings(method=method, max_new_tokens=max_new_tokens, acceptance="greedy",
                       temperature=0.0, top_p=1.0, epsilon=0.09, delta=0.3, seed=None,
                       tree=tree, num_heads=None, draft_tokens=4 if method == "draft-model" else None,
                       lookup_tokens=4 if method == "prompt-lookup" else None)


def make_run(choices: list[list[int]], accepted_leaves: list[int], seed: int = 0) -> RunTrace:
    """A finished Medusa run whose round k accepts the path to node `accepted_leaves[k]`."""
    rng = random.Random(seed)
    tree = make_tree(choices)
    trace = RunTrace(model="hand-made", device="cpu", dtype="float32", settings=settings(),
                     prompt="It is a truth", prompt_tokens=[1, 2, 3, 4], tree=tree,
                     drafter=DrafterInfo("medusa", "hand-made heads", 99_000, 396_000),
                     prefill_token=0, prefill_text=WORDS[0], time_prefill=0.01)
    t = trace.time_prefill
    root = 0
    for k, leaf in enumerate(accepted_leaves):
        rnd = make_round(tree, k, path_nodes(tree, leaf), t, rng, root)
        trace.rounds.append(rnd)
        t, root = rnd.t_end, rnd.emitted_tokens[-1]
    trace.stop_reason, trace.total_time = "max_new_tokens", t
    return trace


def make_ar_run(num_tokens: int, seconds_per_token: float = 0.004) -> RunTrace:
    """A finished plain (autoregressive) run: one token per round."""
    trace = RunTrace(model="hand-made", device="cpu", dtype="float32",
                     settings=settings("ar", num_tokens, None), prompt="It is a truth",
                     prompt_tokens=[1, 2, 3, 4], prefill_token=0, prefill_text=WORDS[0],
                     time_prefill=0.01)
    t = trace.time_prefill
    for k in range(num_tokens - 1):
        t += seconds_per_token
        word = (k + 1) % len(WORDS)
        trace.rounds.append(RoundTrace(
            index=k, position=4 + k, emitted_tokens=[word], emitted_texts=[WORDS[word]],
            emitted_from_drafter=[False], time_draft=0.0, time_verify=seconds_per_token,
            time_accept=0.0, t_end=t))
    trace.stop_reason, trace.total_time = "max_new_tokens", t
    return trace


SMALL_CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def make_chain_run(method: str, accepted: list[int | None], length: int = 4, seed: int = 0) -> RunTrace:
    """A finished draft-model or prompt-lookup run over a chain of `length` guesses: round k accepts
    `accepted[k]` of them. Draft-model rounds take `length` draft passes (their draft time) with a
    probability per guess; prompt-lookup rounds copy from position 2 + k, and where `accepted[k]`
    is None the lookup found nothing: the round verifies its root alone."""
    chain = [[0] * depth for depth in range(1, length + 1)]
    run = make_run(chain, [count or 0 for count in accepted], seed)
    run.settings, run.tree.name = settings(method, tree=f"chain-{length}"), f"chain-{length}"
    for rnd, count in zip(run.rounds, accepted, strict=True):
        if count is None:  # a root-only round: the node lists keep the root alone
            for name in ("node_tokens", "node_texts", "node_base_probs", "base_argmax_tokens",
                         "base_argmax_texts", "base_argmax_probs"):
                setattr(rnd, name, getattr(rnd, name)[:1])
            rnd.guesses = []
        rnd.node_sources = ["base"] + [method] * (rnd.tree_size - 1)
        if method == "draft-model":
            rnd.draft_passes = length
            rnd.guess_probs = [[0.5] for _ in range(length)]
        else:
            rnd.guess_probs = []  # prompt lookup copies 2 + k tokens on, in the drafter's own words
            copied = 2 + rnd.index
            rnd.drafting_note = NOTHING_TO_COPY if count is None else copy_note(copied, length, len(run.prompt_tokens))
            rnd.node_origins = [] if count is None else copy_origins(copied, length)
    parameters = 30_000 if method == "draft-model" else 0
    run.drafter = DrafterInfo(method, f"a hand-made {method}", parameters, 4 * parameters,
                              6_000 if method == "draft-model" else 0)
    return run


def make_race(runs: dict[str, list[RunTrace]], focus: str = "medusa") -> RaceResult:
    """A finished race: `runs[lane][k]` is that lane's trace in race k ("ar" must be there)."""
    lanes = ["ar", *[lane for lane in runs if lane != "ar"]]
    count = len(runs["ar"])
    return RaceResult(lanes, focus, [{lane: runs[lane][k] for lane in lanes} for k in range(count)])


# A hand-checked EAGLE-2 draft (top 2, 3 deep, the 2 most confident of each depth expanded):
# (parent candidate, confidence) per candidate, the root's children first. Ranked by confidence
# (ties: the shallower, then the earlier) the first four are candidates 0, 1, 2, 3.
EAGLE_DRAFT = [(-1, 0.6), (-1, 0.3), (0, 0.30), (0, 0.15), (1, 0.15), (1, 0.03),
               (2, 0.15), (2, 0.06), (3, 0.06), (3, 0.015)]
EAGLE_EXPANDED = [True, True, True, True, False, False, False, False, False, False]


def make_eagle_round(index: int, kept: int, accepted_leaf: int, t_start: float, rng: random.Random,
                     root_token: int) -> RoundTrace:
    """An EAGLE round over EAGLE_DRAFT whose rerank kept its `kept` most confident candidates
    (0, 2 or 4): its verified tree, and every candidate drafted with its node there or -1."""
    choices = {0: [], 2: [[0], [1]], 4: [[0], [1], [0, 0], [0, 1]]}[kept]
    tree = make_tree(choices, name="dynamic")
    rnd = make_round(tree, index, path_nodes(tree, accepted_leaf), t_start, rng, root_token)
    parents = [parent for parent, _ in EAGLE_DRAFT]
    depths = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    nodes = [i + 1 if i < kept else -1 for i in range(len(parents))]
    tokens = [rng.randrange(len(WORDS)) for _ in parents]
    for candidate, node in enumerate(nodes):
        if node > 0:
            tokens[candidate] = rnd.node_tokens[node]
    rnd.tree = tree
    rnd.drafted = DraftedTree(parents=parents, tokens=tokens, texts=[WORDS[t] for t in tokens],
                              confidences=[conf for _, conf in EAGLE_DRAFT], depths=depths,
                              expanded=list(EAGLE_EXPANDED), nodes=nodes)
    rnd.node_sources = ["base"] + ["eagle"] * (tree.size - 1)
    rnd.guesses, rnd.guess_probs, rnd.draft_passes = [], [], 3
    return rnd


def make_eagle_run(rounds: list[tuple[int, int]], seed: int = 0) -> RunTrace:
    """A finished EAGLE run: round k keeps `rounds[k][0]` candidates and accepts the path to node
    `rounds[k][1]` of its own tree (the run has no tree of its own: each round grows one)."""
    rng = random.Random(seed)
    run_settings = settings("eagle", tree="dynamic")
    run_settings.eagle_depth, run_settings.eagle_top_k = 3, 2
    trace = RunTrace(model="hand-made", device="cpu", dtype="float32", settings=run_settings,
                     prompt="It is a truth", prompt_tokens=[1, 2, 3, 4], tree=None,
                     drafter=DrafterInfo("eagle", "hand-made EAGLE layer", 45_000, 180_000, 9_000),
                     prefill_token=0, prefill_text=WORDS[0], time_prefill=0.01)
    t, root = trace.time_prefill, 0
    for k, (kept, leaf) in enumerate(rounds):
        rnd = make_eagle_round(k, kept, leaf, t, rng, root)
        trace.rounds.append(rnd)
        t, root = rnd.t_end, rnd.emitted_tokens[-1]
    trace.stop_reason, trace.total_time = "max_new_tokens", t
    return trace


SUMMARY_NUMBERS = re.compile(r"(\d+) tokens in (\d+) passes of the model(?:, and (\d+) passes of [^:]+)?: "
                             r"(\d+) from the prefill \+ (\d+) from (\d+) rounds, ([\d.]+) tokens per round")


def summary_arithmetic_holds(summary: str) -> bool:
    """The run summary's numbers add up as written (as Markdown or as the page shows it): tokens =
    the prefill's + the rounds', passes = 1 + rounds, tokens per round = the rounds' tokens / rounds
    as printed."""
    tokens, passes, _, first, added, rounds, per_round = SUMMARY_NUMBERS.search(summary.replace("**", "")).groups()
    return (int(tokens) == int(first) + int(added) and int(passes) == 1 + int(rounds)
            and per_round == f"{int(added) / int(rounds):.2f}")


NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w)")


def numbers_in(text: str) -> list[float]:
    """Every number a text writes as a word of its own, in order ("20,000" reads 20000; the 32 of
    "float32" is no number): a view's figures, whatever words surround them."""
    return [float(number.replace(",", "")) for number in NUMBER.findall(text)]


def carries(text: str, *values: float) -> bool:
    """The text writes each value (as often as it is given), rounded as the text rounds it: the
    caller rounds each value to the places the text prints."""
    return not Counter(values) - Counter(numbers_in(text))


def on_a_new_thread(fn, *args):
    """`fn(*args)` on a thread of its own, as Gradio's pool may run any call: its result or error."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed back to the test
            box["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
