"""EAGLE on the page: its lane in the race, the dynamic tree of each round (verified nodes, the
candidates the rerank cut, which were expanded, their confidence), the mask of each round's own
tree, and the Learn step "after Medusa". Hand-made traces (app_helpers.make_eagle_run), and a real
run on the tiny model's random EAGLE head where the engine's own trace is the point."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from types import SimpleNamespace

import pytest

from app import charts, eagle_views, lanes, race_views, views
from app.drafter_costs import count, draft_passes_per_round, drafter_comparison, megabytes
from app.eagle_figures import CUT_SHOWN, drawn_draft, dynamic_tree_figure, guessing_figure
from app.eagle_views import GuessingAccuracy, after_medusa_values, kept_count
from app.figure_style import Look
from app.lanes import EAGLE, MTP
from app.models import ModelCache
from app.text import load_steps, render_steps
from app.tree_figures import mask_figure
from app_helpers import SMALL_CHOICES, carries, make_ar_run, make_eagle_run, make_race, make_run, numbers_in
from decoding.medusa_modules import MEDUSA
from decoding.race import race
from decoding.settings import DecodeSettings

# Round 1 keeps 4 candidates and accepts node 3 (two guesses); round 2 keeps none; round 3 keeps
# 2 and accepts node 1.
ROUNDS = [(4, 3), (0, 0), (2, 1)]
ACCURACY = GuessingAccuracy(medusa=[0.41, 0.23, 0.12], eagle=[0.57, 0.44, 0.36, 0.31])


@pytest.fixture
def eagle():
    return make_eagle_run(ROUNDS)


def _hovers(figure, name: str | None = None) -> list[str]:
    return [text for trace in figure.data if trace.hovertext and (name is None or trace.name == name)
            for text in trace.hovertext]


# ----------------------------------------------------------------------------- names and lanes

def test_eagle_has_a_name_a_colour_and_a_place_in_the_drafter_pickers():
    assert lanes.title("eagle") == "EAGLE" and lanes.colour("eagle") not in {
        lanes.colour(m) for m in ("ar", "medusa", "draft-model", "prompt-lookup")}
    assert ("EAGLE", "eagle") in lanes.choices(["medusa", "eagle"], short=True)
    assert lanes.guess_name("eagle", 2) == "step 2" and lanes.guess_name("eagle", 2, short=True) == "s2"


def test_the_eagle_lane_is_raced_tabled_and_costed_like_the_others(eagle):
    plain = make_ar_run(len(eagle.tokens))
    result = make_race({"ar": [plain], "medusa": [make_run(SMALL_CHOICES, [6, 0, 3])], "eagle": [eagle]},
                       focus="eagle")
    html = race_views.lanes_html(race_views.RaceFrame("done", 1, result.lanes, 1, result=result, clock=1.0))
    note = race_views.lane_note("eagle", eagle)
    assert 'data-lane="eagle"' in html and note in html and numbers_in(note) == [3, 3]  # 3 deep, 3 nodes a round
    table = race_views.lane_table(result)
    row = next(line for line in table.splitlines() if line.startswith("| EAGLE |"))
    timing = result.timing("eagle")
    assert f"| {timing.tokens_per_pass:.2f} |" in row and f"| {result.draft_cost('eagle'):.2f} |" in row
    assert race_views.race_verdict(result).startswith("**EAGLE:")
    costs = drafter_comparison(result)
    medusa_bullet, eagle_bullet = (line for line in costs.splitlines() if line.startswith("- "))
    assert (count(eagle.drafter.parameters), megabytes(eagle.drafter.weight_bytes)) == ("45K", "0.2 MB")
    assert "45K" in eagle_bullet and "0.2 MB" in eagle_bullet and "45K" not in medusa_bullet
    assert draft_passes_per_round(result, "eagle") == 3.0 and carries(eagle_bullet, 3.0)


# ----------------------------------------------------------------------------- the dynamic tree


# ----------------------------------------------------------------------------- the dynamic tree

def test_a_round_says_what_the_draft_scored_expanded_and_kept(eagle):
    facts = views.round_facts(eagle, 0)
    assert (facts.verified, facts.accepted_guesses) == (5, 2)
    info = views.round_info(eagle, 0)
    assert f"({lanes.title('eagle')})" in info and eagle_views.drafting_text(eagle.rounds[0]) in info
    # Round 3: 10 candidates drafted in 3 passes (1.0 ms), the 4 most confident expanded, 2 kept.
    last = eagle.rounds[2]
    assert (len(last.drafted.parents), last.draft_passes, sum(last.drafted.expanded), kept_count(last)) == (10, 3, 4, 2)
    assert Counter(numbers_in(eagle_views.drafting_text(last))) == Counter([10, 3, 1.0, 4, 2])
    kept_none = eagle_views.drafting_text(eagle.rounds[1])
    assert Counter(numbers_in(kept_none)) == Counter([10, 3, 1.0, 4]) and "none" in kept_none
    assert views.round_facts(eagle, 1).verified == 1  # the root alone
    assert views.run_facts(eagle).draft_passes == 9 and carries(views.run_summary(eagle), 9)
    assert "draft layer" in views.run_summary(eagle)  # EAGLE's passes, not a draft model's


def test_a_draft_that_stopped_after_one_level_says_so(eagle):
    first = eagle.rounds[0]
    stopped = dataclasses.replace(first, draft_passes=1, drafted=dataclasses.replace(
        first.drafted, expanded=[False] * len(first.drafted.expanded)))
    told = eagle_views.drafting_text(stopped)
    assert Counter(numbers_in(told)) == Counter([10, 1, 1.0, 4])  # no count expanded: none was
    assert "stopped" in told and told in views.round_info(dataclasses.replace(eagle, rounds=[stopped]), 0)


def test_the_tree_view_draws_the_verified_nodes_the_cut_candidates_and_the_expanded_ones(eagle):
    view = views.round_view(eagle, 0)
    figure = view.tree
    assert figure.layout.title.text == "Round 1 · 2 of 4 accepted · 4 of 10 drafted"
    (cut,) = [trace for trace in figure.data if trace.name == "cut by the rerank" and trace.mode == "markers+text"]
    assert cut.name in figure.layout.annotations[0].text  # the note names what is drawn faded
    assert len(cut.x) == 6 and cut.marker.opacity < 0.5  # every cut candidate, faded
    assert figure.data[0].name == "cut by the rerank"  # drawn behind the verified tree
    (rings,) = [trace for trace in figure.data if trace.name.startswith("expanded")]
    assert len(rings.x) == 4  # candidates 0-3 were expanded, all verified here
    # The accepted path is highlighted as for every drafter.
    (path,) = [trace for trace in figure.data if trace.name == "accepted path"]
    assert len([x for x in path.x if x is not None]) == 4  # root -> node 1 -> node 3
    headings = figure.layout.xaxis.ticktext
    assert f">{lanes.guess_name('eagle', 1)}<" in headings[1] and f">{lanes.guess_name('eagle', 3)}<" in headings[3]
    # (a cut candidate reaches depth 3)
    hovers = _hovers(figure)
    assert any("node 1" in h and "confidence (product along its path): 0.600" in h and "expanded" in h
               and "kept by the rerank: the 1st most confident of 10" in h for h in hovers)
    cut_hovers = _hovers(figure, "cut by the rerank")
    assert len(cut_hovers) == 6 and all("not verified" in h for h in cut_hovers)
    assert any("confidence (product along its path): 0.015" in h and "not expanded" in h for h in cut_hovers)


def test_each_cut_candidate_hangs_under_its_own_parent_below_the_kept_siblings(eagle):
    rnd = eagle.rounds[0]
    drawn = drawn_draft(rnd.tree, rnd)
    assert drawn.verified == 5 and drawn.hidden == 0
    assert drawn.candidates == [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert drawn.parents == [-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # candidate 4's parent is candidate 1 = node 2
    few = drawn_draft(rnd.tree, rnd, cut_shown=1)
    assert few.candidates == [-1, 0, 1, 2, 3, 4] and few.hidden == 5  # the most confident cut: 0.15, shallower
    root_only = drawn_draft(eagle.rounds[1].tree, eagle.rounds[1], cut_shown=3)
    assert root_only.verified == 1 and root_only.candidates == [-1, 0, 1, 2]
    assert root_only.parents == [-1, 0, 0, 1]
    headings = views.round_view(eagle, 1).tree.layout.xaxis.ticktext  # the cut candidates' columns
    assert f">{lanes.guess_name('eagle', 1)}<" in headings[1] and f">{lanes.guess_name('eagle', 3)}<" in headings[3]
    assert numbers_in(dynamic_tree_figure(rnd.tree, rnd, cut_shown=1).layout.annotations[0].text) == [few.hidden]
    assert CUT_SHOWN >= 8


def test_the_mask_is_each_rounds_own_tree_and_changes_size_with_it(eagle):
    sizes = [len(views.round_view(eagle, index).mask.data[0].z) for index in range(3)]
    assert sizes == [5, 1, 3]
    mask = mask_figure(eagle.round_tree(eagle.rounds[0]), eagle.rounds[0])
    assert list(mask.data[0].z[3]) == [2, 2, 0, 2, 0]  # node 3 sees node 1 and the root, on the accepted path
    assert numbers_in(views.round_view(eagle, 2).mask.layout.title.text) == [3]


def test_the_stream_stats_and_acceptance_read_every_rounds_own_tree(eagle):
    keys = re.findall(r'<span class="key"[^>]*>([^<]*)</span>', views.stream_view(eagle))
    assert lanes.guess_name("eagle", 2) in keys
    assert [depth for depth, _, _ in charts.acceptance_by_depth(eagle)] == [1, 2]
    four = make_eagle_run([*ROUNDS, (4, 1)])  # trees of 5, 1, 3 and 5 nodes
    assert eagle_views.mean_tree_size(four) == 3.5
    race = make_race({"ar": [make_ar_run(len(four.tokens))], "eagle": [four]}, focus="eagle")
    assert carries(views.stats_text(four, race), 3.5)


# ----------------------------------------------------------------------------- Learn

def test_learn_has_an_after_medusa_step_with_its_own_figure():
    steps = load_steps()
    (step,) = [s for s in steps if s.title.startswith("After Medusa")]
    assert step.figure == "guessing" and steps.index(step) == len(steps) - 3  # before "train a head", "what next"
    assert "MTP" in step.template  # it names multi-token prediction, where this idea went next


def test_the_after_medusa_step_sets_the_measured_accuracies_side_by_side_on_the_visitors_run(eagle):
    medusa = make_run(SMALL_CHOICES, [6, 0, 3])
    race = make_race({"ar": [make_ar_run(len(eagle.tokens))], "medusa": [medusa], "eagle": [eagle]}, focus="eagle")
    index = next(i for i, s in enumerate(load_steps()) if s.title.startswith("After Medusa"))
    text = render_steps(load_steps(), eagle, race, ACCURACY)[index]
    values = after_medusa_values(eagle, race, ACCURACY)
    assert values["after_medusa_table"] in text and values["after_medusa_run"] in text
    assert [row[:3] for row in _table_rows(values["after_medusa_table"])] == [
        ["1", "41%", "57%"], ["2", "23%", "44%"], ["3", "12%", "36%"], ["4", "—", "31%"]]
    assert values["after_medusa_note"] == eagle_views.TABLE_NOTE and "top-1" in values["after_medusa_note"]
    deepest = max(len(rnd.accepted_nodes) - 1 for rnd in eagle.rounds)
    assert deepest == 2 and carries(values["after_medusa_run"], round(eagle.mean_accepted, 2), deepest,
                                    round(medusa.mean_accepted, 2), round(race.timing("eagle").tokens_per_pass, 2))
    # The numbers are the data's: other data, other numbers.
    other = after_medusa_values(eagle, None, GuessingAccuracy(medusa=[0.05], eagle=[0.93]))["after_medusa_table"]
    assert _table_rows(other)[0][:3] == ["1", "5%", "93%"] and "41%" not in other
    figures = views.learn_figures(eagle, race, accuracy=ACCURACY)
    bars = {bar.name: list(bar.y) for bar in figures["guessing"].data}
    assert bars["Medusa head d, top-1 (held-out)"] == ACCURACY.medusa
    assert bars["EAGLE step d, given the steps before (held-out)"] == ACCURACY.eagle
    assert bars["your EAGLE run, top-1"] == eagle_views.top1_rates(eagle)
    phone = views.learn_figures(eagle, race, Look(width=390), ACCURACY)["guessing"]
    assert phone.layout.title.text == "Right how often, d ahead?" and len(phone.data) == 4


def _cells(line: str) -> list[str]:
    """One row of a Markdown table, cell by cell."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table_rows(table: str) -> list[list[str]]:
    """A Markdown table's cells, row by row, below its header and rule."""
    return [_cells(line) for line in table.splitlines()[2:]]


def test_before_an_eagle_run_the_step_invites_one_and_says_when_there_are_no_numbers():
    medusa = make_run(SMALL_CHOICES, [6, 0])
    values = after_medusa_values(medusa, None)
    assert values["after_medusa_run"] == eagle_views.INVITATION
    assert _cells(values["after_medusa_table"].splitlines()[0]) == ["*d*", "your Medusa run, top-1"]  # its own column
    assert after_medusa_values(None, None)["after_medusa_table"] == eagle_views.NO_TABLE
    no_eagle = GuessingAccuracy(offers_eagle=False)
    assert after_medusa_values(medusa, None, no_eagle)["after_medusa_run"] == eagle_views.NO_EAGLE
    assert guessing_figure(GuessingAccuracy(), None, None).layout.uirevision == "message"
    before = after_medusa_step(render_steps(load_steps(), None, None))  # the step reads before any run
    assert "{{" not in before and eagle_views.INVITATION in before


def after_medusa_step(rendered: list[str]) -> str:
    return next(text for text in rendered if text.startswith("### After Medusa"))


def test_the_accuracies_come_from_the_models_describing_fields_only():
    model = SimpleNamespace(parts={MEDUSA: SimpleNamespace(accuracy=[[0.4, 0.1], [0.2, 0.05]], num_heads=2),
                                   EAGLE: SimpleNamespace(accuracy=[0.6, 0.5]),
                                   MTP: SimpleNamespace(accuracy=[0.7, 0.6])})
    assert GuessingAccuracy.of(model) == GuessingAccuracy([0.4, 0.2], [0.6, 0.5], offers_eagle=True, mtp=[0.7, 0.6])
    bare = SimpleNamespace(parts={})
    assert GuessingAccuracy.of(bare) == GuessingAccuracy(offers_eagle=False)
    assert GuessingAccuracy.of(None) == GuessingAccuracy()
    cache = ModelCache(keep=1)
    assert cache.loaded_model("anything") is None  # never loads


# ----------------------------------------------------------------------------- a real run

def test_a_real_eagle_run_and_race_on_the_tiny_model_draw_every_round(tiny_llama):
    settings = DecodeSettings(max_new_tokens=10, eagle_nodes=12)
    frames = list(race(tiny_llama, "It is a truth", settings, ["medusa", "eagle"], races=1, focus="eagle"))
    result = frames[-1].result
    assert result.lanes == ["ar", "medusa", "eagle"] and result.differing() == []
    run = result.shown["eagle"]
    assert run.tree is None and all(rnd.tree is not None and rnd.drafted is not None for rnd in run.rounds)
    for index, rnd in enumerate(run.rounds):
        view = views.round_view(run, index)
        assert len(view.mask.data[0].z) == rnd.tree.size == rnd.tree_size
        cut = sum(1 for node in rnd.drafted.nodes if node < 0)
        drawn = drawn_draft(rnd.tree, rnd)
        assert len(drawn.candidates) - drawn.verified + drawn.hidden == cut
        assert carries(view.tree.layout.title.text, kept_count(rnd), len(rnd.drafted.parents))
    assert any(line.startswith(f"| {lanes.title('eagle')} |") for line in race_views.lane_table(result).splitlines())
    accuracy = GuessingAccuracy.of(tiny_llama)
    told = after_medusa_values(run, result, accuracy)["after_medusa_run"]
    assert told in after_medusa_step(render_steps(load_steps(), run, result, accuracy))
    assert carries(told, round(run.mean_accepted, 2), round(result.timing("eagle").tokens_per_pass, 2),
                   round(result.spread("eagle").median, 2))


def test_the_runs_top1_rate_counts_the_first_guess_only_where_the_text_that_far_is_known():
    """Like with like beside held-out top-1: a round whose path went through head 1's second guess
    counts head 1 wrong; a depth the round never reached is not counted."""
    run = make_run(SMALL_CHOICES, [6, 0, 5])  # [0,0,0] accepted; nothing; [1,0] accepted
    rates = eagle_views.top1_rates(run)
    # depth 1: right (round 1), wrong (round 2: the bonus differed), wrong (round 3: rank 1 was
    # right) -> 1/3. Depth 2, asked in rounds 1 and 3 only: right both times; depth 3: round 1 only.
    assert rates == [pytest.approx(1 / 3), 1.0, 1.0]
    assert eagle_views.top1_rates(None) == []
