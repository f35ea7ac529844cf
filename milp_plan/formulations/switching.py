"""Hot switching between strategies across sequence-length buckets (HotSPa, SOSP'24): which
strategy runs each bucket of a step, exactly (formulations/switching.md).

Data (`SwitchingProblem`), all times in seconds:

  buckets b = 0..B-1   in the order a step runs them (HotSPa: longest first); the step is a
                       cycle, so after the last bucket the next step's first bucket follows
  strategies k         layouts over all the cluster's GPUs (dp, tp, pp, ...)
  time[b][k]           running bucket b's sequences under k, pipeline fill excluded
                       (None: k cannot run b, e.g. b's rows do not fit k's memory)
  fill[b][k]           k's pipeline fill and drain at b's row length; a strategy runs its
                       buckets as one run (contiguity) and pays one fill, the largest of them
  switch[k][k2]        moving parameters and gradient accumulators from layout k to k2
                       (0 on the diagonal)
  home_time[h]         the gradient reduction and optimizer step, run once a step in the home
                       layout h, one of the used layouts (HotSPa: the longest bucket's), where
                       the optimizer state lives (default 0)
  room[b][k][h]        optional: k running bucket b leaves room for home h's optimizer state
                       (None: always)

Step time T = sum_b time[b][x_b] + sum_k F_k + sum over the cycle's transitions of
switch[x_b][x_{b+1}] (the last bucket to the first once: the next step starts over)
+ home_time[h], with F_k = max{fill[b][k] : x_b = k} (0 for an unused k).

The model (one function per constraint family, the names of switching.md) is an integer
program on integer ticks: every coefficient is rounded down to TICK_S, so its optimum is a
lower bound on the true optimum; the assignment it returns is evaluated exactly in seconds
(`step_time`) and the gap between the two is reported (at most the rounding of the terms it
sums: B + K + B + 1 ticks). `brute_force` enumerates every assignment (small instances) and is
the cross-check.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from milp_plan.errors import InputError
from milp_plan.result import PROOF_TOL, relative_gap

TICK_S = 1e-6   # the model's time unit


@dataclass(frozen=True)
class SwitchingProblem:
    time: tuple[tuple[float | None, ...], ...]      # [bucket][strategy]
    fill: tuple[tuple[float, ...], ...]             # [bucket][strategy]
    switch: tuple[tuple[float, ...], ...]           # [strategy][strategy]
    room: tuple[tuple[tuple[bool, ...], ...], ...] | None = None  # [bucket][strategy][home]
    home_time: tuple[float, ...] | None = None      # [strategy]: once a step, in the home layout

    def __post_init__(self) -> None:
        B, K = len(self.time), len(self.switch)
        if B < 1 or K < 1:
            raise InputError("a switching problem needs at least one bucket and one strategy", field="buckets")
        for rows, what in ((self.time, "time"), (self.fill, "fill")):
            if len(rows) != B or any(len(r) != K for r in rows):
                raise InputError(f"{what} must be buckets x strategies ({B} x {K})", field=what)
        if any(len(r) != K for r in self.switch) or any(self.switch[k][k] != 0 for k in range(K)):
            raise InputError("switch must be strategies x strategies with 0 on the diagonal", field="switch")
        if self.room is not None and (len(self.room) != B or any(len(r) != K or any(len(c) != K for c in r)
                                                                  for r in self.room)):
            raise InputError(f"room must be buckets x strategies x strategies ({B} x {K} x {K})", field="room")
        if self.home_time is not None and len(self.home_time) != K:
            raise InputError(f"home_time must have one entry a strategy ({K})", field="home_time")

    @property
    def buckets(self) -> int:
        return len(self.time)

    @property
    def strategies(self) -> int:
        return len(self.switch)


@dataclass(frozen=True)
class Switching:
    """An answer: the strategy of each bucket, the home layout (or None), the step time (exact,
    seconds), the proven lower bound and the status (optimal | infeasible)."""
    assignment: tuple[int, ...] | None
    home: int | None
    step_time_s: float | None
    bound_s: float | None
    status: str

    @property
    def switches(self) -> int:
        a = self.assignment or ()
        return sum(a[b] != a[(b + 1) % len(a)] for b in range(len(a))) if len(a) > 1 else 0


# ---- the exact value of an assignment ------------------------------------------------
def step_time(p: SwitchingProblem, assignment: Sequence[int], home: int | None = None) -> float | None:
    """T of an assignment and home (None when a bucket's strategy cannot run it): bucket
    times, each used strategy's largest fill, the switches around the cycle and the home's
    once-a-step time."""
    B = p.buckets
    if any(p.time[b][k] is None for b, k in enumerate(assignment)):
        return None
    total = sum(p.time[b][k] for b, k in enumerate(assignment))
    if p.home_time is not None and home is not None:
        total += p.home_time[home]
    for k in set(assignment):
        total += max(p.fill[b][k] for b in range(B) if assignment[b] == k)
    if B > 1:
        total += sum(p.switch[assignment[b]][assignment[(b + 1) % B]] for b in range(B))
    return total


def feasible(p: SwitchingProblem, assignment: Sequence[int], home: int | None) -> bool:
    """Runs (every bucket's strategy can run it), leaves room for the home's optimizer state,
    and gives each strategy one run of consecutive buckets around the cycle."""
    if any(p.time[b][k] is None for b, k in enumerate(assignment)) or home not in set(assignment):
        return False
    if p.room is not None and not all(p.room[b][k][home] for b, k in enumerate(assignment)):
        return False
    if len(assignment) > 1:
        entries = [assignment[b] for b in range(len(assignment)) if assignment[b] != assignment[b - 1]]
        if len(entries) != len(set(entries)):
            return False
    return True


def brute_force(p: SwitchingProblem) -> Switching:
    """Every assignment (and home): K^B x K evaluations; the least T, ties to the first."""
    best = None
    for assignment in itertools.product(range(p.strategies), repeat=p.buckets):
        for home in sorted(set(assignment)):
            if feasible(p, assignment, home):
                t = step_time(p, assignment, home)
                if best is None or t < best[0]:
                    best = (t, assignment, home)
    if best is None:
        return Switching(None, None, None, None, "infeasible")
    return Switching(best[1], best[2], best[0], best[0], "optimal")


# ---- the integer model ---------------------------------------------------------------
def _ticks(seconds: float) -> int:
    return math.floor(seconds / TICK_S)


class SwitchingModel:
    """x[b,k]: bucket b runs strategy k; u[k]: k runs some bucket; F[k]: k's fill (ticks);
    y[b,k,k2]: the transition after bucket b goes from k to k2 (k != k2); h[k]: k is home."""

    def __init__(self, p: SwitchingProblem, be) -> None:
        self.p, self.be = p, be
        B, K = p.buckets, p.strategies
        self.x = {(b, k): be.new_bool(f"x[{b},{k}]") for b in range(B) for k in range(K)}
        self.u = {k: be.new_bool(f"u[{k}]") for k in range(K)}
        top = max([_ticks(f) for row in p.fill for f in row] + [0])
        self.F = {k: be.new_int(0, top, f"F[{k}]") for k in range(K)}
        self.y = {(b, k, k2): be.new_bool(f"y[{b},{k},{k2}]")
                  for b in range(B if B > 1 else 0) for k in range(K) for k2 in range(K) if k != k2}
        self.h = {k: be.new_bool(f"h[{k}]") for k in range(K)}

    def build(self) -> None:
        self.add_assignment()
        self.add_runs()
        self.add_fill()
        self.add_switches()
        self.add_home_memory()
        self.add_contiguity()
        self.add_objective()

    def add_assignment(self) -> None:
        """assignment: every bucket runs exactly one strategy, one that can run it."""
        p, be = self.p, self.be
        for b in range(p.buckets):
            be.add(be.sum([self.x[b, k] for k in range(p.strategies)]) == 1)
            for k in range(p.strategies):
                if p.time[b][k] is None:
                    be.add(self.x[b, k] == 0)

    def add_runs(self) -> None:
        """runs: u[k] = 1 exactly when k runs a bucket: u[k] >= x[b,k], u[k] <= sum_b x[b,k]."""
        for (b, k), x in self.x.items():
            self.be.add(self.u[k] >= x)
        for k, u in self.u.items():
            self.be.add(u <= self.be.sum([self.x[b, k] for b in range(self.p.buckets)]))

    def add_fill(self) -> None:
        """fill: F[k] >= fill[b][k] x[b,k]: a strategy's fill is that of its longest bucket."""
        for (b, k), x in self.x.items():
            self.be.add(self.F[k] >= _ticks(self.p.fill[b][k]) * x)

    def add_switches(self) -> None:
        """switches: y[b,k,k2] >= x[b,k] + x[b+1,k2] - 1 around the cycle (b+1 of the last
        bucket is the first: the next step's)."""
        B = self.p.buckets
        for (b, k, k2), y in self.y.items():
            self.be.add(y >= self.x[b, k] + self.x[(b + 1) % B, k2] - 1)

    def add_home_memory(self) -> None:
        """home_memory: one of the used layouts is home (sum h = 1, h[k] <= u[k]); a bucket
        runs on k only where k leaves room for the home's optimizer state:
        x[b,k] + h[k2] <= 1 where room[b][k][k2] is false."""
        p, be = self.p, self.be
        be.add(be.sum(list(self.h.values())) == 1)
        for k, h in self.h.items():
            be.add(h <= self.u[k])
        if p.room is None:
            return
        for (b, k), x in self.x.items():
            for k2 in range(p.strategies):
                if not p.room[b][k][k2]:
                    be.add(x + self.h[k2] <= 1)

    def add_contiguity(self) -> None:
        """contiguity: a strategy enters the cycle at most once, so it runs one run of
        consecutive buckets and its one fill F[k] is exact: sum_b sum_{k2 != k} y[b,k2,k] <= 1."""
        p, be = self.p, self.be
        if p.buckets < 2:
            return
        for k in range(p.strategies):
            be.add(be.sum([self.y[b, k2, k] for b in range(p.buckets) for k2 in range(p.strategies)
                           if k2 != k]) <= 1)

    def add_objective(self) -> None:
        """T = sum time x + sum F + sum switch y + sum home_time h (ticks, each rounded down)."""
        p, be = self.p, self.be
        terms = [_ticks(p.time[b][k]) * x for (b, k), x in self.x.items() if p.time[b][k] is not None]
        terms += list(self.F.values())
        terms += [_ticks(p.switch[k][k2]) * y for (b, k, k2), y in self.y.items() if p.switch[k][k2] > 0]
        if p.home_time is not None:
            terms += [_ticks(p.home_time[k]) * h for k, h in self.h.items()]
        be.minimize(be.sum(terms))

    def extract(self, value) -> tuple[tuple[int, ...], int | None]:
        p = self.p
        assignment = tuple(next(k for k in range(p.strategies) if value(self.x[b, k]) > 0.5)
                           for b in range(p.buckets))
        home = next((k for k in self.h if value(self.h[k]) > 0.5), None)
        return assignment, home


def solve(p: SwitchingProblem, backend: str = "cpsat", time_limit_s: float = 60.0, seed: int = 1) -> Switching:
    """The least-T assignment, proven: the model's optimum is a lower bound (rounded-down
    coefficients), the returned assignment's exact T is within PROOF_TOL of it, or the status
    says how far (feasible)."""
    from milp_plan.solvers.backends import make_backend
    be = make_backend(backend)
    model = SwitchingModel(p, be)
    model.build()
    run = be.solve(time_limit_s, seed)
    if run.status == "infeasible":
        return Switching(None, None, None, None, "infeasible")
    if run.status == "timeout":
        return Switching(None, None, None, None, "timeout")
    assignment, home = model.extract(run.value)
    t = step_time(p, assignment, home)
    bound = run.bound * TICK_S
    status = "optimal" if run.status == "optimal" and relative_gap(t, bound) <= PROOF_TOL else "feasible"
    return Switching(assignment, home, t, bound, status)
