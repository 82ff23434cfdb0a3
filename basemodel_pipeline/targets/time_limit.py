"""A time limit on calls into user code (the Python targets' modules and functions).

    with TimeLimit(seconds) as limit:
        for ...:
            value = limit.call(fn, *args)   # TimeLimitExceeded once a call runs past `seconds`

In the main thread (the CLI, the Pipes entrypoints, Dagster's step processes) a SIGALRM timer, armed for each
call, interrupts it: Python code at its next bytecode, and a blocking system call (time.sleep, a socket read)
at once. In another thread, where signals cannot be used, a watchdog thread raises the exception in the
calling thread asynchronously (PyThreadState_SetAsyncExc): Python code stops at its next bytecode, a blocking
call when it returns. Either way a call stuck inside one long C function stops only when that returns.
TimeLimitExceeded derives from BaseException, so user code's `except Exception:` does not swallow it.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class TimeLimitExceeded(BaseException):
    """A call ran past its time limit (BaseException: `except Exception` in user code lets it through)."""


class TimeLimit:
    """Calls made through `call` are stopped after `seconds` each (see the module docstring)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.armed = False
        self.use_signal = threading.current_thread() is threading.main_thread() and hasattr(
            signal, "setitimer"
        )
        self.previous: Any = None
        self.previous_timer = (0.0, 0.0)
        self.started = 0.0
        self.watchdog: _Watchdog | None = None

    def __enter__(self) -> TimeLimit:
        if self.use_signal:  # another timer (pytest-timeout's, say) is put back on exit with what it had left
            self.started = time.monotonic()
            self.previous_timer = signal.getitimer(signal.ITIMER_REAL)
            self.previous = signal.signal(signal.SIGALRM, self._on_alarm)
        else:
            self.watchdog = _Watchdog(threading.get_ident())
            self.watchdog.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False
        if self.use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous if self.previous is not None else signal.SIG_DFL)
            left, interval = self.previous_timer
            if left > 0:
                signal.setitimer(
                    signal.ITIMER_REAL, max(left - (time.monotonic() - self.started), 1e-3), interval
                )
        elif self.watchdog is not None:
            self.watchdog.stop()

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:  # a signal delivered after the call returned does nothing
            self.armed = False
            raise TimeLimitExceeded

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), stopped with TimeLimitExceeded after `seconds`."""
        if self.use_signal:
            self.armed = True
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            try:
                return fn(*args)
            finally:
                self.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        assert self.watchdog is not None
        self.watchdog.arm(self.seconds)
        try:
            return fn(*args)
        finally:
            if self.watchdog.disarm():  # it fired: clear an exception still pending, then report it
                _set_async_exc(threading.get_ident(), None)
                raise TimeLimitExceeded


class _Watchdog(threading.Thread):
    """Raises TimeLimitExceeded in thread `target` when an armed call passes its deadline."""

    def __init__(self, target: int) -> None:
        super().__init__(name="python-target-time-limit", daemon=True)
        self.target = target
        self.cond = threading.Condition()
        self.deadline: float | None = None
        self.fired = False
        self.stopped = False

    def arm(self, seconds: float) -> None:
        with self.cond:
            self.deadline, self.fired = time.monotonic() + seconds, False
            self.cond.notify()

    def disarm(self) -> bool:
        """Disarm; whether the deadline passed (the exception may still be pending in the target thread)."""
        with self.cond:
            self.deadline = None
            return self.fired

    def stop(self) -> None:
        with self.cond:
            self.stopped, self.deadline = True, None
            self.cond.notify()

    def run(self) -> None:
        with self.cond:
            while not self.stopped:
                if self.deadline is None:
                    self.cond.wait()
                elif (left := self.deadline - time.monotonic()) > 0:
                    self.cond.wait(left)
                else:
                    self.deadline, self.fired = None, True
                    _set_async_exc(self.target, TimeLimitExceeded)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in thread `thread_id` at its next bytecode (None clears a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None
    )
