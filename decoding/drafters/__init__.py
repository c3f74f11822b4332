"""Drafters: where a round's guesses come from. One loop verifies them all (see base.py).

Each module here is one drafter, which registers itself (registry.py); importing the package
registers the ones this project ships, in the order they are offered.
"""

from __future__ import annotations

# In the order they are offered; each registers itself.
from . import medusa_heads, eagle, mtp, draft_model, prompt_lookup, retrieval  # noqa: F401  # isort: skip
from .base import Drafter, ModelFiles, Proposal
from .registry import (
    DRAFTERS,
    available_drafters,
    check_settings,
    drafter_class,
    drafter_setting,
    make_drafter,
    methods,
    register,
    setting_high,
    unregister,
)

__all__ = ["DRAFTERS", "Drafter", "ModelFiles", "Proposal", "available_drafters", "check_settings", "drafter_class",
           "drafter_setting", "make_drafter", "methods", "register",
           "setting_high", "unregister"]
