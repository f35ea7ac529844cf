"""A heuristic plan per free-mode config: the pool of each stage by local search, then each
stage's option and layer count by the least bottleneck.

A complete free config fixes each node type's stage size (its pool) but not how many stages a
pool hosts, where they sit, or which of the pool's options (tp x dp split, recompute) each
stage runs. warmstart.py's heuristic takes one option per node type (Megatron mode); this one
takes a *pool sequence* (the pool of each stage position) and makes the rest:

* **Options and layers at a bottleneck z** (`_stage_cap`): stage s of pool p holds
  max over p's options o of min(floor((z - c - rho r) / a), memory room with r recomputed
  layers) layers (whole chunks of vpp; r over the multiples of vpp under full recompute, 0
  otherwise), with (a, rho, c) the option's time fit at position s. The least z (bisection
  over the values a j + rho r + c) at which every stage holds >= vpp layers and they hold L in
  all, then the surplus taken from the slowest stages (as warmstart.partition), and each full
  recompute stage the fewest recomputed layers that fit its count.
* **The pool sequence** (`best_plan`): stage counts from each pool's least (a required node
  type hosts one) filled fastest pool first up to each pool's most; two starts (the pools
  fastest first, and slowest first); then first-improvement local search over two moves, swap
  the pools of two stages, or give a stage another pool (counts kept within their range),
  until no move improves or `evals` sequences are scored.

Every sequence is scored by the plan it makes (placement.build_plan, predict through
plan.predicted): the heuristic never trusts its own arithmetic, and a plan that breaks a
limit, a pin or the cluster's nodes scores infinity. On mixed-128 (GPT-3 13B, batch 512) the
config pp 8, 16 samples per micro-batch, stage sizes 8, 32, 16, 32, interleaved v2 gets
3.5942 s in 0.33 work units, the config's optimum and the free one (the Megatron-mode
optimum, the free search's first incumbent, is 3.8767 s).

The driver (solvers/driver.py, many_pools) runs it on each complete free config of three
node types or more that it is about to solve: a plan that beats the incumbent, after the
checker and the limits pass it, becomes the model's cutoff and hint, and the config's plan
unless the model finds a better one. Tests: tests/test_free_start.py.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

from milp_plan.deadline import WORK, Deadline
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.formulations.placement import build_plan, fits
from milp_plan.formulations.space import matches_pins
from milp_plan.heuristics.warmstart import Candidate
from milp_plan.job import Limits
from milp_plan.plan import Plan
from milp_plan.result import objective_of

FREE_EVALS = 96   # pool sequences scored per config (each a plan built and priced, ~1.2 ms)


class _Stages:
    """Per config: each option's least stage time per layer count at each position (cached)."""

    def __init__(self, coef: Coefficients) -> None:
        self.coef, self.unit, self.L = coef, coef.cfg.vpp, coef.inst.model.num_layers
        self.opts_of = coef.pool_options()
        self._alts: dict[tuple[int, int], list[tuple]] = {}

    def alts(self, p: int, s: int) -> list[tuple]:
        """(option, layer counts, their least times, their recomputed layers, per-layer time)
        for pool p at position s: every count n (whole chunks) that fits in memory, with the
        fewest recomputed layers r that let it fit under full recompute (r a multiple of vpp,
        1..n; 0 otherwise), so the time a n + rho r + c rises with n."""
        key = (p, s)
        if key not in self._alts:
            c, unit, out = self.coef, self.unit, []
            for o in self.opts_of[p]:
                t = c.time(o, s)[0]
                ns, ts, rs = [], [], []
                for n in range(unit, self.L + 1, unit):
                    if c.full(o):
                        r = next((r for r in range(unit, n + 1, unit) if c.layer_room(o, s, r) >= n), None)
                    else:
                        r = 0 if c.layer_room(o, s) >= n else None
                    if r is not None:
                        ns.append(n), ts.append(t(n, r)), rs.append(r)
                if ns:
                    out.append((o, ns, ts, rs, t.a))
            self._alts[key] = out
        return self._alts[key]

    def cap(self, p: int, s: int, z: float) -> tuple[int, int, int, float]:
        """(layers, option, r, per-layer time) of the option of pool p that holds the most layers
        at stage s within time z and memory (the least time on a tie), or layers 0, option -1."""
        best, best_t = (0, -1, 0, math.inf), math.inf
        for o, ns, ts, rs, a in self.alts(p, s):
            i = bisect.bisect_right(ts, z * (1 + 1e-12)) - 1
            if i >= 0 and (ns[i], -ts[i]) > (best[0], -best_t):
                best, best_t = (ns[i], o, rs[i], a), ts[i]
        return best

    def times(self, seq: Sequence[int]) -> list[float]:
        """The values z at which some stage's capacity changes."""
        return sorted({t for s, p in enumerate(seq) for alt in self.alts(p, s) for t in alt[2]})


def _partition(st: _Stages, seq: Sequence[int]) -> Candidate | None:
    """The stages' options, layers and recomputed layers at the least bottleneck z for the pool
    sequence `seq`, or None when no z holds the L layers."""
    unit, L = st.unit, st.L

    def at(z: float):
        caps = [st.cap(p, s, z) for s, p in enumerate(seq)]
        return caps if all(c[1] >= 0 for c in caps) and sum(c[0] for c in caps) >= L else None
    zs = st.times(seq)
    if not zs or at(zs[-1]) is None:
        return None
    caps = at(zs[bisect.bisect_left(range(len(zs)), True, key=lambda i: at(zs[i]) is not None)])
    layers = [c[0] for c in caps]
    surplus = sum(layers) - L
    for s in sorted(range(len(seq)), key=lambda s: (-caps[s][3], s)):  # the slowest stages give first
        cut = min(surplus, layers[s] - unit) // unit * unit
        layers[s] -= cut
        surplus -= cut
    if surplus:
        return None
    rs = [_fewest_recomputes(st, seq[s], s, caps[s][1], layers[s]) for s in range(len(seq))]
    return tuple(c[1] for c in caps), tuple(layers), tuple(rs)


def _fewest_recomputes(st: _Stages, p: int, s: int, o: int, n: int) -> int:
    """The fewest recomputed layers with which option o holds n layers at stage s (0 without
    full recompute; fewer layers never need more)."""
    for oo, ns, _, rs, _ in st.alts(p, s):
        if oo == o:
            return rs[bisect.bisect_left(ns, n)]
    raise AssertionError("the option was chosen at this stage")


def _counts(coef: Coefficients, order: Sequence[int]) -> dict[int, int] | None:
    """Stages per pool: each its least, then the rest in `order`, each up to its most."""
    beta = {p: coef.min_stages(p) for p in order}
    left = coef.cfg.pp - sum(beta.values())
    for p in order:
        add = min(left, coef.max_stages(p) - beta[p])
        beta[p] += add
        left -= add
    return None if left else beta


def _moves(seq: tuple[int, ...], lo: dict[int, int], hi: dict[int, int]):
    """Sequences one move away: two stages of different pools swapped; one stage given another
    pool (every pool's count kept within [lo, hi])."""
    n = len(seq)
    for i in range(n):
        for j in range(i + 1, n):
            if seq[i] != seq[j]:
                s = list(seq)
                s[i], s[j] = s[j], s[i]
                yield tuple(s)
    count = {p: seq.count(p) for p in lo}
    for i in range(n):
        for q in sorted(lo):
            if q != seq[i] and count[seq[i]] > lo[seq[i]] and count[q] < hi[q]:
                yield seq[:i] + (q,) + seq[i + 1:]


def best_plan(coef: Coefficients, limits: Limits, dl: Deadline | None = None,
              evals: int = FREE_EVALS) -> tuple[Plan, Candidate] | None:
    """The best plan the local search finds for the complete free config of `coef` within
    `evals` scored pool sequences (and the deadline `dl`), with its candidate (option, layers,
    recomputed layers per stage), or None."""
    cfg, inst = coef.cfg, coef.inst
    st = _Stages(coef)
    pools = range(len(coef.pools))
    mid = min(1, cfg.pp - 1)
    speed = {p: min((alt[4] for alt in st.alts(p, mid)), default=math.inf) for p in pools}
    fast = sorted(pools, key=lambda p: (speed[p], p))
    beta = _counts(coef, fast)
    if beta is None:
        return None
    lo = {p: coef.min_stages(p) for p in pools}
    hi = {p: coef.max_stages(p) for p in pools}
    scored: dict[tuple[int, ...], tuple[float, Plan | None, Candidate | None]] = {}

    def score(seq: tuple[int, ...]) -> float:
        if seq not in scored:
            scored[seq] = (math.inf, None, None)
            if dl is not None:
                dl.charge(WORK.step)
            got = _partition(st, seq)
            if got is not None and fits(inst, [coef.options[o] for o in got[0]]):
                plan = build_plan(inst, cfg, [coef.options[o] for o in got[0]], got[1], got[2], None)
                if dl is not None:
                    dl.charge(WORK.plan)
                if limits.admit(plan) and matches_pins(inst, coef.pins, plan):
                    scored[seq] = (objective_of(plan, limits), plan, got)
        return scored[seq][0]

    def spent() -> bool:
        return len(scored) >= evals or (dl is not None and dl.expired())
    best: tuple[float, tuple[int, ...]] | None = None
    for order in (fast, fast[::-1]):
        cur = tuple(p for p in order for _ in range(beta[p]))
        value = score(cur)
        moved = True
        while moved and not spent():
            moved = False
            for s in _moves(cur, lo, hi):
                if spent():
                    break
                if score(s) < value * (1 - 1e-9):  # first improvement: move on from it
                    value, cur, moved = scored[s][0], s, True
                    break
        if best is None or (value, cur) < best:
            best = (value, cur)
        if spent():
            break
    if best is None or best[0] == math.inf:
        return None
    _, plan, cand = scored[best[1]]
    return plan, cand
