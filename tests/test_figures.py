"""The figure builders on hand-made traces: what is drawn must match what the trace says."""

from __future__ import annotations

import json

import pytest

from app import figures
from app.tokens import figure_text, stream_html
from app.tree_layout import leaf_count, path_to_root, tidy_layout
from app_helpers import SMALL_CHOICES, make_ar_run, make_run, make_tree
from decoding.tree import MC_SIM_7B_63


@pytest.fixture
def run():
    # Round 1 accepts the path to node 6 ([0, 0, 0]), round 2 nothing, round 3 node 5 ([1, 0]).
    return make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5])


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
        assert all(b - a >= 1 for a, b in zip(rows, rows[1:]))
    leaves = [n for n in range(tree.size) if n not in tree.parents]
    assert sorted(pos[n][1] for n in leaves) == list(range(leaf_count(tree.parents)))


def test_path_to_root():
    tree = make_tree(SMALL_CHOICES)
    assert path_to_root(tree.parents, 6) == [0, 1, 3, 6]


# ----------------------------------------------------------------------------- tree figure

def test_tree_figure_highlights_exactly_the_accepted_path(run):
    rnd = run.rounds[0]
    assert rnd.accepted_nodes == [0, 1, 3, 6]
    fig = figures.tree_figure(run.tree, rnd)
    pos = tidy_layout(run.tree.parents, run.tree.depths)
    (edges,) = _trace_named(fig, "accepted path")
    drawn = {(x, y) for x, y in zip(edges.x, edges.y) if x is not None}
    assert drawn == {pos[n] for n in rnd.accepted_nodes}
    # Node markers: full opacity and a green ring on the path, faded elsewhere.
    for trace in _trace_named(fig, "head") + _trace_named(fig, "root"):
        for node, opacity in zip(trace.customdata, trace.marker.opacity):
            assert (opacity == 1.0) == (node in rnd.accepted_nodes)


def test_tree_figure_labels_nodes_with_their_tokens_and_hover_has_the_facts(run):
    rnd = run.rounds[2]
    fig = figures.tree_figure(run.tree, rnd)
    labelled = {}
    for trace in _trace_named(fig, "head") + _trace_named(fig, "root"):
        for node, text, hover in zip(trace.customdata, trace.text, trace.hovertext):
            labelled[node] = (text, hover)
    assert sorted(labelled) == list(range(run.tree.size))
    for node, (text, hover) in labelled.items():
        assert text == figure_text(rnd.node_texts[node], 10)
        if node:
            assert f"head {run.tree.heads[node]}, rank {run.tree.ranks[node] + 1}" in hover
            parent_choice = figure_text(rnd.base_argmax_texts[run.tree.parents[node]])
            assert f"own prediction here: '{parent_choice}'" in hover
            assert ("accepted" in hover) == (node in rnd.accepted_nodes)


def test_tree_figure_colours_by_head_and_has_a_legend_entry_per_colour(run):
    fig = figures.tree_figure(run.tree, run.rounds[0])
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert {"root (base model)", "head 1 guess", "head 2 guess", "head 3 guess",
            "accepted path", "rejected branch (faded)", "base model's bonus token"} <= set(names)
    colours = {t.name: t.marker.color for t in _trace_named(fig, "head")}
    assert len(set(colours.values())) == 3


def test_bonus_token_is_the_base_argmax_after_the_last_accepted_node(run):
    rnd = run.rounds[1]
    assert rnd.accepted_nodes == [0]
    (bonus,) = _trace_named(fig := figures.tree_figure(run.tree, rnd), "base model's bonus")
    assert bonus.text[0] == figure_text(rnd.base_argmax_texts[0], 10) == figure_text(rnd.emitted_texts[-1], 10)
    assert fig.layout.height > 0


def test_big_tree_figure_is_tall_enough_for_one_row_per_leaf():
    big = make_run(MC_SIM_7B_63, accepted_leaves=[40])
    fig = figures.tree_figure(big.tree, big.rounds[0])
    rows = leaf_count(big.tree.parents)
    assert fig.layout.height >= rows * figures.ROW_PX
    assert all(len(t) <= 10 for tr in _trace_named(fig, "head") for t in tr.text)


# ----------------------------------------------------------------------------- mask figure

def test_mask_cells_match_ancestry(run):
    tree, rnd = run.tree, run.rounds[0]
    fig = figures.mask_figure(tree, rnd)
    (heat,) = fig.data
    for row in range(tree.size):
        ancestors = set(path_to_root(tree.parents, row))
        for col in range(tree.size):
            allowed = heat.z[row][col] > 0
            assert allowed == (col in ancestors)
            assert (heat.z[row][col] == 2) == (allowed and row in rnd.accepted_nodes)
            if allowed and col != row:
                assert "because" in heat.text[row][col]


def test_mask_uses_integer_coordinates_unique_labels_and_row_zero_on_top():
    # A round where every node holds the same token: labels must still be distinct rows.
    run = make_run(SMALL_CHOICES, accepted_leaves=[1])
    rnd = run.rounds[0]
    rnd.node_texts = [" the"] * run.tree.size
    fig = figures.mask_figure(run.tree, rnd)
    (heat,) = fig.data
    assert list(heat.x) == list(heat.y) == list(range(run.tree.size))
    labels = list(fig.layout.yaxis.ticktext)
    assert len(labels) == len(set(labels)) == run.tree.size
    assert list(fig.layout.xaxis.ticktext) == labels
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.height and fig.layout.uirevision


def test_reference_tree_mask_labels_unique():
    big = make_run(MC_SIM_7B_63, accepted_leaves=[12])
    labels = figures.mask_labels(big.tree, big.rounds[0])
    assert len(set(labels)) == 64


# ----------------------------------------------------------------------------- race and stats

def test_race_timeline_counts_every_token_at_its_measured_time(run):
    times, counts = figures.timeline(run)
    assert counts[-1] == len(run.tokens)
    assert times[-1] == pytest.approx(run.total_time)
    assert times == sorted(times)


def test_race_figure_has_both_lines_and_the_speedup(run):
    ar = make_ar_run(len(run.tokens), seconds_per_token=0.01)
    fig = figures.race_figure(ar, run)
    assert [t.name.split(":")[0] for t in fig.data] == ["plain decoding (AR)", "Medusa"]
    assert f"{figures.speedup(ar, run):.2f}×" in fig.layout.title.text
    assert f"{ar.forward_passes} passes" in fig.data[0].name
    cut = figures.race_figure(ar, run, until=0.02)
    assert max(cut.data[0].x) <= 0.02


def test_acceptance_by_depth(run):
    # Accepted guesses per round: 3, 0, 2.
    rows = figures.acceptance_by_depth(run)
    assert rows == [(1, 2 / 3, 2 / 3), (2, 2 / 3, 1.0), (3, 1 / 3, 1 / 2)]
    hist = figures.accepted_histogram(run)
    assert list(hist.data[0].y) == [1, 0, 1, 1]


def test_speed_figure_with_and_without_a_race(run):
    alone = figures.speed_figure(run, None)
    assert len(alone.data[0].x) == 1
    ar = make_ar_run(len(run.tokens))
    both = figures.speed_figure(run, ar)
    assert both.data[0].y[2] == pytest.approx(figures.speedup(ar, run))


def test_figures_serialise_to_json(run):
    for fig in (figures.tree_figure(run.tree, run.rounds[0]),
                figures.mask_figure(run.tree, run.rounds[0]),
                figures.race_figure(make_ar_run(5), run), figures.head_acceptance_figure(run)):
        json.loads(fig.to_json())


# ----------------------------------------------------------------------------- token stream

def test_stream_html_groups_tokens_by_pass_and_marks_head_tokens(run):
    html = stream_html(run)
    assert html.count('class="pass"') == 1 + len(run.rounds)
    assert html.count("tok-head") == sum(sum(r.emitted_from_heads) for r in run.rounds)
    assert stream_html(run, until=0.0).count('class="pass"') == 0


def test_figure_text_escapes_the_tags_plotly_would_read(run):
    rnd = run.rounds[0]
    rnd.node_texts = ["<br>"] * run.tree.size
    fig = figures.tree_figure(run.tree, rnd)
    labels = [t for tr in _trace_named(fig, "head") for t in tr.text]
    assert labels and all(label == "&lt;br&gt;" for label in labels)
    assert "<br>" not in figures.mask_labels(run.tree, rnd)[3]


def test_stream_html_escapes_text(run):
    run.prompt = "<script>alert(1)</script>"
    assert "<script>" not in stream_html(run)


# ----------------------------------------------------------------------------- explainer text

def test_explainer_steps_load_with_labels_and_the_view_they_point_at():
    from app.text import load_steps

    steps = load_steps()
    assert len(steps) == 7
    assert all(step.label and len(step.label) <= 14 for step in steps)
    assert {step.shows for step in steps} <= {"race", "stream", "tree", "mask", "stats", "none"}
    assert all(step.template.startswith(f"### {step.title}") for step in steps)


def test_explainer_is_filled_with_this_runs_numbers(run):
    from app.text import PLACEHOLDER, explainer_values, load_steps, render_steps

    ar = make_ar_run(len(run.tokens))
    steps = load_steps()
    wanted = {name for step in steps for name in PLACEHOLDER.findall(step.template)}
    assert wanted <= set(explainer_values(run, ar)), wanted - set(explainer_values(run, ar))
    texts = render_steps(steps, run, ar)
    assert not any("{{" in text for text in texts)
    speedup_step = texts[5]
    assert f"**{run.forward_passes} passes produced {len(run.tokens)} tokens**" in speedup_step
    assert f"{figures.speedup(ar, run):.2f}×" in speedup_step


def test_explainer_before_any_run_shows_dashes_not_placeholders():
    from app.text import MISSING, load_steps, render_steps

    texts = render_steps(load_steps(), None, None)
    assert not any("{{" in text for text in texts)
    assert MISSING in texts[5]


def test_round_cost_parts_split_a_round_into_verify_and_drafting(run):
    # Hand-made rounds: draft 1 ms, verify 4 ms, accept 0.5 ms; the plain passes take 4 ms each.
    ar = make_ar_run(len(run.tokens), seconds_per_token=0.004)
    verify, draft_accept = figures.round_cost_parts(ar, run)
    assert verify == pytest.approx(1.0) and draft_accept == pytest.approx(0.375)
    assert verify + draft_accept == pytest.approx(figures.pass_cost_ratio(ar, run))
    assert figures.round_cost_parts(ar, make_run(SMALL_CHOICES, accepted_leaves=[])) == (0.0, 0.0)


def test_speedup_step_shows_where_a_rounds_time_goes(run):
    from app.text import load_steps, render_steps

    ar = make_ar_run(len(run.tokens), seconds_per_token=0.004)
    speedup_step = render_steps(load_steps(), run, ar)[5]
    assert "verify pass alone cost 1.00 plain passes" in speedup_step
    assert "accepting 0.38" in speedup_step
    assert f"≈ **{run.mean_accepted / 1.0:.2f}×**" in speedup_step


def test_stats_page_names_the_verify_cost_and_the_ceiling(run):
    from app.ui import stats_views

    ar = make_ar_run(len(run.tokens), seconds_per_token=0.004)
    text = stats_views(run, ar, scale=1.0)[0]
    assert "cost **1.38×**" in text and "verify pass over the whole tree cost 1.00×" in text
    assert f"ceiling is {run.mean_accepted:.2f} ÷ 1.00" in text
    assert "Race" in stats_views(run, None, scale=1.0)[0]
    # A sampled plain run can end at its first token: nothing to compare a round with, no crash.
    assert "ceiling" not in stats_views(run, make_ar_run(1), scale=1.0)[0]
