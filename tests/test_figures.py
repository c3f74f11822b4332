"""The figure builders on hand-made traces: what is drawn must match what the trace says."""

from __future__ import annotations

import json
import re
from itertools import pairwise

import pytest

from app import charts
from app.figure_style import Look
from app.tokens import figure_text, stream_html
from app.tree_figures import (
    label_every,
    labelled_nodes,
    mask_figure,
    mask_height,
    mask_label,
    mask_plot_px,
    next_token_hover,
    tree_figure,
    tree_height,
)
from app.tree_layout import leaf_count, tidy_layout
from app_helpers import SMALL_CHOICES, make_ar_run, make_chain_run, make_race, make_run, make_tree, path_nodes
from decoding.tree import MC_SIM_7B_63


@pytest.fixture
def run():
    # Round 1 accepts the path to node 6 ([0, 0, 0]), round 2 nothing, round 3 node 5 ([1, 0]).
    return make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5])


def _node_traces(fig):
    return [t for t in fig.data if t.customdata is not None]


def _trace_named(fig, prefix):
    return [t for t in fig.data if (t.name or "").startswith(prefix)]


# ----------------------------------------------------------------------------- layout

def test_tidy_layout_puts_depth_on_x_and_parents_between_children():
    tree = make_tree(SMALL_CHOICES)
    pos = tidy_layout(tree.parents, tree.depths)
    assert [pos[n][0] for n in range(tree.size)] == tree.depths
    for node in range(tree.size):
        kids = [c for c, p in enumerate(tree.parents) if p == node]
        if kids:
            rows = sorted(pos[k][1] for k in kids)
            assert pos[node][1] == (rows[0] + rows[-1]) / 2


def test_reference_tree_layout_has_no_two_nodes_on_one_spot():
    tree = make_tree(MC_SIM_7B_63)
    assert tree.size == 64
    assert [tree.depths.count(d) for d in range(1, 5)] == [10, 28, 23, 2]
    pos = tidy_layout(tree.parents, tree.depths)
    assert len(set(pos.values())) == 64
    # Labels sit to the right of their node: two nodes of one depth need a full row between them.
    for depth in range(5):
        rows = sorted(y for x, y in pos.values() if x == depth)
        assert all(b - a >= 1 for a, b in pairwise(rows))
    leaves = [n for n in range(tree.size) if n not in tree.parents]
    assert sorted(pos[n][1] for n in leaves) == list(range(leaf_count(tree.parents)))


# ----------------------------------------------------------------------------- tree figure

def test_tree_figure_highlights_exactly_the_accepted_path(run):
    rnd = run.rounds[0]
    assert rnd.accepted_nodes == [0, 1, 3, 6]
    fig = tree_figure(run.tree, rnd)
    pos = tidy_layout(run.tree.parents, run.tree.depths)
    (edges,) = _trace_named(fig, "accepted path")
    drawn = {(x, y) for x, y in zip(edges.x, edges.y, strict=True) if x is not None}
    assert drawn == {pos[n] for n in rnd.accepted_nodes}
    for trace in _node_traces(fig):
        for node, opacity in zip(trace.customdata, trace.marker.opacity, strict=True):
            assert (opacity == 1.0) == (node in rnd.accepted_nodes)


def test_tree_figure_labels_nodes_with_their_tokens_and_hover_has_the_facts(run):
    rnd = run.rounds[2]
    fig = tree_figure(run.tree, rnd)
    labelled = {}
    for trace in _node_traces(fig):
        for node, text, hover in zip(trace.customdata, trace.text, trace.hovertext, strict=True):
            labelled[node] = (text, hover)
    assert sorted(labelled) == list(range(run.tree.size))
    for node, (text, hover) in labelled.items():
        assert text == figure_text(rnd.node_texts[node], 10)
        if node:
            assert f"head {run.tree.depths[node]}, rank {run.tree.ranks[node] + 1}" in hover
            parent_choice = figure_text(rnd.base_argmax_texts[run.tree.parents[node]])
            assert f"most likely token here: '{parent_choice}'" in hover
            assert ("accepted" in hover) == (node in rnd.accepted_nodes)


def test_tree_is_one_trace_per_edge_kind_and_per_depth_not_per_node():
    big = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    fig = tree_figure(big.tree, big.rounds[0])
    # rejected edges, accepted edges, 5 depths, the star's dotted edge and the star
    assert len(fig.data) == 2 + 5 + 2
    (heat,) = mask_figure(big.tree, big.rounds[0]).data
    assert len(heat.z) == 64


def test_each_column_heading_has_its_heads_colour(run):
    from app.palette import head_colour

    fig = tree_figure(run.tree, run.rounds[0])
    headings = list(fig.layout.xaxis.ticktext)
    assert len(headings) == 5 and "root" in headings[0] and "next" in headings[-1]
    for depth in (1, 2, 3):
        assert f"head {depth}" in headings[depth] and head_colour(depth) in headings[depth]


def test_the_star_is_the_token_the_round_chose_even_when_it_is_not_the_argmax(run):
    rnd = run.rounds[1]
    assert rnd.accepted_nodes == [0]
    (star,) = _trace_named(tree_figure(run.tree, rnd), "next token")
    assert star.text[0] == figure_text(rnd.emitted_texts[-1], 10)
    # A sampled round: the chosen token is not the base model's most likely one.
    rnd.next_token, rnd.next_text = 999, " sampled"
    (star,) = _trace_named(tree_figure(run.tree, rnd), "next token")
    assert star.text[0] == figure_text(" sampled", 10)
    hover = next_token_hover(rnd)
    assert "sampled" in hover and f"'{figure_text(rnd.base_argmax_texts[0])}'" in hover


def test_a_big_tree_is_capped_in_height_with_labels_no_taller_than_a_row():
    big = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    fig = tree_figure(big.tree, big.rounds[0])
    rows = leaf_count(big.tree.parents)
    assert fig.layout.height == tree_height(big.tree) <= 720  # on one 1280x800 screen once scrolled to it
    sizes = _node_traces(fig)[2].textfont.size  # depth 2: 28 nodes, one of them accepted
    assert 10 <= min(sizes) <= (fig.layout.height - 90) / rows and max(sizes) > min(sizes)
    assert all(len(t) <= 10 for tr in _node_traces(fig) for t in tr.text)


def test_a_phone_gets_shorter_labels_and_no_drag_capture():
    big = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    fig = tree_figure(big.tree, big.rounds[0], Look(width=390))
    assert all(len(t) <= 6 for tr in _node_traces(fig) for t in tr.text)
    assert fig.layout.dragmode is False


def test_projector_scales_type_up():
    run = make_run(SMALL_CHOICES, accepted_leaves=[6])
    laptop, projector = (tree_figure(run.tree, run.rounds[0], Look(projector=p)) for p in (False, True))
    assert projector.layout.font.size > laptop.layout.font.size
    assert projector.layout.height > laptop.layout.height


# ----------------------------------------------------------------------------- mask figure

def test_mask_cells_match_ancestry(run):
    tree, rnd = run.tree, run.rounds[0]
    (heat,) = mask_figure(tree, rnd).data
    for row in range(tree.size):
        ancestors = set(path_nodes(tree, row))
        for col in range(tree.size):
            allowed = heat.z[row][col] > 0
            assert allowed == (col in ancestors)
            assert (heat.z[row][col] == 2) == (allowed and row in rnd.accepted_nodes)
            assert ("sees" in heat.text[row][col]) == allowed


def test_mask_uses_integer_coordinates_unique_labels_and_row_zero_on_top():
    # A round where every node holds the same token: labels must still be distinct rows.
    run = make_run(SMALL_CHOICES, accepted_leaves=[1])
    rnd = run.rounds[0]
    rnd.node_texts = [" the"] * run.tree.size
    fig = mask_figure(run.tree, rnd)
    (heat,) = fig.data
    assert list(heat.x) == list(heat.y) == list(range(run.tree.size))
    labels = list(fig.layout.yaxis.ticktext)
    assert len(labels) == len(set(labels)) == run.tree.size  # a small tree: every row labelled
    assert fig.layout.yaxis.autorange == "reversed"


def test_a_big_mask_thins_its_labels_and_keeps_a_hover_for_every_cell():
    big = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    rnd = big.rounds[0]
    fig = mask_figure(big.tree, rnd)
    shown = list(fig.layout.yaxis.tickvals)
    assert 0 in shown and 5 <= len(shown) < 30
    assert all(b - a >= label_every(big.tree) for a, b in pairwise(shown))
    assert list(fig.layout.yaxis.ticktext) == [mask_label(rnd, n) for n in shown]
    assert all(mask_label(rnd, n).startswith("✓") for n in rnd.accepted_nodes)
    (heat,) = fig.data
    assert all(len(row) == 64 and all(row) for row in heat.text)  # a hover for every cell
    assert [max(heat.z[n]) for n in range(64)] == [2 if n in rnd.accepted_nodes else 1 for n in range(64)]


def test_tick_labels_are_not_measured_against_the_page_on_every_draw():
    """Plotly's default for numeric axes ("hide past div") measures every tick label on every
    draw: most of a 64-node mask's drawing time on a 2-core CPU. The labels sit in the margins."""
    big = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    rnd = big.rounds[0]
    mask, tree = mask_figure(big.tree, rnd), tree_figure(big.tree, rnd)
    assert mask.layout.xaxis.ticklabeloverflow == mask.layout.yaxis.ticklabeloverflow == "allow"
    assert tree.layout.xaxis.ticklabeloverflow == "allow"


def test_labelled_rows_are_never_closer_than_the_step_and_the_root_is_always_labelled():
    shown = labelled_nodes(64, [0, 1, 3, 17, 40], every=6)
    assert shown[0] == 0 and {17, 40} <= set(shown)
    assert all(b - a >= 6 for a, b in pairwise(shown))
    assert labelled_nodes(9, [0, 2], every=1) == list(range(9))


def test_a_narrower_mask_labels_fewer_rows():
    big = make_tree(MC_SIM_7B_63)
    assert label_every(big, Look(width=1920, projector=True)) < label_every(big, Look(width=1280))
    assert label_every(make_tree(SMALL_CHOICES)) == 1


# ----------------------------------------------------------------------------- race and stats

def test_race_timeline_counts_every_token_at_its_measured_time(run):
    times, counts = charts.timeline(run)
    assert counts[-1] == len(run.tokens)
    assert times[-1] == pytest.approx(run.total_time)
    assert times == sorted(times)


def test_recording_time_is_left_out_of_the_race_clock(run):
    for rnd in run.rounds:
        rnd.time_trace = 0.001
    times, _ = charts.timeline(run)
    assert times[-1] == pytest.approx(run.total_time - 0.001 * len(run.rounds))


def test_race_figure_replays_the_median_race_one_line_per_lane(run):
    ar = make_ar_run(len(run.tokens), seconds_per_token=0.01)
    lookup = make_chain_run("prompt-lookup", [2, None])
    race = make_race({"ar": [ar], "medusa": [run], "prompt-lookup": [lookup]})
    race.races[0] = {"prompt-lookup": lookup, "ar": ar, "medusa": run}  # the order this race ran them in
    fig = charts.race_figure(race)
    assert [t.name.split(":")[0] for t in fig.data] == ["Plain decoding", "Medusa", "Prompt lookup"]
    assert f"{ar.forward_passes} passes" in fig.data[0].name and f"{lookup.forward_passes} passes" in fig.data[2].name
    assert "race 1 of 1: Medusa's median" in fig.layout.title.text
    cut = charts.race_figure(race, until=0.02)
    assert all(max(line.x) <= 0.02 for line in cut.data)


def test_acceptance_by_depth(run):
    # Accepted guesses per round: 3, 0, 2.
    rows = charts.acceptance_by_depth(run)
    assert rows == [(1, 2 / 3, 2 / 3), (2, 2 / 3, 1.0), (3, 1 / 3, 1 / 2)]
    hist = charts.accepted_histogram(run)
    assert list(hist.data[0].y) == [1, 0, 1, 1]


def test_speed_figure_with_and_without_a_race(run):
    assert len(charts.speed_figure(run, None).data[0].x) == 1
    ar = make_ar_run(len(run.tokens), seconds_per_token=0.004)
    both = charts.speed_figure(run, make_race({"ar": [ar], "medusa": [run]}))
    # Hand-made: plain 0.01 + 8 x 0.004 s, Medusa 0.01 + 3 x 0.0055 s, 9 tokens each.
    assert both.data[0].y[2] == pytest.approx((0.01 + 8 * 0.004) / (0.01 + 3 * 0.0055))
    assert both.data[0].y[1] == pytest.approx(0.0055 / 0.004)


def test_figures_serialise_to_json(run):
    for fig in (tree_figure(run.tree, run.rounds[0]), mask_figure(run.tree, run.rounds[0]),
                charts.race_figure(make_race({"ar": [make_ar_run(5)], "medusa": [run]})),
                charts.head_acceptance_figure(run)):
        json.loads(fig.to_json())


# ----------------------------------------------------------------------------- token stream

def test_stream_html_groups_tokens_by_pass_and_marks_head_tokens(run):
    html = stream_html(run)
    assert html.count('class="pass') == 1 + len(run.rounds)
    assert html.count("tok-guess") == sum(sum(r.emitted_from_drafter) for r in run.rounds)
    assert stream_html(run, until=0.0).count('class="pass') == 0


def test_stream_marks_the_round_in_view_and_each_box_names_its_round(run):
    html = stream_html(run, current=1)
    assert html.count("pass current") == 1
    assert 'class="pass current" data-round="2"' in html
    assert [f'data-round="{k}"' in html for k in (1, 2, 3)] == [True] * 3


def test_figure_text_escapes_the_tags_plotly_would_read(run):
    rnd = run.rounds[0]
    rnd.node_texts = ["<br>"] * run.tree.size
    labels = [t for tr in _node_traces(tree_figure(run.tree, rnd)) for t in tr.text]
    assert labels and all(label == "&lt;br&gt;" for label in labels)
    assert "<br>" not in mask_label(rnd, 3)


def test_a_line_break_shows_in_its_box_and_breaks_the_line_after_it(run):
    """A raw line break inside a pass's box made the box two lines tall, and the stream's lines
    uneven: its whole-line scrolling then cut its top line in half."""
    run.rounds[0].emitted_texts[-1] = ".\n\n"
    html_out = stream_html(run)
    boxes = re.findall(r'<span class="pass[^>]*>.*?</span></span>', html_out)
    assert len(boxes) == 1 + len(run.rounds) and not any("\n" in box for box in boxes)
    assert ".↵↵</span></span>\n" in html_out and html_out.count("\n") == 1


def test_stream_html_escapes_text(run):
    run.prompt = "<script>alert(1)</script>"
    assert "<script>" not in stream_html(run)


def test_the_papers_64_node_mask_is_readable_at_1280x800():
    big = make_tree(MC_SIM_7B_63)
    # Half the row beside the tree (it was 0.4, a 250 px square with one row in four labelled).
    assert mask_plot_px(big) >= 320 and label_every(big) <= 3
    assert mask_height(big) == round(mask_plot_px(big) + 100)  # no empty band between the cells and the key
    run = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    key = mask_figure(run.tree, run.rounds[0]).layout.annotations[0].text
    assert len(re.sub("<[^>]+>", "", key)) <= 45  # fits under a 330 px square at 11 px


def test_the_masks_hover_gives_each_cells_reason_from_the_trees_shape():
    """Node 1 is node 0's child: node 0 cannot see it because it comes later on its own branch, not
    because it is on another branch; siblings are on other branches; ancestors are seen."""
    from app.tree_figures import mask_figure

    run = make_run(SMALL_CHOICES, accepted_leaves=[3])
    tree = run.round_tree(run.rounds[0])
    hover = mask_figure(tree, run.rounds[0]).data[0].text
    ancestors = {node: set() for node in range(tree.size)}
    for node in range(1, tree.size):
        parent = tree.parents[node]
        ancestors[node] = {parent} | ancestors[parent]
    for row in range(tree.size):
        for col in range(tree.size):
            text = hover[row][col]
            if col == row:
                assert text.endswith("sees itself")
            elif col in ancestors[row]:
                assert text.endswith("the root" if col == 0 else "its ancestor")
            elif row in ancestors[col]:
                assert text.endswith("it comes later, below it on its own branch"), (row, col, text)
            else:
                assert text.endswith("another branch"), (row, col, text)
    assert hover[0][1].endswith("comes later, below it on its own branch")


def test_the_end_of_text_token_is_a_marker_not_raw_text():
    run = make_run(SMALL_CHOICES, accepted_leaves=[3, 0])
    run.rounds[-1].emitted_texts[-1] = "<|im_end|>"
    run.stop_reason = "eos"
    html_out = stream_html(run)
    assert "<|im_end|>" not in html_out and "&lt;|im_end|&gt;" in html_out  # in the hover only
    assert html_out.count("tok-end") == 1 and "⏹ end of text" in html_out
    run.stop_reason = "max_new_tokens"  # a token that only looks like it, mid-run, stays as it is
    assert "tok-end" not in stream_html(run)
