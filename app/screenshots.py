"""Refresh assets/screenshots: start the app, drive it in a real browser, photograph every view.

    python -m app.screenshots                 # the embedded default model
    python -m app.screenshots --model DIR     # any model `load_model` accepts

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

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "assets" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}


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
        env["MEDUSA_PLAYGROUND_MODEL"] = model
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
def browser_page(playwright) -> Iterator:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    try:
        yield browser.new_page(viewport=VIEWPORT)
    finally:
        browser.close()


# ----------------------------------------------------------------------------- page actions

def plot_traces(page, elem_id: str) -> int:
    """How many data traces the Plotly figure in `#elem_id` has drawn."""
    return page.locator(f"#{elem_id} [data-testid='plotly'] :is(g.trace, g.hm)").count()


def plot_title(page, elem_id: str) -> str:
    title = page.locator(f"#{elem_id} [data-testid='plotly'] .gtitle")
    return title.first.text_content() if title.count() else ""


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


def run_race(page, timeout_ms: int = 120_000) -> str:
    """Press Race; wait for the verdict; returns the race summary text."""
    page.click("#race-button")
    page.wait_for_function(
        "document.querySelector('#race-summary')?.innerText.includes('passes')", timeout=timeout_ms)
    return page.locator("#race-summary").inner_text()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()
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


def photograph_every_view(page, folder: Path, prompt: str | None = None) -> list[Path]:
    """Run, race, then photograph each tab (the walkthrough at the tree-and-mask step)."""
    shots = [shoot(page, folder / "01-start.png", full_page=False)]
    first_tree = run_prompt(page, prompt)
    print(f"first tree drawn {first_tree:.2f} s after pressing Run")
    page.locator("#tree-plot").scroll_into_view_if_needed()
    shots.append(shoot(page, folder / "02-playground.png"))
    print(run_race(page))
    page.wait_for_timeout(800)
    shots.append(shoot(page, folder / "03-race.png"))
    open_tab(page, "Stats")
    shots.append(shoot(page, folder / "04-stats.png"))
    open_tab(page, "Learn")
    walk_to_step(page, 4)
    shots.append(shoot(page, folder / "05-learn.png"))
    open_tab(page, "Playground")
    page.click("#class-mode input")
    page.wait_for_timeout(1500)
    shots.append(shoot(page, folder / "06-class-mode.png", full_page=False))
    return shots


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model name or directory (default: the embedded model)")
    parser.add_argument("--out", type=Path, default=SCREENSHOTS)
    parser.add_argument("--prompt", help="prompt to run (default: the first example)")
    args = parser.parse_args()
    with running_app(args.model) as url, sync_playwright() as playwright, browser_page(playwright) as page:
        page.goto(url)
        page.wait_for_selector("#run-button")
        for path in photograph_every_view(page, args.out, args.prompt):
            print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
