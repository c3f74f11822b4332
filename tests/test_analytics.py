"""The app runs offline: Gradio's usage analytics are off unless GRADIO_ANALYTICS_ENABLED turns them on."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

import pytest

from decoding.tiny import make_tiny_model_dir

APP = Path(__file__).resolve().parent.parent / "app.py"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model")))


def build_app(monkeypatch, tiny_model_dir: str, analytics: str | None) -> dict:
    """app.py's page config (what its /config route serves), built with GRADIO_ANALYTICS_ENABLED as given."""
    monkeypatch.setenv("MEDUSA_PLAYGROUND_MODEL", tiny_model_dir)
    # Set first, so that monkeypatch restores the variable as it was even after app.py's setdefault.
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", analytics or "")
    if analytics is None:
        monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED")
    demo = runpy.run_path(str(APP), run_name="app_under_test")["demo"]  # not "__main__": no launch
    return demo.get_config_file()


def test_analytics_are_off_by_default(monkeypatch, tiny_model_dir):
    assert build_app(monkeypatch, tiny_model_dir, None)["analytics_enabled"] is False


def test_gradios_own_variable_still_turns_them_on(monkeypatch, tiny_model_dir):
    assert build_app(monkeypatch, tiny_model_dir, "True")["analytics_enabled"] is True


def test_the_default_is_set_before_anything_is_imported():
    """Only `import os` may come before the default: any other import could load gradio first."""
    body = ast.parse(APP.read_text(encoding="utf-8")).body
    setdefault = next(i for i, node in enumerate(body)
                      if "GRADIO_ANALYTICS_ENABLED" in ast.unparse(node) and "setdefault" in ast.unparse(node))
    before = [ast.unparse(node) for node in body[:setdefault] if isinstance(node, ast.Import | ast.ImportFrom)]
    assert before == ["import os"]
