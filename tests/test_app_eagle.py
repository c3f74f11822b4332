"""EAGLE on the page: its lane in the race, the dynamic tree of each round (verified nodes, the
candidates the rerank cut, which were expanded, their confidence), the mask of each round's own
tree, and the Learn step "after Medusa". Hand-made traces (app_helpers.make_eagle_run), and a real
run on the tiny model's random EAGLE head where the engine's own trace is the point."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from app import charts, lanes, race_views, views
from app.drafter_costs import drafter_comparison
from app.eagle_figures import CUT_SHOWN, drawn_draft, dynamic_tree_figure, guessing_figure
from app.eagle_views import GuessingAccuracy, after_medusa_values
from app.figure_style import Look
from app.models import ModelCache
from app.text import load_steps, render_steps
from app.tree_figures import mask_figure
from app_helpers import SMALL_CHOICES, make_ar_run, make_eagle_run, make_race, make_run
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
    assert 'data-lane="eagle"' in html and "dynamic tree, 3 deep, 3 nodes a round" in html
    table = race_views.lane_table(result)
    row = next(line for line in table.splitlines() if line.startswith("| EAGLE |"))
    timing = result.timing("eagle")
    assert f"| {timing.tokens_per_pass:.2f} |" in row and f"| {result.draft_cost('eagle'):.2f} |" in row
    assert race_views.race_verdict(result).startswith("**EAGLE:")
    costs = drafter_comparison(result)
    assert "**EAGLE's draft layer**" in costs and "**45K parameters** (0.2 MB)" in costs
    assert "3.0 passes of that one layer a round" in costs


# ----------------------------------------------------------------------------- the dynamic tree

def test_a_round_says_what_the_draft_scored_expanded_and_kept(eagle):
    info = views.round_info(eagle, 0)
    assert "(EAGLE)" in info and "EAGLE drafted **10 candidates** in **3 passes** of its draft layer" in info
    assert "expanding the 4 most confident, and kept the **4 most confident**" in info
    assert "verified **5 tree nodes**" in info and "accepted **2 guess(es)**" in info
    assert "kept **none**" in views.round_info(eagle, 1) and "the root alone" in views.round_info(eagle, 1)
    assert "passes of the model**, and 9 passes of EAGLE's draft layer:" in views.run_summary(eagle)


def test_a_draft_that_stopped_after_one_level_says_so(eagle):
    first = eagle.rounds[0]
    stopped = dataclasses.replace(first, draft_passes=1, drafted=dataclasses.replace(
        first.drafted, expanded=[False] * len(first.drafted.expanded)))
    info = views.round_info(dataclasses.replace(eagle, rounds=[stopped, *eagle.rounds[1:]]), 0)
    assert "in **1 pass** of its draft layer" in info
    assert "then stopped: another level was not likely enough to pay for its pass, and kept" in info


def test_the_tree_view_draws_the_verified_nodes_the_cut_candidates_and_the_expanded_ones(eagle):
    view = views.round_view(eagle, 0)
    figure = view.tree
    assert figure.layout.title.text == "Round 1 · 2 of 4 accepted · 4 of 10 drafted"
    assert "faded, dotted: cut by the rerank" in figure.layout.annotations[0].text
    (cut,) = [trace for trace in figure.data if trace.name == "cut by the rerank" and trace.mode == "markers+text"]
    assert len(cut.x) == 6 and cut.marker.opacity < 0.5  # every cut candidate, faded
    assert figure.data[0].name == "cut by the rerank"  # drawn behind the verified tree
    (rings,) = [trace for trace in figure.data if trace.name.startswith("expanded")]
    assert len(rings.x) == 4  # candidates 0-3 were expanded, all verified here
    # The accepted path is highlighted as for every drafter.
    (path,) = [trace for trace in figure.data if trace.name == "accepted path"]
    assert len([x for x in path.x if x is not None]) == 4  # root -> node 1 -> node 3
    headings = figure.layout.xaxis.ticktext
    assert ">step 1<" in headings[1] and ">step 3<" in headings[3]  # a cut candidate reaches depth 3
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
    assert ">step 1<" in headings[1] and ">step 3<" in headings[3]
    assert "(5 more not drawn)" in dynamic_tree_figure(rnd.tree, rnd, cut_shown=1).layout.annotations[0].text
    assert CUT_SHOWN >= 8


def test_the_mask_is_each_rounds_own_tree_and_changes_size_with_it(eagle):
    sizes = [len(views.round_view(eagle, index).mask.data[0].z) for index in range(3)]
    assert sizes == [5, 1, 3]
    mask = mask_figure(eagle.round_tree(eagle.rounds[0]), eagle.rounds[0])
    assert list(mask.data[0].z[3]) == [2, 2, 0, 2, 0]  # node 3 sees node 1 and the root, on the accepted path
    assert "round 3" in views.round_view(eagle, 2).mask.layout.title.text


def test_the_stream_stats_and_acceptance_read_every_rounds_own_tree(eagle):
    assert ">step 2</span>" in views.stream_view(eagle)
    assert [depth for depth, _, _ in charts.acceptance_by_depth(eagle)] == [1, 2]
    race = make_race({"ar": [make_ar_run(len(eagle.tokens))], "eagle": [eagle]}, focus="eagle")
    assert "verifying 3.0 nodes on average" in views.stats_text(eagle, race)


# ----------------------------------------------------------------------------- Learn

def test_learn_has_an_after_medusa_step_with_its_own_figure():
    steps = load_steps()
    (step,) = [s for s in steps if s.title.startswith("After Medusa")]
    assert step.figure == "guessing" and steps.index(step) == len(steps) - 2  # before "what next"
    assert "DeepSeek-V3" in step.template and "MTP" in step.template


def test_the_after_medusa_step_sets_the_measured_accuracies_side_by_side_on_the_visitors_run(eagle):
    medusa = make_run(SMALL_CHOICES, [6, 0, 3])
    race = make_race({"ar": [make_ar_run(len(eagle.tokens))], "medusa": [medusa], "eagle": [eagle]}, focus="eagle")
    index = next(i for i, s in enumerate(load_steps()) if s.title.startswith("After Medusa"))
    text = render_steps(load_steps(), eagle, race, ACCURACY)[index]
    assert "| 1 | 41% | 57% |" in text and "| 3 | 12% | 36% |" in text and "| 4 | — | 31% |" in text
    assert f"added **{eagle.mean_accepted:.2f} tokens per pass**" in text and "accepted up to 2 guesses" in text
    assert f"Medusa's heads added {medusa.mean_accepted:.2f} on the same prompt" in text
    assert f"EAGLE: {race.timing('eagle').tokens_per_pass:.2f} tokens per pass" in text
    # The numbers are the data's: other data, other numbers.
    other = render_steps(load_steps(), eagle, None, GuessingAccuracy(medusa=[0.05], eagle=[0.93]))[index]
    assert "| 1 | 5% | 93% |" in other and "41%" not in other
    figures = views.learn_figures(eagle, race, accuracy=ACCURACY)
    bars = {bar.name: list(bar.y) for bar in figures["guessing"].data}
    assert bars["Medusa head d, top-1 (held-out)"] == ACCURACY.medusa
    assert bars["EAGLE step d, given the steps before (held-out)"] == ACCURACY.eagle
    assert bars["your EAGLE run"] == [rate for _, _, rate in charts.acceptance_by_depth(eagle)]
    phone = views.learn_figures(eagle, race, Look(width=390), ACCURACY)["guessing"]
    assert phone.layout.title.text == "Right how often, d ahead?" and len(phone.data) == 4


def test_before_an_eagle_run_the_step_invites_one_and_says_when_there_are_no_numbers():
    medusa = make_run(SMALL_CHOICES, [6, 0])
    values = after_medusa_values(medusa, None)
    assert "Pick **EAGLE**" in values["after_medusa_run"] and "| your Medusa run |" in values["after_medusa_table"]
    assert "No measured accuracy" in after_medusa_values(None, None)["after_medusa_table"]
    no_eagle = GuessingAccuracy(offers_eagle=False)
    assert "This model ships no EAGLE" in after_medusa_values(medusa, None, no_eagle)["after_medusa_run"]
    assert "No measured accuracy" in guessing_figure(GuessingAccuracy(), None, None).layout.annotations[0].text
    before = render_steps(load_steps(), None, None)[-2]  # the step reads before any run
    assert "{{" not in before and "Pick **EAGLE**" in before


def test_the_accuracies_come_from_the_models_describing_fields_only():
    model = SimpleNamespace(head_accuracy=[[0.4, 0.1], [0.2, 0.05]], eagle_accuracy=[0.6, 0.5], heads=object(),
                            eagle=object(), draft=None)
    assert GuessingAccuracy.of(model) == GuessingAccuracy([0.4, 0.2], [0.6, 0.5], offers_eagle=True)
    bare = SimpleNamespace(head_accuracy=None, eagle_accuracy=None, heads=None, eagle=None, draft=None)
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
        assert "drafted" in view.tree.layout.title.text
    assert "| EAGLE |" in race_views.lane_table(result)
    text = render_steps(load_steps(), run, result, GuessingAccuracy.of(tiny_llama))[-2]
    assert "**In your run**" in text and "In the race, EAGLE:" in text
