"""End to end in a real browser: `python app.py`, Debian's Chromium driven by Playwright.

Runs a prompt, checks that the tree, the mask and the race are drawn with data, steps to
another round and sees the figures change, and saves screenshots (to $APP_SCREENSHOTS_DIR, or
pytest's temporary directory). Without Chromium the test skips, except under CI, where a
missing browser is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.screenshots import (
    CHROMIUM, browser_page, open_tab, plot_title, plot_traces, run_prompt, run_race, running_app, shoot,
    walk_to_step,
)
from decoding import embedded_models
from decoding.prompts import example_prompts
from decoding.tiny import make_tiny_model_dir

sync_api = pytest.importorskip("playwright.sync_api")


def _require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    message = f"{CHROMIUM} is missing: apt-get install -y chromium"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    _require_chromium()
    model = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))
    with running_app(str(model)) as url, sync_api.sync_playwright() as playwright, \
            browser_page(playwright) as page:
        page.goto(url)
        page.wait_for_selector("#run-button", timeout=60_000)
        yield page


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("APP_SCREENSHOTS_DIR")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


def test_run_draws_tree_and_mask_and_steps_through_rounds(page, shots):
    assert page.locator("#run-button").inner_text() == "Run"
    first_tree = run_prompt(page, "It is a truth universally acknowledged")
    print(f"first tree drawn {first_tree:.2f} s after pressing Run")
    assert "tokens in" in page.locator("#run-summary").inner_text()
    assert page.locator("#stream-box .tok").count() >= 8

    assert plot_traces(page, "tree-plot") >= 6  # edges, nodes per depth, bonus token
    assert page.locator("#tree-plot .textpoint").count() >= 5  # token labels on the nodes
    assert plot_traces(page, "mask-plot") == 1  # the heatmap
    # Figures export as PNG from Plotly's own toolbar.
    assert page.locator("#tree-plot .modebar-btn[data-title*='png' i]").count() == 1
    last_tree, last_mask = plot_title(page, "tree-plot"), plot_title(page, "mask-plot")
    shoot(page, shots / "playground.png")

    page.click("#prev-round")
    page.wait_for_function(
        f"document.querySelector('#tree-plot .gtitle')?.textContent !== {last_tree!r}", timeout=15_000)
    assert plot_title(page, "tree-plot") != last_tree
    assert plot_title(page, "mask-plot") != last_mask
    assert "Round" in page.locator("#round-info").inner_text()
    shoot(page, shots / "previous-round.png")

    page.click("#next-round")
    page.wait_for_function(
        f"document.querySelector('#tree-plot .gtitle')?.textContent === {last_tree!r}", timeout=15_000)
    page.click("#play-rounds")  # at the last round, Play starts again from round 1
    page.wait_for_function(
        "document.querySelector('#tree-plot .gtitle')?.textContent.startsWith('Round 1 ')", timeout=15_000)
    page.click("#play-rounds")
    page.get_by_role("button", name="▶ Play").wait_for(timeout=10_000)


def test_a_malformed_tree_is_explained_before_any_run(page):
    editor = page.locator("#tree-json .cm-content")
    original = editor.inner_text()
    editor.fill("[[0], [0, 1")
    page.get_by_text("the tree JSON is malformed").wait_for(timeout=10_000)
    editor.fill("[[0], [1], [0, 0]]")
    page.wait_for_function(
        "document.querySelector('#tree-status')?.innerText.includes('4 nodes incl. root')", timeout=10_000)
    editor.fill(original)


def test_race_draws_both_lines_and_states_how_it_was_timed(page, shots):
    summary = run_race(page)
    assert "Medusa:" in summary and "plain decoding:" in summary and "×" in summary
    assert plot_traces(page, "race-plot") == 2
    assert "timed" in page.get_by_text("How this was timed").inner_text()
    shoot(page, shots / "race.png")

    open_tab(page, "Stats")
    assert plot_traces(page, "stats-figures") >= 3
    shoot(page, shots / "stats.png")
    open_tab(page, "Learn")
    walk_to_step(page, 6)
    speedup_step = page.locator("#learn-step-6").inner_text()
    assert "passes produced" in speedup_step
    assert "—" not in speedup_step  # every number of the step filled from this run and race
    shoot(page, shots / "learn.png")


def test_empty_prompt_shows_an_error_and_the_app_keeps_running(page):
    open_tab(page, "Playground")
    page.locator("#prompt textarea").fill("")
    page.click("#run-button")
    page.get_by_text("the prompt is empty").first.wait_for(timeout=15_000)
    run_prompt(page, "Mr. Darcy")  # still answers


@pytest.mark.skipif("stdlib" not in embedded_models(), reason="the embedded code model is not in assets/")
def test_a_code_example_switches_to_the_code_model_and_runs(page):
    """Each example prompt comes with the model it was written for: picking one picks both."""
    open_tab(page, "Playground")
    prompt = example_prompts("stdlib")[0]
    page.get_by_text(prompt.splitlines()[0]).first.click()
    page.wait_for_function(
        "document.querySelector('#model-dropdown input')?.value.startsWith('stdlib')", timeout=60_000)
    assert page.locator("#prompt textarea").input_value() == prompt
    page.wait_for_function(
        "document.querySelector('#model-card')?.innerText.startsWith('stdlib')", timeout=60_000)
    run_prompt(page)
    assert page.locator("#stream-box .tok").count() >= 8
