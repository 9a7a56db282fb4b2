"""Running one source of outputs (a runtime, or eager PyTorch) within a time limit, and stopping it
at once on Ctrl-C, so that ``torchscan check`` always ends. The limit is on the model's run: a
source that starts a child process first says when the model starts (:meth:`Limit.begin`).

The source runs in a thread of its own while the calling thread waits: a wait on a thread is
interrupted by Ctrl-C, where onnxruntime's C++ run, in the calling thread, would not return to
Python before the model ends. A source past its time, or interrupted, is stopped in the way it
registered with :meth:`Limit.on_stop` (onnxruntime: ``RunOptions.terminate``, which its executor
reads between nodes, the bodies of ``Loop`` and ``Scan`` included; a child process: killing it),
and by an exception raised in its thread, which stops Python code (onnx's reference evaluator,
eager PyTorch) at its next line. A thread costs about a tenth of a millisecond to start, no
process is started, and a source that ends in time is not slowed.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torchscan._errors import reduce_error

T = TypeVar("T")

STARTUP = 60.0
"""Seconds a source may take to start (a child process that imports onnxruntime) before its own
time limit begins: see :meth:`Limit.starting` and :meth:`Limit.begin`."""

GRACE = 2.0
"""Seconds a stopped source is given to end before the next one starts; one that does not (a
single long operation in C) is left to end on its own, and does not hold up the check."""

RESEND = 0.05
"""Seconds between the stops sent to a source that has not ended yet, and between two readings
of the deadline of one that runs."""


class TimedOut(Exception):
    """A source that did not end within its time limit, and was stopped."""

    __reduce__ = reduce_error

    def __init__(self, seconds: float) -> None:
        super().__init__(f"timed out after {seconds_text(seconds)}")
        self.seconds = seconds


class _Stopped(BaseException):
    """Raised in a source's thread to stop it; not an ``Exception``, so that no ``except
    Exception`` of the code it stops catches it."""

    __reduce__ = reduce_error


def seconds_text(seconds: float) -> str:
    """A duration as the report says it: ``"5 s"``, ``"0.5 s"``."""
    return f"{seconds:g} s"


class Limit:
    """What a source running under a time limit is given: the limit, and a place to say how to
    stop it (:meth:`on_stop`)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._stops: list[Callable[[], object]] = []
        self._stopped = False
        self._running = True
        self.deadline = time.monotonic() + seconds

    def starting(self) -> None:
        """The source starts a process before it runs the model: that start-up may take up to
        :data:`STARTUP` seconds, and the time limit counts from :meth:`begin`."""
        with self._lock:
            self.deadline = time.monotonic() + max(self.seconds, STARTUP)

    def begin(self) -> None:
        """The model starts running now: the source has ``seconds`` from here."""
        with self._lock:
            self.deadline = time.monotonic() + self.seconds

    def remaining(self) -> float:
        with self._lock:
            return self.deadline - time.monotonic()

    def on_stop(self, stop: Callable[[], object]) -> None:
        """Call ``stop`` (from another thread) when the source is to stop; at once if it is."""
        with self._lock:
            self._stops.append(stop)
            stopped = self._stopped
        if stopped:
            _quietly(stop)

    def _stop(self, thread: threading.Thread) -> None:
        with self._lock:
            self._stopped = True
            stops = list(self._stops)
        self._interrupt(thread)
        for stop in stops:
            _quietly(stop)

    def _interrupt(self, thread: threading.Thread) -> None:
        """Raise :class:`_Stopped` in ``thread`` while it is in ``run``."""
        with self._lock:
            if self._running and thread.ident is not None:  # under the lock: it is in run
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(_Stopped)
                )

    def _join(self, thread: threading.Thread) -> None:
        """Wait up to :data:`GRACE` seconds for a stopped ``thread`` to end, raising
        :class:`_Stopped` in it again every :data:`RESEND` seconds: Python drops an exception
        raised in a callback that it calls for the interpreter (a weakref's, a ``__del__``), so
        that a single one may be lost where the source frees objects as it runs."""
        deadline = time.monotonic() + GRACE
        while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
            thread.join(min(RESEND, left))
            if thread.is_alive():
                self._interrupt(thread)

    def _leave(self) -> None:
        with self._lock:
            self._running = False


def within(seconds: float | None, run: Callable[[Limit | None], T]) -> T:
    """``run(limit)``, stopped after ``seconds``; ``run(None)`` in this thread where ``seconds``
    is None.

    Raises:
      TimedOut: ``run`` did not end in time.
      KeyboardInterrupt: Ctrl-C while it ran; it is stopped first.
      Exception: what ``run`` raised.
    """
    if seconds is None:
        return run(None)
    limit = Limit(seconds)
    outcome: list[tuple[bool, object]] = []

    def work() -> None:
        try:
            try:
                outcome.append((True, run(limit)))
            except BaseException as error:  # re-raised in the waiting thread
                outcome.append((False, error))
            finally:
                limit._leave()
            _checkpoint()  # a stop sent just before _leave is raised here, not in threading
        except _Stopped:
            pass

    thread = threading.Thread(target=work, name="torchscan check", daemon=True)
    with _stops_not_reported():
        thread.start()
        return _wait(thread, limit, seconds, outcome)


def _wait(
    thread: threading.Thread, limit: Limit, seconds: float, outcome: list[tuple[bool, object]]
) -> Any:
    try:
        # The deadline moves where the source says when its model starts (Limit.begin): it is
        # read again every RESEND seconds.
        while thread.is_alive() and (remaining := limit.remaining()) > 0:
            thread.join(min(remaining, RESEND))
    except BaseException:  # Ctrl-C: stop the source, and let the interrupt go on
        limit._stop(thread)
        with contextlib.suppress(BaseException):  # a second Ctrl-C ends the wait
            limit._join(thread)  # onnxruntime returns at once when told to terminate
        raise
    if thread.is_alive() or not outcome:
        limit._stop(thread)
        limit._join(thread)
        raise TimedOut(seconds)
    done, value = outcome[0]
    if not done:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


@contextlib.contextmanager
def _stops_not_reported() -> Iterator[None]:
    """Python reports an exception raised in a callback it calls for the interpreter (a
    weakref's, a ``__del__``) to ``sys.unraisablehook`` and drops it; a :class:`_Stopped` that
    lands there is not reported (it is sent again, :meth:`Limit._join`). Other exceptions are
    reported as before."""
    prior = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, _Stopped):
            prior(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:
            sys.unraisablehook = prior


def _checkpoint() -> None:
    """Nothing; calling it lets a pending asynchronous exception be raised."""


def _quietly(stop: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # a source that has ended cannot be stopped: no matter
        stop()
