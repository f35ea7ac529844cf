"""Token slicing (TeraPipe, Li et al. ICML'21): the slicing subproblem of one configuration.

A sequence of U token units (a unit is L / U tokens) is cut into slices
0 = x_0 < x_1 < ... < x_n = U; slice k covers units x_{k-1} .. x_k - 1 after x_{k-1} units of
context, and takes t(x_{k-1}, x_k) seconds (the caller's time of a slice, e.g. its slowest
stage's forward + backward, costmodel.slice_stage_times). Each of m sequences is cut the same
way and the m n slices flow through K pipeline stages one after another. The objective is
TeraPipe's step time

    J(x) = m sum_k t_k + (K - 1) max_k t_k,           t_k = t(x_{k-1}, x_k),

which is the makespan of the slices on K identical stages (a permutation flow shop whose
jobs take the same time on every machine: the longest path visits every job once and K - 1
jobs twice, at most max_k t_k each; the path through the longest job attains it).

`best_slices` solves  min_x J(x)  exactly, optionally with exactly N slices or at most N
slices, by TeraPipe's capped min-sum dynamic programme:

  * the caps are the distinct values t(i, j) (the largest slice of an optimal x is one of them);
  * for a cap tau, F(tau) = min sum_k t_k over slicings whose every slice has t_k <= tau is a
    shortest path from 0 to U in the DAG of arcs (i, j), i < j, with t(i, j) <= tau (arc-wise
    feasibility, additive cost: Bellman's principle; with a slice count, over (unit, count));
  * G(tau) = m F(tau) + (K - 1) tau bounds J of the slicing x_tau attaining F(tau) from above
    (its largest slice is <= tau), and G(tau*) <= J(x*) at tau* = max slice of an optimal x*, so
        min_tau J(x_tau) <= min_tau G(tau) <= G(tau*) <= J(x*):
    the best x_tau is optimal;
  * stop: with the caps in increasing order, any slicing not yet covered has a slice >= tau,
    so its J >= m max(tau, F_inf) + (K - 1) tau (F_inf = the uncapped min-sum, a lower bound
    of every sum); once that is >= the best J found, no later cap can win (TeraPipe's rule
    (K - 1) cap + max(cap, F_inf) > best at m = 1).

Ties: the least J, then the fewest slices, then the lexicographically largest first slices
(deterministic). tests/test_slicing.py checks it against enumeration of all 2^(U-1)
compositions (`compositions`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from milp_plan.errors import InputError

MAX_UNITS = 64            # token units of one sequence the DP accepts (O(caps U^2) work)
DEFAULT_UNITS = 16        # the granularity the planner slices at: L / 16 tokens per unit


@dataclass(frozen=True)
class Slicing:
    """An optimal slicing: slice lengths in units, their times (seconds), and J."""

    lengths: tuple[int, ...]
    times: tuple[float, ...]
    objective: float
    caps_tried: int

    @property
    def count(self) -> int:
        return len(self.lengths)


def step_objective(times: Sequence[float], stages: int, sequences: int = 1) -> float:
    """J = m sum_k t_k + (K - 1) max_k t_k (see the module docstring)."""
    return sequences * sum(times) + (stages - 1) * max(times)


def compositions(units: int) -> Iterator[tuple[int, ...]]:
    """Every composition of `units` (2^(units-1) of them), as slice lengths."""
    for cuts in itertools.product((False, True), repeat=units - 1):
        out, run = [], 1
        for c in cuts:
            if c:
                out.append(run)
                run = 1
            else:
                run += 1
        out.append(run)
        yield tuple(out)


def times_of(lengths: Sequence[int], t: Callable[[int, int], float]) -> tuple[float, ...]:
    """t_k of each slice: t(start, end) in units."""
    out, start = [], 0
    for n in lengths:
        out.append(t(start, start + n))
        start += n
    return tuple(out)


def brute_force(units: int, t: Callable[[int, int], float], stages: int, sequences: int = 1,
                count: int | None = None, max_count: int | None = None) -> Slicing:
    """The optimum by enumeration of every composition (the test oracle; units <= 20)."""
    best = None
    for lengths in compositions(units):
        if (count is not None and len(lengths) != count) or (max_count is not None and len(lengths) > max_count):
            continue
        ts = times_of(lengths, t)
        key = (step_objective(ts, stages, sequences), len(lengths), tuple(-x for x in lengths))
        if best is None or key < best[0]:
            best = (key, lengths, ts)
    if best is None:
        raise InputError(f"no slicing of {units} units into {count or max_count} slices", field="slices")
    return Slicing(best[1], best[2], best[0][0], 0)


def _min_sum(units: int, table: list[list[float]], cap: float, count: int | None,
             max_count: int | None) -> tuple[float, tuple[int, ...]] | None:
    """F(cap): the least sum of slice times over slicings whose slices all take <= cap, with
    exactly `count` (or at most `max_count`) slices when given; the slicing (ties: fewest
    slices, then the largest first slices). A shortest path over (unit, slices used)."""
    n_max = count if count is not None else (max_count if max_count is not None else units)
    inf = math.inf
    # best[j][c]: (sum, lengths) reaching unit j with c slices
    best: list[list[tuple[float, tuple[int, ...]] | None]] = [[None] * (n_max + 1) for _ in range(units + 1)]
    best[0][0] = (0.0, ())
    for j in range(1, units + 1):
        for c in range(1, min(j, n_max) + 1):
            got = None
            for i in range(c - 1, j):
                prev = best[i][c - 1]
                w = table[i][j]
                if prev is None or w > cap:
                    continue
                cand = (prev[0] + w, prev[1] + (j - i,))
                if got is None or (cand[0], tuple(-x for x in cand[1])) < (got[0], tuple(-x for x in got[1])):
                    got = cand
            best[j][c] = got
    ends = [best[units][c] for c in range(1, n_max + 1) if count is None or c == count]
    done = [(s, len(x), tuple(-v for v in x), x) for e in ends if e is not None for s, x in [e] if s < inf]
    if not done:
        return None
    s, _, _, x = min(done)
    return s, x


def best_slices(units: int, t: Callable[[int, int], float], stages: int, sequences: int = 1,
                count: int | None = None, max_count: int | None = None) -> Slicing:
    """min over slicings of J (module docstring): TeraPipe's capped min-sum DP, exact.

    t(i, j): seconds of the slice of units i .. j-1 after i units of context (0 <= i < j <= units).
    count: exactly this many slices; max_count: at most this many."""
    if not 1 <= units <= MAX_UNITS:
        raise InputError(f"token units must lie in [1, {MAX_UNITS}], got {units}", field="slices")
    if stages < 1 or sequences < 1:
        raise InputError(f"need >= 1 stage and >= 1 sequence, got {stages} and {sequences}", field="slices")
    for name, v in (("count", count), ("max_count", max_count)):
        if v is not None and not 1 <= v <= units:
            raise InputError(f"{name} of slices must lie in [1, {units}] (the token units), got {v}", field="slices")
    table = [[math.inf] * (units + 1) for _ in range(units + 1)]
    for i in range(units):
        for j in range(i + 1, units + 1):
            v = float(t(i, j))
            if not v >= 0 or math.isinf(v):
                raise InputError(f"slice time t({i}, {j}) must be finite and >= 0, got {v}", field="slices")
            table[i][j] = v
    caps = sorted({table[i][j] for i in range(units) for j in range(i + 1, units + 1)})
    uncapped = _min_sum(units, table, math.inf, count, max_count)
    assert uncapped is not None   # count, max_count in [1, units]: some slicing exists
    f_inf = uncapped[0]
    best: tuple[tuple, tuple[int, ...]] | None = None
    tried = 0
    for cap in caps:
        if best is not None and sequences * max(cap, f_inf) + (stages - 1) * cap >= best[0][0]:
            break
        tried += 1
        got = _min_sum(units, table, cap, count, max_count)
        if got is None:
            continue
        ts = times_of(got[1], lambda i, j: table[i][j])
        key = (step_objective(ts, stages, sequences), len(got[1]), tuple(-x for x in got[1]))
        if best is None or key < best[0]:
            best = (key, got[1])
    assert best is not None
    lengths = best[1]
    return Slicing(lengths, times_of(lengths, lambda i, j: table[i][j]), best[0][0], tried)


def units_for(seq_length: int, wanted: int = DEFAULT_UNITS) -> int:
    """Token units per sequence: the largest u <= wanted that divides seq_length."""
    for u in range(min(wanted, seq_length), 0, -1):
        if seq_length % u == 0:
            return u
    return 1
