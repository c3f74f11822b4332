"""How long the browser takes to draw a run, for trees of 9, 26, 64 and 100 nodes.

    python -m scripts.browser_bench                       # the embedded default model, 64 new tokens
    python -m scripts.browser_bench --model stdlib --tokens 128 --repeats 3

Starts the app, opens it in Debian's Chromium (Playwright, headless, 1280x800), and for each tree
size types the tree into the editor, presses Run and measures, on one clock (the same machine):
- run: the engine's own time for the run (from the page's summary);
- first tree: from the click until the first round's tree is on screen;
- drawn after end: from the moment the server saw the run end (the stream's `data-ended`) until
  the last round's tree and mask are drawn. This is what a visitor waits for once the run is over.
Not a test: it prints a table, and times depend on the machine and its load (printed too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from app.inputs import format_choices
from scripts.screenshots import browser_page, running_app

SIZES = (9, 26, 64, 100)
DECAY = 0.6  # a node's weight falls by this factor per level and with its rank


def bench_tree(nodes: int, depth: int = 5, top_k: int = 10) -> list[list[int]]:
    """A tree of `nodes` nodes (root included) grown best-first, like the paper's trees: each path
    weighs the product of 1 / (rank + 1) along it times DECAY per level."""
    chosen: list[list[int]] = []
    frontier = [(1.0, [r]) for r in range(top_k)]
    while len(chosen) < nodes - 1:
        frontier.sort(key=lambda item: -item[0])
        weight, path = frontier.pop(0)
        chosen.append(path)
        if len(path) < depth:
            frontier += [(weight * DECAY / (r + 1), path + [r]) for r in range(top_k)]
    return sorted(chosen, key=lambda p: (len(p), p))


@dataclass
class Measurement:
    nodes: int
    run_seconds: float
    first_tree: float
    drawn_after_end: float


SET_TREE_WAIT = "(n) => document.querySelector('#tree-status')?.innerText.includes(`${n} nodes incl. root`)"
ENDED = """(before) => { const el = document.querySelector('#stream-box [data-ended]');
  return el && el.dataset.run !== before ? Number(el.dataset.ended) : null; }"""
DRAWN = """() => { const summary = document.querySelector('#run-summary')?.innerText ?? '';
  const rounds = summary.match(/\\+ (\\d+) rounds/); if (!rounds) return null;
  const title = (id) => document.querySelector(`#${id} .gtitle`)?.textContent ?? '';
  return title('tree-plot').startsWith(`Round ${rounds[1]} `) && title('mask-plot').endsWith(`round ${rounds[1]}`)
    ? new Promise((done) => requestAnimationFrame(() => done(Date.now() / 1000))) : null; }"""
FIRST_TREE = """(before) => document.querySelector('#stream-box [data-run]')?.dataset.run !== before
  && document.querySelector('#tree-plot .gtitle')?.textContent.startsWith('Round')"""


def measure(page, nodes: int, timeout_ms: int) -> Measurement:
    editor = page.locator("#tree-json .cm-content")
    editor.fill(format_choices(bench_tree(nodes)))
    page.wait_for_function(SET_TREE_WAIT, arg=nodes, timeout=timeout_ms)
    before = page.evaluate("document.querySelector('#stream-box [data-run]')?.dataset.run ?? ''")
    clicked = time.perf_counter()
    page.click("#run-button")
    page.wait_for_function(FIRST_TREE, arg=before, timeout=timeout_ms)
    first_tree = time.perf_counter() - clicked
    ended = page.wait_for_function(ENDED, arg=before, timeout=timeout_ms).json_value()
    drawn = page.wait_for_function(DRAWN, timeout=timeout_ms).json_value()
    summary = page.locator("#run-summary").inner_text()
    run_seconds = float(summary.split(" s measured")[0].split("·")[-1])
    return Measurement(nodes, run_seconds, first_tree, max(0.0, drawn - ended))


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model name or directory (default: the page's default model)")
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per run")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="tree sizes, root included")
    parser.add_argument("--repeats", type=int, default=2, help="runs per size; the table shows medians")
    args = parser.parse_args()
    with running_app(args.model) as url, sync_playwright() as playwright, browser_page(playwright) as page:
        page.goto(url)
        page.wait_for_selector("#run-button", timeout=120_000)
        tokens = page.locator("#max-new-tokens input[type=number]")
        tokens.fill(str(args.tokens))
        tokens.press("Enter")
        measure(page, SIZES[0], 120_000)  # the first run pays for loading Plotly
        rows = [[measure(page, n, 300_000) for _ in range(args.repeats)] for n in args.sizes]
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores; "
          f"{args.tokens} new tokens; medians of {args.repeats} runs")
    print(f"{'nodes':>6}{'run (s)':>10}{'first tree (s)':>16}{'drawn after end (s)':>21}")
    for runs in rows:
        median = {k: statistics.median(getattr(m, k) for m in runs)
                  for k in ("run_seconds", "first_tree", "drawn_after_end")}
        print(f"{runs[0].nodes:>6}{median['run_seconds']:>10.2f}{median['first_tree']:>16.2f}"
              f"{median['drawn_after_end']:>21.2f}")


if __name__ == "__main__":
    main()
