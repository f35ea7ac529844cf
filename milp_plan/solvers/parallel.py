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
config itself, as with one process, and drops the worker's answer. The search shares its
incumbent with the workers (`Ahead.moved`), and a worker stops a solve whose cutoff it no longer
is (`_stop_when_stale`): its answer would be dropped. A worker's solve runs
every check the search's does (the checker, the drift checks); one that raises is solved
again by the search, which raises the same. The work charged is the
search's alone (a taken answer's charges are replayed in order; dropped ones are not
charged), so the work limit, the incumbents, the bound and the plan are those of one
process: N changes only the wall time.

Free mode's bounding runs ahead too (the bounds are functions of the config and the limits
alone; tests/test_bound_memo.py checks a memoised bound against a fresh one):

- `BoundWorkers.root`: every parent's root bound (driver._cheap_bounds) is computed in the
  workers while the search's own process solves the Megatron-mode start, which does not read
  them; the search then charges and cuts the bounding as if it had computed them. A root
  process then guesses (`_guess`): it bounds its parents, least root bound first (the order
  the search pops them in), until the start ends, under the start's incumbent of the moment
  (at least the search's first: the start's optimum), and the search takes those done as if
  asked ahead (below). On the default (free mode, 2 processes) the
  root bounds took 0.4 s of the start's 1.25 s, and the root process used to idle the rest.
- `BoundWorkers.ahead`: while the search bounds or solves one config, the workers compute the
  full bound (bounds.full_bound) of the next configs of the heap, from the heap key each would
  be popped with, asked for the search's incumbent of then (bounds.full_bound's `enough`:
  exact below it); the search takes a worker's bound when it pops that config at that key.
  For a parent the worker also computes what the search computes around that bound
  (`Opened`): the parent's cheap bound before it, and after it, where it is below the
  incumbent, the parent's children with their bounds (driver.Prepared.open), whose
  coefficients the search makes only when it pops one (Prepared.kid). The search's
  incumbent may have fallen since, never risen, and what it reads is the same from either:
  a bound below its incumbent is exact under both; one at or above it is pruned under both
  (a bound cut at an incumbent reaches it where the exact one does); but a None (no plan)
  under the older incumbent could be a bound at or above the newer one (pruned, where None
  counts as ruled out), so the search reads a None only under the incumbent it was asked
  under, and bounds the config itself otherwise. The children's bounds are the same under
  any incumbent: a complete child's cheap bound reads none, and an open one's GPU-budget bound
  is cut at one only where no limit can make it None (parent_bounds.gpu_budget_bound), so
  they differ at or above the incumbent alone, never popped. A complete config's full bound
  is taken only under the incumbent it was asked under: its few-stage bound's work, which the
  search charges (Coefficients.bound_work), depends on it. A bound that no worker has begun
  when the search pops its config is taken back (`_claim`) and computed by the search itself
  rather than waited for. On mixed-128 (free mode, 2 processes) the parents' bounds ahead took
  the search's own process from 10.1 to 7.1 s of CPU and its wall time from 12.7 to 11.9 s
  (README, "Speed").
- Each config goes to the worker of its samples per micro-batch B (`BoundWorkers.worker`):
  the configs of one B share their stage options, so most of the terms a bound memoises
  (the options' memory fits, their time terms, the recompute pieces). A worker fills its own
  cache: on scale-1024 two workers spent 4.9 s of CPU on the search's 1,908 full bounds by B,
  5.9 s when dealt config by config.

Workers are forked (the configs and coefficients are the parent's, copied on write) when a
solve first has work for them, and end with it (where a platform cannot fork, the search
solves every config itself). They ignore SIGINT (a terminal's Ctrl-C reaches the whole
process group): the search handles it (deadline.py), stops, and terminates them.
"""
from __future__ import annotations

import contextlib
import heapq
import math
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass, field

from milp_plan import deadline as deadline_mod
from milp_plan.deadline import Deadline
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.predict import SIMULATED

LOOKAHEAD = 64   # heap entries looked at, per dispatch, for configs to solve ahead
QUEUE = 2        # configs handed out per worker at most (one running, one waiting)
MAX_WAIT_S = 600.0   # the search waits this long for a worker's answer at most, then solves it itself
STALE_POLL_S = 0.05  # how often a worker's solve ahead reads whether the search's incumbent moved

_FORKED = None   # (Prepared, driver._solve_config, the shared incumbent) of the search a forked worker serves
_BOUNDS = None   # (Prepared, Limits, driver._cheap_bound) of the bounding a forked BoundWorkers process serves
BOUND_QUEUE = 32 # full bounds handed to a BoundWorkers process at most (3-10 ms each at 1024 GPUs)
CLAIM_SLOTS = 4096   # BoundWorkers' claims on the full bounds asked: a ring, far longer than the queues (BOUND_QUEUE)
_CLAIMS = None   # (the claims, their lock) a forked BoundWorkers process shares with the search
GUESSES = 8      # parents a root process bounds per job once its root bounds are done (`_guess`)
_RANKED = None   # in a root process: (root bound, config index) of its parents, least first (`_guess`)
_BAR = None      # (the Megatron-mode start's incumbent objective, shared; the search's REL_EPS) (`_guess`)


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
    prep, solve_config, incumbent = _FORKED
    coef = Coefficients(prep.inst, cfg, prep.shared, prep.fix)
    if paths is not None:
        coef.paths()[:] = list(paths)
    dl, trace = Deadline(seconds, work=work), Trace()
    charge = dl.charge

    def logged(units: float) -> None:
        trace.charges.append(units)
        charge(units)
    dl.charge = logged
    with _stop_when_stale(incumbent, math.inf if cutoff is None else cutoff) as stale:
        try:
            plan, bound = solve_config(coef, limits, backend, cutoff, hint, dl, seed, lb, trace)
        except Exception:  # noqa: BLE001 - the search's own solve raises it again
            return None
    if stale:
        return None   # the search's cutoff moved: it would not take this answer
    if dl.expired():
        trace.statuses.append("expired")
    return plan, bound, trace


@contextlib.contextmanager
def _stop_when_stale(incumbent, cutoff: float):
    """In a worker: stop the solve in the block (deadline.request_stop: its Deadline expires and
    CP-SAT's stop_search is called) once the search's incumbent, shared in `incumbent`, is no
    longer `cutoff`. The search takes an answer only under the cutoff it was solved with
    (Ahead.take), and its incumbent only falls, so the rest of such a solve is wasted: on
    mixed-128 free with --workers 2, one config solved under the Megatron-mode start's cutoff
    ran 21.5 s after the search had found a better plan. Yields a list that holds True when it
    stopped the solve (the worker's stop flag is cleared on the way out)."""
    stale: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(STALE_POLL_S):
            if incumbent.value != cutoff:
                stale.append(True)
                deadline_mod.request_stop()
                return
    watcher = threading.Thread(target=watch, name="milp-plan-stale", daemon=True)
    deadline_mod.reset()
    watcher.start()
    try:
        yield stale
    finally:
        done.set()
        watcher.join()
        deadline_mod.reset()


QUEUED, STARTED, TAKEN_BACK = 0, 1, 2   # a full bound's claim: waiting, begun by its worker, or the search's


def _claim(slot: int, who: int) -> bool:
    """Claim the full bound of claim `slot` for `who` (STARTED: its worker; TAKEN_BACK: the
    search), where nobody has yet: whichever comes first computes it. False too where the lock
    is not had within a second (a worker killed holding it): the worker then does not start it
    and the search waits for its answer, None, and bounds it itself."""
    claims, lock = _CLAIMS
    if not lock.acquire(timeout=1.0):
        return False
    try:
        if claims[slot] != QUEUED:
            return False
        claims[slot] = who
        return True
    finally:
        lock.release()


@dataclass
class Opened:
    """A config's bounds from a BoundWorkers process (`_bounds`), as the search computes them
    (driver._solve), asked under the search's incumbent of then (`budget_enough`)."""
    budget_enough: float           # the incumbent (a guess: the start's), or inf in a sweep: what every bound here reads
    cheap: float | None            # a parent's bounds.config_lower_bound without the memory rooms
    full: float | None             # bounds.full_bound; `cheap` where that reaches `enough` (or is None)
    kids: list | None = None       # Prepared.open's (config, bound) of each child, where `full` is below `enough`
    work: float = 0.0              # Coefficients.bound_work after the full bound (a complete config's few-stage bound)


def _full_bound(cfg, floor, enough, budget_enough, slot):
    """In a BoundWorkers process: the config `cfg`'s Opened (`_bounds`, its full bound from
    `floor`), or None when it raised (the search then bounds it itself, and raises the same).
    None without a start where the search has taken it back (claim `slot`: BoundWorkers.take)."""
    if not _claim(slot, STARTED):
        return None   # the search took it back (BoundWorkers.take) and bounds it itself
    prep = _BOUNDS[0]
    try:
        return _bounds(Coefficients(prep.inst, cfg, prep.shared, prep.fix), floor, enough, budget_enough)
    except Exception:  # noqa: BLE001 - the search's own bound raises it again
        return None


def _bounds(coef: Coefficients, floor: float, enough: float, budget_enough: float) -> Opened:
    """A config's Opened as the search computes it (driver._solve). A complete config: its full
    bound from `floor` and the work it charges. A parent: its cheap bound, then its full bound,
    not where the cheap one reaches `enough` (the search, whose incumbent is no larger, prunes
    it by that bound before it reads a full one, so the answer is the cheap one); where the
    full bound is below `enough` the search opens the parent: then also its children with their
    bounds."""
    from milp_plan.solvers.bounds import config_lower_bound, full_bound
    prep, limits, _ = _BOUNDS
    if coef.cfg.complete:
        full = full_bound(coef, limits, floor, enough)
        return Opened(budget_enough, None, full, work=coef.bound_work)
    cheap = config_lower_bound(coef, limits, memory=False, enough=enough)
    if cheap is None or cheap >= enough:
        return Opened(budget_enough, cheap, cheap)
    full = full_bound(coef, limits, floor, enough)
    if full is None or full >= enough:
        return Opened(budget_enough, cheap, full)
    return Opened(budget_enough, cheap, full, [(kid.cfg, lb) for kid, lb in prep.open(coef, limits, budget_enough)])


def _root_bounds(indices: list[int]):
    """In a BoundWorkers process: the root bound of each config `indices` names (by its index
    in the Prepared), or None when one raised. Its parents, least root bound first, are left
    for the guesses that follow (`_guess`)."""
    global _RANKED
    prep, limits, bound = _BOUNDS
    try:
        got = [bound(prep.coef(i), limits) for i in indices]
    except Exception:  # noqa: BLE001 - the search's own bound raises it again
        return None
    _RANKED = sorted((lb, i) for lb, i in zip(got, indices) if lb is not None and not prep.configs[i].complete)
    return got


def _guess(part: int):
    """In a BoundWorkers process, after its root bounds (`_root_bounds`, the job before): the
    Opened of its parents ranked part x GUESSES on by root bound (the first the search pops),
    as [(config index, root bound, Opened)]; None where one raised. They use a root process's
    idle time while the search's own solves the Megatron-mode start (BoundWorkers.root), so
    the search's incumbent is not known yet: each is asked under the start's incumbent of then
    (`_BAR`, inf before its first plan: exact bounds), which is at least the search's first
    (the start's optimum), so that the search reads of them what it reads of its own
    (driver._solve)."""
    if _RANKED is None:
        return None
    prep = _BOUNDS[0]
    bar, rel_eps = _BAR
    out = []
    try:
        for lb, i in _RANKED[part * GUESSES:(part + 1) * GUESSES]:
            incumbent = bar.value
            out.append((i, lb, _bounds(prep.coef(i), lb, incumbent * (1 - rel_eps), incumbent)))
    except Exception:  # noqa: BLE001 - the search's own bound raises it again
        return None
    return out


def _wait(job, dl: Deadline):
    """The job's answer, or None where the deadline or MAX_WAIT_S came first."""
    waited = time.perf_counter()
    while not job.ready():
        if dl.expired() or time.perf_counter() - waited > MAX_WAIT_S:
            return None   # (a worker lost, e.g. killed): the search's own work gives the same answer
        job.wait(0.05)
    return _answer(job)


def _answer(job):
    """A finished job's answer, or None where it failed on its way (a worker's own failures
    answer None: the search then does the work itself, and raises what it raised)."""
    try:
        return job.get()
    except Exception:  # noqa: BLE001
        return None


def _fork_pool(processes: int):
    """A pool of forked workers, or None where the platform cannot fork."""
    try:
        context = multiprocessing.get_context("fork")
    except ValueError:
        return None
    return context.Pool(processes, initializer=_init_worker)


class BoundWorkers:
    """Free mode's bounds computed ahead by forked processes, each config in the process of its
    samples per micro-batch (module docstring): the root bounds (`root`, `root_bounds`) and the
    next parents' full bounds (`ahead`, `take`)."""

    def __init__(self, prepared, limits, processes: int, root_bound, rel_eps: float):
        """root_bound: driver._cheap_bound, rel_eps: driver.REL_EPS (passed in: this module does
        not import the driver)."""
        self.prepared, self.limits, self.root_bound, self.rel_eps = prepared, limits, root_bound, rel_eps
        self.size = processes
        self.pools: list = []                   # the full bounds' workers, forked on first use
        self.forked = False
        self.of_samples: dict[int, int] = {}   # B -> its worker, in order of first sight
        self.asked: dict = {}                   # Config -> (floor, AsyncResult)
        self.running: list[list] = []
        self.roots: list = []                   # (indices, AsyncResult, pool)
        self.guesses: list = []                 # the root processes' `_guess` jobs, in order
        self.guessed: dict = {}                 # Config -> (root bound, Opened) of the guesses done in time
        self.taken = 0                          # full bounds the search took (asked ahead or guessed)
        self.slots = 0                          # full bounds asked (their claims: slots % CLAIM_SLOTS)

    def _fork(self, processes: int) -> list:
        """`processes` pools of one forked process each ([] where the platform cannot fork)."""
        global _BOUNDS, _CLAIMS, _BAR
        _BOUNDS = self.prepared, self.limits, self.root_bound
        if _BAR is None:
            _BAR = multiprocessing.RawValue("d", math.inf), self.rel_eps
        if _CLAIMS is None:   # shared memory and a lock the forks inherit
            _CLAIMS = multiprocessing.RawArray("b", CLAIM_SLOTS), multiprocessing.Lock()
        pools = [_fork_pool(1) for _ in range(processes)]
        if any(p is None for p in pools):
            _close(pools)
            return []
        return pools

    def worker(self, cfg) -> int:
        return self.of_samples.setdefault(cfg.samples, len(self.of_samples) % self.size)

    def root(self, configs: list, indices: list[int]) -> None:
        """Start the root bounds of configs[i] for i in `indices`, in size - 1 processes forked
        now, beside the search's own (the Megatron-mode start). The full bounds' are forked
        later, when they inherit what the search's process has memoised by then."""
        n = max(1, self.size - 1)
        mine: list[list[int]] = [[] for _ in range(n)]
        by_samples: dict[int, int] = {}
        for i in indices:
            mine[by_samples.setdefault(configs[i].samples, len(by_samples) % n)].append(i)
        pools = self._fork(n)
        self.roots = [(ix, pool.apply_async(_root_bounds, (ix,)), pool) for ix, pool in zip(mine, pools) if ix]
        # then each process's parents, least root bound first, until the search needs the bounds
        # (root_bounds: those done go to the search, the rest are dropped)
        for ix, _, pool in self.roots:
            parents = sum(not configs[i].complete for i in ix)
            self.guesses += [pool.apply_async(_guess, (part,)) for part in range(-(-parents // GUESSES))]

    def bar(self, objective: float) -> None:
        """The Megatron-mode start's better incumbent `objective`, for the guesses (`_guess`)."""
        if _BAR is not None:
            _BAR[0].value = objective

    def root_bounds(self, dl: Deadline) -> dict[int, float | None]:
        """Config index -> its root bound, of the workers done when all are or `dl` expires (the
        search bounds the rest itself, or stops bounding); their processes end."""
        while not all(job.ready() for _, job, _ in self.roots) and not dl.expired():
            next(job for _, job, _ in self.roots if not job.ready()).wait(0.05)
        out: dict[int, float | None] = {}
        for ix, job, _ in self.roots:
            got = _answer(job) if job.ready() else None
            if got is not None:
                out.update(zip(ix, got))
        for job in self.guesses:
            for i, lb, opened in (_answer(job) if job.ready() else None) or ():
                self.guessed[self.prepared.configs[i]] = lb, opened
        _close([pool for _, _, pool in self.roots])
        self.roots, self.guesses = [], []
        return out

    def ahead(self, heap, enough: float, dl: Deadline, lifted, budget_enough: float, known) -> None:
        """Hand each worker, up to BOUND_QUEUE, the next configs of `heap` the search would
        full-bound (kind 0 below `enough`: the incumbent less REL_EPS, or inf in a sweep; a
        parent in `lifted`, its GPU-budget bound read; a complete config not in `known`, whose
        full bound the search has), each from its heap key and asked for `enough`
        (bounds.full_bound: exact below it). The search's `enough` when it takes one is no
        larger (its incumbent only falls), so it reads the same of it: the exact bound below its
        own, a bound at least its own where the exact one is (driver._solve)."""
        if not self.forked:
            self.pools, self.forked = self._fork(self.size), True
            self.running = [[] for _ in self.pools]
        if not self.pools or dl.expired():
            return
        for w, jobs in enumerate(self.running):
            self.running[w] = [j for j in jobs if not j.ready()]
        if all(len(jobs) > BOUND_QUEUE // 2 for jobs in self.running):
            return   # every worker has work: the heap is walked again once one has half
        for lb, cfg, kind, _ in smallest(heap.entries, LOOKAHEAD):
            if lb >= enough:
                break
            if kind != 0 or cfg in self.asked or cfg in self.guessed or (cfg in known if cfg.complete else
                                                                         cfg not in lifted):
                continue
            w = self.worker(cfg)
            if len(self.running[w]) >= BOUND_QUEUE:
                continue
            slot = self.slots % CLAIM_SLOTS
            self.slots += 1
            _CLAIMS[0][slot] = QUEUED
            job = self.pools[w].apply_async(_full_bound, (cfg, lb, enough, budget_enough, slot))
            self.asked[cfg] = (lb, job, slot)
            self.running[w].append(job)

    def take(self, cfg, floor: float, dl: Deadline) -> Opened | None:
        """The bounds of `cfg` (its full bound from `floor`) where a root process guessed them
        (`root`) or a worker was asked for them (`ahead`) and has begun, else None (the search
        bounds it itself)."""
        guess = self.guessed.pop(cfg, None)
        if guess is not None and guess[0] == floor and guess[1] is not None:
            self.taken += 1
            return guess[1]
        got = self.asked.pop(cfg, None)
        if got is None or got[0] != floor or _claim(got[2], TAKEN_BACK):
            return None   # not asked, or asked and not begun: the search's own bound is as soon
        answer = _wait(got[1], dl)
        self.taken += answer is not None
        return answer

    def close(self) -> None:
        global _BOUNDS, _CLAIMS, _BAR
        _close(self.pools + [pool for _, _, pool in self.roots])
        self.pools, self.roots = [], []
        _BOUNDS = _CLAIMS = _BAR = None   # the search's configs and caches are freed with it, not at exit


def _close(pools: list) -> None:
    for pool in pools:
        if pool is not None:
            pool.terminate()
            pool.join()


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
        self.incumbent = None     # the search's incumbent objective, shared with the workers (inf: none)
        self.running: list = []   # every job not known to be done (taken, dropped or pending)
        self.taken = self.dropped = 0   # answers the search took, and dropped (another cutoff, a limit)

    def close(self) -> None:
        global _FORKED
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None
            _FORKED = None   # the search's configs and caches are freed with it, not at exit

    def moved(self, objective: float) -> None:
        """The search's incumbent is now `objective`: the workers stop the solves they run under
        another cutoff (_stop_when_stale), whose answers the search would not take."""
        if self.incumbent is not None:
            self.incumbent.value = objective

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
            if coef is None:   # a child a worker opened: its coefficients made now (Prepared.kid)
                coef = self.prepared.kid(cfg)
            full = self.full.get(cfg, False)
            if full is False:   # exact below the limit, which only falls: all a later call reads of it
                full = self.full[cfg] = full_bound(coef, self.limits, enough=limit)
            if full is None or full >= limit:
                continue
            inputs = inputs_of(coef)
            cutoff, hint, paths = inputs
            if not self._start():
                return
            self.moved(objective)   # the job's cutoff (inf: no incumbent yet), for its watcher
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
            self.incumbent = multiprocessing.RawValue("d", math.inf)   # shared memory the fork inherits
            _FORKED = self.prepared, self.solve_config, self.incumbent
            self.pool = _fork_pool(self.size)
            if self.pool is None:
                self.size = 0
                return False
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
        answer = _wait(got[1], dl)
        if answer is None:
            return None
        plan, bound, trace = answer
        if any(s not in ("optimal", "closed", "stopped", "infeasible", "probed") for s in trace.statuses):
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
