"""What the model is busy with, for a visitor whose Run or Race waits its turn. No Gradio here.

Model work runs one event at a time (events.MODEL_QUEUE), so a second visitor during a race
would see only the queue's "1/1" for as long as the race takes. The running event writes what
it is doing here (who leads, about how long is left), and each page reads it every few seconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Activity:
    session: str  # the page session whose event runs
    what: str  # Markdown: what runs, who leads
    ends_at: float | None  # time.time() when it should end, if known


class Board:
    """The one activity the model runs now, if any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: Activity | None = None

    def post(self, session: str, what: str, seconds_left: float | None = None) -> None:
        ends_at = time.time() + seconds_left if seconds_left is not None else None
        with self._lock:
            self._now = Activity(session, what, ends_at)

    def clear(self, session: str) -> None:
        with self._lock:
            if self._now is not None and self._now.session == session:
                self._now = None

    def runs_for(self, session: str) -> bool:
        """Whether the model's work now is this page's own run or race."""
        with self._lock:
            return self._now is not None and self._now.session == session

    def notice(self, session: str) -> str:
        """For the page of `session`: what the model is busy with for someone else (empty if it
        is idle, or busy with this page's own run, which its own status line tells)."""
        with self._lock:
            now = self._now
        if now is None or now.session == session:
            return ""
        left = f" About {max(0.0, now.ends_at - time.time()):.0f} s left." if now.ends_at is not None else ""
        return (f"⏳ **The model is busy with another visitor's {now.what}.**{left} Your Run or Race starts "
                "as soon as it ends: one at a time, so that nothing slows the measurements down.")


BOARD = Board()
