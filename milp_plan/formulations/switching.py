"""Hot switching between strategies across sequence-length buckets (HotSPa, SOSP'24): which
strategy runs each bucket of a step, and optionally where the bucket edges lie, exactly
(formulations/switching.md).

Data (`SwitchingProblem`), all times in seconds:

  bins b = 0..B-1      the finest length buckets, in the order a step runs them (shortest
                       first); the step is a cycle: after the last bin the next step's first
  items r              the buckets the model may form: each a range of consecutive bins
                       (`ranges[r]` = (first, last)); by default item b is bin b alone (edges
                       fixed). With ranges of several bins the model chooses the edges: it
                       picks items that cover every bin once (a merged item pads its
                       sequences to its longest bin's edge)
  strategies k         layouts over all the cluster's GPUs (dp, tp, pp, ...)
  time[r][k]           running item r's sequences under k, pipeline fill excluded
                       (None: k cannot run r, e.g. r's rows do not fit k's memory)
  fill[r][k]           k's pipeline fill and drain at r's row length
  switch[k][k2]        moving parameters and gradient accumulators from layout k to k2
                       (0 on the diagonal)
  home_time[h]         the gradient reduction and optimizer step, run once a step in the home
                       layout h, one of the used layouts (HotSPa: the longest bucket's), where
                       the optimizer state lives (default 0)
  room[r][k][h]        optional: k running item r leaves room for home h's optimizer state
                       (None: always)

A strategy's items form one run around the cycle (contiguity). The step's optimizer barrier
cuts that cycle between the last bin and the first, so a run through the wrap is two
segments of the step, each draining its pipeline: a segment (a maximal run of one strategy
in bin order 0..B-1) pays one fill, the largest of its items'.

Step time T = sum over chosen items of time[r][k_r] + sum over segments of their fill + sum
over the cycle's transitions of switch[k_b][k_{b+1}] (the last bin to the first once: the
next step starts over) + home_time[h].

The model (one function per constraint family, the names of switching.md) is an integer
program on integer ticks: every coefficient is rounded down to TICK_S, so its optimum is a
lower bound on the true optimum; the answer it returns is evaluated exactly in seconds
(`step_time`) and `optimal` is reported only within PROOF_TOL. `brute_force` enumerates every
choice of items, assignment and home (small instances) and is the cross-check.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from milp_plan.errors import InputError
from milp_plan.plan import one_run_each, segments, transitions
from milp_plan.result import PROOF_TOL, relative_gap

TICK_S = 1e-6   # the model's time unit


@dataclass(frozen=True)
class SwitchingProblem:
    time: tuple[tuple[float | None, ...], ...]      # [item][strategy]
    fill: tuple[tuple[float, ...], ...]             # [item][strategy]
    switch: tuple[tuple[float, ...], ...]           # [strategy][strategy]
    room: tuple[tuple[tuple[bool, ...], ...], ...] | None = None  # [item][strategy][home]
    home_time: tuple[float, ...] | None = None      # [strategy]: once a step, in the home layout
    ranges: tuple[tuple[int, int], ...] | None = None  # [item]: (first bin, last bin); None: item b = bin b

    def __post_init__(self) -> None:
        R, K = len(self.time), len(self.switch)
        if R < 1 or K < 1:
            raise InputError("a switching problem needs at least one bucket and one strategy", field="buckets")
        for rows, what in ((self.time, "time"), (self.fill, "fill")):
            if len(rows) != R or any(len(r) != K for r in rows):
                raise InputError(f"{what} must be buckets x strategies ({R} x {K})", field=what)
        if any(len(r) != K for r in self.switch) or any(self.switch[k][k] != 0 for k in range(K)):
            raise InputError("switch must be strategies x strategies with 0 on the diagonal", field="switch")
        if self.room is not None and (len(self.room) != R or any(len(r) != K or any(len(c) != K for c in r)
                                                                  for r in self.room)):
            raise InputError(f"room must be buckets x strategies x strategies ({R} x {K} x {K})", field="room")
        if self.home_time is not None and len(self.home_time) != K:
            raise InputError(f"home_time must have one entry a strategy ({K})", field="home_time")
        if self.ranges is not None:
            if len(self.ranges) != R or any(not 0 <= a <= b for a, b in self.ranges):
                raise InputError(f"ranges must give (first bin, last bin) for each of the {R} items", field="ranges")
            covered = {b for a, z in self.ranges for b in range(a, z + 1)}
            if covered != set(range(self.buckets)):
                raise InputError("every bin must lie in some item's range", field="ranges")

    @property
    def buckets(self) -> int:
        """Bins: the finest buckets."""
        return len(self.time) if self.ranges is None else max(z for _, z in self.ranges) + 1

    @property
    def items(self) -> int:
        return len(self.time)

    @property
    def item_ranges(self) -> tuple[tuple[int, int], ...]:
        return self.ranges if self.ranges is not None else tuple((b, b) for b in range(self.items))

    @property
    def strategies(self) -> int:
        return len(self.switch)

    def singletons(self) -> tuple[int, ...]:
        """The items of one bin each, in bin order (the fixed-edge partition), or () if a bin has none."""
        one = {a: r for r, (a, z) in enumerate(self.item_ranges) if a == z}
        return tuple(one[b] for b in range(self.buckets)) if len(one) == self.buckets else ()


@dataclass(frozen=True)
class Switching:
    """An answer: the strategy of each bin, the chosen items (the buckets, in bin order), the
    home layout (or None), the step time (exact, seconds), the proven lower bound and the
    status (optimal | feasible | infeasible | timeout)."""
    assignment: tuple[int, ...] | None
    home: int | None
    step_time_s: float | None
    bound_s: float | None
    status: str
    items: tuple[int, ...] | None = None

    @property
    def switches(self) -> int:
        return len(transitions(self.assignment or ()))


# ---- the exact value of an answer ---------------------------------------------------
def _items_of(p: SwitchingProblem, items: Sequence[int] | None) -> tuple[int, ...] | None:
    """The chosen items (default: one per bin), or None when they do not cover the bins
    once, in order."""
    items = tuple(items) if items is not None else p.singletons()
    nxt = 0
    for r in items:
        a, z = p.item_ranges[r]
        if a != nxt:
            return None
        nxt = z + 1
    return items if items and nxt == p.buckets else None


def step_time(p: SwitchingProblem, assignment: Sequence[int], home: int | None = None,
              items: Sequence[int] | None = None) -> float | None:
    """T of an answer (None when a chosen item's strategy cannot run it, or the items do not
    cover the bins): item times, each segment's largest fill, the switches around the cycle
    and the home's once-a-step time."""
    chosen = _items_of(p, items)
    if chosen is None or len(assignment) != p.buckets:
        return None
    ranges = p.item_ranges
    kof = {r: assignment[ranges[r][0]] for r in chosen}
    if any(p.time[r][k] is None or any(assignment[b] != k for b in range(ranges[r][0], ranges[r][1] + 1))
           for r, k in kof.items()):
        return None
    total = sum(p.time[r][k] for r, k in kof.items())
    if p.home_time is not None and home is not None:
        total += p.home_time[home]
    for fill in segment_fills(p, assignment, chosen):
        total += fill
    return total + sum(p.switch[a][b] for _, a, b in transitions(assignment))


def segment_fills(p: SwitchingProblem, assignment: Sequence[int], chosen: Sequence[int]) -> list[float]:
    """The fill each segment (plan.segments) pays: its largest chosen item's."""
    ranges = p.item_ranges
    return [max(p.fill[r][assignment[ranges[r][0]]] for r in chosen if a <= ranges[r][0] <= z)
            for a, z in segments(assignment)]


def feasible(p: SwitchingProblem, assignment: Sequence[int], home: int | None,
             items: Sequence[int] | None = None) -> bool:
    """Runs (every chosen item's strategy can run it), leaves room for the home's optimizer
    state, and gives each strategy one run of consecutive bins around the cycle."""
    chosen = _items_of(p, items)
    if chosen is None or step_time(p, assignment, home, chosen) is None or home not in set(assignment):
        return False
    if p.room is not None and not all(p.room[r][assignment[p.item_ranges[r][0]]][home] for r in chosen):
        return False
    return one_run_each(assignment)


def partitions(p: SwitchingProblem) -> list[tuple[int, ...]]:
    """Every choice of items that covers the bins once, in order."""
    starts: dict[int, list[int]] = {}
    for r, (a, _) in enumerate(p.item_ranges):
        starts.setdefault(a, []).append(r)

    def from_bin(b: int) -> list[tuple[int, ...]]:
        if b == p.buckets:
            return [()]
        return [(r,) + rest for r in starts.get(b, ()) for rest in from_bin(p.item_ranges[r][1] + 1)]
    return from_bin(0)


def brute_force(p: SwitchingProblem) -> Switching:
    """Every choice of items, strategy per item and home: the least T, ties to the first."""
    best = None
    ranges = p.item_ranges
    for chosen in partitions(p):
        for per_item in itertools.product(range(p.strategies), repeat=len(chosen)):
            assignment = [0] * p.buckets
            for r, k in zip(chosen, per_item):
                for b in range(ranges[r][0], ranges[r][1] + 1):
                    assignment[b] = k
            for home in sorted(set(per_item)):
                if feasible(p, assignment, home, chosen):
                    t = step_time(p, assignment, home, chosen)
                    if best is None or t < best[0]:
                        best = (t, tuple(assignment), home, chosen)
    if best is None:
        return Switching(None, None, None, None, "infeasible")
    return Switching(best[1], best[2], best[0], best[0], "optimal", best[3])


# ---- the integer model ---------------------------------------------------------------
def _ticks(seconds: float) -> int:
    return math.floor(seconds / TICK_S)


class SwitchingModel:
    """z[r,k]: item r is chosen and runs k; x[b,k]: bin b runs k; u[k]: k runs some bin;
    g[b,k]: bin b lies in k's head segment (the run from bin 0); H[k], F[k]: the fills of k's
    head segment and of its other segment (ticks); y[b,k,k2]: the transition after bin b goes
    from k to k2 (k != k2); h[k]: k is home."""

    def __init__(self, p: SwitchingProblem, be) -> None:
        self.p, self.be = p, be
        B, K = p.buckets, p.strategies
        self.z = {(r, k): be.new_bool(f"z[{r},{k}]") for r in range(p.items) for k in range(K)}
        self.x = {(b, k): be.new_bool(f"x[{b},{k}]") for b in range(B) for k in range(K)}
        self.u = {k: be.new_bool(f"u[{k}]") for k in range(K)}
        self.g = {(b, k): be.new_bool(f"g[{b},{k}]") for b in range(B) for k in range(K)}
        top = max([_ticks(f) for row in p.fill for f in row] + [0])
        self.H = {k: be.new_int(0, top, f"H[{k}]") for k in range(K)}
        self.F = {k: be.new_int(0, top, f"F[{k}]") for k in range(K)}
        self.y = {(b, k, k2): be.new_bool(f"y[{b},{k},{k2}]")
                  for b in range(B if B > 1 else 0) for k in range(K) for k2 in range(K) if k != k2}
        self.h = {k: be.new_bool(f"h[{k}]") for k in range(K)}

    def build(self) -> None:
        self.add_edges()
        self.add_assignment()
        self.add_runs()
        self.add_fill()
        self.add_switches()
        self.add_home_memory()
        self.add_contiguity()
        self.add_objective()

    def add_edges(self) -> None:
        """edges: the chosen items cover every bin once, sum_{r ni b} sum_k z[r,k] = 1, and a bin
        runs its item's strategy, x[b,k] = sum_{r ni b} z[r,k]."""
        p, be = self.p, self.be
        for b in range(p.buckets):
            inside = [r for r, (a, z) in enumerate(p.item_ranges) if a <= b <= z]
            be.add(be.sum([self.z[r, k] for r in inside for k in range(p.strategies)]) == 1)
            for k in range(p.strategies):
                be.add(self.x[b, k] == be.sum([self.z[r, k] for r in inside]))

    def add_assignment(self) -> None:
        """assignment: every bin runs exactly one strategy, through an item that strategy can
        run: z[r,k] = 0 where time[r][k] is None."""
        p, be = self.p, self.be
        for b in range(p.buckets):
            be.add(be.sum([self.x[b, k] for k in range(p.strategies)]) == 1)
        for (r, k), z in self.z.items():
            if p.time[r][k] is None:
                be.add(z == 0)

    def add_runs(self) -> None:
        """runs: u[k] = 1 exactly when k runs a bin: u[k] >= x[b,k], u[k] <= sum_b x[b,k]."""
        for (b, k), x in self.x.items():
            self.be.add(self.u[k] >= x)
        for k, u in self.u.items():
            self.be.add(u <= self.be.sum([self.x[b, k] for b in range(self.p.buckets)]))

    def add_fill(self) -> None:
        """fill: g[b,k] marks k's head segment (g[0,k] = x[0,k]; g[b,k] = g[b-1,k] AND x[b,k]);
        H[k] >= fill[r][k] (z[r,k] + g[first(r),k] - 1) and F[k] >= fill[r][k] (z[r,k] -
        g[first(r),k]): each of k's (at most two, by contiguity) segments pays its largest fill."""
        p, be = self.p, self.be
        for k in range(p.strategies):
            be.add(self.g[0, k] == self.x[0, k])
            for b in range(1, p.buckets):
                g, prev, x = self.g[b, k], self.g[b - 1, k], self.x[b, k]
                be.add(g <= prev)
                be.add(g <= x)
                be.add(g >= prev + x - 1)
        for (r, k), z in self.z.items():
            f = _ticks(p.fill[r][k])
            if f > 0:
                g = self.g[p.item_ranges[r][0], k]
                be.add(self.H[k] >= f * z + f * g - f)
                be.add(self.F[k] >= f * z - f * g)

    def add_switches(self) -> None:
        """switches: y[b,k,k2] >= x[b,k] + x[b+1,k2] - 1 around the cycle (b+1 of the last
        bin is the first: the next step's)."""
        B = self.p.buckets
        for (b, k, k2), y in self.y.items():
            self.be.add(y >= self.x[b, k] + self.x[(b + 1) % B, k2] - 1)

    def add_home_memory(self) -> None:
        """home_memory: one of the used layouts is home (sum h = 1, h[k] <= u[k]); an item
        runs on k only where k leaves room for the home's optimizer state:
        z[r,k] + h[k2] <= 1 where room[r][k][k2] is false."""
        p, be = self.p, self.be
        be.add(be.sum(list(self.h.values())) == 1)
        for k, h in self.h.items():
            be.add(h <= self.u[k])
        if p.room is None:
            return
        for (r, k), z in self.z.items():
            for k2 in range(p.strategies):
                if not p.room[r][k][k2]:
                    be.add(z + self.h[k2] <= 1)

    def add_contiguity(self) -> None:
        """contiguity: a strategy enters the cycle at most once, so its bins are one run
        around the cycle (at most two segments, H and F): sum_b sum_{k2 != k} y[b,k2,k] <= 1."""
        p, be = self.p, self.be
        if p.buckets < 2:
            return
        for k in range(p.strategies):
            be.add(be.sum([self.y[b, k2, k] for b in range(p.buckets) for k2 in range(p.strategies)
                           if k2 != k]) <= 1)

    def add_objective(self) -> None:
        """T = sum time z + sum (H + F) + sum switch y + sum home_time h (ticks, each rounded down)."""
        p, be = self.p, self.be
        terms = [_ticks(p.time[r][k]) * z for (r, k), z in self.z.items() if p.time[r][k] is not None]
        terms += list(self.H.values()) + list(self.F.values())
        terms += [_ticks(p.switch[k][k2]) * y for (b, k, k2), y in self.y.items() if p.switch[k][k2] > 0]
        if p.home_time is not None:
            terms += [_ticks(p.home_time[k]) * h for k, h in self.h.items()]
        be.minimize(be.sum(terms))

    def extract(self, value) -> tuple[tuple[int, ...], int | None, tuple[int, ...]]:
        p = self.p
        assignment = tuple(next(k for k in range(p.strategies) if value(self.x[b, k]) > 0.5)
                           for b in range(p.buckets))
        home = next((k for k in self.h if value(self.h[k]) > 0.5), None)
        chosen = sorted((r for (r, k), z in self.z.items() if value(z) > 0.5), key=lambda r: p.item_ranges[r][0])
        return assignment, home, tuple(chosen)


WORK = 60.0      # CP-SAT's deterministic limit of one switching solve (work units, deadline.py)


def solve(p: SwitchingProblem, backend: str = "cpsat", time_limit_s: float = 600.0, seed: int = 1,
          work: float = WORK) -> Switching:
    """The least-T answer, proven: the model's optimum is a lower bound (rounded-down
    coefficients), the returned answer's exact T is within PROOF_TOL of it, or the status
    says how far (feasible). CP-SAT stops at `work` units (deterministic), with its LP at
    linearization level 2: the assignment and fill rows are an LP-friendly MILP (a 28-item,
    8-strategy model took 48 s at the default level and 0.23 s at 2); HiGHS and CBC stop at
    `time_limit_s` (wall clock)."""
    from milp_plan.solvers.backends import make_backend
    be = make_backend(backend)
    model = SwitchingModel(p, be)
    model.build()
    if backend == "cpsat":
        be.parameters["linearization_level"] = 2
        run = be.solve(time_limit_s, seed, work=work)
    else:
        run = be.solve(time_limit_s, seed)
    if run.status == "infeasible":
        return Switching(None, None, None, None, "infeasible")
    if run.status == "timeout":
        return Switching(None, None, None, None, "timeout")
    assignment, home, chosen = model.extract(run.value)
    t = step_time(p, assignment, home, chosen)
    bound = run.bound * TICK_S
    status = "optimal" if run.status == "optimal" and relative_gap(t, bound) <= PROOF_TOL else "feasible"
    return Switching(assignment, home, t, bound, status, chosen)
