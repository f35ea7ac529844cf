"""`--workers N`: the exact search's per-config models solved ahead in N worker processes,
with the same answer as one process (byte-identical plan.json whatever N).

The search (driver.solve) stays serial: it pops the configs in bound order, solves each
under the incumbent as its cutoff, and charges the work as it goes. Workers only solve
ahead (speculation): while the search works on one config, each idle worker takes the next
config of the heap that the search would solve (complete, its bounds below the incumbent)
and solves it as the search would now, with the incumbent of now as its cutoff (QUEUE
configs per worker are handed out, so that a worker does not wait for the search). When the
search reaches that config it takes the worker's answer instead of solving it, but only
when that answer is the one its own solve would give:

- the same inputs: the cutoff (the incumbent has not improved since), the hint, and on a
  simulated instance the same known critical paths (driver._solve_config learns paths that
  every config of the same schedule, pp, m and vpp reads), and the same bound to start from
  (a run stops at a plan close enough to it: driver._solve_model);
- no limit touched it: every backend run ended optimal, closed (at the config's bound:
  driver._solve_model) or infeasible, and the worker's
  deadline never expired; and, under a work limit, the worker's charges, replayed on the
  search's meter, stay below the search's own work limit, so every run of the search's solve
  would have had more work than the worker's run used.

CP-SAT with one worker is deterministic for one model, seed and hint, and a run that ends
before its limits does not depend on them (tests/test_parallel.py, and golden_plans.py with
--workers 2, check the whole answer), so the search's own solve would return the same plan
and bound. Otherwise (the incumbent improved, a limit, an error) the search solves the
config itself, as with one process, and drops the worker's answer. A worker's solve runs
every check the search's does (the checker, the drift checks); one that raises is solved
again by the search, which raises the same. The work charged is the
search's alone (a taken answer's charges are replayed in order; dropped ones are not
charged), so the work limit, the incumbents, the bound and the plan are those of one
process: N changes only the wall time.

Workers are forked (the configs and coefficients are the parent's, copied on write) when a
solve first has work for them, and end with it (where a platform cannot fork, the search
solves every config itself). They ignore SIGINT (a terminal's Ctrl-C reaches the whole
process group): the search handles it (deadline.py), stops, and terminates them.
"""
from __future__ import annotations

import heapq
import multiprocessing
import signal
import time
from dataclasses import dataclass, field

from milp_plan import deadline as deadline_mod
from milp_plan.deadline import Deadline
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.predict import SIMULATED

LOOKAHEAD = 64   # heap entries looked at, per dispatch, for configs to solve ahead
QUEUE = 2        # configs handed out per worker at most (one running, one waiting)
MAX_WAIT_S = 600.0   # the search waits this long for a worker's answer at most, then solves it itself

_FORKED = None   # (Prepared, driver._solve_config) of the search a forked worker serves


@dataclass
class Trace:
    """What driver._solve_config did that decides whether its answer is the serial one."""
    statuses: list[str] = field(default_factory=list)   # each backend run's status
    paths: list = field(default_factory=list)           # critical paths learned, in order
    charges: list[float] = field(default_factory=list)  # work charged, in order


def paths_of(coef: Coefficients) -> tuple | None:
    """The known critical paths the config's model reads (simulated step only), as a value."""
    return tuple(coef.paths()) if coef.basis() == SIMULATED else None


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    deadline_mod._active = 0   # the parent's signal routing: backend runs in this thread


def _solve_ahead(cfg, limits, backend, cutoff, hint, seconds, work, seed, paths, lb):
    """In a worker: driver._solve_config of `cfg` as the search would run it now, from the
    bound `lb` the search would hand it (its heap key and full bound: a run closes at a plan
    that close to it, driver._solve_model). Returns (plan, bound, trace), or None when it raised
    (the search then solves it itself, and raises the same)."""
    prep, solve_config = _FORKED
    coef = Coefficients(prep.inst, cfg, prep.shared, prep.fix)
    if paths is not None:
        coef.paths()[:] = list(paths)
    dl, trace = Deadline(seconds, work=work), Trace()
    charge = dl.charge

    def logged(units: float) -> None:
        trace.charges.append(units)
        charge(units)
    dl.charge = logged
    try:
        plan, bound = solve_config(coef, limits, backend, cutoff, hint, dl, seed, lb, trace)
    except Exception:  # noqa: BLE001 - the search's own solve raises it again
        return None
    if dl.expired():
        trace.statuses.append("expired")
    return plan, bound, trace


def smallest(entries: list, k: int):
    """The `k` least entries of the binary heap `entries`, in order (by e[:3], as the search
    pops them), found by walking the heap from its root: O(k log k), not O(len)."""
    if not entries:
        return
    front = [(entries[0][:3], 0)]
    for _ in range(k):
        if not front:
            return
        _, i = heapq.heappop(front)
        yield entries[i]
        for j in (2 * i + 1, 2 * i + 2):
            if j < len(entries):
                heapq.heappush(front, (entries[j][:3], j))


class Ahead:
    """The configs solved ahead by a pool of worker processes, keyed by config."""

    def __init__(self, prepared, limits, backend: str, seed: int, workers: int, solve_config=None):
        """solve_config: driver._solve_config (passed in: this module does not import the driver)."""
        self.prepared, self.limits, self.backend, self.seed = prepared, limits, backend, seed
        self.solve_config = solve_config
        self.size = workers
        self.full: dict = {}      # Config -> its full bound (bounds.full_bound) under these limits
        self.pool = None
        self.pending: dict = {}   # Config -> (inputs, AsyncResult)
        self.running: list = []   # every job not known to be done (taken, dropped or pending)
        self.taken = self.dropped = 0   # answers the search took, and dropped (another cutoff, a limit)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def _busy(self) -> int:
        self.running = [r for r in self.running if not r.ready()]
        return len(self.running)

    def dispatch(self, heap, inputs_of, objective: float, dl: Deadline, rel_eps: float) -> None:
        """Give each idle worker the next config of `heap` the search would solve (kind 0,
        complete, bounds below `objective`), with the inputs `inputs_of(coef)` of now."""
        free = QUEUE * self.size - self._busy()
        if free <= 0 or dl.expired():
            return
        from milp_plan.solvers.bounds import full_bound
        limit = objective * (1 - rel_eps)
        for lb, cfg, kind, coef in smallest(heap.entries, LOOKAHEAD):
            if free <= 0 or lb >= limit:
                break
            if (kind != 0 or not cfg.complete or cfg in self.pending or self.prepared.carried(cfg, self.limits) > lb
                    or self.prepared.too_slow(cfg, self.limits)):
                continue
            full = self.full.get(cfg, False)
            if full is False:
                full = self.full[cfg] = full_bound(coef, self.limits)
            if full is None or full >= limit:
                continue
            inputs = inputs_of(coef)
            cutoff, hint, paths = inputs
            if not self._start():
                return
            work, lb = dl.work_left(), max(lb, full)   # the bound the search's solve would start from
            job = self.pool.apply_async(_solve_ahead, (cfg, self.limits, self.backend, cutoff, hint, dl.left(),
                                                       work, self.seed, paths, lb))
            self.pending[cfg] = ((inputs, lb), job)
            self.running.append(job)
            free -= 1

    def _start(self) -> bool:
        """The pool, forked on first use; False where the platform cannot fork (the search then
        solves every config itself, as with one process)."""
        global _FORKED
        if self.pool is None:
            try:
                context = multiprocessing.get_context("fork")
            except ValueError:
                self.size = 0
                return False
            _FORKED = self.prepared, self.solve_config
            self.pool = context.Pool(self.size, initializer=_init_worker)
        return True

    def take(self, cfg, inputs, dl: Deadline, lb: float):
        """The worker's (plan, bound) for `cfg` when it is what the search's own solve under
        `inputs`, from the bound `lb`, and `dl` would return, its charges replayed on `dl` and its paths learned by
        `learn(path)`'s caller; else None (the search solves it)."""
        got = self.pending.pop(cfg, None)
        if got is None:
            return None
        self.dropped += 1
        if got[0] != (inputs, lb):
            return None
        waited = time.perf_counter()
        while not got[1].ready():
            if dl.expired() or time.perf_counter() - waited > MAX_WAIT_S:
                return None   # (a worker lost, e.g. killed): the search's own solve gives the same answer
            got[1].wait(0.05)
        answer = got[1].get()
        if answer is None:
            return None
        plan, bound, trace = answer
        if any(s not in ("optimal", "closed", "infeasible") for s in trace.statuses):
            return None
        if dl.work_end is not None:
            used = dl.meter.used
            for units in trace.charges:
                used += units
            if used >= dl.work_end:
                return None
        for units in trace.charges:
            dl.charge(units)
        self.taken, self.dropped = self.taken + 1, self.dropped - 1
        return plan, bound, trace.paths
