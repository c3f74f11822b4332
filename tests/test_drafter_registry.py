"""A drafter is one module: register a toy one here and every part of the project offers it."""

from __future__ import annotations

import pytest
import torch

from app import lanes, views
from app.drafter_costs import drafter_comparison
from app.inputs import RunRequest, decode_settings, trace_request
from app.sidebar import drafter_controls
from app.tree_figures import tree_figure
from app_helpers import make_race
from decoding import DecodeSettings, DecodingError, generate
from decoding.bench import run_bench
from decoding.cli import build_parser
from decoding.drafters import DRAFTERS, available_drafters, check_settings, drafter_class, register, unregister
from decoding.drafters.base import Drafter, Proposal, chain_proposal, chain_tree, root_only
from decoding.settings import PLAIN, Setting
from decoding.trace import DrafterInfo, RunTrace


class RepeatDrafter(Drafter):
    """Guesses that the root repeats `repeat_tokens` times: often wrong, always verifiable."""

    name = "repeat"
    label = "Repeat"
    description = "repeat (the last token again)"
    colour = "#123456"
    settings = (Setting("repeat_tokens", 2, 1, 8, "times the root is guessed again"),)

    def __init__(self, device: torch.device, length: int) -> None:
        self.device, self.length, self.tree = device, length, chain_tree(length)

    @classmethod
    def create(cls, lm, settings: DecodeSettings) -> RepeatDrafter:
        return cls(lm.device, settings.repeat_tokens)

    def propose(self, root: int, hidden, max_depth: int, with_probs: bool) -> Proposal:
        length = min(self.length, max_depth)
        if length < 1:
            return root_only(self.tree, root, self.device)
        return chain_proposal(self.tree, root, [root] * length, self.device)

    def info(self) -> DrafterInfo:
        return DrafterInfo(self.name, f"repeats the root {self.length} times", 0, 0)


@pytest.fixture
def repeat():
    register(RepeatDrafter)
    yield RepeatDrafter
    unregister(RepeatDrafter.name)


def test_a_registered_drafter_is_offered_everywhere(repeat, tiny_llama):
    # The command line: a method and a flag of its own.
    args = build_parser(["generate"]).parse_args(["generate", "--prompt", "x", "--method", "repeat",
                                                  "--repeat-tokens", "3"])
    assert (args.method, args.repeat_tokens) == ("repeat", 3)
    assert "repeat" in build_parser(["bench"])._subparsers._group_actions[0].choices["bench"].format_help()
    # The trace: its settings, its own option, its name on every guessed node.
    trace = generate(tiny_llama, "abc abc", DecodeSettings(method="repeat", max_new_tokens=8, repeat_tokens=3))
    assert trace.settings.method == "repeat" and trace.settings.options == {"repeat_tokens": 3}
    assert RunTrace.from_json(trace.to_json()).settings.repeat_tokens == 3
    assert {source for rnd in trace.rounds for source in rnd.node_sources} == {"base", "repeat"}
    # The tree's hover: each guess in the drafter's own word for it, never another drafter's.
    guessed = next(rnd for rnd in trace.rounds if rnd.tree_size > 2)
    hovers = [text for part in tree_figure(trace.round_tree(guessed), guessed).data if part.hovertext
              for text in part.hovertext]
    assert any(f"{lanes.guess_name('repeat', 2)}, rank 1: its top-1 guess, 2 tokens after the root" in h
               for h in hovers)
    assert not any("head" in h for h in hovers)
    assert "Repeat" in views.round_info(trace, guessed.index)
    # Lossless like every drafter, and its costs in the walkthrough's comparison of the race's drafters.
    plain = generate(tiny_llama, "abc abc", DecodeSettings(method=PLAIN, max_new_tokens=8))
    assert trace.tokens == plain.tokens
    costs = drafter_comparison(make_race({PLAIN: [plain], "repeat": [trace]}, focus="repeat"))
    assert f"**{lanes.title('repeat')}**" in costs and "drafting cost" in costs
    # Bench: a lane of its own.
    report = run_bench(tiny_llama, ["abc abc"], DecodeSettings(max_new_tokens=4), ["auto"], progress=False,
                       drafters=["repeat"])
    assert [row["drafter"] for row in report["lanes"]] == ["repeat"]
    # The page: the drafter choice, its colour and title, its slider, and a run's settings.
    assert "repeat" in available_drafters(tiny_llama)
    assert ("repeat (the last token again)", "repeat") in lanes.choices(available_drafters(tiny_llama))
    assert (lanes.colour("repeat"), lanes.title("repeat")) == ("#123456", "Repeat")
    assert drafter_controls("repeat")["repeat_tokens"]["visible"]
    request = RunRequest.of(prompt="abc", model=tiny_llama.name, method="repeat", repeat_tokens=4)
    assert decode_settings(tiny_llama, request).repeat_tokens == 4
    # /trace: its setting, by the name it declares.
    request = trace_request("abc", {"method": "repeat", "repeat_tokens": 5})
    assert decode_settings(tiny_llama, request).repeat_tokens == 5


def test_unknown_names_are_refused_in_one_line(tiny_llama):
    with pytest.raises(DecodingError, match="no drafter is called 'nope'"):
        drafter_class("nope")
    with pytest.raises(DecodingError, match="no drafter is called 'nope'"):
        lanes.colour("nope")
    with pytest.raises(DecodingError, match="no drafter has a setting 'nope_tokens'"):
        check_settings(DecodeSettings(nope_tokens=3))
    with pytest.raises(DecodingError, match="no drafter is called 'nope'"):
        generate(tiny_llama, "abc", DecodeSettings(method="nope"))


def test_each_setting_is_checked_against_its_own_declaration(repeat):
    with pytest.raises(DecodingError, match="repeat_tokens must be a whole number from 1 to 8, not 9"):
        check_settings(DecodeSettings(method="repeat", repeat_tokens=9))
    # Unset, a drafter's settings take the defaults it declares; another drafter's read as None.
    assert check_settings(DecodeSettings(method="repeat")).options == {"repeat_tokens": 2}
    assert DecodeSettings(method="repeat").draft_tokens is None
    with pytest.raises(AttributeError):
        DecodeSettings().no_such_setting  # noqa: B018 - the read is the test


def test_a_drafter_may_not_take_a_name_in_use(repeat):
    clash = type("Clash", (RepeatDrafter,), {"name": "clash"})  # owns repeat_tokens too
    with pytest.raises(ValueError, match="repeat_tokens"):
        register(clash)
    assert "clash" not in DRAFTERS


def test_each_drafters_name_is_written_in_at_most_two_production_files():
    """A drafter is one module: its name is written there and, at most, beside the data it
    names (a folder, a part's key); every other file reads it from the registry."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "-C", str(root), "ls-files", "decoding", "app", "app.py"],
                             capture_output=True, text=True, check=True).stdout.split()
    sources = {path: (root / path).read_text(encoding="utf-8") for path in tracked if path.endswith(".py")}
    for name in DRAFTERS:
        quoted = re.compile(rf"[\"']{re.escape(name)}[\"']")
        writing = sorted(path for path, text in sources.items() if quoted.search(text))
        assert len(writing) <= 2, f"{name!r} is written in {writing}"
