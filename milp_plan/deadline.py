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

Deterministic work (`--work-limit`). A wall-clock limit makes a search that stops early
depend on the machine and its load. A Deadline may instead (or also) carry a budget of work
units: every search charges what it does (`charge`), and `expired()` reads the meter, so the
same inputs, seed and work limit give the same answer on any machine. One unit is about one
second of one core of the reference machine (2 shared cores of this project's CI machine):

* CP-SAT charges its own deterministic time (`max_deterministic_time`, which is in about
  seconds); HiGHS and CBC have no deterministic measure and refuse a work limit;
* the Python side charges a fixed amount per operation (`WORK`): a config's bound, a
  per-config model built, a heuristic's step (a layer partition, a state it rejects), a plan
  built and scored by the cost model. Enumerating the configs is not charged. The full bound
  of a free parent (open stage sizes: 40-100 stage options at 1024 GPUs) is charged per
  option it fits (`WorkCosts.option_fit`, driver.full_bound_work): a flat `bound` made a unit
  3.5-7 CPU seconds there.

The amounts are a least-squares fit of CPU time on 20 runs (5 planners x 4 instances) on the
reference machine, where CP-SAT's deterministic time came out at 1.02 CPU seconds a unit;
tests/benchmarks/bench_work.py runs them again and prints each run's CPU time, work and ratio
(0.65-1.3 at the fit). They make work comparable across planners, not exact seconds.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WorkCosts:
    """Work units charged per operation (about seconds on the reference machine)."""
    bound: float = 4e-4       # a config's or a family's lower bound (solvers/bounds.py)
    option_fit: float = 2.5e-5  # and per stage option of a free parent's full bound (its options' memory
    #                             rooms at three positions, slots, recompute pieces: 0.024-0.026 ms an option
    #                             beyond `bound` at 1024 and 8192 GPUs, 77-170 options a parent; 0.06-0.10
    #                             ms before the pieces were made at once, 0.18 before the memory fits' parts)
    work_bound: float = 1e-5  # a family's work bound, a division (bounds.WeakFamilyBounds.work_bound)
    weak_bound: float = 5e-5  # a family's weak bound, its group's terms shared (WeakFamilyBounds.bound: 15-70 us)
    split_cell: float = 4e-8  # a cell of a few-stage bound's enumeration: an option tuple, a split and a path
    #                             (bounds._few_stage_bound: 37-47 ns a cell over the free searches of the default,
    #                             its shipped job and two-type-32, 2-5 million cells each)
    model: float = 2e-2       # a per-config model built (formulations/pipeline.py) and handed to CP-SAT
    step: float = 1e-4        # a heuristic step that builds no plan: a layer partition, a state rejected
    plan: float = 3.7e-3      # a plan built and scored by the cost model (placement.build_plan)


WORK = WorkCosts()


class _Meter:
    """The work a command has done, shared by a deadline and the deadlines cut from it."""
    __slots__ = ("used",)

    def __init__(self) -> None:
        self.used = 0.0


class Deadline:
    """A budget from now: `seconds` of wall clock (perf_counter) and, optionally, `work` units
    (see the module docstring). `expired()` is true once either has run out or the command
    was interrupted."""

    def __init__(self, seconds: float, start: float | None = None, work: float | None = None,
                 meter: _Meter | None = None) -> None:
        self.seconds = float(seconds)
        self.start = time.perf_counter() if start is None else start
        self.end = self.start + self.seconds
        self.meter = meter or _Meter()
        self.work = None if work is None else float(work)
        self.work_start = self.meter.used
        self.work_end = None if work is None else self.work_start + self.work

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def charge(self, units: float) -> None:
        """Count `units` of work done (on the meter this deadline shares with its parts)."""
        self.meter.used += units

    def work_used(self) -> float:
        return self.meter.used - self.work_start

    def work_left(self) -> float | None:
        """Work units left, or None without a work limit."""
        if self.work_end is None:
            return None
        return 0.0 if _signal is not None else max(0.0, self.work_end - self.meter.used)

    def left(self) -> float:
        """Wall-clock seconds left (whatever the work left: a native solver given both limits
        must stop on the work, or the wall clock would decide where it stops)."""
        return 0.0 if _signal is not None else max(0.0, self.end - time.perf_counter())

    def expired(self) -> bool:
        return (_signal is not None or (self.work_end is not None and self.meter.used >= self.work_end)
                or time.perf_counter() >= self.end)

    def mark(self) -> tuple[float, float]:
        """Now, to measure a step's share of the budget with `spent(since=...)`."""
        return time.perf_counter(), self.meter.used

    def spent(self, since: tuple[float, float] | None = None) -> float:
        """The share of the budget used (since `mark()` when given): of the work under a work
        limit (the wall clock is then only a guard, so the shares, and where a search moves on,
        do not depend on the machine), else of the wall clock."""
        t0, w0 = since or (self.start, self.work_start)
        if self.work is not None:
            return (self.meter.used - w0) / self.work if self.work > 0 else 1.0
        return (time.perf_counter() - t0) / self.seconds if self.seconds > 0 else 1.0

    def part(self, fraction: float) -> "Deadline":
        """A deadline of `fraction` of this one's budget (seconds and work) from now, never past
        this one's end; its work counts on the same meter."""
        work = None if self.work is None else min(fraction * self.work, self.work_left())
        return Deadline(min(fraction * self.seconds, self.left()), work=work, meter=self.meter)

    def share(self, fraction: float) -> "Deadline":
        """A deadline of `fraction` of what this one has left (seconds and work), from now; its
        work counts on the same meter."""
        work = None if self.work is None else fraction * self.work_left()
        return Deadline(fraction * self.left(), work=work, meter=self.meter)
