"""End to end in a real browser: `python app.py`, Debian's Chromium driven by Playwright.

Each test starts from a freshly loaded page (one app for the module), so none depends on another
having run first. Screenshots go to $APP_SCREENSHOTS_DIR, or pytest's temporary directory.
Without Chromium the tests skip, except under CI, where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from app.layout import PLAY_EVERY
from decoding.assets import RECORDINGS_ENV
from decoding.loading import embedded_models, load_model
from decoding.medusa_modules import medusa_part
from decoding.prompts import example_prompts
from decoding.tiny import make_tiny_model_dir
from scripts.screenshots import (
    CHROMIUM,
    LAPTOP,
    PHONE,
    PROJECTOR,
    browser_page,
    open_app,
    open_tab,
    pick_drafter,
    run_prompt,
    run_race,
    running_app,
    set_race_count,
    shoot,
    train_head,
    walk_to_step,
)
from tests.test_quick_heads import write_cycle_recording

sync_api = pytest.importorskip("playwright.sync_api")


# ----- what the tests read off the page -----

def plot_traces(page, elem_id: str) -> int:
    """How many data traces the Plotly figure in `#elem_id` has drawn."""
    return page.locator(f"#{elem_id} [data-testid='plotly'] :is(g.trace, g.hm)").count()


def plot_title(page, elem_id: str) -> str:
    title = page.locator(f"#{elem_id} [data-testid='plotly'] .gtitle")
    return title.first.text_content() if title.count() else ""


IN_VIEW = """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
  const seen = Math.min(r.bottom, window.innerHeight) - Math.max(r.top, 0);
  return r.height > 0 ? Math.max(0, seen) / r.height : 0; }"""


def in_view(page, selector: str, at_least: float = 1.0, timeout_ms: int = 5_000) -> float:
    """The share of the element's height inside the viewport, as the page is scrolled, once it
    reaches `at_least` (the page may still be scrolling or drawing) or the time is up."""
    try:
        page.wait_for_function(f"({IN_VIEW})({selector!r}) >= {at_least}", timeout=timeout_ms)
    except sync_api.TimeoutError:  # report the share as it is
        pass
    return page.evaluate(IN_VIEW, selector)


def overlapping_labels(page, elem_id: str) -> int:
    """How many pairs of the figure's text labels overlap on screen."""
    return page.evaluate("""(id) => {
      const boxes = [...document.querySelectorAll(`#${id} .textpoint text`)]
        .map((t) => t.getBoundingClientRect()).filter((r) => r.width > 0);
      let pairs = 0;
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i], b = boxes[j];
        if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) pairs++;
      }
      return pairs; }""", elem_id)


def stream_lines(page) -> list[float]:
    """Each visible token stream's height and scroll position, in lines: whole numbers when no line
    is cut at the box's top or bottom edge."""
    return page.evaluate("""() => [...document.querySelectorAll('.stream')].filter(b => b.offsetParent)
      .flatMap(b => { const s = getComputedStyle(b), line = parseFloat(s.lineHeight);
        const inner = b.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom);
        return [inner / line, b.scrollTop / line]; })""")


def no_line_is_cut(page) -> None:
    lines = stream_lines(page)
    assert lines and all(abs(x - round(x)) < 0.05 for x in lines), lines


def _require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    message = f"{CHROMIUM} is missing: apt-get install -y chromium"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    _require_chromium()
    model = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))
    # A recording of the tiny model's answers, for the Train tab (the page finds it through the environment).
    lm = load_model(str(model))
    recording = write_cycle_recording(tmp_path_factory.mktemp("recording"), lm.tokenizer,
                                      medusa_part(lm).heads.config.vocab_size, lm.name)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(RECORDINGS_ENV, str(recording))
        with running_app(str(model)) as url:
            yield url


@pytest.fixture(scope="module")
def playwright():
    with sync_api.sync_playwright() as pw:
        yield pw


def _page(playwright, url: str, viewport: dict):
    with browser_page(playwright, viewport) as page:
        open_app(page, url)
        yield page


@pytest.fixture
def page(playwright, app_url):
    yield from _page(playwright, app_url, LAPTOP)


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("APP_SCREENSHOTS_DIR")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


def _title_is(page, elem_id: str, start: str) -> None:
    page.wait_for_function(
        f"document.querySelector('#{elem_id} .gtitle')?.textContent.startsWith({start!r})", timeout=15_000)


def test_after_run_the_tree_and_mask_are_in_view_at_1280x800(page, shots):
    first_tree = run_prompt(page, "It is a truth universally acknowledged")
    print(f"first tree drawn {first_tree:.2f} s after pressing Run")
    assert in_view(page, "#tree-plot") == 1.0 and in_view(page, "#mask-plot", 0.8) >= 0.8
    assert "tokens in" in page.locator("#run-summary").inner_text()
    assert page.locator("#stream-box .tok").count() >= 8
    assert plot_traces(page, "tree-plot") >= 6  # edges, nodes per depth, the next token
    assert page.locator("#tree-plot .textpoint").count() >= 5  # token labels on the nodes
    assert plot_traces(page, "mask-plot") == 1  # the heatmap
    assert page.locator("#tree-plot .modebar-btn[data-title*='png' i]").count() == 1
    shoot(page, shots / "playground.png", full_page=False)


def test_stepping_rounds_marks_their_tokens_and_a_click_on_a_token_selects_its_round(page):
    run_prompt(page, "It is a truth universally acknowledged")
    last_tree = plot_title(page, "tree-plot")
    rounds = int(last_tree.split()[1])
    page.click("#prev-round")
    _title_is(page, "tree-plot", f"Round {rounds - 1} ")
    assert plot_title(page, "mask-plot").endswith(f"round {rounds - 1}")
    current = page.locator("#stream-box .pass.current")
    assert current.count() == 1 and current.get_attribute("data-round") == str(rounds - 1)
    assert f"Round {rounds - 1} of {rounds}" in page.locator("#round-info").inner_text()

    page.locator('#stream-box .pass[data-round="2"]').click()
    _title_is(page, "tree-plot", "Round 2 ")
    assert page.locator("#stream-box .pass.current").get_attribute("data-round") == "2"


def test_play_walks_the_rounds_at_its_stated_pace(page):
    run_prompt(page, "It is a truth universally acknowledged")
    page.click("#play-rounds")  # at the last round, Play starts again from round 1
    _title_is(page, "tree-plot", "Round 1 ")
    started = time.perf_counter()
    _title_is(page, "tree-plot", "Round 3 ")
    pace = (time.perf_counter() - started) / 2
    print(f"Play: {pace:.2f} s per round (timer {PLAY_EVERY} s)")
    assert pace < 2 * PLAY_EVERY
    page.click("#play-rounds")
    page.get_by_role("button", name="▶ Play").wait_for(timeout=10_000)


def test_a_malformed_tree_is_explained_before_any_run(page):
    editor = page.locator("#tree-json .cm-content")
    editor.fill("[[0], [0, 1")
    page.get_by_text("the tree JSON is malformed").wait_for(timeout=10_000)
    editor.fill("[[0], [1], [0, 0]]")
    page.wait_for_function(
        "document.querySelector('#tree-status')?.innerText.includes('4 nodes incl. root')", timeout=10_000)


def test_races_run_a_lane_per_drafter_report_their_speedups_and_link_to_stats(page, shots):
    open_tab(page, "Race")
    for name in ("draft model", "prompt lookup"):  # Medusa alone is ticked at first
        page.locator("#race-lanes-picker").get_by_label(name).check()
    started = time.perf_counter()
    verdict = run_race(page, races=3)
    print(f"a race of 4 lanes x 3 races on the tiny model: {time.perf_counter() - started:.1f} s")
    assert "median of 3 races" in verdict and "range" in verdict and "passes" in verdict
    # The tiny model has heads and a draft model: plain decoding and three drafters, out of the box.
    lanes = page.locator("#race-panes .lane")
    assert lanes.count() == 4 and plot_traces(page, "race-plot") == 4
    assert [lanes.nth(i).get_attribute("data-lane") for i in range(4)] == [
        "ar", "medusa", "draft-model", "prompt-lookup"]
    for i in range(4):
        assert "64 tokens" in lanes.nth(i).inner_text() and "done in" in lanes.nth(i).inner_text()
    rows = page.locator("#race-summary table tbody tr")
    assert rows.count() == 4
    for i, name in enumerate(["Medusa", "Draft model", "Prompt lookup"], start=1):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).inner_text() == name
        assert re.fullmatch(r"\d+\.\d\d× \(\d+\.\d\d–\d+\.\d\d×\)", cells.nth(5).inner_text())
    assert "Every lane wrote exactly plain decoding's text" in verdict
    assert in_view(page, "#race-summary") == 1.0
    no_line_is_cut(page)
    shoot(page, shots / "race.png", full_page=False)

    page.click("#race-button")  # a new race: the last verdict goes at once
    page.wait_for_function("document.querySelector('#race-summary')?.innerText.trim() === ''",
                           polling="raf", timeout=10_000)
    page.wait_for_function("document.querySelector('#race-status')?.innerText.includes('Done')", timeout=300_000)

    page.click("#why-speedup")
    page.wait_for_timeout(600)
    assert "per pass" in page.locator("#stats-explanation").inner_text()
    assert plot_traces(page, "stats-figures") >= 3
    open_tab(page, "Learn")
    walk_to_step(page, 2)
    guess_step = page.locator("#learn-step-2").inner_text()
    assert "Draft model, a second network" in guess_step and "plain steps" in guess_step
    walk_to_step(page, 5)  # from step 2: to step 6
    speedup_step = page.locator("#learn-step-6").inner_text()
    assert "passes produced" in speedup_step and "—" not in speedup_step


def test_eagle_runs_as_a_drafter_and_a_race_lane_and_learn_tells_its_run(page, shots):
    """The tiny model ships a random EAGLE head: its rounds draw their own tree, it races in a lane of
    its own, and the Learn step "after Medusa" is told on that run."""
    tokens = page.locator("#max-new-tokens input[type=number]")
    tokens.fill("16")  # EAGLE drafts hundreds of candidates a round: a short run keeps the test short
    tokens.press("Enter")
    pick_drafter(page, "EAGLE")
    page.locator("#eagle-nodes").wait_for(state="visible", timeout=10_000)  # EAGLE's own controls
    assert not page.locator("#tree-preset").is_visible()
    for control, value in (("eagle-depth", "3"), ("eagle-nodes", "5")):
        box = page.locator(f"#{control} input[type=number]")
        box.fill(value)
        box.press("Enter")
    run_prompt(page, "It is a truth universally acknowledged", timeout_ms=180_000)
    assert "(EAGLE)" in page.locator("#round-info").inner_text()
    assert "verified 6 tree nodes" in page.locator("#round-info").inner_text()  # the root and the 5 asked for
    assert "passes of its draft layer" in page.locator("#round-info").inner_text()
    assert "drafted" in plot_title(page, "tree-plot")
    assert "step 1" in page.locator("#tree-plot .xtick").all_text_contents()
    assert "cut by the rerank" in page.locator("#tree-plot .annotation").first.text_content()
    assert plot_traces(page, "mask-plot") == 1
    open_tab(page, "Race")
    page.locator("#race-lanes-picker").get_by_label("EAGLE").check()  # beside Medusa, ticked at first
    verdict = run_race(page, races=1, timeout_ms=300_000)
    lanes = page.locator("#race-panes .lane")
    assert [lanes.nth(i).get_attribute("data-lane") for i in range(lanes.count())] == ["ar", "medusa", "eagle"]
    assert "dynamic tree" in lanes.nth(2).inner_text() and plot_traces(page, "race-plot") == 3
    assert verdict.startswith("EAGLE:")  # the Playground's drafter is the race's focus
    rows = page.locator("#race-summary table tbody tr")
    assert rows.nth(2).locator("td").nth(0).inner_text() == "EAGLE"
    shoot(page, shots / "race-eagle.png", full_page=False)
    open_tab(page, "Learn")
    walk_to_step(page, 7)
    step = page.locator("#learn-step-7")
    step.wait_for(state="visible", timeout=10_000)
    text = step.inner_text()
    assert text.startswith("After Medusa") and "DeepSeek-V3" in text
    assert "In your run" in text and "In the race, EAGLE:" in text
    assert plot_traces(page, "learn-guessing") >= 1
    shoot(page, shots / "learn-after-medusa.png")


def test_unticking_every_lane_is_explained_and_the_race_still_runs_after(page):
    open_tab(page, "Race")
    for name in ("Medusa heads", "draft model", "prompt lookup"):
        page.locator("#race-lanes-picker").get_by_label(name).uncheck()
    page.click("#race-button")
    page.get_by_text("tick at least one drafter").first.wait_for(timeout=15_000)
    page.locator("#race-lanes-picker").get_by_label("prompt lookup").check()
    verdict = run_race(page, races=1)
    assert "Prompt lookup:" in verdict and page.locator("#race-panes .lane").count() == 2


def test_the_drafter_picker_shows_each_drafters_own_controls_and_rounds(page):
    sidebar = page.locator(".sidebar")
    if not page.locator(".sidebar.open").count():
        page.click(".sidebar .toggle-button")
    assert page.locator("#tree-preset").is_visible() and not page.locator("#draft-tokens").is_visible()
    sidebar.get_by_label("prompt lookup", exact=False).check()
    page.locator("#lookup-tokens").wait_for(state="visible", timeout=10_000)
    assert not page.locator("#tree-preset").is_visible() and not page.locator("#draft-tokens").is_visible()
    run_prompt(page, "It is a truth universally acknowledged, It is a truth universally")
    assert "(Prompt lookup)" in page.locator("#round-info").inner_text()
    assert page.locator("#stream-box .legend").inner_text().count("copy") >= 1
    sidebar.get_by_label("draft model", exact=False).check()
    page.locator("#draft-tokens").wait_for(state="visible", timeout=10_000)
    run_prompt(page)
    info = page.locator("#round-info").inner_text()
    assert "(Draft model)" in info and "passes of its own" in info
    assert "draft 1" in page.locator("#tree-plot .xtick").all_text_contents()


def test_visitor_text_is_shown_as_text_everywhere(page):
    prompt = "<img src=x id=injected> **bold** [link](http://example.com)"
    run_prompt(page, prompt)
    assert page.locator("#injected").count() == 0
    open_tab(page, "Learn")
    banner = page.get_by_text("The numbers below come from your last run")
    assert "<img src=x" in banner.inner_text() and "**bold**" in banner.inner_text()
    assert page.locator("strong", has_text="bold").count() == 0


def test_one_new_token_says_there_is_no_round(page):
    tokens = page.locator("#max-new-tokens input[type=number]")
    tokens.fill("1")
    tokens.press("Enter")
    page.click("#run-button")
    page.wait_for_function(
        "document.querySelector('#run-summary')?.innerText.includes('prefill pass alone')", timeout=60_000)
    assert "no rounds yet" in page.locator("#round-slider").inner_text()


def test_empty_prompt_shows_an_error_and_the_app_keeps_running(page):
    page.locator("#prompt textarea").fill("")
    page.click("#run-button")
    page.get_by_text("the prompt is empty").first.wait_for(timeout=15_000)
    run_prompt(page, "Mr. Darcy")


def test_a_ten_thousand_node_tree_is_refused_at_once_without_an_error_on_every_panel(page):
    paths = [[i] for i in range(64)] + [[i, j] for i in range(64) for j in range(64)]
    paths += [[i, j, k] for i in range(64) for j in range(64) for k in range(2)]
    run_prompt(page, "Mr. Darcy")  # a run to keep on screen
    page.locator("#tree-json .cm-content").fill(json.dumps(paths[:10_000]))
    page.wait_for_function("document.querySelector('#tree-status')?.innerText.includes('10001 nodes')",
                           timeout=30_000)
    started = time.perf_counter()
    page.click("#run-button")
    page.wait_for_function("document.querySelector('#run-summary')?.innerText.includes('Not run')", timeout=30_000)
    assert time.perf_counter() - started < 20  # generous: refusing takes milliseconds, the run would take minutes
    summary = page.locator("#run-summary").inner_text()
    assert "at most 128" in summary and "still your last run" in summary
    page.wait_for_timeout(500)
    assert page.locator("[data-testid='status-tracker'] span.error").count() == 0  # Gradio's red badge
    assert page.locator("#stream-box .tok").count() >= 4  # the last run is still there
    page.locator("#tree-json .cm-content").fill("[[0], [1], [0, 0]]")
    run_prompt(page, "Mr. Bingley")  # and the page runs the next one


def test_projector_mode_is_big_closes_the_sidebar_and_fills_the_width(playwright, app_url, shots):
    for page in _page(playwright, app_url, PROJECTOR):
        laptop_title = page.evaluate("parseFloat(getComputedStyle(document.querySelector('#title h1')).fontSize)")
        page.click("#projector input")
        page.wait_for_timeout(800)
        assert page.locator(".sidebar.open").count() == 0
        run_prompt(page, "It is a truth universally acknowledged")
        page.wait_for_timeout(800)
        title = page.evaluate("parseFloat(getComputedStyle(document.querySelector('#title h1')).fontSize)")
        assert title >= 1.5 * laptop_title
        tree_width = page.evaluate("document.querySelector('#tree-plot').getBoundingClientRect().width")
        assert tree_width > 0.8 * PROJECTOR["width"]
        no_line_is_cut(page)
        shoot(page, shots / "projector.png", full_page=False)
        settings_open_from_the_closed_sidebar(page)


def settings_open_from_the_closed_sidebar(page) -> None:
    """The closed sidebar's button sits whole on the screen, and opens the settings."""
    box = page.locator(".sidebar .toggle-button").bounding_box()
    assert box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    page.locator(".sidebar .toggle-button").click()
    page.wait_for_timeout(800)
    assert page.locator(".sidebar.open").count() == 1 and in_view(page, "#drafter") > 0


def test_a_phone_can_run_at_once_and_the_tree_labels_do_not_overlap(playwright, app_url, shots):
    for page in _page(playwright, app_url, PHONE):
        assert page.locator(".sidebar.open").count() == 0
        assert in_view(page, "#run-button") == 1.0
        shoot(page, shots / "phone-start.png", full_page=False)
        run_prompt(page, "It is a truth universally acknowledged")
        no_line_is_cut(page)
        for name in ("Playground", "Race", "Train", "Stats", "Learn", "Export"):  # none behind a menu
            assert page.get_by_role("tab", name=name).is_visible(), name
        page.locator("#tree-plot").scroll_into_view_if_needed()
        assert overlapping_labels(page, "tree-plot") == 0
        shoot(page, shots / "phone-tree.png", full_page=False)
        settings_open_from_the_closed_sidebar(page)


@pytest.mark.skipif("stdlib" not in embedded_models(), reason="the embedded code model is not in assets/")
def test_a_code_example_is_one_pick_away_and_switches_to_the_code_model(page):
    """Each example prompt comes with the model it was written for: picking one picks both."""
    prompt = example_prompts("stdlib")[0]
    page.click("#examples input")
    page.get_by_role("option", name=prompt.splitlines()[0][:40], exact=False).first.click()
    page.wait_for_function(
        "document.querySelector('#model-dropdown input')?.value.startsWith('stdlib')", timeout=60_000)
    assert page.locator("#prompt textarea").input_value() == prompt
    page.wait_for_function(
        "document.querySelector('#model-card')?.innerText.startsWith('stdlib')", timeout=60_000)
    run_prompt(page)
    assert page.locator("#stream-box .tok").count() >= 8


# ----- issue 28: words and numbers that agree -----

def mask_hover(page, row: int, col: int) -> str:
    """The mask's hover text over cell (row, col), as a visitor's pointer brings it up."""
    size = page.evaluate("document.querySelector('#mask-plot .js-plotly-plot').data[0].z.length")
    box = page.locator("#mask-plot .nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + (col + 0.5) * box["width"] / size, box["y"] + (row + 0.5) * box["height"] / size)
    # The label of the cell under the pointer, not the last cell's, which may still be shown.
    page.wait_for_function(
        """([row, col]) => { const t = document.querySelector('#mask-plot .hovertext')?.textContent ?? '';
          return t.startsWith(`node ${row} `) && t.includes(` node ${col} `); }""", arg=[row, col], timeout=5_000)
    return page.locator("#mask-plot .hovertext").first.text_content()


def test_the_masks_hover_says_why_and_the_summary_adds_up(page):
    # Node 1 = [0] and node 2 = [1] are siblings under the root; node 3 = [0, 0] is node 1's child.
    page.locator("#tree-json .cm-content").fill("[[0], [1], [0, 0]]")
    page.wait_for_timeout(1500)  # the editor's text reaches the server with the next event
    run_prompt(page, "It is a truth universally acknowledged")
    assert plot_title(page, "mask-plot").startswith("Attention mask")
    assert page.evaluate("document.querySelector('#mask-plot .js-plotly-plot').data[0].z.length") == 4
    from app_helpers import summary_arithmetic_holds

    assert summary_arithmetic_holds(page.locator("#run-summary").inner_text())
    page.locator("#mask-plot").scroll_into_view_if_needed()
    assert mask_hover(page, 0, 1).endswith("comes later, below it on its own branch")
    assert mask_hover(page, 1, 3).endswith("comes later, below it on its own branch")
    assert mask_hover(page, 1, 2).endswith("another branch")
    assert mask_hover(page, 3, 2).endswith("another branch")
    assert mask_hover(page, 3, 1).endswith("its ancestor") and mask_hover(page, 2, 0).endswith("the root")


def test_a_race_on_a_busy_machine_says_so_beside_its_figure(page):
    """Programs keep every core busy while the race measures: the page must say so beside its
    headline speedup, not present the figure as the method's speed."""
    import subprocess
    import sys

    tokens = page.locator("#max-new-tokens input[type=number]")
    tokens.fill("256")  # long enough runs for the kernel's CPU accounting (10 ms ticks) to be read
    tokens.press("Enter")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        run_race(page, races=2)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    notice = page.locator("#race-summary .busy-note")
    assert notice.count() == 1 and "Measured on a busy machine" in notice.inner_text()
    assert re.search(r"kept \d\.\d of its \d+ cores busy", notice.inner_text())
    # Beside the figure: right under the headline speedup, above the lanes' table.
    headline = page.locator("#race-summary p", has_text="× the speed of plain decoding")
    head, note, table = (locator.first.bounding_box() for locator in
                         (headline, notice, page.locator("#race-summary table")))
    assert head["y"] + head["height"] <= note["y"] < table["y"]


def test_nothing_animates_while_a_run_streams(page):
    """Every frame of an endless animation (a blinking caret, a pulsing border round an updating
    output) is a restyle and repaint that the browser takes from the cores the model decodes on.
    A one-off transition (a tab's underline) ends by itself and is not counted."""
    page.evaluate("""() => { const seen = window.__animations = {frames: 0, endless: []};
      const tick = () => {
        if (document.querySelector('#stream-box .caret')) {
          seen.frames++;
          for (const a of document.getAnimations()) {
            if (a.playState === 'running' && a.effect?.getComputedTiming().iterations === Infinity
                && !seen.endless.includes(a.animationName)) seen.endless.push(a.animationName);
          }
        }
        if (window.__animations === seen) requestAnimationFrame(tick);
      };
      tick(); }""")
    tokens = page.locator("#max-new-tokens input[type=number]")
    tokens.fill("256")
    tokens.press("Enter")
    run_prompt(page, "It is a truth universally acknowledged")
    seen = page.evaluate("window.__animations")
    assert seen["frames"] > 0, "no frame was drawn while the run streamed"
    assert seen["endless"] == []


def test_a_page_stops_asking_what_the_model_does_while_its_own_race_runs(page):
    """A page asks every WAITING_EVERY seconds what the model is busy with for another visitor. Each
    ask is a request to the process whose runs the race is timing: the racing page's own asks stop
    while its race runs, also when Race is pressed again the moment the last race says Done (before
    that race's after-work has reached the page), and start again after."""
    from app.layout import WAITING_EVERY

    asks = []
    page.on("request", lambda r: asks.append(time.perf_counter()) if r.url.endswith("/run/predict") else None)
    page.wait_for_timeout(3_000 * WAITING_EVERY)
    assert asks, "the page never asked what the model is busy with"
    open_tab(page, "Race")
    for name in ("draft model", "prompt lookup"):  # lanes enough for a race of several asks' length
        page.locator("#race-lanes-picker").get_by_label(name).check()
    tokens = page.locator("#max-new-tokens input[type=number]")
    tokens.fill("256")
    tokens.press("Enter")
    set_race_count(page, 2)  # before the loop: each race is timed from its own click
    page.wait_for_timeout(500)
    for _ in range(2):
        pressed = time.perf_counter()
        run_race(page)
        done = time.perf_counter()
        # Its first frame stops the asks (one may be on its way); Done is read within half a second.
        own_race = (pressed + 1.0, done - 0.8)
        assert own_race[1] - own_race[0] > 2 * WAITING_EVERY, "the race ended too soon to tell"
        assert [round(t - pressed, 1) for t in asks if own_race[0] < t < own_race[1]] == []
    page.wait_for_timeout(3_000 * WAITING_EVERY)
    assert any(t > done for t in asks), "the page did not ask again after its race"


# ----- issue 41: every control once, every model and back, and no error reaches the visitor -----

def _open_sidebar(page) -> None:
    if not page.locator(".sidebar.open").count():
        page.click(".sidebar .toggle-button")
        page.wait_for_timeout(400)


def _menu_options(page, elem_id: str) -> list[str]:
    """The labels a dropdown offers (opened, read, closed again)."""
    page.click(f"#{elem_id} input")
    labels = page.get_by_role("option").all_inner_texts()
    page.keyboard.press("Escape")
    return [label.strip().removeprefix("✓").strip() for label in labels]  # the chosen one is ticked


def _pick(page, elem_id: str, label: str) -> None:
    """Choose an option as a visitor typing in the menu would (as `set_tree` does)."""
    page.locator(f"#{elem_id} input").fill(label)
    page.keyboard.press("Enter")
    page.wait_for_timeout(800)


def _no_error_shown(page, errors: list[str]) -> None:
    assert page.locator(".toast-body.error").count() == 0, page.locator(".toast-body").all_inner_texts()
    assert "Error" not in page.locator("#tree-status").inner_text()
    assert not errors, errors


def test_every_control_once_and_every_model_and_back_raise_no_error(page):
    """Switching model once showed 'Value: auto: optimal-2 is not in the list of choices' and left
    an Error badge on the tree's status: the page had written its auto tree into the shared model."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    _open_sidebar(page)
    for option in page.locator("#drafter input[type=radio]").all():
        option.check()
        page.wait_for_timeout(500)
    page.locator("#drafter input[type=radio]").first.check()
    for preset in _menu_options(page, "tree-preset"):
        _pick(page, "tree-preset", preset)
        page.wait_for_function("document.querySelector('#tree-status')?.innerText.startsWith('✓')", timeout=15_000)
    for option in page.locator("#acceptance input[type=radio], #race-tree input[type=radio]").all():
        option.check()
        page.wait_for_timeout(300)
    _no_error_shown(page, errors)
    models = _menu_options(page, "model-dropdown")
    for label in [*models[1:], models[0]]:
        card = page.locator("#model-card").inner_text()
        _pick(page, "model-dropdown", label)
        page.wait_for_function("(before) => document.querySelector('#model-card')?.innerText !== before",
                               arg=card, timeout=180_000)
        page.wait_for_timeout(800)
        _no_error_shown(page, errors)
        if page.locator("#tree-preset").is_visible():
            page.wait_for_function("document.querySelector('#tree-status')?.innerText.startsWith('✓')",
                                   timeout=30_000)
            assert page.locator("#tree-preset input").input_value() in _menu_options(page, "tree-preset")
    run_prompt(page)
    _no_error_shown(page, errors)


def test_the_train_tab_trains_a_head_that_beats_its_fresh_start_and_the_playground_uses_it(page, shots):
    seconds = train_head(page, 5)
    status = page.locator("#train-status").inner_text()
    print(f"trained in {seconds:.1f} s: {status}")
    learned, fresh = (int(x) for x in re.search(r"head 1: (\d+)% \(fresh (\d+)%", status).groups())
    assert learned > fresh
    assert plot_traces(page, "train-plot") == 3  # the learning line, its fresh start, the shipped head
    shoot(page, shots / "train.png")
    page.locator("#use-trained input").check()
    open_tab(page, "Playground")
    run_prompt(page, "It is a truth")
    assert "(heads trained on this page for 5 s)" in page.locator("#run-summary").inner_text()
