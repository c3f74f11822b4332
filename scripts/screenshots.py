"""Refresh assets/screenshots: start the app, drive it in a real browser, photograph every view.

    python -m scripts.screenshots                 # the page's default model
    python -m scripts.screenshots --model DIR     # any model the page can offer

Views: a laptop at 1280x800 (start, after Run, the race, stats, the walkthrough), projector mode
at 1920x1080 (on the paper's 64-node tree) and at 1280x720, a phone at 390x844, and, on a
model with a draft model (`--drafters-model`), the race's lanes, a draft-model round, the
walkthrough's measured comparison and a prompt-lookup round on a prompt that repeats itself.

Needs Playwright (Python) and Debian's Chromium (`apt-get install -y chromium`); Playwright's own
browser download is not used. The browser end-to-end test drives the page with the same helpers.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app import MODEL_ENV
from decoding.assets import ASSETS_DIR

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ASSETS_DIR / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
LAPTOP = {"width": 1280, "height": 800}
PROJECTOR = {"width": 1920, "height": 1080}
SMALL_PROJECTOR = {"width": 1280, "height": 720}
PHONE = {"width": 390, "height": 844}
# SmolLM2's load, self-test, cost curve and warm-up took over 2 minutes on a busy 2-core machine.
STARTUP_SECONDS = 600
# Prompts whose answers copy them, where prompt lookup shines: prose to continue, or a chat request.
COPY_PROMPTS = {"austen": ("Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. "
                           "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday,")}
COPY_REQUEST = ("Repeat this paragraph exactly: The old lighthouse stood on the rocks at the edge of the bay. "
                "Every night its keeper climbed the stairs, lit the lamp and watched the ships pass safely "
                "into the harbour.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_app(model: str | None = None, timeout: float = 120) -> Iterator[str]:
    """`python app.py` in a subprocess on a free port (through GRADIO_SERVER_PORT); yields its URL."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    if model:
        env[MODEL_ENV] = model
    # The log goes to a file, not a pipe: nobody reads a pipe while the app runs, and a full
    # pipe would block the app.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(proc, url, timeout, log)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_until_up(proc: subprocess.Popen, url: str, timeout: float, log) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the app exited with {proc.returncode}:\n{log.read().decode()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the app did not answer at {url} within {timeout:.0f} s")


@contextmanager
def browser_page(playwright, viewport: dict[str, int] = LAPTOP) -> Iterator:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    try:
        yield browser.new_page(viewport=viewport)
    finally:
        browser.close()


# ----------------------------------------------------------------------------- page actions

def run_prompt(page, prompt: str | None = None, timeout_ms: int = 60_000) -> float:
    """Press Run; wait for the run to finish. Returns seconds from the click to the first tree.

    A new run is told from the previous one by the `data-run` mark on the output stream.
    """
    if prompt is not None:
        page.locator("#prompt textarea").fill(prompt)
    before = page.evaluate("document.querySelector('#stream-box [data-run]')?.dataset.run ?? ''")
    started = time.perf_counter()
    page.click("#run-button")
    page.wait_for_function(
        """(before) => document.querySelector('#stream-box [data-run]')?.dataset.run !== before
             && document.querySelector('#tree-plot .gtitle')?.textContent.startsWith('Round')""",
        arg=before, timeout=timeout_ms)
    first_tree = time.perf_counter() - started
    page.wait_for_function(
        "document.querySelector('#run-summary')?.innerText.includes('stopped')", timeout=timeout_ms)
    return first_tree


def run_race(page, races: int | None = None, timeout_ms: int = 300_000) -> str:
    """Press Race; wait for the verdict; returns it."""
    if races is not None:
        set_race_count(page, races)
    page.click("#race-button")
    # Wait for this race's own first frame (its warm-up), so the last race's "Done" is not read as
    # this one's; then for this race's end.
    page.wait_for_function(
        "/Warming up|Race \\d+ of/.test(document.querySelector('#race-status')?.innerText ?? '')",
        timeout=timeout_ms, polling=50)
    # Read the status twice a second, not on every animation frame (Playwright's default): the
    # runs being timed share the CPU with this browser.
    page.wait_for_function(
        "document.querySelector('#race-status')?.innerText.includes('Done')", timeout=timeout_ms, polling=500)
    return page.locator("#race-summary").inner_text()


def train_head(page, seconds: int | None = None, timeout_ms: int = 240_000) -> float:
    """Open the Train tab, press Train (after setting its seconds); wait for the training's end.
    Returns seconds from the click to the end."""
    open_tab(page, "Train")
    if seconds is not None:
        box = page.locator("#train-seconds input[type=number]")
        box.fill(str(seconds))
        box.press("Enter")
    before = page.locator("#train-status").inner_text()
    started = time.perf_counter()
    page.click("#train-button")
    # This training's own end: a status that differs from the last one's and says it is over.
    page.wait_for_function(
        """(before) => { const text = document.querySelector('#train-status')?.innerText ?? '';
                          return text !== before && /Trained head|⚠/.test(text); }""",
        arg=before, timeout=timeout_ms, polling=500)
    return time.perf_counter() - started


def set_race_count(page, races: int) -> None:
    """Open the Race tab and set how many races a press of Race runs."""
    open_tab(page, "Race")
    count = page.locator("#race-count input[type=number]")
    count.fill(str(races))
    count.press("Enter")


def open_tab(page, name: str) -> None:
    tab = page.get_by_role("tab", name=name)
    if not tab.count() or not tab.first.is_visible():  # a phone: the tabs that do not fit are in a menu
        page.locator(".overflow-menu button").first.click()
        tab = page.locator(".overflow-dropdown button", has_text=name)
    tab.first.click()
    page.wait_for_timeout(600)  # the tab's figures re-fit after a resize event


def walk_to_step(page, number: int) -> None:
    """Step the Learn walkthrough forward to step `number` (later steps open only in order)."""
    for _ in range(number - 1):
        page.get_by_role("button", name="Next ▶").click()
        page.wait_for_timeout(300)


def shoot(page, path: Path, full_page: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    return path


def open_app(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#run-button", timeout=120_000)
    page.wait_for_timeout(1000)  # the sidebar closes on narrow screens after the first paint


def set_tree(page, preset: str) -> None:
    """Choose a tree preset in the sidebar (opening it if it is closed)."""
    if not page.locator(".sidebar.open").count():
        page.click(".sidebar .toggle-button")
    page.locator("#tree-preset input").fill(preset)
    page.keyboard.press("Enter")
    page.wait_for_timeout(800)


def photograph_laptop(page, url: str, folder: Path, prompt: str | None) -> list[Path]:
    """1280x800: the page on arrival, after Run (one screen), the race, stats and the walkthrough."""
    open_app(page, url)
    shots = [shoot(page, folder / "01-start.png", full_page=False)]
    print(f"first tree drawn {run_prompt(page, prompt):.2f} s after pressing Run")
    shots.append(shoot(page, folder / "02-playground.png", full_page=False))
    print(run_race(page))
    page.wait_for_timeout(800)
    shots.append(shoot(page, folder / "03-race.png", full_page=False))
    open_tab(page, "Stats")
    shots.append(shoot(page, folder / "04-stats.png"))
    open_tab(page, "Learn")
    walk_to_step(page, 4)
    shots.append(shoot(page, folder / "05-learn.png"))
    return shots


def pick_drafter(page, label: str) -> None:
    """Choose a drafter in the sidebar (opening it if it is closed): "Medusa heads", "draft model",
    "prompt lookup"."""
    if not page.locator(".sidebar.open").count():
        page.click(".sidebar .toggle-button")
    page.locator("#drafter").get_by_label(label, exact=False).check()
    page.wait_for_timeout(800)


def photograph_drafters(page, url: str, folder: Path, prompt: str | None, copy_prompt: str) -> list[Path]:
    """1280x800 on a model with a draft model: the race's lanes on one clock, a draft-model round,
    a prompt-lookup round on a copy-heavy prompt, and the walkthrough's measured comparison."""
    open_app(page, url)
    run_prompt(page, prompt)
    open_tab(page, "Race")
    lanes = page.locator("#race-lanes-picker input[type=checkbox]")
    for i in range(lanes.count()):  # every drafter the model offers, EAGLE included
        lanes.nth(i).check()
    print(run_race(page, timeout_ms=900_000))
    page.evaluate("document.getElementById('race-summary').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(800)
    shots = [shoot(page, folder / "11-race-lanes.png", full_page=False)]
    pick_drafter(page, "draft model")
    run_prompt(page)
    page.evaluate("document.getElementById('results').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(800)
    shots.append(shoot(page, folder / "12-draft-model-round.png", full_page=False))
    open_tab(page, "Learn")
    walk_to_step(page, 2)
    shots.append(shoot(page, folder / "13-learn-draft-model.png"))
    open_tab(page, "Playground")
    pick_drafter(page, "prompt lookup")
    run_prompt(page, copy_prompt)
    page.evaluate("document.getElementById('results').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(800)
    return shots + [shoot(page, folder / "14-prompt-lookup-round.png", full_page=False)]


def photograph_projector(page, url: str, path: Path, prompt: str | None, tree: str | None) -> list[Path]:
    """Projector mode on the given screen, after a run on the given tree preset; then Learn."""
    open_app(page, url)
    if tree:
        set_tree(page, tree)
    page.click("#projector input")
    page.wait_for_timeout(800)
    run_prompt(page, prompt)
    page.wait_for_timeout(1000)
    shot = shoot(page, path, full_page=False)
    open_tab(page, "Learn")  # the step bar at its ends, and the first step's figure, in large type
    page.evaluate("document.getElementById('results').scrollIntoView({block: 'start'})")
    page.wait_for_timeout(600)
    return [shot, shoot(page, path.with_name(path.stem + "-learn.png"), full_page=False)]


def photograph_phone(page, url: str, folder: Path, prompt: str | None) -> list[Path]:
    open_app(page, url)
    shots = [shoot(page, folder / "08-phone-start.png", full_page=False)]
    run_prompt(page, prompt)
    page.locator("#tree-plot").scroll_into_view_if_needed()
    page.wait_for_timeout(800)
    shots.append(shoot(page, folder / "09-phone-tree.png", full_page=False))
    open_tab(page, "Learn")
    return shots + [shoot(page, folder / "10-phone-learn.png", full_page=False)]


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model name or directory (default: the embedded model)")
    parser.add_argument("--out", type=Path, default=SCREENSHOTS)
    parser.add_argument("--prompt", help="prompt to run (default: the first example)")
    parser.add_argument("--big-tree", default="mc_sim_7b_63", help="tree preset for the 1920x1080 projector view")
    parser.add_argument("--drafters-model", help="model with a draft model for the drafter views (default: --model)")
    parser.add_argument("--copy-prompt", help="a prompt whose answer copies it, for prompt lookup")
    args = parser.parse_args()
    drafters_model = args.drafters_model or args.model
    copy_prompt = args.copy_prompt or COPY_PROMPTS.get(drafters_model, COPY_REQUEST)
    with running_app(drafters_model, timeout=STARTUP_SECONDS) as url, sync_playwright() as playwright:
        with browser_page(playwright, LAPTOP) as page:
            shots = photograph_drafters(page, url, args.out, args.prompt, copy_prompt)
    with running_app(args.model, timeout=STARTUP_SECONDS) as url, sync_playwright() as playwright:
        with browser_page(playwright, LAPTOP) as page:
            shots += photograph_laptop(page, url, args.out, args.prompt)
        with browser_page(playwright, PROJECTOR) as page:
            shots += photograph_projector(page, url, args.out / "06-projector-1920.png", args.prompt, args.big_tree)
        with browser_page(playwright, SMALL_PROJECTOR) as page:
            shots += photograph_projector(page, url, args.out / "07-projector-1280x720.png", args.prompt, None)
        with browser_page(playwright, PHONE) as page:
            shots += photograph_phone(page, url, args.out, args.prompt)
    for path in shots:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
