"""`app.model_thread`: every call wrapped in `on_model_thread` runs on one thread, whoever calls."""

from __future__ import annotations

import contextvars
import threading

import pytest

from app.model_thread import on_model_thread, on_the_model_thread
from app_helpers import on_a_new_thread


@on_model_thread
def where() -> str:
    return threading.current_thread().name


def test_a_call_runs_on_the_model_thread_whichever_thread_calls():
    names = {where(), on_a_new_thread(where), on_a_new_thread(where)}
    assert len(names) == 1 and names != {threading.current_thread().name}
    assert not on_the_model_thread()


def test_its_exception_reaches_the_caller():
    @on_model_thread
    def fails() -> None:
        raise ValueError("the model said no")

    with pytest.raises(ValueError, match="the model said no"):
        on_a_new_thread(fails)


def test_a_wrapped_call_may_call_another_without_waiting_for_itself():
    @on_model_thread
    def outer() -> tuple[str, bool]:
        return where(), on_the_model_thread()

    assert outer() == (where(), True)


def test_each_step_of_a_generator_runs_there_and_closing_it_early_closes_it_there():
    ended_on = []

    @on_model_thread
    def steps():
        try:
            for number in range(5):
                yield number, threading.current_thread().name
        finally:
            ended_on.append(threading.current_thread().name)

    stream = steps()
    first = on_a_new_thread(next, stream)
    second = on_a_new_thread(next, stream)
    assert [first[0], second[0]] == [0, 1] and first[1] == second[1] == where()
    on_a_new_thread(stream.close)
    assert ended_on == [where()]
    assert [number for number, _ in steps()] == [0, 1, 2, 3, 4]  # run to its end, it simply stops


def test_the_callers_context_variables_go_with_the_call():
    """Gradio finds the visitor's request (for its toasts) in context variables."""
    visitor = contextvars.ContextVar("visitor", default="nobody")

    @on_model_thread
    def who() -> str:
        return visitor.get()

    token = visitor.set("a student")
    try:
        assert who() == "a student"
    finally:
        visitor.reset(token)
    assert who() == "nobody"
