"""Does the page's race measure what `bench` measures? And which thread count keeps the drafters
ahead while another program holds a core? (issue 28; the figures are in docs/page-race.md)

    python -m scripts.page_race --prompts PROMPTS.txt                 # the page's race vs bench
    python -m scripts.page_race --prompts PROMPTS.txt --repeats 4     # the same 4 times, with a spread
    python -m scripts.page_race --prompts PROMPTS.txt --neighbour     # the same while a core is taken
    python -m scripts.page_race --prompts PROMPTS.txt --threads-under-load

The first starts the app on its default model (SmolLM2 where fetched), presses Race in Debian's
Chromium on each prompt with the default lanes, and reads the page's Medusa speedup and whether it
said the machine was busy; then, with the app and browser closed, it runs `python -m decoding bench`
on each prompt in a fresh process, as often as the page races it, and compares the two prompt by
prompt (each against the plain decoding fastest on that prompt). Beside the speedups it prints
where they part: plain decoding's step, Medusa's tokens a pass and its round in plain steps
(verify pass + the rest), from the page's own traces (its Export tab's download) and from bench's
report, both with `decoding.stats`. One such pair
is no verdict on a noisy machine (bench gave 1.24x-1.43x on the same three prompts within one
day); `--repeats` runs the pair several times and gives the page/bench ratio's mean and standard
error. `--neighbour` keeps one core busy (a Python loop) while the page races. The third, in one
process and without the page, measures heats (`decoding.measure`, the function both use) with 2
threads and with 1, on a quiet machine and with a neighbour holding a core.
Not a test: it prints what it measured, with the machine's load beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from scripts.screenshots import LAPTOP, STARTUP_SECONDS, browser_page, open_app, running_app

if TYPE_CHECKING:
    from decoding.stats import Timing
    from decoding.trace import RunTrace

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = re.compile(r"Medusa: ([\d.]+)× the speed of plain decoding")


@contextmanager
def neighbour(on: bool = True) -> Iterator[None]:
    """Another program holding one core (a busy Python loop) for the length of the block."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        hog.kill()
        hog.wait()


def race_traces(page) -> list[dict]:
    """The last race's traces, as its Export tab downloads them: one {lane: RunTrace} per race."""
    from decoding.trace import RunTrace
    from scripts.screenshots import open_tab

    open_tab(page, "Export")
    with page.expect_download() as download:
        page.click("#download-races")  # waits until the race's after-work has made it clickable
    races = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))["races"]
    return [{lane: RunTrace.from_dict(trace) for lane, trace in race.items()} for race in races]


def breakdown(ar: Timing, medusa: Timing) -> dict:
    """Where a speedup comes from (speedup ≈ tokens a pass / round cost), with `decoding.stats`."""
    from decoding.stats import round_cost, speedup, verify_cost

    return {"speedup": speedup(ar, medusa), "step_ms": 1000 * ar.seconds_per_round,
            "tokens_per_pass": medusa.tokens_per_pass, "round_cost": round_cost(ar, medusa),
            "verify_cost": verify_cost(ar, medusa)}


def describe(figures: dict) -> str:
    return (f"{figures['speedup']:.2f}x over all heats, plain step {figures['step_ms']:.1f} ms, "
            f"{figures['tokens_per_pass']:.2f} tokens a pass, round {figures['round_cost']:.2f} steps "
            f"(verify {figures['verify_cost']:.2f})")


def round_seconds(trace: RunTrace) -> list[float]:
    """Each round's seconds on the clock the race replays (`round_end_times`: recording excluded),
    the whole round as `Timing` counts it: drafting, verify, accepting and the bookkeeping between."""
    from decoding.stats import round_end_times

    return [end - start for start, end in pairwise([trace.time_prefill, *round_end_times(trace)])]


def heat_rounds(plain: RunTrace, medusa: RunTrace) -> str:
    """One heat's rounds, median against mean: a slow heat whose median round is as usual was
    slowed by a few interrupted rounds (another program, the hypervisor); one whose median moved
    was slowed throughout."""
    from decoding.stats import Timing

    steps, rounds = round_seconds(plain), round_seconds(medusa)
    step = statistics.median(steps)
    return (f"plain step median {1000 * step:.1f} ms (mean {1000 * statistics.mean(steps):.1f}); Medusa round "
            f"median {statistics.median(rounds) / step:.2f} steps (mean {statistics.mean(rounds) / step:.2f}, "
            f"slowest {max(rounds) / step:.1f}), {Timing.of(medusa).tokens_per_pass:.2f} tokens a pass")


def page_races(prompts: list[str], busy: bool) -> tuple[list[dict], dict]:
    """The page's race on each prompt (default lanes and settings): its Medusa speedup and notice;
    and, from the traces of all its races, where the speedup comes from (`breakdown`)."""
    from playwright.sync_api import sync_playwright

    from decoding.settings import PLAIN
    from decoding.stats import Timing
    from scripts.screenshots import run_race

    rows, races = [], []
    with running_app(timeout=STARTUP_SECONDS) as url, sync_playwright() as playwright, \
            browser_page(playwright, LAPTOP) as page:
        open_app(page, url)
        for prompt in prompts:
            page.locator("#prompt textarea").fill(prompt)
            with neighbour(busy):
                started = time.perf_counter()
                verdict = run_race(page, timeout_ms=600_000)
                seconds = time.perf_counter() - started
            match = HEADLINE.search(verdict)
            notice = page.locator("#race-summary .busy-note")
            rows.append({"prompt": prompt, "speedup": float(match.group(1)) if match else None,
                         "busy_notice": notice.inner_text() if notice.count() else "", "seconds": seconds,
                         "load": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), flush=True)
            heats = race_traces(page)
            for heat in heats:
                print("    heat: " + heat_rounds(heat[PLAIN], heat["medusa"]), flush=True)
            races += heats
    return rows, breakdown(Timing.of(race[PLAIN] for race in races), Timing.of(race["medusa"] for race in races))


def bench(prompts: list[str], model: str) -> dict:
    """`python -m decoding bench` on the prompts, in a fresh process, as a user would run it: each
    prompt as many times as the page races it (DEFAULT_RACES), so that bench's figure rests on as
    many heats as the page's (one heat's speedup varies by ~0.15 on this project's machines)."""
    from decoding.race import DEFAULT_RACES  # torch: loaded only where a measurement needs it

    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as repeated:
        repeated.write("".join(f"{prompt}\n" for prompt in prompts for _ in range(DEFAULT_RACES)))
        repeated.flush()
        out = subprocess.run([sys.executable, "-m", "decoding", "bench", "--model", model, "--prompts",
                              repeated.name, "--max-new-tokens", "64", "--json"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    report = json.loads(out[out.index("{"):])
    medusa = report["lanes"][0]
    return {"speedup": report["speedup"], "load": report.get("load"), "tree": medusa["tree"],
            "step_ms": 1000 * report["ar"]["seconds_per_round"], "tokens_per_pass": medusa["mean_accepted"],
            # bench's round costs are its untraced runs' (nothing recorded); the page's exclude recording
            "round_cost": medusa["round_cost"], "verify_cost": medusa["verify_cost"]}


def threads_under_load(prompts: list[str], model: str, heats: int) -> None:
    """Medusa against plain decoding, as heats of decoding.measure, with 2 threads and 1, quiet and
    with a neighbour holding a core."""
    import dataclasses

    import torch

    from decoding.loading import load_model
    from decoding.measure import combined, run_heat
    from decoding.settings import DecodeSettings
    from decoding.stats import Timing, speedup

    before = torch.get_num_threads()
    lm = load_model(model)
    plan = {"ar": DecodeSettings(method="ar"), "medusa": DecodeSettings(tree="auto")}
    for name, settings in plan.items():  # warm-up
        run_heat(lm, prompts[0], {name: dataclasses.replace(settings, max_new_tokens=8)}, [name])
    for busy in (False, True):
        with neighbour(busy):
            results = {threads: [] for threads in (2, 1)}
            for index in range(heats):  # the thread counts interleaved, heat by heat
                for threads in (2, 1) if index % 2 == 0 else (1, 2):
                    torch.set_num_threads(threads)
                    prompt = prompts[index % len(prompts)]
                    order = ["ar", "medusa"] if index % 2 == 0 else ["medusa", "ar"]
                    results[threads].append(run_heat(lm, prompt, plan, order))
                    heat = results[threads][-1]
                    print(f"  heat {index + 1}, {threads} thread(s): speedup "
                          f"{speedup(Timing.of(heat.runs['ar']), Timing.of(heat.runs['medusa'])):.2f}x, "
                          f"others {heat.load.others:.2f} cores", flush=True)
            for threads, measured in results.items():
                ar = Timing.of(h.runs["ar"] for h in measured)
                medusa = Timing.of(h.runs["medusa"] for h in measured)
                per_heat = [speedup(Timing.of(h.runs["ar"]), Timing.of(h.runs["medusa"])) for h in measured]
                load = combined([h.load for h in measured])
                print(f"neighbour={busy} threads={threads}: plain {ar.tokens_per_second:.1f} tok/s, Medusa "
                      f"{medusa.tokens_per_second:.1f} tok/s, speedup {speedup(ar, medusa):.2f}x (median per heat "
                      f"{statistics.median(per_heat):.2f}x, range {min(per_heat):.2f}-{max(per_heat):.2f}), "
                      f"{len(measured)} heats; other programs {load.others:.2f} of {load.cores} cores; "
                      f"tree {lm.default_tree}", flush=True)
    torch.set_num_threads(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=Path, required=True, help="one prompt per line")
    parser.add_argument("--model", default="smollm2", help="bench's --model: the page's default model")
    parser.add_argument("--neighbour", action="store_true", help="keep one core busy while the page races")
    parser.add_argument("--threads-under-load", action="store_true", help="heats with 2 and 1 threads instead")
    parser.add_argument("--repeats", type=int, default=1, help="page races and bench, one after the other, this often")
    parser.add_argument("--heats", type=int, default=6, help="heats per thread count (--threads-under-load)")
    args = parser.parse_args()
    prompts = [line.strip() for line in args.prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.threads_under_load:
        threads_under_load(prompts, args.model, args.heats)
        return
    ratios = []
    for repeat in range(1, args.repeats + 1):
        rows, traced = page_races(prompts, args.neighbour)
        # Prompt by prompt: each figure counts against the plain decoding fastest on that prompt, and
        # a short answer weighs as much as a long one on both sides. (One bench over every prompt
        # gives a single total instead, over all tokens and against one baseline: not the same figure.)
        measured = [bench([row["prompt"]], args.model) for row in rows]
        pairs = [(row["speedup"], figures["speedup"]) for row, figures in zip(rows, measured, strict=True)
                 if row["speedup"] is not None]
        ratios.append(statistics.mean(page / bench_figure for page, bench_figure in pairs))
        speeds = ", ".join(f"{page:.2f}x/{bench_figure:.2f}x" for page, bench_figure in pairs)
        print(f"[{repeat}/{args.repeats}] page/bench by prompt: {speeds} (on {measured[0]['tree']}, load "
              f"{measured[-1]['load']}); page/bench {ratios[-1] - 1:+.1%}; load average now {os.getloadavg()[0]:.2f}\n"
              f"  page's races: {describe(traced)}\n"
              + "\n".join(f"  bench, prompt {k}: {describe(figures)}" for k, figures in enumerate(measured, 1)),
              flush=True)
    if len(ratios) > 1:
        error = statistics.stdev(ratios) / len(ratios) ** 0.5
        print(f"page/bench over {len(ratios)} pairs: {statistics.mean(ratios) - 1:+.1%} "
              f"(standard error {error:.1%}; each pair {', '.join(f'{r - 1:+.1%}' for r in ratios)})")


if __name__ == "__main__":
    main()
