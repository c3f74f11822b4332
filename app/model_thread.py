"""One thread for all of the app's torch work.

Torch runs its CPU kernels on OpenMP (GNU libgomp, in torch's Linux wheels). Every thread that
starts a parallel region gets a team of worker threads of its own, and the team lives as long as
that thread does. While a process holds no more such threads than the machine has cores, libgomp's
workers spin between one region and the next; past that, they go to sleep after a few spins, and
every layer of every pass waits for them to be woken. Gradio runs each handler, and each step of
a streaming one, on whichever thread of its pool is free, so once a page had run the model from two
threads, every later pass ran with sleeping workers. On a 2-core machine that cost a race 150,000
context switches instead of about 100, made the tree's verify pass 1.5 plain steps instead of 1.3,
and put the page's race a fifth below `bench`, which runs on one thread (docs/page-race.md).

So the app runs the model on one long-lived thread: each function that loads a model, warms it
up or decodes is wrapped in `on_model_thread`, and its caller waits for it there. The page's
other work (drawing figures from traces, the waiting notices) stays on Gradio's threads.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

THREAD_NAME = "model"

F = TypeVar("F", bound=Callable[..., Any])

_state = threading.local()  # `on_it` is True on the model thread
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_pid = 0


def _mark_model_thread() -> None:
    _state.on_it = True


def _model_executor() -> ThreadPoolExecutor:
    """The model thread's executor, started on first use in this process. A forked child (ZeroGPU
    runs a call in one) starts its own: threads do not survive a fork."""
    global _executor, _executor_pid
    with _lock:
        if _executor is None or _executor_pid != os.getpid():
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME,
                                           initializer=_mark_model_thread)
            _executor_pid = os.getpid()
        return _executor


def on_the_model_thread() -> bool:
    """Whether the calling thread is the model thread."""
    return getattr(_state, "on_it", False)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` run on the model thread; the caller waits for its result or exception.
    Called from the model thread itself, it runs at once (a wrapped function may call another)."""
    if on_the_model_thread():
        return fn(*args, **kwargs)
    # Gradio finds the visitor's request (for its warnings and toasts) in context variables,
    # which a thread does not inherit: the call runs in a copy of the caller's.
    context = contextvars.copy_context()
    return _model_executor().submit(context.run, fn, *args, **kwargs).result()


def on_model_thread(fn: F) -> F:
    """`fn` run on the model thread. A generator function is stepped there: each of its steps runs
    on the model thread, and the values are handed to the caller between steps (a page can draw
    them meanwhile); closing it early closes it there too."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stepped(*args: Any, **kwargs: Any) -> Any:
            steps = fn(*args, **kwargs)  # making a generator runs none of its body
            try:
                while True:
                    try:
                        value = _call(next, steps)
                    except StopIteration:
                        return
                    yield value
            finally:
                _call(steps.close)
        return stepped  # type: ignore[return-value]

    @functools.wraps(fn)
    def called(*args: Any, **kwargs: Any) -> Any:
        return _call(fn, *args, **kwargs)
    return called  # type: ignore[return-value]
