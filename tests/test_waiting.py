"""What a waiting visitor is told while another visitor's run or race holds the model."""

from __future__ import annotations

import pytest

from app.race_views import waiting_text
from app.waiting import Board
from decoding.race import RaceFrame


def test_only_other_visitors_are_told_and_only_while_it_runs():
    board = Board()
    assert board.notice("b") == ""
    board.post("a", "race (Plain decoding, Medusa: race 2 of 3; Medusa leads at 1.20×)", seconds_left=30)
    told = board.notice("b")
    assert "another visitor's race" in told and "Medusa leads at 1.20×" in told
    assert int(told.split("About ")[1].split(" s")[0]) in (29, 30)
    assert board.notice("a") == ""  # its own page has its own status line
    board.clear("b")  # someone else's end does not clear it
    assert board.notice("b") != ""
    board.clear("a")
    assert board.notice("b") == ""


@pytest.mark.parametrize("frame, said", [
    (RaceFrame("warm-up", 3, ["ar", "medusa"]), "race (Plain decoding, Medusa: warming up)"),
    (RaceFrame("measuring", 3, ["ar", "medusa"], 1, "medusa", leader="medusa", lead=1.234),
     "race (Plain decoding, Medusa: race 2 of 3; Medusa leads at 1.23×)"),
])
def test_the_waiting_text_names_the_race_and_who_leads(frame, said):
    assert waiting_text(frame) == said
