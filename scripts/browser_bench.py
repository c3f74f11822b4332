"""How long the browser takes to draw a run, for trees of 9, 26, 64 and 100 nodes.

    python -m scripts.browser_bench                       # the embedded default model, 64 new tokens
    python -m scripts.browser_bench --model stdlib --tokens 128 --repeats 3
    python -m scripts.browser_bench --bar                 # the page's drawing bar: mc_sim_7b_63, 64 new tokens

Starts the app, opens it in Debian's Chromium (Playwright, headless, 1280x800), and for each tree
size types the tree into the editor, presses Run and measures, on one clock (the same machine):
- run: the engine's own time for the run (from the page's summary);
- first tree: from the click until the first round's tree is on screen;
- drawn after end: from the moment the server saw the run end (the stream's `data-ended`) until
  the last round's tree and mask are drawn. This is what a visitor waits for once the run is over.
With `--bar`, it times the page's drawing bar instead: the preset `mc_sim_7b_63` (64 nodes) chosen in the
sidebar, Run pressed, and the time until the run is finished with its summary and the last round's
64-row mask drawn; beside it the engine's time, when the server saw the end, how many times the
summary and the tree were redrawn on the way, and whether a figure is in view (no scrolling).
Not a test: it prints a table, and times depend on the machine and its load (printed too).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass

from app.inputs import format_choices
from scripts.screenshots import browser_page, running_app, set_tree

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
  const rounds = summary.match(/from (\\d+) rounds/); if (!rounds) return null;
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


# Records, once per animation frame, when the summary and the figures' titles change: how many
# updates a run streams, and when the last one is drawn.
WATCH = """() => { const seen = window.__seen = {summary: [], tree: [], mask: []}; const last = {};
  const read = {summary: () => document.querySelector('#run-summary')?.innerText ?? '',
    tree: () => document.querySelector('#tree-plot .gtitle')?.textContent ?? '',
    mask: () => document.querySelector('#mask-plot .gtitle')?.textContent ?? ''};
  const tick = () => { for (const [k, f] of Object.entries(read)) { const v = f();
      if (v !== last[k]) { last[k] = v; seen[k].push([Date.now() / 1000, v]); } }
    if (window.__seen === seen) requestAnimationFrame(tick); };
  tick(); }"""
BAR_DONE = """() => { const summary = document.querySelector('#run-summary')?.innerText ?? '';
  const rounds = summary.match(/from (\\d+) rounds/); if (!rounds || !summary.includes('stopped')) return null;
  const plot = document.querySelector('#mask-plot .js-plotly-plot');
  const title = plot?.querySelector('.gtitle')?.textContent ?? '';
  if (!title.endsWith(`round ${rounds[1]}`) || plot.data?.[0]?.z?.length !== 64) return null;
  return new Promise((done) => requestAnimationFrame(() => done(Date.now() / 1000))); }"""
IN_VIEW = """() => [...document.querySelectorAll('#tree-plot .main-svg, #mask-plot .main-svg')].some((el) => {
  const r = el.getBoundingClientRect(); return r.height > 100 && r.top >= 0 && r.top + 100 <= innerHeight; })"""


@dataclass
class BarMeasurement:
    run_seconds: float  # the engine's own time (the summary's)
    ended: float  # from the click until the server saw the run end
    done: float  # from the click until the summary says stopped and the last round's 64-row mask is drawn
    first_tree: float
    summaries: int  # distinct summary texts drawn during the run
    trees: int  # distinct tree titles drawn (one per redraw of a new round)
    in_view: bool
    browser_busy: float  # seconds the page's main thread worked, from the click until drawn
    app_cpu: float  # CPU seconds the app's process used meanwhile (all its threads)


def app_cpu_seconds() -> float:
    """CPU seconds used so far by this process's children (the app), from /proc."""
    total = 0.0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if pid.isdigit() and int(fields[1]) == os.getpid() and "app.py" in open(f"/proc/{pid}/cmdline").read():
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main_thread_seconds(cdp) -> float:
    return next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "TaskDuration")


def measure_bar(page, cdp, timeout_ms: int) -> BarMeasurement:
    before = page.evaluate("document.querySelector('#stream-box [data-run]')?.dataset.run ?? ''")
    page.evaluate(WATCH)
    busy, cpu = main_thread_seconds(cdp), app_cpu_seconds()
    clicked = time.time()
    page.click("#run-button")
    ended = page.wait_for_function(ENDED, arg=before, timeout=timeout_ms).json_value()
    done = page.wait_for_function(BAR_DONE, timeout=timeout_ms).json_value()
    busy, cpu = main_thread_seconds(cdp) - busy, app_cpu_seconds() - cpu
    seen = page.evaluate("window.__seen")
    page.evaluate("window.__seen = null")
    summary = page.locator("#run-summary").inner_text()
    run_seconds = float(summary.split(" s measured")[0].split("·")[-1])
    trees = [t for t, text in seen["tree"][1:] if text.startswith("Round")]  # [0]: before the click
    return BarMeasurement(run_seconds, ended - clicked, done - clicked, trees[0] - clicked if trees else math.nan,
                          len(seen["summary"]) - 1, len(trees), page.evaluate(IN_VIEW), busy, cpu)


def bar(url: str, repeats: int) -> None:
    """The page's drawing bar: mc_sim_7b_63 on the page's default model and its default settings."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright, browser_page(playwright) as page:
        page.goto(url)
        page.wait_for_selector("#run-button", timeout=120_000)
        set_tree(page, "mc_sim_7b_63")
        page.wait_for_function(SET_TREE_WAIT, arg=64, timeout=30_000)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        rows = []
        for i in range(repeats + 1):  # the first run pays for loading Plotly
            m = measure_bar(page, cdp, 300_000)
            rows.append(m)
            print(f"{'warm-up' if i == 0 else f'run {i}':>8}: engine {m.run_seconds:.2f} s · server saw the end "
                  f"{m.ended:.2f} s · finished and drawn {m.done:.2f} s after Run · first tree {m.first_tree:.2f} s "
                  f"· {m.summaries} summaries, {m.trees} trees drawn · "
                  f"browser main thread busy {m.browser_busy:.2f} s · "
                  f"app CPU {m.app_cpu:.2f} s · figure in view: {m.in_view} · "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"median over {repeats} runs: finished and drawn {statistics.median(m.done for m in rows[1:]):.2f} s "
          f"after Run (engine {statistics.median(m.run_seconds for m in rows[1:]):.2f} s); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model name or directory (default: the page's default model)")
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per run")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="tree sizes, root included")
    parser.add_argument("--repeats", type=int, default=2, help="runs per size; the table shows medians")
    parser.add_argument("--bar", action="store_true", help="time the page's drawing bar (mc_sim_7b_63) instead")
    args = parser.parse_args()
    if args.bar:
        with running_app(args.model) as url:
            bar(url, args.repeats)
        return
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
