"""The Train tab's handler: it streams a training, keeps the heads in the visitor's state, and
the Playground decodes with them only when that visitor ticks "Use these heads"."""

from __future__ import annotations

import pytest
import torch

from app import handlers
from app.store import cache
from app.text import load_steps, render_steps
from app.training_views import TRAINING_INVITATION, training_figure, training_status, training_step_values
from decoding.medusa_modules import medusa_part
from decoding.training.quick_heads import TrainedHeads
from tests.test_app_api import _page_and_values, tiny_model_dir  # noqa: F401  (a fixture)
from tests.test_quick_heads import write_cycle_recording


@pytest.fixture()
def trained_page(tiny_model_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    model = cache.get(tiny_model_dir)
    folder = write_cycle_recording(tmp_path, model.tokenizer, medusa_part(model).heads.config.vocab_size, model.name)
    monkeypatch.setattr("decoding.training.quick_heads.recordings_of", lambda name: [folder])
    page, values = _page_and_values(tiny_model_dir, prompt="It is a truth", max_new_tokens=12)
    values |= {"train_heads": "1", "train_seconds": 2, "trained_state": None, "use_trained": False,
               "run_state": None, "race_state": None}
    return model, page, values


def test_train_streams_its_chart_and_keeps_the_heads_in_the_visitors_state(trained_page):
    model, page, values = trained_page
    shipped = [p.clone() for p in medusa_part(model).heads.parameters()]
    updates = list(handlers.train_heads(page, values))
    statuses = [u["train_status"] for u in updates if "train_status" in u]
    assert statuses[0].startswith("Reading answers") and statuses[-1].startswith("**Trained head 1 in")
    trained = updates[-1]["trained_state"]
    assert isinstance(trained, TrainedHeads) and updates[-1]["use_trained"].interactive
    assert all(torch.equal(a, b) for a, b in zip(shipped, medusa_part(model).heads.parameters(), strict=True))
    figure = updates[-2]["train_plot"]
    assert [t.name for t in figure.data] == ["head 1, learning", "head 1, fresh start", "head 1, shipped"]

    values |= {"trained_state": trained}
    runs = {}
    for use, says in ((True, True), (False, False)):
        updates = list(handlers.run_drafter(page, values | {"use_trained": use}))
        run = runs[use] = [u["run_state"] for u in updates if "run_state" in u][-1]
        assert ("trained on this page" in run.drafter.origin) is says
        summary = [u["summary"] for u in updates if "summary" in u][-1]
        assert ("Medusa (heads trained on this page for 2 s)" in summary) is says, summary

    # Learn's step on training tells this training, and the run that used its heads.
    step = next(text for text in render_steps(load_steps(), runs[True], None, trained=trained)
                if text.startswith("### Train a head"))
    latest = trained.trace.latest.top1[0]
    assert "**Your training** (head 1 of" in step and f"to **{latest:.0%}**" in step
    assert "Your last run decoded with them (heads trained on this page" in step
    assert "Tick **Use these heads**" in training_step_values(trained, runs[False])["training_result"]
    assert training_step_values(None, runs[False])["training_result"] == TRAINING_INVITATION


def test_heads_trained_on_another_model_are_not_used(trained_page):
    model, page, values = trained_page
    trained = [u for u in handlers.train_heads(page, values) if "trained_state" in u][-1]["trained_state"]
    trained.trace.model = "another model"
    assert page.model(values | {"trained_state": trained, "use_trained": True}, model.name) is model


@pytest.mark.parametrize("change, words", [
    ({"train_seconds": 0}, "1 to 60 seconds"),
    ({"train_heads": "nine"}, "pick a head"),
    ({"train_heads": "9"}, "heads 1 to 4"),
])
def test_a_training_the_page_refuses_says_why(trained_page, change, words):
    _, page, values = trained_page
    with pytest.warns(UserWarning, match=words):
        updates = list(handlers.train_heads(page, values | change))
    assert updates[-1]["train_status"].startswith("⚠") and "trained_state" not in updates[-1]


def test_the_views_before_any_training():
    assert "press **Train**" in training_status(None)
    assert training_figure(None).layout.annotations[0].text.startswith("Press Train")
