"""Deadlines and interrupts for the search: one clock and one stop flag that every loop reads.

* `Deadline(seconds)`: wall-clock budget from its creation; `expired()` is also true once the
  user has interrupted the command, so a loop that honours the deadline honours Ctrl-C too.
* `handle_signals()`: while active, SIGINT and SIGTERM set the stop flag and call every
  registered stopper (e.g. CP-SAT's `stop_search`) instead of raising KeyboardInterrupt in
  the middle of a solve. The command then unwinds normally with the best plan so far, and
  the CLI exits 130 (SIGINT) or 143 (SIGTERM) without writing its output.
* `run_native(fn, stop)`: runs a call that does not return to Python until it is done (a
  native solver) in a worker thread, so that the main thread keeps receiving signals, and
  calls `stop()` when one arrives.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_signal: int | None = None                 # the signal that stopped the command, if any
_stoppers: list[Callable[[], None]] = []   # called once when a signal arrives
_active = 0                                # nesting depth of handle_signals()


def interrupted() -> int | None:
    """The signal number that asked the command to stop (SIGINT / SIGTERM), or None."""
    return _signal


def request_stop(signum: int = signal.SIGINT) -> None:
    """What the signal handler does (and what tests call): set the flag, stop native solves."""
    global _signal
    with _lock:
        first = _signal is None
        _signal = signum if _signal is None else _signal
        stoppers = list(_stoppers)
    if first:
        for stop in stoppers:
            try:
                stop()
            except Exception:  # pragma: no cover - a stopper must never break the handler
                pass


def reset() -> None:
    """Clear the stop flag (a new command in the same process, e.g. the tests)."""
    global _signal
    with _lock:
        _signal = None


def _handler(signum, frame) -> None:  # noqa: ARG001
    if _signal is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt  # a second Ctrl-C: stop now, whatever is running
    request_stop(signum)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Route SIGINT/SIGTERM to the stop flag for the duration (main thread only; elsewhere a no-op)."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    reset()
    _active += 1
    try:
        for s in old:
            signal.signal(s, _handler)
        yield
    finally:
        _active -= 1
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def stopper(stop: Callable[[], None]) -> Iterator[None]:
    """Register `stop` to be called if a signal arrives while the block runs (called at once
    when one already has)."""
    with _lock:
        _stoppers.append(stop)
        already = _signal is not None
    try:
        if already:
            stop()
        yield
    finally:
        with _lock:
            _stoppers.remove(stop)


def run_native(fn: Callable[[], T], stop: Callable[[], None]) -> T:
    """fn() in a worker thread while this (main) thread waits and keeps receiving signals; a
    signal calls stop(), which must make fn return soon. Outside handle_signals(), fn() runs here."""
    with stopper(stop):
        if not _active or threading.current_thread() is not threading.main_thread():
            return fn()
        box: dict[str, object] = {}

        def work() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc
        worker = threading.Thread(target=work, name="milp-plan-solve", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]


class Deadline:
    """A wall-clock budget of `seconds` from now (perf_counter). `expired()` is true once it has
    run out or the command was interrupted."""

    def __init__(self, seconds: float, start: float | None = None) -> None:
        self.seconds = float(seconds)
        self.start = time.perf_counter() if start is None else start
        self.end = self.start + self.seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return 0.0 if _signal is not None else max(0.0, self.end - time.perf_counter())

    def expired(self) -> bool:
        return _signal is not None or time.perf_counter() >= self.end

    def share(self, fraction: float) -> "Deadline":
        """A deadline at `fraction` of the time left (never past this one)."""
        return Deadline(fraction * self.left())

    def within(self, seconds: float) -> "Deadline":
        """A deadline `seconds` from now or this one's end, whichever comes first."""
        return Deadline(min(seconds, self.left()))


def unbounded() -> Deadline:
    return Deadline(float("inf"))
