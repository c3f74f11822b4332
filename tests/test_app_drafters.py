"""The page for every drafter: rounds of a draft model and of prompt lookup (chains, root-only
rounds), the race's lanes and verdict, and the walkthrough's measured comparison with Medusa's
heads. Hand-made traces, no model (except where a real run is the point)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from app import lanes, race_views, views
from app.drafter_costs import INVITATION, drafter_comparison
from app.sidebar import drafter_controls
from app.text import load_steps, render_steps, walkthrough_run
from app.tree_figures import mask_figure, tree_figure
from app_helpers import SMALL_CHOICES, carries, make_ar_run, make_chain_run, make_race, make_run, numbers_in
from decoding.drafters import DRAFTERS
from decoding.drafters.prompt_lookup import copy_note


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
    rnd = draft.rounds[0]
    rnd.draft_passes = 6  # more passes than its 4 guesses: each figure tells apart
    facts = views.round_facts(draft, 0)
    assert (facts.verified, facts.paths, facts.guessed, facts.from_base) == (5, 1, 4, 1)  # a chain, all accepted
    drafting = views.drafting_text(draft, rnd)
    assert Counter(numbers_in(drafting)) == Counter([4, rnd.draft_passes, round(rnd.time_draft * 1e3, 1)])
    info = views.round_info(draft, 0)
    assert drafting in info and f"({lanes.title('draft-model')})" in info and lanes.who_guessed("draft-model") in info
    assert views.run_facts(draft).draft_passes == 6 + 4 + 4 and carries(views.run_summary(draft), 14)


def test_a_prompt_lookup_round_says_where_it_copied_from_or_that_nothing_matched(lookup):
    in_prompt = views.drafting_text(lookup, lookup.rounds[0])
    assert numbers_in(in_prompt) == [4, 2] and "prompt" in in_prompt  # 4 tokens from position 2, of 4 prompt tokens
    lookup.rounds[2].drafting_note = copy_note(7, 4, len(lookup.prompt_tokens))  # past the 4 prompt tokens
    in_answer = views.drafting_text(lookup, lookup.rounds[2])
    assert numbers_in(in_answer) == [4, 7] and "prompt" not in in_answer
    nothing = views.drafting_text(lookup, lookup.rounds[1])
    assert nothing and numbers_in(nothing) == [] and nothing in views.round_info(lookup, 1)
    facts = views.round_facts(lookup, 1)
    assert (facts.verified, facts.accepted_guesses, facts.guessed, facts.from_base) == (1, 0, 0, 1)


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
    assert any(f"{lanes.guess_name('draft-model', 2)}, rank 1: its top-1 guess, 2 tokens after the root" in h
               and "probability: 0.50" in h for h in hovers)
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
    def keys(trace):
        return re.findall(r'<span class="key"[^>]*>([^<]*)</span>', views.stream_view(trace))[1:]  # after the base

    assert keys(draft) == [lanes.guess_name("draft-model", depth) for depth in range(1, 5)]
    assert keys(lookup) == [lanes.guess_name("prompt-lookup", depth) for depth in range(1, 5)]
    long = make_chain_run("prompt-lookup", [10], length=10)
    assert keys(long) == [lanes.guess_name("prompt-lookup", depth) for depth in range(1, 9)]  # 8 colours
    notes = re.findall(r'<span class="key-note">([^<]*)</span>', views.stream_view(long))
    assert lanes.guess_name("prompt-lookup", 10) in notes[0]  # then they repeat up to the chain's end
    assert keys(make_run(SMALL_CHOICES, accepted_leaves=[6])) == [lanes.guess_name("medusa", d) for d in (1, 2, 3)]


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
    assert numbers_in(rows[0].split(" | ")[-1]) == [1]  # plain decoding's speedup: 1× by definition


def test_where_another_drafter_beat_medusa_the_verdict_says_so_with_both_medians():
    race = _three_lanes(lookup_seconds=0.001)  # prompt lookup: 4 tokens in 1 ms a round
    assert race.fastest() == "prompt-lookup"
    headline = race_views.race_verdict(race).split("\n\n")[0]
    lookup, medusa = race.spread("prompt-lookup").median, race.spread("medusa").median
    # Medusa's median twice: the headline's, then beside the faster lane's.
    assert lanes.in_sentence("prompt-lookup") in headline and carries(headline, round(lookup, 2), round(medusa, 2),
                                                                         round(medusa, 2))
    race = _three_lanes(lookup_seconds=0.1)
    assert race.fastest() == "medusa"
    assert lanes.in_sentence("prompt-lookup") not in race_views.race_verdict(race).split("\n\n")[0]


def test_a_win_within_the_noise_is_called_that():
    clear, close = _three_lanes(lookup_seconds=0.001), _three_lanes(lookup_seconds=0.012)
    assert clear.fastest() == close.fastest() == "prompt-lookup"
    assert not clear.overlap("prompt-lookup", "medusa") and close.overlap("prompt-lookup", "medusa")
    assert "noise" not in race_views.race_verdict(clear) and "noise" not in drafter_comparison(clear)
    assert "noise" in race_views.race_verdict(close) and "noise" in drafter_comparison(close)


def test_the_verdict_says_plainly_whether_the_greedy_lanes_wrote_plain_decodings_text():
    race = _three_lanes()  # hand-made: plain decoding's words differ from every drafter's
    assert race.differing()[:2] == [("medusa", 1), ("draft-model", 1)]
    told = race_views.race_verdict(race).split("\n\n")[-1]
    assert told != race_views.SAME_TEXT and "⚠" in told
    assert all(lanes.in_sentence(lane) in told for lane, _ in race.differing())
    for runs in race.races:
        for lane in race.drafters:
            runs[lane].rounds, runs[lane].prefill_token = runs["ar"].rounds, runs["ar"].prefill_token
    assert race.differing() == [] and race_views.race_verdict(race).endswith(race_views.SAME_TEXT)


def test_lanes_show_one_row_each_on_one_clock():
    race = _three_lanes()
    frame = race_views.RaceFrame("replaying", 3, race.lanes, 3, result=race, clock=0.012)
    html = race_views.lanes_html(frame)
    assert [m for m in re.findall(r'data-lane="([\w-]+)"', html)] == race.lanes
    notes = re.findall(r"<small>\((.*?)\)</small>", html)
    assert notes == [race_views.lane_note(lane, race.shown[lane]) for lane in race.lanes]
    assert notes[1:] == ["tree test", "4 tokens a round", "copies up to 4 tokens"]  # each drafter's settings
    # At 12 ms the plain lane (prefill 10 ms, then 4 ms a token) has written 1 token in 1 pass.
    counts = re.findall(r'<div class="pane-head">.*?<span>(.*?)</span>', html)
    assert numbers_in(counts[0]) == [1, 1]


# ----------------------------------------------------------------------------- stats and learn

def test_the_walkthrough_compares_the_draft_model_with_medusas_heads_in_measured_numbers():
    from app.drafter_costs import count, draft_passes_per_round, megabytes

    race = _three_lanes()
    text = drafter_comparison(race)
    bullets = {line.split("**")[1]: line for line in text.splitlines() if line.startswith("- ")}
    assert list(bullets) == [lanes.title(lane) for lane in race.drafters]  # every raced drafter, in the race's order
    draft, heads, lookup = (bullets[lanes.title(lane)] for lane in ("draft-model", "medusa", "prompt-lookup"))
    drafter = race.shown["draft-model"].drafter
    assert (count(drafter.parameters), megabytes(drafter.weight_bytes), megabytes(drafter.cache_bytes)) == (
        "30K", "0.1 MB", "6 kB")
    assert all(told in draft for told in ("30K", "0.1 MB", "6 kB"))
    assert draft_passes_per_round(race, "draft-model") == 4.0
    assert carries(draft, 4.0, round(race.draft_cost("draft-model"), 2))
    assert count(race.shown["medusa"].drafter.parameters) == "99K" and "99K" in heads and "0.4 MB" in heads
    assert carries(heads, round(race.draft_cost("medusa"), 2))
    assert carries(lookup, round(race.timing("prompt-lookup").tokens_per_pass, 2))
    medusa, drafted = race.spread("medusa").median, race.spread("draft-model").median
    winner = text.splitlines()[-1]  # the winner's median first
    assert medusa > drafted and numbers_in(winner)[:2] == [round(medusa, 2), round(drafted, 2)]
    step = render_steps(load_steps(), None, race)[1]
    assert text in step and "{{" not in step


def test_the_walkthrough_says_when_prompt_lookup_beat_medusa():
    race = _three_lanes(lookup_seconds=0.001)
    medusa, lookup = race.spread("medusa").median, race.spread("prompt-lookup").median
    winner = drafter_comparison(race).splitlines()[-1]
    assert lookup > medusa and numbers_in(winner)[-2:] == [round(lookup, 2), round(medusa, 2)]


def test_the_walkthrough_invites_a_race_with_a_draft_model_until_there_is_one():
    assert drafter_comparison(None) == INVITATION
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    only_medusa = make_race({"ar": [make_ar_run(len(medusa.tokens))], "medusa": [medusa]})
    text = drafter_comparison(only_medusa)
    assert text.startswith(INVITATION) and "- **Medusa**" in text and "Here" not in text


def test_learn_follows_medusa_and_says_so_after_a_run_of_another_drafter(draft):
    assert walkthrough_run(draft, None) is None
    assert lanes.in_sentence("draft-model") in views.learn_banner(draft, None)  # the drafter it did not follow
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    race = make_race({"ar": [make_ar_run(len(medusa.tokens))], "medusa": [medusa], "draft-model": [draft]},
                     focus="draft-model")
    assert walkthrough_run(draft, race) is medusa and walkthrough_run(medusa, race) is medusa
    # The same Medusa run, told as the race's lane or as the last run.
    assert views.learn_banner(draft, race) != views.learn_banner(medusa, race)
    assert f"**{medusa.forward_passes} passes produced" in render_steps(load_steps(), draft, race)[5]


def test_stats_speak_of_the_runs_own_drafter(draft):
    race = make_race({"ar": [make_ar_run(len(draft.tokens))], "draft-model": [draft]}, focus="draft-model")
    text = views.stats_text(draft, race)
    assert text.startswith(lanes.title("draft-model")) and lanes.in_sentence("draft-model") in text
    lookup = make_chain_run("prompt-lookup", [1])
    unraced = views.stats_text(lookup, race)  # its lane was not in the race: it asks for one
    assert lanes.title("prompt-lookup") in unraced
    assert numbers_in(unraced) == [round(lookup.mean_accepted, 2), len(lookup.rounds)]


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_each_drafter_shows_its_own_controls_alone(method):
    """By name: Medusa's tree (preset, editor, status) and each drafter's own settings."""
    shown = {name for name, update in drafter_controls(method).items() if update["visible"]}
    own = {setting.name for setting in DRAFTERS[method].settings}
    assert shown == own | ({"preset", "tree_text", "tree_status"} if DRAFTERS[method].takes_tree else set())
