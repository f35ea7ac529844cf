"""The per-stage model for one Config (formulations/pipeline.md is its math).

Written once against a small backend interface (`Backend`: new_bool, new_int, add,
minimize), so CP-SAT, HiGHS and CBC solve the very same integer model. Times are integer
ticks (units.seconds_to_ticks), memory integer KiB (coefficients rounded up, capacity
down: the model is never optimistic about memory), money integer 1e-4 $/h.

Variables (symbols as in the math):
  y[s,k]    stage s runs on node type k                      (bool)
  n[s,k]    layers of stage s if it runs on type k, else 0   (int)
  r         recomputed layers per stage (full recompute)     (int, >= 1)
  rr[s,k]   r if stage s runs on type k, else 0              (int)
  u[k,b]    node type k holds exactly b stages               (bool, one-hot in b)
  st[s,k]   a block of type k starts at stage s              (bool)
  e[s,k]    stages s and s+1 both on type k                  (bool, exact AND)
  g[s,k]    ... and a node boundary lies between them        (bool, exact AND)
  x[s,k,j]  stage s on type k and stage s+1 on type j != k   (bool, exact AND)
  h[s]      one-direction transfer time of hop s (ticks, exact expression of e, g, x)
  Q[s]      sum_{j<s} (t_j + 2 h_j): prefix sums for the steady-period windows
  z         steady period (ticks): (b-a+1) z >= Q[b] - Q[a] + t_b for every window a..b
            (max_s t_s for interleaved)
  zf, zb    GPipe: max_s f_s and max_s b_s (and every hop h_s): two flow shops
  D         scale x max_s (dp_s - sum_{k<s} (b_k / v + h_k));  o = max_s opt_s
  W[k,b]    step time if u[k,b] else 0 (ticks; min-cost and $/step budgets)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from milp_plan.formulations.coefficients import Affine, Coefficients
from milp_plan.units import TICKS_PER_SECOND

KIB = 1024.0
MONEY_SCALE = 1e4  # 1e-4 $/h


class Backend(Protocol):
    def new_bool(self, name: str) -> Any: ...
    def new_int(self, lo: int, hi: int, name: str) -> Any: ...
    def add(self, constraint: Any) -> None: ...
    def sum(self, terms: list) -> Any: ...
    def minimize(self, expr: Any) -> None: ...


@dataclass(frozen=True)
class Limits:
    """Objective and side constraints, in model units."""

    objective: str = "min-time"          # min-time | min-cost
    time_limit_s: float | None = None
    budget_usd_per_hour: float | None = None
    budget_usd_per_step: float | None = None

    def admit(self, plan) -> bool:
        """The plan fits in memory and meets every limit, by the cost model's numbers
        (plan.predicted), never a model's."""
        p = plan.predicted
        if any(sp.peak_memory_gib > sp.capacity_gib * (1 + 1e-9) for sp in p.stages):
            return False
        if self.time_limit_s is not None and p.step_time_s > self.time_limit_s:
            return False
        if self.budget_usd_per_hour is not None and p.usd_per_hour > self.budget_usd_per_hour:
            return False
        return self.budget_usd_per_step is None or p.usd_per_step <= self.budget_usd_per_step


def ticks(seconds: float) -> int:
    return int(round(seconds * TICKS_PER_SECOND))


def kib_up(n_bytes: float) -> int:
    return int(math.ceil(n_bytes / KIB - 1e-9))


@dataclass
class Vars:
    y: dict = field(default_factory=dict)
    n: dict = field(default_factory=dict)
    rr: dict = field(default_factory=dict)
    u: dict = field(default_factory=dict)
    st: dict = field(default_factory=dict)
    x: dict = field(default_factory=dict)
    W: dict = field(default_factory=dict)
    t: list = field(default_factory=list)   # stage time expressions (ticks)
    bwd: list = field(default_factory=list)  # stage backward expressions (ticks)
    h: list = field(default_factory=list)   # hop time expressions (ticks)
    e: dict = field(default_factory=dict)
    g: dict = field(default_factory=dict)
    wrap: Any = 0                           # last -> first transfer (interleaved)
    r: Any = None
    z: Any = None
    zf: Any = None                          # GPipe: max forward, max backward (ticks)
    zb: Any = None
    D: Any = None
    o: Any = None
    step: Any = None                        # step time expression, ticks x scale
    scale: int = 1                          # step = scale x T (interleaved keeps integers)
    usd_h: Any = None                       # 1e-4 $/h
    objective: Any = None


class PipelineModel:
    """Builds the model into a backend; one method per constraint family."""

    def __init__(self, coef: Coefficients, limits: Limits, backend: Backend, cutoff: float | None = None):
        """cutoff: only plans with objective below this value (seconds or $/step) are wanted;
        the driver passes its incumbent so a Config that cannot beat it is refuted fast."""
        self.c, self.lim, self.be, self.cutoff = coef, limits, backend, cutoff
        self.cfg = coef.cfg
        self.S = range(coef.cfg.pp)
        self.K = coef.usable_types()
        self.L = coef.inst.model.num_layers
        self.v = Vars()
        self.t_hi = self._time_upper_bound()

    # ---- helpers ---------------------------------------------------------------------
    def _aff_ticks(self, aff: Affine, s: int, k: int):
        v = self.v
        expr = [ticks(aff.a) * v.n[s, k], ticks(aff.c) * v.y[s, k]]
        if self.c.full:
            expr.append(ticks(aff.rho) * v.rr[s, k])
        return self.be.sum(expr)

    def _time_upper_bound(self) -> int:
        c, L = self.c, self.L
        worst = 0.0
        for k in self.K:
            for s in (0, self.cfg.pp - 1):
                t, _ = c.time(k, s)
                worst = max(worst, t(L, L if c.full else 0))
        t_hi = ticks(worst) + 1
        return t_hi

    # ---- constraint families -----------------------------------------------------------
    def add_stage_type(self) -> None:
        """Every stage runs on exactly one node type."""
        be, v = self.be, self.v
        for s in self.S:
            for k in self.K:
                v.y[s, k] = be.new_bool(f"y[{s},{k}]")
            be.add(be.sum([v.y[s, k] for k in self.K]) == 1)

    def add_layer_cover(self) -> None:
        """Layers sum to L; every stage holds >= 1 layer (>= vpp and a multiple of vpp when interleaved)."""
        be, v, vpp = self.be, self.v, self.cfg.vpp
        for s in self.S:
            for k in self.K:
                if vpp > 1:
                    q = be.new_int(0, self.L // vpp, f"q[{s},{k}]")
                    v.n[s, k] = be.new_int(0, self.L, f"n[{s},{k}]")
                    be.add(v.n[s, k] == vpp * q)
                else:
                    v.n[s, k] = be.new_int(0, self.L, f"n[{s},{k}]")
                be.add(v.n[s, k] <= self.L * v.y[s, k])
            be.add(be.sum([v.n[s, k] for k in self.K]) >= vpp)
        be.add(be.sum([v.n[s, k] for s in self.S for k in self.K]) == self.L)

    def add_recompute(self) -> None:
        """Full recompute: 1 <= r <= n_s for every stage; rr[s,k] = r y[s,k] (exact linearisation)."""
        if not self.c.full:
            return
        be, v, L = self.be, self.v, self.L
        v.r = be.new_int(1, L, "r")
        if self.cfg.vpp > 1:  # Megatron recomputes r / vpp layers of every chunk
            rq = be.new_int(1, L // self.cfg.vpp, "r/vpp")
            be.add(v.r == self.cfg.vpp * rq)
        for s in self.S:
            be.add(v.r <= be.sum([v.n[s, k] for k in self.K]))
            for k in self.K:
                v.rr[s, k] = be.new_int(0, L, f"rr[{s},{k}]")
                be.add(v.rr[s, k] <= L * v.y[s, k])
                be.add(v.rr[s, k] <= v.r)
                be.add(v.rr[s, k] >= v.r - L * (1 - v.y[s, k]))

    def add_contiguity(self) -> None:
        """Stages of one node type form one contiguous block."""
        be, v = self.be, self.v
        for k in self.K:
            for s in self.S:
                v.st[s, k] = be.new_bool(f"st[{s},{k}]")
                be.add(v.st[s, k] >= v.y[s, k] - (v.y[s - 1, k] if s else 0))
            be.add(be.sum([v.st[s, k] for s in self.S]) <= 1)

    def add_device_count(self) -> None:
        """u[k,b] one-hot: node type k holds b stages, at most what fits on its nodes."""
        be, v = self.be, self.v
        for k in self.K:
            cap = min(self.cfg.pp, self.c.place[k].max_stages)
            for b in range(cap + 1):
                v.u[k, b] = be.new_bool(f"u[{k},{b}]")
            be.add(be.sum([v.u[k, b] for b in range(cap + 1)]) == 1)
            be.add(be.sum([v.y[s, k] for s in self.S]) == be.sum([b * v.u[k, b] for b in range(cap + 1)]))

    def add_memory_capacity(self) -> None:
        """Per GPU: a n + rho r + c <= usable capacity of node type k (KiB, rounded safe)."""
        be, v = self.be, self.v
        for s in self.S:
            for k in self.K:
                mem = self.c.memory(k, s)
                terms = [kib_up(mem.a) * v.n[s, k], kib_up(mem.c) * v.y[s, k]]
                if self.c.full:
                    terms.append(kib_up(mem.rho) * v.rr[s, k])
                be.add(be.sum(terms) <= int(self.c.capacity(k) // KIB))

    def add_stage_time(self) -> None:
        """t_s = sum_k (a n + rho r + c y) ticks; z >= t_s (GPipe: zf >= f_s, zb >= b_s)."""
        be, v = self.be, self.v
        v.z = be.new_int(0, self.t_hi, "z")
        for s in self.S:
            t = be.sum([self._aff_ticks(self.c.time(k, s)[0], s, k) for k in self.K])
            v.t.append(t)
            v.bwd.append(be.sum([self._aff_ticks(self.c.time(k, s)[1], s, k) for k in self.K]))
            be.add(v.z >= t)
            if self.cfg.schedule == "gpipe":  # two flow shops: zf >= f_s = t_s - b_s, zb >= b_s
                if s == 0:
                    v.zf = be.new_int(0, self.t_hi, "zf")
                    v.zb = be.new_int(0, self.t_hi, "zb")
                be.add(v.zf >= be.sum([t, -1 * v.bwd[-1]]))
                be.add(v.zb >= v.bwd[-1])

    def _and(self, name: str, *bools):
        """An exact AND of booleans: w <= each, w >= sum - (n - 1)."""
        be = self.be
        w = be.new_bool(name)
        for x in bools:
            be.add(w <= x)
        be.add(w >= be.sum(list(bools)) - (len(bools) - 1))
        return w

    def add_hops(self) -> None:
        """h[s] exactly: same type -> intra-node unless a node boundary lies between the two
        stages (canonical placement: a block of type k starts on a fresh node and puts
        q_k = stages_per_node stages on each); different types -> inter-node."""
        be, v, c = self.be, self.v, self.c
        for s in list(self.S)[:-1]:
            terms = []
            for k in self.K:
                v.e[s, k] = self._and(f"e[{s},{k}]", v.y[s, k], v.y[s + 1, k])
                q = c.place[k].stages_per_node
                if q >= 2:
                    starts = [v.st[b, k] for b in range(s + 1) if (s + 1 - b) % q == 0]
                    boundary = be.sum(starts) if starts else 0
                    if starts:
                        v.g[s, k] = be.new_bool(f"g[{s},{k}]")
                        be.add(v.g[s, k] <= v.e[s, k])
                        be.add(v.g[s, k] <= boundary)
                        be.add(v.g[s, k] >= v.e[s, k] + boundary - 1)
                        terms += [ticks(c.hop_intra(k)) * v.e[s, k],
                                  (ticks(c.hop_inter(k, k)) - ticks(c.hop_intra(k))) * v.g[s, k]]
                    else:
                        terms.append(ticks(c.hop_intra(k)) * v.e[s, k])
                else:
                    terms.append(ticks(c.hop_inter(k, k)) * v.e[s, k])
                for j in self.K:
                    if j != k:
                        v.x[s, k, j] = self._and(f"x[{s},{k},{j}]", v.y[s, k], v.y[s + 1, j])
                        terms.append(ticks(c.hop_inter(k, j)) * v.x[s, k, j])
            v.h.append(be.sum(terms))
            if self.cfg.schedule == "gpipe":  # a link is a machine of both flow shops
                be.add(v.zf >= v.h[-1])
                be.add(v.zb >= v.h[-1])
        if self.cfg.schedule == "interleaved" and self.cfg.vpp > 1 and self.cfg.pp > 1:
            last, terms = self.cfg.pp - 1, []
            for k in self.K:
                for j in self.K:
                    w = self._and(f"wrap[{k},{j}]", v.y[last, k], v.y[0, j])
                    one_node = j == k and 0 < self.cfg.pp <= c.place[k].stages_per_node
                    cost = c.hop_intra(k) if one_node else c.hop_inter(k, j)
                    terms.append(ticks(cost) * w)
            v.wrap = be.sum(terms)

    def add_steady_period(self) -> None:
        """(b - a + 1) z >= sum_{a..b} t + 2 sum_{a..b-1} h  (costmodel.steady_period_s)."""
        if (self.cfg.schedule == "interleaved" and self.cfg.vpp > 1) or self.cfg.schedule == "gpipe":
            return  # interleaved: z >= t_s (add_stage_time) is its closed form; GPipe uses zf, zb
        be, v, pp = self.be, self.v, self.cfg.pp
        if pp < 2:
            return
        hi = 4 * pp * self.t_hi
        Q = [0]
        for s in range(pp - 1):
            q = be.new_int(0, hi, f"Q[{s + 1}]")
            be.add(q == (Q[-1] if s else 0) + v.t[s] + 2 * v.h[s])
            Q.append(q)
        for a in range(pp):
            for b in range(a + 1, pp):
                be.add((b - a + 1) * v.z >= Q[b] - (Q[a] if a else 0) + v.t[b])

    def add_dp_optimizer(self) -> None:
        """D >= scale (dp_s - sum_{k<s} (b_k / v + h_k)) and o >= opt_s for every stage
        (costmodel.dp_tail_s; D is scale x the reduction tail)."""
        be, v = self.be, self.v
        sc = v_scale(self.cfg)
        v.D = be.new_int(0, 10 * sc * self.t_hi, "D")
        v.o = be.new_int(0, 10 * self.t_hi, "o")
        for s in self.S:
            slack = [v.bwd[k] + sc * v.h[k] for k in range(s)]
            for k in self.K:
                dp = self._aff_ticks(self.c.dp_time(k, s), s, k)
                be.add(v.D >= be.sum([sc * dp, -1 * be.sum(slack)]) if slack else v.D >= sc * dp)
                be.add(v.o >= self._aff_ticks(self.c.opt_time(k, s), s, k))

    def add_step_time(self) -> None:
        """T (scaled): costmodel.pipeline_time_s + p2p_time_s + dp_tail_s + max optimizer."""
        be, v, cfg = self.be, self.v, self.cfg
        m = self.c.m
        hops = be.sum(v.h) if v.h else 0
        if cfg.schedule == "interleaved" and cfg.vpp > 1:
            vp = cfg.vpp
            v.scale = vp  # vpp T = (m vpp - 1) z + sum t + vpp (2 (vpp sum h + (vpp-1) wrap) + o) + D
            v.step = be.sum([(m * vp - 1) * v.z, be.sum(v.t), 2 * vp * vp * hops, 2 * vp * (vp - 1) * v.wrap,
                             v.D, vp * v.o])
        elif cfg.schedule == "gpipe":  # (m-1)(zf + zb) + sum t + 2 sum h
            v.step = be.sum([(m - 1) * v.zf, (m - 1) * v.zb, be.sum(v.t), 2 * hops, v.D, v.o])
        else:
            v.step = be.sum([(m - 1) * v.z, be.sum(v.t), 2 * hops, v.D, v.o])
        if self.lim.time_limit_s is not None:
            be.add(v.step <= v.scale * ticks(self.lim.time_limit_s))

    def add_cost(self) -> None:
        """$/h from block sizes; W[k,b] = T u[k,b] (binary x bounded integer, exact) for $/step."""
        be, v, lim = self.be, self.v, self.lim
        price = {(k, b): int(round(self.c.usd_per_hour(k, b) * MONEY_SCALE)) for (k, b) in v.u}
        v.usd_h = be.sum([price[kb] * v.u[kb] for kb in v.u])
        if lim.budget_usd_per_hour is not None:
            be.add(v.usd_h <= int(math.floor(lim.budget_usd_per_hour * MONEY_SCALE)))
        if lim.objective == "min-cost" or lim.budget_usd_per_step is not None:
            hi = self._step_upper_bound()
            for (k, b), var in v.u.items():
                if b == 0 or price[k, b] == 0:
                    continue
                w = be.new_int(0, hi, f"W[{k},{b}]")
                be.add(w <= hi * var)
                be.add(w >= v.step - hi * (1 - var))
                v.W[k, b] = (price[k, b], w)
            if lim.budget_usd_per_step is not None:
                # sum price W / (3600 scale ticks/s MONEY_SCALE) <= budget
                rhs = lim.budget_usd_per_step * 3600 * v.scale * TICKS_PER_SECOND * MONEY_SCALE
                be.add(be.sum([p * w for p, w in v.W.values()]) <= int(math.floor(rhs)))

    def _step_upper_bound(self) -> int:
        cfg = self.cfg
        return v_scale(cfg) * (self.c.m + cfg.pp + 4) * 12 * self.t_hi

    def set_objective(self) -> None:
        be, v = self.be, self.v
        if self.lim.objective == "min-cost":
            v.objective = be.sum([p * w for p, w in v.W.values()]) if v.W else 0
        else:
            v.objective = v.step
        if self.cutoff is not None and not isinstance(v.objective, int):
            be.add(v.objective <= int(math.floor(self.cutoff * self._objective_scale())))
        be.minimize(v.objective)

    def _objective_scale(self) -> float:
        if self.lim.objective == "min-cost":
            return 3600 * self.v.scale * TICKS_PER_SECOND * MONEY_SCALE
        return self.v.scale * TICKS_PER_SECOND

    def build(self) -> Vars:
        for family in (self.add_stage_type, self.add_layer_cover, self.add_recompute, self.add_contiguity,
                       self.add_device_count, self.add_memory_capacity, self.add_stage_time, self.add_hops,
                       self.add_steady_period, self.add_dp_optimizer, self.add_step_time, self.add_cost,
                       self.set_objective):
            family()
        return self.v

    def hint(self, types: Sequence[int], layers: Sequence[int], r: int) -> None:
        """Start the search from a known plan of this Config (the heuristic's)."""
        be, v = self.be, self.v
        for s in self.S:
            for k in self.K:
                on = types[s] == k
                be.hint(v.y[s, k], int(on))
                be.hint(v.n[s, k], layers[s] if on else 0)

    # ---- reading a solution --------------------------------------------------------------
    def objective_in_units(self, raw: float) -> float:
        """Model objective -> seconds (min-time) or $/step (min-cost)."""
        return raw / self._objective_scale()

    def extract(self, value) -> tuple[list[int], list[int], int]:
        """(node type per stage, layers per stage, recomputed layers) from a value(var) function."""
        types, layers = [], []
        for s in self.S:
            k = max(self.K, key=lambda kk: value(self.v.y[s, kk]))
            types.append(k)
            layers.append(int(round(value(self.v.n[s, k]))))
        r = int(round(value(self.v.r))) if self.v.r is not None else 0
        return types, layers, r


def v_scale(cfg) -> int:
    return cfg.vpp if (cfg.schedule == "interleaved" and cfg.vpp > 1) else 1
