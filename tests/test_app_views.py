"""The page's pure views and texts on hand-made traces: no Gradio, no model, no browser."""

from __future__ import annotations

import dataclasses
import html
import re
from collections import Counter

import pytest

from app import race_views, views
from app.text import (
    CURVE_SHAPES,
    HEADS_TRAINING,
    MISSING,
    PLACEHOLDER,
    curve_shape,
    explainer_values,
    load_steps,
    load_text,
    render_steps,
)
from app.tokens import md_code, visible
from app_helpers import SMALL_CHOICES, carries, make_ar_run, make_race, make_run, numbers_in
from decoding.medusa_modules import MEDUSA
from decoding.race import RaceFrame
from decoding.stats import round_cost, round_end_times, verify_cost
from decoding.trace import CostCurve


@pytest.fixture
def run():
    # Round 1 accepts the path to node 6 ([0, 0, 0]), round 2 nothing, round 3 node 5 ([1, 0]).
    return make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5])


def _race(run, *ar_seconds_per_token: float):
    return make_race({"ar": [make_ar_run(len(run.tokens), s) for s in ar_seconds_per_token],
                      "medusa": [run] * len(ar_seconds_per_token)})


# ----------------------------------------------------------------------------- the playground

def test_round_numbers_agree_with_the_tree_even_when_the_run_ends_mid_round():
    run = make_run(SMALL_CHOICES, accepted_leaves=[6])
    facts = views.round_facts(run, 0)  # the path to node 6: three guesses, then the base model's token
    assert (facts.verified, facts.paths, facts.accepted_guesses) == (7, 3, 3)
    assert (facts.added, facts.guessed, facts.from_base, facts.cut) == (4, 3, 1, False)
    last = run.rounds[0]
    last.emitted_tokens, last.emitted_texts, last.emitted_from_drafter = (
        last.emitted_tokens[:2], last.emitted_texts[:2], last.emitted_from_drafter[:2])
    facts = views.round_facts(run, 0)
    assert (facts.accepted_guesses, facts.added, facts.guessed, facts.from_base, facts.cut) == (3, 2, 2, 0, True)


def test_the_round_details_write_every_figure_of_the_round():
    run = make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5, 0, 0])
    facts = views.round_facts(run, 0)
    assert (facts.number, facts.rounds) == (1, 5)
    assert (facts.draft_ms, facts.verify_ms, facts.accept_ms) == pytest.approx((1.0, 4.0, 0.5))
    assert facts.done_at == round_end_times(run)[0]
    info = views.round_info(run, 0)
    assert carries(info, facts.number, facts.rounds, facts.verified, facts.paths, facts.accepted_guesses,
                   facts.added, facts.guessed, facts.from_base, round(facts.draft_ms, 1),
                   round(facts.verify_ms, 1), round(facts.accept_ms, 1), round(facts.done_at, 3))
    cut = run.rounds[0]
    cut.emitted_tokens, cut.emitted_texts, cut.emitted_from_drafter = (
        cut.emitted_tokens[:2], cut.emitted_texts[:2], cut.emitted_from_drafter[:2])
    assert "cut" in views.round_info(run, 0) and "cut" not in info


def test_round_info_names_the_sampled_token_and_the_argmax_it_beat(run):
    rnd = run.rounds[0]
    assert views.round_facts(run, 0).sampled_over is None
    assert views.round_info(run, 0).split("★")[1].count("<code>") == 1  # the next token alone
    argmax = rnd.base_argmax_texts[rnd.accepted_nodes[-1]]
    rnd.next_token, rnd.next_text = 999, "<img src=x>"
    assert views.round_facts(run, 0).sampled_over == argmax
    info = views.round_info(run, 0)
    chosen = info.split("★")[1]  # the next token, then the most likely one it was sampled over
    assert chosen.index(md_code("<img src=x>", 14)) < chosen.index(md_code(argmax, 14))
    assert "<img" not in info


def test_a_run_that_stops_at_the_prefill_says_so_and_promises_no_tree():
    run = make_run(SMALL_CHOICES, accepted_leaves=[])
    run.rounds, run.stop_reason = [], "max_new_tokens"
    facts = views.run_facts(run)
    assert (facts.tokens, facts.from_prefill, facts.rounds) == (1, 1, 0)
    summary = views.run_summary(run)
    assert numbers_in(summary) == [1] and views.STOP_REASONS[run.stop_reason] in summary
    assert "tokens per pass" not in summary and "1 tokens" not in summary
    assert views.round_label(run) == "Round (no rounds yet)" and views.round_label(None) == "Round (no rounds yet)"
    view = views.round_view(run, 0)
    assert view.info == "" and "prefill" in view.tree.layout.annotations[0].text


def test_summary_counts_tokens_and_passes_and_its_arithmetic_adds_up(run):
    facts = views.run_facts(run)
    assert (facts.tokens, facts.passes, facts.rounds, facts.draft_passes) == (
        len(run.tokens), run.forward_passes, len(run.rounds), 0)
    assert facts.tokens == facts.from_prefill + facts.from_rounds and facts.passes == 1 + facts.rounds
    assert facts.from_rounds == 4 + 1 + 3 and facts.tokens_per_round == pytest.approx(facts.from_rounds / facts.rounds)
    summary = views.run_summary(run, first_round_after=0.5)
    assert carries(summary, facts.tokens, facts.passes, facts.from_prefill, facts.from_rounds, facts.rounds,
                   round(facts.tokens_per_round, 2), round(facts.seconds, 2), round(facts.tokens_per_second), 0.5)
    assert views.STOP_REASONS[run.stop_reason] in summary
    assert views.round_label(run) == f"Round (of {len(run.rounds)})"


def test_the_summary_says_stopped_only_once_the_run_is_timed(run):
    total, run.total_time = run.total_time, 0.0  # the engine's yield after the last round, before its clock is read
    facts, running = views.run_facts(run), views.run_summary(run)
    assert not facts.finished and views.STOP_REASONS[run.stop_reason] not in running
    # While running, the clock at the last round, never "0.00 s measured (0 tokens/s)".
    assert facts.seconds == round_end_times(run)[-1] > 0
    assert facts.tokens_per_second == pytest.approx(len(run.tokens) / facts.seconds)
    assert carries(running, round(facts.seconds, 2), round(facts.tokens_per_second))
    assert "measured" not in running
    run.total_time = total
    facts, summary = views.run_facts(run), views.run_summary(run)
    assert facts.finished and facts.seconds == total and facts.tokens_per_second == run.tokens_per_second
    assert views.STOP_REASONS[run.stop_reason] in summary and carries(summary, round(total, 2))


def test_stream_view_marks_the_run_and_its_end_for_the_benchmark(run):
    html = views.stream_view(run, current=2, ended_at=1700000000.25)
    assert 'data-ended="1700000000.250"' in html and "pass current" in html
    assert "data-ended" not in views.stream_view(run)


# ----------------------------------------------------------------------------- visitor text is text

def test_learn_banner_shows_the_prompt_as_text(run):
    run.prompt = "**bold** <img src=x> [link](http://x)"
    banner = views.learn_banner(run, None)
    assert "<img" not in banner and "**bold**" not in banner and "](" not in banner
    assert "&lt;img src=x&gt;" in banner


def test_tokens_quoted_in_the_explainer_cannot_break_out(run):
    best = max(run.rounds, key=lambda r: r.accepted_length)
    best.emitted_texts = ["`<img src=x>`"] + best.emitted_texts[1:]
    text = render_steps(load_steps(), run, None)[4]
    assert "<img" not in text and "&lt;img" in text


@pytest.mark.parametrize("token", ["'s", '"', "<img src=x>", "**b**", "&amp;", "`x`", "# h", "[a](b)"])
def test_a_quoted_token_reads_as_itself_once_the_browser_decodes_its_entities(token):
    code = md_code(token)
    assert code.startswith("<code>") and code.endswith("</code>")
    inner = code.removeprefix("<code>").removesuffix("</code>")
    assert html.unescape(inner) == visible(token)  # "'s" once read "&#x27;s" in the round details
    assert "<" not in inner and "*" not in inner and "`" not in inner


# ----------------------------------------------------------------------------- stats and learn

def test_stats_page_names_the_round_cost_verify_cost_and_the_ceiling(run):
    # Hand-made rounds: draft 1 ms, verify 4 ms, accept 0.5 ms; plain steps 4 ms each.
    race = _race(run, 0.004)
    plain, lane = race.timing("ar"), race.timing("medusa")
    cost, verify, drafting = round_cost(plain, lane), verify_cost(plain, lane), race.draft_cost("medusa")
    assert (cost, verify, drafting) == pytest.approx((5.5 / 4, 1.0, 0.25), abs=0.006)
    text = views.stats_text(run, race)
    spread, per_pass = race.spread("medusa"), lane.tokens_per_pass
    def printed(a, b):  # a ÷ b of the two figures as printed, so a reader who divides them gets it
        return round(a, 2) / round(b, 2)

    told = [run.mean_accepted, len(run.rounds), spread.count, per_pass, run.tree.size,  # what was run
            cost, per_pass, cost, printed(per_pass, cost), per_pass, spread.median, spread.low,  # a round's cost
            spread.high, verify, cost - verify, drafting, per_pass, verify, printed(per_pass, verify)]  # the ceiling
    assert Counter(numbers_in(text)) == Counter(round(figure, 2) for figure in told)
    # Without a race, the run's own figures alone: nothing was timed against plain decoding.
    assert numbers_in(views.stats_text(run, None)) == [round(run.mean_accepted, 2), len(run.rounds)]
    # A sampled plain run can end at its first token: nothing to compare a round with, no crash.
    assert "ceiling" not in views.stats_text(run, make_race({"ar": [make_ar_run(1)], "medusa": [run]}))


def test_explainer_steps_load_with_labels_and_the_view_they_point_at():
    steps = load_steps()
    assert len(steps) == 9
    assert all(step.label and len(step.label) <= 14 for step in steps)
    assert {step.shows for step in steps} <= {"race", "stream", "tree", "mask", "stats", "none"}
    assert all(step.template.startswith(f"### {step.title}") for step in steps)


def test_explainer_is_filled_with_this_runs_and_races_numbers(run):
    race = _race(run, 0.004, 0.005, 0.003)
    steps = load_steps()
    values = explainer_values(run, race)
    wanted = {name for step in steps for name in PLACEHOLDER.findall(step.template)} - {"heads_training"}
    assert wanted <= set(values), wanted - set(values)
    assert (values["passes"], values["new_tokens"]) == (str(run.forward_passes), str(len(run.tokens)))
    medusa_s = 0.01 + 3 * 0.0055
    speeds = sorted((0.01 + 8 * s) / medusa_s for s in (0.004, 0.005, 0.003))
    assert values["speedup"] == f"{speeds[1]:.2f}" and values["speedup_range"] == f"{speeds[0]:.2f}–{speeds[2]:.2f}"
    assert values["verify_cost"] == "1.00"
    # Every figure of the step comes from one race, so they divide as written, and the measured
    # speedup never beats the ceiling it is told against.
    per_round, cost, verify = (float(values[name]) for name in ("race_tokens_per_pass", "round_cost", "verify_cost"))
    assert values["predicted_speedup"] == f"{per_round / cost:.2f}"
    assert values["ceiling_speedup"] == f"{per_round / verify:.2f}"
    assert float(values["speedup"]) <= float(values["ceiling_speedup"])
    speedup_step = render_steps(steps, run, race)[5]
    assert carries(speedup_step, *(float(values[name]) for name in (
        "passes", "new_tokens", "race_tokens_per_pass", "round_cost", "predicted_speedup", "speedup",
        "verify_cost", "ceiling_speedup")))


def test_step_one_says_why_its_two_step_times_differ_and_a_busy_race_says_so(run):
    from decoding.machine_load import MachineLoad
    from decoding.measure import busy_note

    race = _race(run, 0.004, 0.005, 0.003)
    curve = CostCurve(sizes=[1, 2], costs=[1.0, 1.1], step_seconds=0.002, device="cpu", dtype="float32",
                      threads=2, past=128, measured_at="now", draft_cost=0.0)
    run.cost_curve = curve
    # The curve timed a step at 2.0 ms, the race at 4 ms: 2.0× as long.
    quiet = explainer_values(run, race)
    assert carries(quiet["two_steps"], 2.0, 2.0) and quiet["race_busy"] == ""
    race.loads = [MachineLoad(1.0, 2, 1, 3.0)] * 3
    race.threads_before = 2
    busy = explainer_values(run, race)
    # Besides the two figures, the load that explains them: 1.0 of the 2 cores busy.
    assert Counter(numbers_in(busy["two_steps"])) - Counter(numbers_in(quiet["two_steps"])) == Counter([1.0, 2])
    assert busy["race_busy"] == " " + busy_note(race.load, 2) and busy_note(race.load, 2)
    assert busy["race_busy"] in render_steps(load_steps(), run, race)[5]
    run.cost_curve = dataclasses.replace(curve, step_seconds=0.0041)  # within 10%: one figure, nothing to explain
    assert explainer_values(run, race)["two_steps"] == ""


def test_explainer_before_any_run_shows_dashes_not_placeholders():
    texts = render_steps(load_steps(), None, None)
    assert not any("{{" in text for text in texts)
    assert MISSING in texts[5]


def test_the_heads_step_says_how_each_embedded_model_was_trained(run):
    heads_step = load_steps()[2]
    assert "heads_training" in PLACEHOLDER.findall(heads_step.template)
    run.model = "austen"  # tuned with its heads (its card: base next-token loss before/after)
    assert HEADS_TRAINING["medusa-2"] in render_steps([heads_step], run, None)[0]
    run.model = "/some/dir"
    assert "heads_training" not in explainer_values(run, None)
    assert not any(told in render_steps([heads_step], run, None)[0] for told in HEADS_TRAINING.values())


# ----------------------------------------------------------------------------- the race

def test_the_verdict_gives_the_median_and_says_when_the_range_crosses_one(run):
    medusa_s = 0.01 + 3 * 0.0055
    # Plain decoding at 1, 2 and 3 ms a token: one race slower, two faster.
    race = _race(run, 0.001, 0.002, 0.003)
    speeds = sorted((0.01 + 8 * s) / medusa_s for s in (0.001, 0.002, 0.003))
    assert speeds[0] < 1 < speeds[2] and race_views.range_reading(race.spread("medusa")) == "crosses"
    headline = race_views.race_verdict(race).split("\n\n")[0]
    assert carries(headline, *(round(speed, 2) for speed in speeds), 3)
    assert race_views.RANGE_CAVEATS["crosses"].format(name="Medusa") in headline
    assert race_views.range_reading(_race(run, 0.004, 0.005).spread("medusa")) == "faster"
    one_race = _race(run, 0.004)
    single = race_views.race_verdict(one_race).split("\n\n")[0]
    assert race_views.ONE_RACE_CAVEAT in single and numbers_in(single)[0] == round(one_race.spread("medusa").median, 2)


def test_race_status_says_which_race_lane_and_place_in_the_order_is_running():
    lanes = ["ar", "medusa", "draft-model"]
    # Race 2 runs medusa, draft-model, ar: the draft model is its second lane, the 5th run of 9.
    status = race_views.race_status(RaceFrame("measuring", 3, lanes, finished=1, measuring="draft-model"))
    assert carries(status, 2, 3, 2, 3, 5, 9) and "**Draft model**" in status
    assert numbers_in(race_views.race_status(RaceFrame("warm-up", 5, lanes))) == [3, 5]  # lanes, races


def test_race_status_shows_each_lanes_progress_the_time_left_and_who_leads():
    lanes = ["ar", "medusa"]
    first = race_views.race_status(RaceFrame("measuring", 3, lanes, 0, "ar", done={"ar": 0, "medusa": 0}))
    assert numbers_in(first) == [1, 3, 1, 2, 1, 6]  # nothing measured yet: no time left, no leader
    assert re.findall("[●◐○]+", first) == ["◐○○", "○○○"]  # plain decoding, then Medusa
    status = race_views.race_status(RaceFrame("measuring", 3, lanes, 1, "medusa", done={"ar": 1, "medusa": 1},
                                              left=20.4, leader="medusa", lead=1.234))
    assert carries(status, 3, 6, 20, 1, 1.23) and status.count("**Medusa**") == 2  # measuring, and leading
    assert re.findall("[●◐○]+", status) == ["●○○", "●◐○"]


def test_the_verdict_reads_its_range_as_printed():
    """A slowest race of 0.998× prints as 1.00×: then no sentence may call every race slower."""
    from decoding.stats import Spread

    assert race_views.range_reading(Spread(0.9, 0.85, 0.994, 3)) == "slower"
    assert race_views.range_reading(Spread(0.9, 0.85, 0.998, 3)) == "reaches"
    assert race_views.range_reading(Spread(1.0, 0.998, 1.004, 3)) == "even"
    assert race_views.range_reading(Spread(1.1, 1.006, 1.2, 3)) == "faster"


def test_page_texts_live_in_assets():
    assert "Medusa Playground" in load_text("header.html")
    assert "median" in load_text("timing_note.md")


def test_rounds_cut_short_at_the_context_limit_draw_the_tree_they_verified(tiny_llama):
    """Near the context limit the engine verifies only the tree levels that fit: each round's
    figures must show that smaller tree, not index the full one."""
    from decoding import DecodeSettings, generate

    saved = tiny_llama.context_length
    tiny_llama.context_length = 70
    try:
        trace = generate(tiny_llama, "It is a truth universally acknowledged, that a single man in possession",
                         DecodeSettings(max_new_tokens=40, tree="mc_sim_7b_63"))
    finally:
        tiny_llama.context_length = saved
    sizes = [r.tree_size for r in trace.rounds]
    assert sizes[0] == 64 and min(sizes) < 64  # the run did reach the limit
    for index, rnd in enumerate(trace.rounds):
        tree = trace.round_tree(rnd)
        assert tree.size == rnd.tree_size and len(tree.mask) == rnd.tree_size
        assert views.round_facts(trace, index).verified == rnd.tree_size
        assert len(views.round_view(trace, index).mask.data[0].z) == rnd.tree_size
    assert sizes[-1] == 1  # the last round had room for the root alone: a plain step, drawn as one


def test_learn_says_how_each_embedded_models_heads_were_trained():
    from app.models import heads_recipe

    assert heads_recipe("austen") == "medusa-2"  # tuned with its heads (--joint-lr)
    assert heads_recipe("smollm2") == "medusa-1-root"  # frozen base, heads read the root
    assert heads_recipe("no-such-model") is None


# ----------------------------------------------------------------------------- what this machine measured

def _curve(costs: list[float]) -> CostCurve:
    return CostCurve(sizes=[1, 4, 16, 64][:len(costs)], costs=costs, step_seconds=0.0455, device="cpu",
                     dtype="float32", threads=2, past=150, measured_at="2026-12-01T10:00:00Z")


def test_learn_step_one_states_the_cost_this_machine_measured(run):
    run.cost_curve = _curve([1.0, 0.93, 1.31, 2.47])
    assert curve_shape(run.cost_curve) == "rising"
    first = render_steps(load_steps(), run, None)[0]
    told = explainer_values(run, None)["cost_curve"]
    assert told in first and CURVE_SHAPES["rising"] in told
    assert numbers_in(told) == [2, 45.5, 4, 0.93, 16, 1.31, 64, 2.47]  # threads, step ms, then each pass
    assert "**Race** tab" in first and "left pane" not in first  # where to look: the tab that exists
    assert curve_shape(_curve([1.0, 1.03, 1.13, 1.54])) == "flat"  # bfloat16 on the matrix units: nearly free
    assert curve_shape(_curve([1.0, 4.0, 15.0, 60.0])) == "steep"
    speedup = render_steps(load_steps(), run, None)[5]
    tree_cost = explainer_values(run, None)["curve_tree_cost"]
    assert tree_cost in speedup and carries(tree_cost, run.tree.size, round(run.cost_curve.cost(run.tree.size), 2))


def test_a_curve_measured_on_a_busy_machine_is_called_rough_beside_its_numbers(run):
    run.cost_curve = dataclasses.replace(_curve([1.0, 0.93, 1.31, 2.47]), other_cores=1.3)
    told = explainer_values(run, None)["cost_curve"]
    assert numbers_in(told) == [2, 45.5, 4, 0.93, 16, 1.31, 64, 2.47, 1.3]  # the others' cores said last
    assert "rough" in views.learn_figures(run, None)["cost-curve"].layout.title.text
    run.cost_curve = dataclasses.replace(run.cost_curve, other_cores=0.1)
    assert "rough" not in views.learn_figures(run, None)["cost-curve"].layout.title.text


@pytest.mark.parametrize("curve", [None, _curve([1.0])], ids=["no curve", "only one-token steps timed"])
def test_without_a_measured_curve_learn_says_so_and_draws_no_numbers(run, curve):
    run.cost_curve = curve
    told = explainer_values(run, None)["cost_curve"]
    assert told and numbers_in(told) == [] and MISSING not in told
    assert told in render_steps(load_steps(), run, None)[0]
    figure = views.learn_figures(run, None)["cost-curve"]
    assert figure.layout.uirevision == "message"  # a message figure: no curve
    before = explainer_values(None, None)["cost_curve"]
    assert before and numbers_in(before) == [] and before != told
    assert views.learn_figures(None, None)["cost-curve"].layout.uirevision == "message"


def test_the_cost_curve_figure_draws_the_measurement_between_free_and_one_step_a_token(run):
    run.cost_curve = _curve([1.0, 0.93, 1.31, 2.47])
    figure = views.learn_figures(run, None)["cost-curve"]
    measured = next(trace for trace in figure.data if trace.name.startswith("measured"))
    assert list(measured.x) == [1, 4, 16, 64] and list(measured.y) == [1.0, 0.93, 1.31, 2.47]
    mark = next(trace for trace in figure.data if trace.name.startswith("your tree"))
    assert list(mark.x) == [run.tree.size] and mark.y[0] == pytest.approx(run.cost_curve.cost(run.tree.size))
    assert measured.name == "measured: cpu, float32, 2 threads"


def test_a_race_lends_its_curve_when_the_last_run_has_none(run):
    race = _race(run, 0.004)
    race.races[0]["ar"].cost_curve = _curve([1.0, 1.2])
    run.cost_curve = None
    assert numbers_in(explainer_values(run, race)["cost_curve"]) == [2, 45.5, 4, 1.2]


def test_the_mask_rule_includes_the_node_itself_and_learn_warns_about_small_models(run):
    mask_step = render_steps(load_steps(), run, None)[3]
    assert "itself" in mask_step  # the rule: a node attends to its ancestors and to itself
    for banner in (views.learn_banner(None, None), views.learn_banner(run, None)):
        assert banner.endswith(views.SMALL_MODEL_NOTE)


def test_a_refusal_says_what_is_wrong_and_whether_the_figures_are_still_the_last_runs():
    error = ValueError("the prompt is empty: type some text to continue")
    assert views.refusal_text(error) == "⚠ **Not run:** the prompt is empty: type some text to continue."
    still_run = views.refusal_text(error, earlier=True).removeprefix(views.refusal_text(error))
    still_race = views.refusal_text(error, "raced", earlier=True).removeprefix(views.refusal_text(error, "raced"))
    assert still_run.endswith("run.") and still_race.endswith("race.")
    refused = views.refusal_text(ValueError("<img src=x>"))
    assert "<img" not in refused and "&lt;img" in refused


def test_near_run_the_page_says_what_this_machine_can_show_from_what_it_measured():
    from types import SimpleNamespace

    from decoding.tree_choice import choose_tree

    curve = CostCurve(sizes=[1, 2, 4, 8], costs=[1.0, 1.05, 1.2, 1.6], step_seconds=0.05, device="cpu",
                      dtype="float32", threads=2, past=128, measured_at="now", draft_cost=0.05)
    accuracy = [[0.6, 0.1], [0.4, 0.05]]
    def model(accuracy, cost_curve):  # what the forecast reads of a model: its heads' part and its curve
        return SimpleNamespace(parts={MEDUSA: SimpleNamespace(accuracy=accuracy)}, cost_curve=cost_curve)


    said = views.expectation(model(accuracy, curve))
    choice = choose_tree(accuracy, curve)
    assert carries(said, round(choice.expected_tokens, 2), choice.nodes + 1,
                   round(choice.pass_cost + choice.draft_cost, 2), round(choice.estimated_speedup, 2))
    busy_then = dataclasses.replace(curve, spread=0.6)
    noisy = views.expectation(model(accuracy, busy_then))
    assert Counter(numbers_in(noisy)) - Counter(numbers_in(said)) == Counter([60])  # the repeats' spread, in %
    crowded = views.expectation(model(accuracy, dataclasses.replace(curve, other_cores=1.2)))
    assert Counter(numbers_in(crowded)) - Counter(numbers_in(said)) == Counter([1.2])  # the others' cores
    assert views.expectation(model(None, curve)) == ""
    assert views.expectation(model(accuracy, None)) == ""


def test_stats_and_learn_give_one_ceiling_and_one_round_cost_for_the_races_shown(run):
    """Three races of different plain speeds: Learn once divided its median race's figures and
    Stats the totals, and the two ceilings differed (1.30x against 1.26x). Both divide the totals now."""
    from app.text import race_values

    race = _race(run, 0.003, 0.004, 0.006)
    learn, stats = race_values(race), views.stats_text(run, race)
    assert f"≈ **{learn['ceiling_speedup']}×** (Learn's" in stats
    assert f"{learn['race_tokens_per_pass']} ÷ {learn['round_cost']} ≈ **{learn['predicted_speedup']}×**" in stats
    assert f"median **{learn['speedup']}×**" in stats


def test_a_drafter_that_proposed_nothing_most_rounds_says_what_to_try():
    from app_helpers import make_chain_run

    idle = make_chain_run("prompt-lookup", accepted=[None, None, None, 1])
    for rnd in idle.rounds[:3]:  # rounds with nothing copied verify the root alone
        rnd.node_tokens = rnd.node_tokens[:1]
    summary = views.run_summary(idle)
    assert "had nothing to propose in 3 of 4 rounds" in summary and "repeat" in summary
    busy = make_chain_run("prompt-lookup", accepted=[2, 1, 0, 1])
    assert "nothing to propose" not in views.run_summary(busy)


def test_the_sidebar_names_each_setting_in_words_never_by_its_raw_name():
    from decoding.drafters import DRAFTERS

    for cls in DRAFTERS.values():
        for setting in cls.settings:
            assert setting.title and "_" not in setting.title and setting.title[0].isupper()
