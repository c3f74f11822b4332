"""The page for every drafter: rounds of a draft model and of prompt lookup (chains, root-only
rounds), the race's lanes and verdict, and the walkthrough's measured comparison with Medusa's
heads. Hand-made traces, no model (except where a real run is the point)."""

from __future__ import annotations

import re

import pytest

from app import race_views, views
from app.drafter_costs import INVITATION, drafter_comparison
from app.sidebar import drafter_controls
from app.text import load_steps, render_steps
from app.tree_figures import mask_figure, tree_figure
from app_helpers import SMALL_CHOICES, make_ar_run, make_chain_run, make_race, make_run
from decoding.drafters import DRAFTERS


@pytest.fixture
def draft():
    return make_chain_run("draft-model", [4, 0, 2])


@pytest.fixture
def lookup():
    # Round 1 copies and accepts 2, round 2 finds nothing to copy, round 3 copies and accepts none.
    return make_chain_run("prompt-lookup", [2, None, 0])


def _node_hovers(figure) -> list[str]:
    return [text for trace in figure.data if trace.hovertext for text in trace.hovertext]


# ----------------------------------------------------------------------------- the playground

def test_a_draft_model_round_names_the_drafter_its_passes_and_its_draft_time(draft):
    info = views.round_info(draft, 0)
    assert "(Draft model)" in info and "wrote 4 guess(es) in **4 passes** of its own (**1.0 ms**)" in info
    assert "verified **5 tree nodes** (a chain)" in info and "4 from the draft model + 1 from the base" in info
    assert "passes of the model**, and 12 passes of the draft model:" in views.run_summary(draft)


def test_a_prompt_lookup_round_says_where_it_copied_from_or_that_nothing_matched(lookup):
    assert "copied 4 token(s) from position 2 (in the prompt)" in views.round_info(lookup, 0)
    lookup.rounds[2].copied_from = 7  # past the 4 prompt tokens
    assert "from position 7 (in the answer so far)" in views.round_info(lookup, 2)
    root_only = views.round_info(lookup, 1)
    assert "nothing to copy" in root_only and "verified **the root alone** in one pass (a plain step)" in root_only
    assert "0 from copies + 1 from the base model" in root_only


def test_chain_rounds_draw_one_row_headed_by_the_drafter_with_who_proposed_each_node(draft, lookup):
    figure = tree_figure(draft.tree, draft.rounds[1])  # no guess accepted
    headings = figure.layout.xaxis.ticktext
    assert ">root<" in headings[0] and ">draft 1<" in headings[1] and ">draft 4<" in headings[4]
    (star,) = [trace for trace in figure.data if (trace.name or "").startswith("next token")]
    drawn = [trace for trace in figure.data if trace.y and trace.name and trace is not star]  # not the star's line
    rows = {y for trace in drawn for y in trace.y if y is not None}
    assert rows == {0.0}  # one row; the star sits half a row below it, off the rejected guesses' line
    assert star.y == (0.5,) and figure.layout.yaxis.range == (1.6, -1.0)  # a range that fits both, not stretched
    full = tree_figure(draft.tree, draft.rounds[0])  # every guess accepted: the star follows on the row
    assert [t for t in full.data if (t.name or "").startswith("next token")][0].y == (0.0,)
    hovers = _node_hovers(figure)
    assert any("the draft model's guess, 2 token(s) after the root" in h and "probability: 0.50" in h
               for h in hovers)
    lookup_hovers = _node_hovers(tree_figure(lookup.tree, lookup.rounds[0]))
    assert any("copied from position 3 of the text" in h for h in lookup_hovers)  # depth 2, copied from 2
    assert not any("head 1, rank" in h for h in lookup_hovers)


def test_a_root_only_round_draws_a_one_node_tree_and_a_one_cell_mask(lookup):
    view = views.round_view(lookup, 1)
    assert view.tree.layout.title.text == "Round 2 · no guesses: a plain step"
    assert [list(row) for row in view.mask.data[0].z] == [[2]]  # the root sees itself, on the accepted path
    chain = mask_figure(lookup.round_tree(lookup.rounds[0]), lookup.rounds[0])
    assert len(chain.data[0].z) == 5 and list(chain.data[0].z[4]) == [1, 1, 1, 1, 1]  # a chain: all ancestors


def test_the_stream_legend_names_the_drafters_guesses(draft, lookup):
    assert ">draft 4</span>" in views.stream_view(draft) and "head 1" not in views.stream_view(draft)
    assert ">copy 1</span>" in views.stream_view(lookup)
    long = views.stream_view(make_chain_run("prompt-lookup", [10], length=10))
    assert ">copy 8</span>" in long and ">copy 9</span>" not in long and "… to copy 10, colours repeating" in long
    assert ">head 3</span>" in views.stream_view(make_run(SMALL_CHOICES, accepted_leaves=[6]))


# ----------------------------------------------------------------------------- the race

def _three_lanes(medusa_speed: float = 0.004, lookup_seconds: float = 0.0055):
    """Plain decoding at `medusa_speed` s a token against Medusa, a draft model and prompt lookup."""
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5])
    draft = make_chain_run("draft-model", [4, 0, 2])
    lookup = make_chain_run("prompt-lookup", [4, 4, 4])
    for trace, seconds in ((draft, 0.0105), (lookup, lookup_seconds)):  # the draft model's passes cost 6 ms
        for rnd in trace.rounds:
            rnd.t_end = trace.time_prefill + (rnd.index + 1) * seconds
        trace.total_time = trace.rounds[-1].t_end
    plain = [make_ar_run(len(medusa.tokens), s) for s in (medusa_speed, medusa_speed * 1.1, medusa_speed * 0.9)]
    return make_race({"ar": plain, "medusa": [medusa] * 3, "draft-model": [draft] * 3,
                      "prompt-lookup": [lookup] * 3})


def test_the_verdict_has_a_row_of_measured_figures_per_lane():
    race = _three_lanes()
    verdict = race_views.race_verdict(race)
    rows = [line for line in verdict.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| Plain decoding", "| Medusa", "| Draft model",
                                                     "| Prompt lookup"]
    for lane, row in zip(race.lanes[1:], rows[1:], strict=True):
        spread = race.spread(lane)
        assert f"{spread.median:.2f}× ({spread.low:.2f}–{spread.high:.2f}×)" in row
        assert f"{race.timing(lane).tokens_per_pass:.2f}" in row and f"| {race.draft_cost(lane):.2f} |" in row
        assert f"{race.shown[lane].forward_passes} ({len(race.shown[lane].tokens)})" in row
    assert "1× by definition" in rows[0]


def test_where_another_drafter_beat_medusa_the_verdict_says_so_with_both_medians():
    race = _three_lanes(lookup_seconds=0.001)  # prompt lookup: 4 tokens in 1 ms a round
    assert race.fastest() == "prompt-lookup"
    verdict = race_views.race_verdict(race)
    lookup, medusa = race.spread("prompt-lookup").median, race.spread("medusa").median
    assert f"**Medusa was not the fastest here:** prompt lookup reached **{lookup:.2f}×** against " \
           f"Medusa's {medusa:.2f}×" in verdict
    race = _three_lanes(lookup_seconds=0.1)
    assert race.fastest() == "medusa" and "not the fastest" not in race_views.race_verdict(race)


def test_a_win_within_the_noise_is_called_that():
    clear, close = _three_lanes(lookup_seconds=0.001), _three_lanes(lookup_seconds=0.012)
    assert clear.fastest() == close.fastest() == "prompt-lookup"
    assert not clear.overlap("prompt-lookup", "medusa") and close.overlap("prompt-lookup", "medusa")
    assert "noise" not in race_views.race_verdict(clear) and "noise" not in drafter_comparison(clear)
    assert "; their ranges overlap, so the gap may be noise." in race_views.race_verdict(close)
    assert "— but their ranges overlap, so the gap may be noise." in drafter_comparison(close)


def test_the_verdict_says_plainly_whether_the_greedy_lanes_wrote_plain_decodings_text():
    race = _three_lanes()  # hand-made: plain decoding's words differ from every drafter's
    assert race.differing()[:2] == [("medusa", 1), ("draft-model", 1)]
    verdict = race_views.race_verdict(race)
    assert "**⚠ Not the same text:** Medusa in race 1, the draft model in race 1," in verdict
    for runs in race.races:
        for lane in race.drafters:
            runs[lane].rounds, runs[lane].prefill_token = runs["ar"].rounds, runs["ar"].prefill_token
    assert "Every lane wrote exactly plain decoding's text" in race_views.race_verdict(race)


def test_lanes_show_one_row_each_on_one_clock():
    race = _three_lanes()
    frame = race_views.RaceFrame("replaying", 3, race.lanes, 3, result=race, clock=0.012)
    html = race_views.lanes_html(frame)
    assert [m for m in re.findall(r'data-lane="([\w-]+)"', html)] == race.lanes
    assert "(copies up to 4 tokens)" in html and "(4 tokens a round)" in html and "(tree test)" in html
    # At 12 ms the plain lane (prefill 10 ms, then 4 ms a token) has written 1 token in 1 pass.
    assert "1 tokens · 1 passes" in html


# ----------------------------------------------------------------------------- stats and learn

def test_the_walkthrough_compares_the_draft_model_with_medusas_heads_in_measured_numbers():
    race = _three_lanes()
    text = drafter_comparison(race)
    draft, heads, lookup = (line for line in text.splitlines() if line.startswith("- "))
    assert "**30K parameters**, 0.1 MB of weights plus 6 kB of its own KV cache" in draft
    assert f"4.0 passes of its own a round, costing **{race.draft_cost('draft-model'):.2f} plain steps**" in draft
    assert "**99K parameters** (0.4 MB), no cache and no pass of their own" in heads
    assert f"**{race.draft_cost('medusa'):.2f} plain steps** a round" in heads
    assert f"{race.timing('prompt-lookup').tokens_per_pass:.2f} tokens per pass" in lookup
    medusa, drafted = race.spread("medusa").median, race.spread("draft-model").median
    assert medusa > drafted and f"**Here Medusa's heads beat the draft model** ({medusa:.2f}× against " in text
    step = render_steps(load_steps(), None, race)[1]
    assert text in step and "{{" not in step


def test_the_walkthrough_says_when_prompt_lookup_beat_medusa():
    race = _three_lanes(lookup_seconds=0.001)
    medusa, lookup = race.spread("medusa").median, race.spread("prompt-lookup").median
    assert (f"**Here prompt lookup was faster than Medusa's heads** ({lookup:.2f}× against {medusa:.2f}×)"
            in drafter_comparison(race))


def test_the_walkthrough_invites_a_race_with_a_draft_model_until_there_is_one():
    assert drafter_comparison(None) == INVITATION
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    only_medusa = make_race({"ar": [make_ar_run(len(medusa.tokens))], "medusa": [medusa]})
    text = drafter_comparison(only_medusa)
    assert text.startswith(INVITATION) and "- **Medusa's heads**" in text and "Here" not in text


def test_learn_follows_medusa_and_says_so_after_a_run_of_another_drafter(draft):
    assert "these steps follow Medusa's heads" in views.learn_banner(draft, None)
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    race = make_race({"ar": [make_ar_run(len(medusa.tokens))], "medusa": [medusa], "draft-model": [draft]},
                     focus="draft-model")
    assert "the Medusa lane of your last race" in views.learn_banner(draft, race)
    assert "from your last run:" in views.learn_banner(medusa, race)
    assert f"**{medusa.forward_passes} passes produced" in render_steps(load_steps(), draft, race)[5]


def test_stats_speak_of_the_runs_own_drafter(draft):
    race = make_race({"ar": [make_ar_run(len(draft.tokens))], "draft-model": [draft]}, focus="draft-model")
    text = views.stats_text(draft, race)
    assert text.startswith("Draft model added") and "the draft model added" in text
    assert "with Prompt lookup ticked" in views.stats_text(make_chain_run("prompt-lookup", [1]), race)


@pytest.mark.parametrize("method", ["medusa", "eagle", "draft-model", "prompt-lookup"])
def test_each_drafter_shows_its_own_controls_alone(method):
    """By name: Medusa's tree (preset, editor, status) and each drafter's own settings."""
    shown = {name for name, update in drafter_controls(method).items() if update["visible"]}
    own = {setting.name for setting in DRAFTERS[method].settings}
    assert shown == own | ({"preset", "tree_text", "tree_status"} if DRAFTERS[method].takes_tree else set())
