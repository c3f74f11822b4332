"""The race (plain decoding and every ticked drafter, each lane measured alone, in an order that
rotates from race to race) and the speed arithmetic it shares with `bench` (`decoding.stats`)."""

from __future__ import annotations

import pytest

from app.views import LEARN_FIGURES, STATS_FIGURES
from app_helpers import SMALL_CHOICES, make_ar_run, make_chain_run, make_race, make_run
from decoding.errors import DecodingError
from decoding.race import RaceFrame, lane_order, race
from decoding.settings import DecodeSettings
from decoding.stats import Timing, round_cost, speedup, spread, verify_cost

DRAFTERS = ["medusa", "draft-model", "prompt-lookup"]


def test_lanes_run_alone_in_rotating_order_after_a_warm_up_and_the_median_race_is_replayed(tiny_llama):
    frames = list(race(tiny_llama, "It is a truth", DecodeSettings(max_new_tokens=12), DRAFTERS, races=4,
                       focus="draft-model"))
    phases = [f.phase for f in frames]
    first_replay = phases.index("replaying")
    assert phases[0] == "warm-up" and phases[-1] == "done"
    measuring = [(f.finished, f.measuring) for f in frames[:first_replay] if f.phase == "measuring"]
    lanes = ["ar", *DRAFTERS]
    assert measuring == [(index, lane) for index in range(4) for lane in lanes[index:] + lanes[:index]]
    # Nothing is shown until every race is over: a page redraw never overlaps a measured run.
    assert all(f.result is None for f in frames[:first_replay])
    result = frames[-1].result
    assert result.lanes == lanes and len(result.races) == 4 and result.focus == "draft-model"
    # Greedy lanes write plain decoding's text, and the race says so.
    assert all(runs[lane].tokens == runs["ar"].tokens for runs in result.races for lane in lanes)
    assert result.differing() == []
    # The replayed race is the one whose focus speedup is the median (the lower middle of four).
    speeds = result.speedups("draft-model")
    assert speeds[result.shown_index] == sorted(speeds)[1]
    assert speeds[result.shown_index] == pytest.approx(
        speedup(Timing.of(result.shown["ar"]), Timing.of(result.shown["draft-model"])))
    clocks = [f.clock for f in frames[first_replay:]]
    assert clocks == sorted(clocks)


def test_lane_order_rotates_so_each_lane_runs_first_once_in_as_many_races():
    lanes = ["ar", "medusa", "draft-model"]
    assert [lane_order(lanes, i) for i in range(4)] == [
        ["ar", "medusa", "draft-model"], ["medusa", "draft-model", "ar"], ["draft-model", "ar", "medusa"],
        ["ar", "medusa", "draft-model"]]


def test_the_race_count_is_bounded_and_a_race_needs_a_drafter(tiny_llama):
    frames = list(race(tiny_llama, "It is", DecodeSettings(max_new_tokens=3), ["prompt-lookup"], races=0))
    assert len(frames[-1].result.races) == 1 and frames[-1].result.focus == "prompt-lookup"
    for drafters in ([], ["ar"], ["medusa", "medusa"]):
        with pytest.raises(DecodingError, match="tick at least one drafter"):
            next(race(tiny_llama, "It is", DecodeSettings(max_new_tokens=3), drafters))


def _at_ms_per_token(trace, ms: float):
    """The run, timed to take `ms` milliseconds a token, none of it spent recording."""
    for rnd in trace.rounds:
        rnd.time_trace = 0.0
    trace.total_time = len(trace.tokens) * ms / 1000
    return trace


def test_each_lanes_speedup_is_against_plain_decoding_in_the_same_race():
    """Plain decoding takes 2.8 ms a token in the first race and 6.4 ms in the second (10 tokens:
    10 ms of prefill, then 2 or 6 ms a step); Medusa 1.6 ms and prompt lookup 3.2 ms in both."""
    medusa = _at_ms_per_token(make_run(SMALL_CHOICES, accepted_leaves=[6, 0]), 1.6)
    lookup = _at_ms_per_token(make_chain_run("prompt-lookup", [2, None]), 3.2)
    plain = [make_ar_run(10, s) for s in (0.002, 0.006)]
    result = make_race({"ar": plain, "medusa": [medusa, medusa], "prompt-lookup": [lookup, lookup]})
    assert result.speedups("medusa") == pytest.approx([1.75, 4.0])
    assert result.speedups("prompt-lookup") == pytest.approx([0.875, 2.0])
    assert result.speedups("ar") == [1.0, 1.0]
    assert result.spread("medusa").median == pytest.approx(2.875) and result.spread("medusa").count == 2
    assert result.fastest() == "medusa"


def test_draft_cost_is_a_lanes_drafting_per_round_in_plain_steps():
    # Hand-made rounds draft for 1 ms; plain decoding takes 4 ms a step.
    draft = make_chain_run("draft-model", [1, 0, 4])
    result = make_race({"ar": [make_ar_run(10, 0.004)], "draft-model": [draft]}, focus="draft-model")
    assert result.draft_cost("draft-model") == pytest.approx(0.25)
    for rnd in draft.rounds:
        rnd.time_draft = 0.006
    assert result.draft_cost("draft-model") == pytest.approx(1.5)


def test_a_greedy_lane_that_writes_other_text_is_reported_and_a_sampled_one_is_not():
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    same, other = make_ar_run(len(medusa.tokens)), make_ar_run(len(medusa.tokens))
    same.rounds = medusa.rounds  # plain decoding in race 1 wrote Medusa's tokens; in race 2, others
    assert same.tokens == medusa.tokens and other.tokens != medusa.tokens
    result = make_race({"ar": [same, other], "medusa": [medusa, medusa]})
    assert result.differing() == [("medusa", 2)]
    medusa.settings.acceptance = "sample"
    assert result.differing() == []


# ----------------------------------------------------------------------------- decoding.stats

def test_speedup_is_tokens_per_second_so_runs_of_different_lengths_compare_fairly():
    ar = make_ar_run(20, seconds_per_token=0.01)  # 20 tokens in 0.01 + 19 x 0.01 s
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6, 0])  # 1 + 4 + 1 = 6 tokens in 0.01 + 2 x 0.0055 s
    expected = (6 / (0.01 + 2 * 0.0055)) / (20 / 0.2)
    assert speedup(Timing.of(ar), Timing.of(medusa)) == pytest.approx(expected)


def test_round_cost_is_a_rounds_decoding_time_in_plain_steps():
    ar = make_ar_run(10, seconds_per_token=0.004)
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6, 0, 5])
    # Hand-made rounds: draft 1 ms + verify 4 ms + accept 0.5 ms; a plain step 4 ms.
    assert round_cost(Timing.of(ar), Timing.of(medusa)) == pytest.approx(5.5 / 4)
    assert verify_cost(Timing.of(ar), Timing.of(medusa)) == pytest.approx(1.0)
    # Time spent recording the page's details is not decoding time.
    for rnd in medusa.rounds:
        rnd.t_end += 0.002
        rnd.time_trace = 0.002
    medusa.total_time += 0.002 * 3
    assert round_cost(Timing.of(ar), Timing.of(medusa)) == pytest.approx(5.5 / 4)


def test_timing_sums_runs_and_spread_gives_median_and_range():
    runs = [make_ar_run(5), make_ar_run(7)]
    total = Timing.of(runs)
    assert total.tokens == 12 and total.rounds == 4 + 6
    s = spread([1.3, 0.9, 1.1])
    assert (s.median, s.low, s.high, s.count) == (1.1, 0.9, 1.3, 3)
    with pytest.raises(ValueError):
        spread([])


def test_the_shown_race_is_the_median_one_of_the_focus_lane():
    medusa = make_run(SMALL_CHOICES, accepted_leaves=[6])
    plain = [make_ar_run(len(medusa.tokens), s) for s in (0.002, 0.009, 0.004)]
    result = make_race({"ar": plain, "medusa": [medusa] * 3})
    assert result.shown["ar"] is plain[2] and result.shown_index == 2


def test_while_lanes_are_measured_the_page_gets_the_status_line_alone(tiny_dirs, monkeypatch):
    """No figure or lane is sent to the browser between measured runs, where its redraw would load
    the machine under the next lane; the first frame clears the last race, the result comes at the end."""
    import dataclasses

    from app import handlers
    from app.inputs import RunRequest

    model = str(tiny_dirs["llama"])
    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", model)
    monkeypatch.setattr(handlers, "PUSH_EVERY", 0.0)  # push every frame
    fields = {f.name: f.name for f in dataclasses.fields(handlers.Page)}  # components named by strings
    page = handlers.Page(**fields | {"request": {f.name: f.name for f in dataclasses.fields(RunRequest)},
                                     "stats_plots": {name: name for name in STATS_FIGURES},
                                     "learn_plots": {name: name for name in LEARN_FIGURES},
                                     "step_mds": [], "steps": []})
    values = dataclasses.asdict(RunRequest.of(prompt="It is a truth", model=model, max_new_tokens=8, races=2,
                                           lanes=("medusa", "prompt-lookup"))) | {"projector": False, "width": 1280}
    updates = list(handlers.run_race(page, values))
    measuring = [u for u in updates if "measuring" in str(u.get("race_status"))]
    assert len(measuring) == 2 * 3 and all(set(u) == {"race_status"} for u in measuring)
    # Each lane's progress: the last run of the last race, every other one measured.
    assert measuring[-1]["race_status"].count("●") == 2 * 3 - 1 and "◐" in measuring[-1]["race_status"]
    # The time left is estimated from the warm-up before the first run, then from the runs measured.
    assert all("s left" in u["race_status"] for u in measuring)
    assert {"tabs", "race_lanes", "race_plot", "race_md"} <= set(updates[0]) and "race_state" not in updates[0]
    assert updates[-1]["race_state"].lanes == ["ar", "medusa", "prompt-lookup"]


def test_a_long_race_is_replayed_faster_every_lane_at_the_same_pace():
    from app.race_views import race_status
    from decoding.race import REPLAY_SECONDS, replay_pace

    assert replay_pace(2.0) == 1.0 and replay_pace(REPLAY_SECONDS * 3) == pytest.approx(3.0)
    frame = RaceFrame("replaying", 3, ["ar", "medusa"], 3, pace=3.0)
    assert "at 3.0× real speed" in race_status(frame)
    assert "real speed" not in race_status(RaceFrame("replaying", 3, ["ar", "medusa"], 3))


def test_the_time_left_follows_what_the_race_measured():
    from decoding.race import REPLAY_SECONDS, expected_seconds, seconds_left

    # A short run's prefill, then its rate of tokens per round at its time per round, to 64 tokens.
    medusa = make_chain_run("draft-model", accepted=[2, 2, 2])
    timing = Timing.of(medusa)
    expected = medusa.time_prefill + 63 / timing.tokens_per_pass * timing.seconds_per_round
    assert expected_seconds(medusa, 64) == pytest.approx(expected)
    # Two lanes of 4 s and 2 s, one race of three done: two of each left, then the replay.
    assert seconds_left({"ar": 4.0, "medusa": 2.0}, {"ar": 1, "medusa": 1}, 3) == pytest.approx(
        2 * 4 + 2 * 2 + min(4.0, REPLAY_SECONDS))


def test_the_warm_up_runs_on_the_threads_the_races_will_use(tiny_llama, monkeypatch):
    """Beside a program holding a core, the warm-up too runs on the free core: an estimate of the
    time left from a warm-up whose two threads took turns on one core was 8x too long."""
    import torch

    from decoding import race as race_module
    from decoding.machine_load import MachineLoad

    monkeypatch.setattr(race_module, "look_at_load", lambda: MachineLoad(1.0, 2, 2, 0.1))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    asked = []
    real_timed = race_module.timed_run
    monkeypatch.setattr(race_module, "timed_run", lambda lm, p, s, threads=None: asked.append(threads)
                        or real_timed(lm, p, s, threads))
    frames = list(race(tiny_llama, "It is", DecodeSettings(max_new_tokens=6), ["medusa"], races=1))
    assert asked and set(asked) == {1}
    assert frames[-1].result.threads == 1
