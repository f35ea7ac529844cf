"""The per-stage model for one config (formulations/pipeline.md is its math).

Written once against a small backend interface (`Backend`: new_bool, new_int, add,
minimize), so CP-SAT, HiGHS and CBC solve the very same integer model.

Rounding (formulations/pipeline.md, "Rounding: a relaxation, then an exact check"): times
are integer ticks (`Resolution.tps` per second, as fine as the model's magnitudes allow),
memory integer bytes, money integer units of 1/`Resolution.money` $/h. Every coefficient
is rounded in the direction that makes the model a relaxation of the cost model: for
every plan of the config the model's step time, $/h, $/step and memory are at most the
cost model's. So no plan the cost model accepts is cut off by rounding, and the model's
optimum is a valid lower bound. The driver then evaluates the returned plan with the cost
model, cuts it off (`add_no_good`) if it breaks a limit, and checks that the model's
objective lies within `rounding_error` below the cost model's (`objective_drift`).

A stage option o (space.StageOption) is a node type with tp, dp, micro-batch and
recompute; the options of a node type share its stage size and form its pool p. In
Megatron mode there is one option per node type; in free mode several (tp x dp splits of
the type's stage size, recompute granularities).

Variables (symbols as in the math):
  y[s,o]    stage s runs as option o                         (bool)
  Y[s,p]    sum of y[s,o] over pool p's options              (0/1 expression)
  n[s,o]    layers of stage s if it runs as o, else 0        (int)
  r         Megatron mode: recomputed layers of every stage  (int, >= 1)
  rr[s,o]   recomputed layers of stage s if it runs as o     (int; = r y[s,o] in Megatron mode)
  u[p,beta] pool p holds exactly beta stages                 (bool, one-hot in beta)
  st[s,p]   a run of pool p starts at stage s                (bool; pools whose stages share nodes)
  w[s,p,i]  stage s of pool p is the i-th of its node        (bool, one-hot in i; i = position in its run mod q_p)
  nn[p,c]   pool p uses c nodes (sum_s w[s,p,0])             (bool, one-hot in c)
  e[s,p]    stages s and s+1 both in pool p                  (bool, exact AND)
  g[s,p]    ... and a node boundary lies between them        (bool, exact AND of e[s,p], w[s,p,q_p-1])
  x[s,p,j]  stage s in pool p, stage s+1 on another type j   (bool, exact AND)
  h[s]      one-direction transfer time of hop s (ticks, exact expression of e, g, x)
  Q[s]      sum_{j<s} (t_j + 2 h_j): prefix sums for the steady-period windows
  P         the steady-period term, weights applied before rounding: 1F1B (m-1) z with
            (c-a+1) z >= Q[c] - Q[a] + t_c for every window a..c; interleaved (m vpp - 1) z,
            z >= t_s; GPipe (m-1)(zf + zb), zf >= f_s, h_s and zb >= b_s, h_s
  D         scale x max_s (dp_s - sum_{k<s} (b_k / v + h_k));  opt = max_s opt_s; dp_s is the
            exposed reduction, the max of its pieces (one without overlap: costmodel.stage_dp_pieces_s)
  E[s,k]    k x stage s's exposed reduction on a path, >= each piece (with overlap only)
  emb       the tied embedding's all-reduce between the end stages (add_embedding_sync), after
            their reductions (with all[p], every stage on pool p: an exact AND)
  W[p,beta] step time if u[p,beta] else 0 (ticks; min-cost and $/step budgets)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from milp_plan.cluster import MixedNodeType
from milp_plan.formulations.coefficients import Affine, Coefficients
from milp_plan.formulations.space import pinned_types
from milp_plan.job import Limits
from milp_plan.predict import SIMULATED
from milp_plan.schedules import Period
from milp_plan.schedules import PathTerms
from milp_plan.units import GIB, SECONDS_PER_HOUR, TICKS_PER_SECOND

NOISE = 1e-12       # relative float noise of the cost model, allowed when rounding (pipeline.md)
TICKS = (10**9, 10**8, 10**7, 10**6)   # ticks per second, finest first
# With a $/step term (min-cost, $/step budgets) W = T u links the step to a big-M, which
# CP-SAT proves slowly at fine ticks when no cutoff helps (a small config: 0.3 s with a step
# bound of 7e5 ticks, not in 10 s at 7e6); under the driver's cutoffs 2^36 kept the shipped
# min-cost solves as fast as at 1 us (default at 7.92 s/step: 4.1 s, gap 4e-8; at 1 us 3.7 s, 5e-6)
W_MAGNITUDE = 2**36


class Backend(Protocol):
    magnitude: int      # largest step bound in ticks at which the backend stays exact (and fast)

    def new_bool(self, name: str) -> Any: ...
    def new_int(self, lo: int, hi: int, name: str) -> Any: ...
    def add(self, constraint: Any) -> None: ...
    def sum(self, terms: list) -> Any: ...
    def minimize(self, expr: Any) -> None: ...


def down(x: float) -> int:
    """Largest integer <= x, up to the cost model's float noise (a plan's rounded term never
    exceeds its true value by more than NOISE relative)."""
    return math.floor(x + abs(x) * NOISE)


def up(x: float) -> int:
    """Smallest integer >= x, up to the cost model's float noise."""
    return math.ceil(x - abs(x) * NOISE)


@dataclass(frozen=True)
class Resolution:
    """Integer units of one model: `tps` ticks per second, `money` units per $/h."""

    tps: int = TICKS_PER_SECOND
    money: int = 10**4

    def t_down(self, seconds: float) -> int:
        return down(seconds * self.tps)

    def t_up(self, seconds: float) -> int:
        return up(seconds * self.tps)

    def usd_down(self, usd_per_hour: float) -> int:
        return down(usd_per_hour * self.money)


@dataclass
class Vars:
    y: dict = field(default_factory=dict)
    n: dict = field(default_factory=dict)
    rr: dict = field(default_factory=dict)
    u: dict = field(default_factory=dict)
    st: dict = field(default_factory=dict)
    w: dict = field(default_factory=dict)   # (s, p, i): stage s of shared-node pool p is i-th on its node
    nn: dict = field(default_factory=dict)  # (p, c): shared-node pool p uses c nodes (one-hot; add_device_count)
    x: dict = field(default_factory=dict)
    W: dict = field(default_factory=dict)
    t: list = field(default_factory=list)   # stage time expressions (ticks)
    h: list = field(default_factory=list)   # hop time expressions (ticks, rounded down)
    hop_terms: list = field(default_factory=list)  # per hop: (var, seconds, seconds subtracted)
    h_up: list = field(default_factory=list)  # the same hops rounded up (subtracted in the dp tail)
    bwd_up: list = field(default_factory=list)  # stage backward rounded up (subtracted in the dp tail)
    e: dict = field(default_factory=dict)
    g: dict = field(default_factory=dict)
    wrap: Any = 0                           # last -> first transfer (interleaved)
    ends: dict = field(default_factory=dict)  # p -> both end stages on pool p; ("all", p) -> every stage (ANDs)
    emb: Any = 0                            # the tied embedding's all-reduce (ticks; add_embedding_sync)
    wrap_terms: list = field(default_factory=list)  # its (var, seconds, seconds subtracted)
    paths: set = field(default_factory=set)  # simulated step: the paths T is bounded by (add_paths)
    r: Any = None
    pipe: Any = None                        # steady-period term: (m-1) z, (m vpp - 1) z, (m-1)(zf + zb)
    D: Any = None
    o: Any = None
    step: Any = None                        # step time expression, ticks x scale
    scale: int = 1                          # step = scale x T (interleaved keeps integers)
    cuts: list = field(default_factory=list)  # plans cut off by add_no_good
    usd_h: Any = None                       # money units ($/h x Resolution.money)
    objective: Any = None


class PipelineModel:
    """Builds the model into a backend; one method per constraint family."""

    def __init__(self, coef: Coefficients, limits: Limits, backend: Backend, cutoff: float | None = None):
        """cutoff: only plans with objective below this value (seconds or $/step) are wanted;
        the driver passes its incumbent so a config that cannot beat it is refuted fast."""
        self.c, self.lim, self.be, self.cutoff = coef, limits, backend, cutoff
        self.period_weight = 0   # add_steady_period's w: P >= w t_s on every stage (0: no P)
        self.cfg = coef.cfg
        self.S = range(coef.cfg.pp)
        self.O = range(len(coef.options))
        self.P = range(len(coef.pools))
        self.opts_of = coef.pool_options()
        self.pool_of_type = {pool.k: p for p, pool in enumerate(coef.pools)}
        assert len(self.pool_of_type) == len(coef.pools), "a solved config has one stage size per node type"
        self.L = coef.inst.model.num_layers
        self.simulated = coef.basis() == SIMULATED
        self._weighted: dict[tuple, Any] = {}   # (what, index, weight) -> expression (add_path)
        self._last: tuple | None = None          # the last plan read from a solution (extract): add_path's hint
        self.v = Vars()
        self.res = self._resolution()
        self.t_hi = self._time_upper_bound()
        self.h_hi = self._hop_upper_bound()
        self.dp_hi = self._stage_upper_bound(coef.dp_time)
        self.e_hi = self.res.t_up(self._embedding_hi_s())
        self.opt_hi = self._stage_upper_bound(coef.opt_time)

    # ---- rounding -------------------------------------------------------------------------
    def prices_step(self) -> bool:
        """Whether a $/step term (min-cost, a $/step budget) links the step to the prices (add_cost's W)."""
        return self.lim.objective == "min-cost" or self.lim.budget_usd_per_step is not None

    def _positions(self) -> list[int]:
        """One stage position of each kind the cost model tells apart: first, a middle one, last."""
        return sorted({0, min(1, self.cfg.pp - 1), self.cfg.pp - 1})

    def _aff_hi_s(self, aff: Affine) -> float:
        """Seconds: the most a n + rho r + c y takes over 0 <= r <= n <= L, y in {0, 1}."""
        return max(aff.a, 0.0) * self.L + max(aff.rho, 0.0) * self.L + max(aff.c, 0.0)

    def _resolution(self) -> Resolution:
        """The finest tick (TICKS, at least 1 us) at which the step's upper bound stays below
        the backend's magnitude (W_MAGNITUDE when a $/step term links it to a big-M)."""
        c = self.c
        mag = self.be.magnitude
        if self.prices_step():
            mag = min(mag, W_MAGNITUDE)
        t = max(self._aff_hi_s(c.time(o, s)[0]) for o in self.O for s in self._positions())
        h = max([c.hop_intra(p) for p in self.P] + [c.hop_inter(p, j) for p in self.P for j in self.pool_of_type])
        dp = max(self._aff_hi_s(a) for o in self.O for s in self._positions() for a in c.dp_time(o, s))
        dp += self._embedding_hi_s()
        opt = max(self._aff_hi_s(c.opt_time(o, s)) for o in self.O for s in self._positions())
        step_s = self._step_bound(t, h, dp, opt)
        return Resolution(next((k for k in TICKS if step_s * k <= mag), TICKS[-1]))

    def _step_bound(self, t: float, h: float, dp: float, opt: float) -> float:
        """An upper bound of the scaled step expression over every plan of the config, given
        bounds of a stage time, a hop, a reduction and an optimizer step (any unit). Simulated
        step: no path is longer than every operation of the step in a row (each rank m t,
        2 m (pp v - 1) transfers, a reduction, an optimizer step)."""
        cfg, sc, m = self.cfg, v_scale(self.cfg), self.c.m
        if self.simulated:
            return sc * (m * cfg.pp * t + 2 * m * cfg.pp * cfg.vpp * h + dp + opt)
        z = t + 2 * h  # bounds z, zf + zb, and t_s + 2 h_s
        return (sc * m * z + cfg.pp * t + 2 * sc * sc * cfg.pp * h + 2 * sc * sc * h
                + sc * dp + sc * opt + sc * cfg.pp * (t + h))

    def _embedding_hi_s(self) -> float:
        """Seconds: the most the tied embedding's all-reduce takes in this config."""
        c = self.c
        return max((c.embedding_sync(o, k, same) for o in self.O for k in self.pool_of_type for same in (False, True)),
                   default=0.0)

    def _aff_ticks(self, aff: Affine, s: int, o: int, rnd=None):
        """a n + rho r + c y in ticks, each coefficient rounded by `rnd` (default: down)."""
        v, rnd = self.v, rnd or self.res.t_down
        expr = [rnd(aff.a) * v.n[s, o], rnd(aff.c) * v.y[s, o]]
        if (s, o) in v.rr:
            expr.append(rnd(aff.rho) * v.rr[s, o])
        return self.be.sum(expr)

    def _aff_hi(self, aff: Affine) -> int:
        """Ticks: the most the rounded a n + rho r + c y takes (rounded-up coefficients bound
        the rounded-down ones), so no variable bound cuts off a plan."""
        up_ = self.res.t_up
        return max(up_(aff.a), 0) * self.L + max(up_(aff.rho), 0) * self.L + max(up_(aff.c), 0)

    def _time_upper_bound(self) -> int:
        return max(self._aff_hi(self.c.time(o, s)[0]) for o in self.O for s in self._positions())

    def _hop_upper_bound(self) -> int:
        c = self.c
        worst = [max(c.hop_intra(p), *(c.hop_inter(p, j) for j in self.pool_of_type)) for p in self.P]
        return self.res.t_up(max(worst, default=0.0))

    def _stage_upper_bound(self, coefficient) -> int:
        """Most ticks a per-stage term (reduction, optimizer step) takes in the model (the end
        stages' reduction adds the embedding all-reduce: dp_hi + e_hi)."""
        return max((self._aff_hi(a) for o in self.O for s in self._positions() for a in _pieces(coefficient(o, s))),
                   default=0)

    def _on_pool(self, s: int, p: int):
        """Y[s,p]: stage s runs as one of pool p's options (a 0/1 expression)."""
        opts = self.opts_of[p]
        return self.v.y[s, opts[0]] if len(opts) == 1 else self.be.sum([self.v.y[s, o] for o in opts])

    # ---- constraint families -----------------------------------------------------------
    def add_stage_type(self) -> None:
        """Every stage runs as exactly one stage option (node type, tp, dp, recompute)."""
        be, v = self.be, self.v
        for s in self.S:
            for o in self.O:
                v.y[s, o] = be.new_bool(f"y[{s},{o}]")
            be.add(be.sum([v.y[s, o] for o in self.O]) == 1)

    def add_layer_cover(self) -> None:
        """Layers sum to L; every stage holds >= 1 layer (>= vpp and a multiple of vpp when interleaved)."""
        be, v, vpp = self.be, self.v, self.cfg.vpp
        for s in self.S:
            for o in self.O:
                if vpp > 1:
                    q = be.new_int(0, self.L // vpp, f"q[{s},{o}]")
                    v.n[s, o] = be.new_int(0, self.L, f"n[{s},{o}]")
                    be.add(v.n[s, o] == vpp * q)
                else:
                    v.n[s, o] = be.new_int(0, self.L, f"n[{s},{o}]")
                be.add(v.n[s, o] <= self.L * v.y[s, o])
            be.add(be.sum([v.n[s, o] for o in self.O]) >= vpp)
        be.add(be.sum([v.n[s, o] for s in self.S for o in self.O]) == self.L)

    def add_pins(self) -> None:
        """--fix layers=n_0,...: stage s holds n_s layers; --fix order=G_0,...: stage s runs on
        a node type called G_s (or of GPU G_s)."""
        be, v, c = self.be, self.v, self.c
        for s in self.S:
            if "layers" in c.pins:
                be.add(be.sum([v.n[s, o] for o in self.O]) == c.pins["layers"][s])
            allowed = pinned_types(c.inst, c.pins, s)
            if allowed is not None:
                for o in self.O:
                    if c.options[o].k not in allowed:
                        be.add(v.y[s, o] == 0)

    def add_recompute(self) -> None:
        """Full recompute, 1 <= r_s <= n_s (a multiple of vpp: Megatron recomputes r / vpp
        layers of every chunk). Megatron mode: one r for all stages, rr[s,o] = r y[s,o]
        (exact linearisation). Free mode: rr[s,o] is stage s's own count, vpp y <= rr <= n."""
        be, v, L, vpp = self.be, self.v, self.L, self.cfg.vpp
        full = [o for o in self.O if self.c.full(o)]
        if not full:
            return
        if self.c.shared_r:
            v.r = be.new_int(1, L, "r")
            if vpp > 1:
                rq = be.new_int(1, L // vpp, "r/vpp")
                be.add(v.r == vpp * rq)
        for s in self.S:
            if v.r is not None:
                be.add(v.r <= be.sum([v.n[s, o] for o in self.O]))
            for o in full:
                v.rr[s, o] = be.new_int(0, L, f"rr[{s},{o}]")
                if v.r is not None:
                    be.add(v.rr[s, o] <= L * v.y[s, o])
                    be.add(v.rr[s, o] <= v.r)
                    be.add(v.rr[s, o] >= v.r - L * (1 - v.y[s, o]))
                    continue
                be.add(v.rr[s, o] <= v.n[s, o])
                be.add(v.rr[s, o] >= vpp * v.y[s, o])
                if vpp > 1:
                    rq = be.new_int(0, L // vpp, f"rr/vpp[{s},{o}]")
                    be.add(v.rr[s, o] == vpp * rq)

    def add_contiguity(self) -> None:
        """Runs of a pool whose stages share nodes (q_p >= 2 stages per node). Each run starts on a
        fresh node (placement.place_stages) and fills q_p stages per node. A pool may form several
        runs, as in an order A100, A10, A100. The variables:
        - st[s,p] = Y[s,p] (1 - Y[s-1,p]): a run starts at stage s;
        - w[s,p,i]: stage s is the i-th stage of its node, i = (stages since its run's start) mod
          q_p. It is one-hot over i when Y[s,p] = 1, 0 otherwise, with w[s,p,0] >= st[s,p] and
          w[s,p,i] >= w[s-1,p,i-1 mod q_p] + Y[s,p] - 1.
        The pool's nodes are its stages at position 0 (add_device_count), and a node boundary lies
        after position q_p - 1 (add_hops). A pool whose stages take whole nodes needs none of it:
        its nodes, price and hops do not depend on how its stages are grouped."""
        be, v = self.be, self.v
        for p in self.P:
            q = self.c.pools[p].place.stages_per_node
            if q < 2:
                continue
            for s in self.S:
                on, before = self._on_pool(s, p), (self._on_pool(s - 1, p) if s else 0)
                v.st[s, p] = be.new_bool(f"st[{s},{p}]")
                be.add(v.st[s, p] >= on - before)
                be.add(v.st[s, p] <= 1 - before)
                for i in range(q):
                    v.w[s, p, i] = be.new_bool(f"w[{s},{p},{i}]")
                be.add(be.sum([v.w[s, p, i] for i in range(q)]) == on)
                be.add(v.w[s, p, 0] >= v.st[s, p])
                if s:
                    for i in range(q):
                        be.add(v.w[s, p, i] >= v.w[s - 1, p, (i - 1) % q] + on - 1)

    def _nodes(self, p: int):
        """Nodes of a shared-node pool p: its stages that are first on their node."""
        return self.be.sum([self.v.w[s, p, 0] for s in self.S])

    def _node_priced(self, p: int) -> bool:
        """Pool p's price depends on its node count, not only its stage count: its stages share
        nodes (several runs may use more nodes than one) and its type bills whole nodes."""
        pool = self.c.pools[p]
        return pool.place.stages_per_node >= 2 and self.c.types[pool.k].billing == "node"

    def add_device_count(self) -> None:
        """u[p,beta] one-hot: pool p holds beta stages, at most what fits on its type's nodes
        (at least one in a free child config: its node types are chosen). A pool whose stages
        share nodes also counts its nodes, sum_s w[s,p,0] = sum_c c nn[p,c] <= its type's
        count, nn one-hot (its runs may need more nodes than ceil(beta / q_p))."""
        be, v, c = self.be, self.v, self.c
        for p in self.P:
            betas = range(c.min_stages(p), c.max_stages(p) + 1)
            for beta in betas:
                v.u[p, beta] = be.new_bool(f"u[{p},{beta}]")
            be.add(be.sum([v.u[p, beta] for beta in betas]) == 1)
            be.add(be.sum([self._on_pool(s, p) for s in self.S])
                   == be.sum([beta * v.u[p, beta] for beta in betas]))
            if c.pools[p].place.stages_per_node >= 2:  # runs on nodes of their own (add_contiguity)
                count = c.types[c.pools[p].k].count
                counts = range(1 if c.min_stages(p) else 0, count + 1)
                for n in counts:
                    v.nn[p, n] = be.new_bool(f"nn[{p},{n}]")
                be.add(be.sum([v.nn[p, n] for n in counts]) == 1)
                be.add(self._nodes(p) == be.sum([n * v.nn[p, n] for n in counts]))

    def add_shared_nodes(self) -> None:
        """Mixed-type stages (--mixed-stages) take whole nodes of the node types they mix: per
        node type k, the nodes its own pool p uses plus n_k per stage of each bundle holding k
        are at most its count: nodes_p + sum_q n_{q,k} sum_beta beta u[q,beta] <= count_k, with
        nodes_p = sum_beta nodes_used(beta) u[p,beta] for stages of whole nodes and
        sum_s w[s,p,0] where they share nodes (placement.place_stages puts the bundles on the
        last nodes)."""
        be, v, c = self.be, self.v, self.c
        mixed = [q for q in self.P if isinstance(c.types[c.pools[q].k], MixedNodeType)]
        if not mixed:
            return
        for k, nt in enumerate(c.inst.cluster.node_types):
            terms = []
            for q in mixed:
                n = dict(c.types[c.pools[q].k].members).get(nt, 0)
                terms += [n * beta * var for (p, beta), var in v.u.items() if p == q and n and beta]
            if not terms:
                continue
            p = self.pool_of_type.get(k)
            if p is not None and c.pools[p].place.stages_per_node >= 2:
                terms.append(self._nodes(p))
            elif p is not None:
                place = c.pools[p].place
                terms += [place.nodes_used(beta) * var for (pp_, beta), var in v.u.items() if pp_ == p and beta]
            be.add(be.sum(terms) <= nt.count)

    def add_memory_capacity(self) -> None:
        """Per GPU: a n + rho r + c <= usable capacity of the option's node type (integer bytes,
        coefficients rounded down and capacity down: a relaxation, checked exactly afterwards)."""
        be, v = self.be, self.v
        for s in self.S:
            for o in self.O:
                mem = self.c.memory(o, s)
                terms = [down(mem.a) * v.n[s, o], down(mem.c) * v.y[s, o]]
                if (s, o) in v.rr:
                    terms.append(down(mem.rho) * v.rr[s, o])
                be.add(be.sum(terms) <= down(self.c.capacity(o)))

    def _stage_expr(self, s: int, part: int, factor: int = 1, rnd=None, options=None):
        """factor x (t_s if part == 0, b_s if 1, f_s = t_s - b_s if 2) in ticks, the factor
        applied before rounding (by `rnd`, default down): the error stays < 1 tick per unit
        of n, r, y whatever the factor. `options`: only these options' terms (a pool's part)."""
        terms = []
        for o in (self.O if options is None else options):
            t, b = self.c.time(o, s)
            aff = (t, b, Affine(t.a - b.a, t.rho - b.rho, t.c - b.c))[part]
            terms.append(self._aff_ticks(Affine(factor * aff.a, factor * aff.rho, factor * aff.c), s, o, rnd))
        return self.be.sum(terms)

    def add_stage_time(self) -> None:
        """t_s = sum_o (a n + rho r + c y) ticks, and b_s rounded up for the dp tail where it
        is subtracted."""
        v = self.v
        for s in self.S:
            v.t.append(self._stage_expr(s, 0))
            v.bwd_up.append(self._stage_expr(s, 1, rnd=self.res.t_up))

    def _and(self, name: str, *bools):
        """An exact AND of 0/1 expressions: w <= each, w >= sum - (n - 1)."""
        be = self.be
        w = be.new_bool(name)
        for x in bools:
            be.add(w <= x)
        be.add(w >= be.sum(list(bools)) - (len(bools) - 1))
        return w

    def _leaving(self, s: int, s2: int, p: int, name: str) -> list:
        """Cost terms (var, seconds) of a transfer from stage s in pool p to stage s2 on another
        node type: x[s,p,j] = Y[s,p] AND (s2 on type j), one per node type j != p's."""
        terms = []
        for j in sorted(self.pool_of_type):
            if j == self.c.pools[p].k:
                continue
            x = self._and(f"{name}[{s},{p},{j}]", self._on_pool(s, p),
                          self._on_pool(s2, self.pool_of_type[j]))
            self.v.x[s, p, j] = x
            terms.append((x, self.c.hop_inter(p, j), 0.0))
        return terms

    def _hop_expr(self, terms: list, rnd):
        """sum of (rnd(plus) - rnd(minus)) var: each case (a set of true vars) sums to rnd of
        its own transfer time, so rounding down (up) gives a lower (upper) bound of it."""
        return self.be.sum([(rnd(plus) - (rnd(minus) if minus else 0)) * var for var, plus, minus in terms])

    def add_hops(self) -> None:
        """h[s] exactly: same pool -> intra-node unless a node boundary lies between the two
        stages (canonical placement: each run of a pool starts on a fresh node and puts q_p =
        stages_per_node stages on each: a boundary follows position q_p - 1, add_contiguity);
        otherwise another node -> inter-node. Kept rounded down (h) and up (h_up: subtracted in
        the dp tail)."""
        v, c = self.v, self.c
        for s in list(self.S)[:-1]:
            terms = []  # (var, seconds, seconds subtracted)
            for p in self.P:
                v.e[s, p] = self._and(f"e[{s},{p}]", self._on_pool(s, p), self._on_pool(s + 1, p))
                q = c.pools[p].place.stages_per_node
                if q >= 2:  # a node boundary follows the last stage of a node (add_contiguity)
                    v.g[s, p] = self._and(f"g[{s},{p}]", v.e[s, p], v.w[s, p, q - 1])
                    terms += [(v.e[s, p], c.hop_intra(p), 0.0),
                              (v.g[s, p], c.hop_inter(p, c.pools[p].k), c.hop_intra(p))]
                else:
                    terms.append((v.e[s, p], c.hop_inter(p, c.pools[p].k), 0.0))
                terms += self._leaving(s, s + 1, p, "x")
            v.hop_terms.append(terms)
            v.h.append(self._hop_expr(terms, self.res.t_down))
            v.h_up.append(self._hop_expr(terms, self.res.t_up))
            self._pair_flows(s, s + 1, lambda p, q, s=s: v.e[s, p] if p == q else v.x[s, p, c.pools[q].k])
        if self.cfg.sched.chunks > 1 and self.cfg.pp > 1:  # chunk j of the last rank feeds chunk j+1 of rank 0
            last, terms = self.cfg.pp - 1, []
            for p in self.P:
                # the wrap stays inside one node only when the whole pipeline is pool p on one node
                # (one run: pp <= q_p); both ends on p in two runs are on two nodes
                one_node = 0 < self.cfg.pp <= c.pools[p].place.stages_per_node
                w = self._both_ends_on(p, f"wrap[{p},{p}]")
                terms.append((w, c.hop_inter(p, c.pools[p].k), 0.0))
                if one_node:
                    terms.append((self._all_on(p), c.hop_intra(p), c.hop_inter(p, c.pools[p].k)))
                terms += self._leaving(last, 0, p, "wrap")
            v.wrap_terms = terms
            v.wrap = self._hop_expr(terms, self.res.t_down)
            self._pair_flows(last, 0, lambda p, q: v.ends[p] if p == q else v.x[last, p, c.pools[q].k])

    def _pair_flows(self, s: int, s2: int, pair) -> None:
        """The pools of stages s and s2 as flows: `pair(p, q)` is the exact AND of Y[s,p] and
        Y[s2,q]; exactly one pair holds (each stage runs on one pool), so
            sum_q pair(p, q) = Y[s,p]  and  sum_p pair(p, q) = Y[s2,q].
        Implied by the integer model (removes no plan); in the LP relaxation they keep a
        fractional stage from pairing with no pool at all, which set every hop's time to 0
        (the AND's lower bound Y + Y' - 1 is 0 below a half). Free configs only: in Megatron
        mode they slowed CP-SAT (the fasop-8x8 Pareto sweep 27.9 -> 41.5 work units, 23.9 ->
        36.7 s). pipeline.md, "add_hops"."""
        be = self.be
        if self.cfg.uniform is not None:
            return
        for p in self.P:
            be.add(be.sum([pair(p, q) for q in self.P]) == self._on_pool(s, p))
            be.add(be.sum([pair(q, p) for q in self.P]) == self._on_pool(s2, p))

    def _both_ends_on(self, p: int, name: str):
        """v.ends[p] = Y[0,p] AND Y[pp-1,p] (created once, named by its first user)."""
        if p not in self.v.ends:
            self.v.ends[p] = self._and(name, self._on_pool(self.cfg.pp - 1, p), self._on_pool(0, p))
        return self.v.ends[p]

    def _all_on(self, p: int):
        """Every stage on pool p (an exact AND; with pp <= q_p: the pipeline on one node)."""
        key = ("all", p)
        if key not in self.v.ends:
            self.v.ends[key] = self._and(f"all[{p}]", *[self._on_pool(s, p) for s in self.S])
        return self.v.ends[key]

    def _end_stages(self) -> tuple[int, ...]:
        """The stages the tied embedding's all-reduce holds up (none without it)."""
        return (0, self.cfg.pp - 1) if self.e_hi else ()

    def add_embedding_sync(self) -> None:
        """emb >= the tied embedding's all-reduce between the end stages, exactly as
        costmodel.tied_embedding_sync_s prices it (the larger of the two directions' times),
        with no product variable: for an end stage's option o and the other end's node type j,
            emb >= e(o, j) (y[end,o] + Y[other,j] - 1 - ends[p(o)]),
        e(o, j) its shard over the inter-node link to type j, all[p] the AND of every stage on
        pool p, subtracted where the whole pipeline then sits on one node (pp <= stages per
        node of p: one run from a fresh node; both ends on p in two runs are two nodes); there
            emb >= e_intra(o) (y[end,o] + all[p(o)] - 1).
        A right side is positive only for the plan's own (option, type) of an end, so emb's least
        value is the cost model's (rounded down); emb enters the reductions of both ends
        (PlanCosts.tail_s): add_paths, add_dp_optimizer. pipeline.md, "add_embedding_sync"."""
        if not self.e_hi:
            return
        be, v, c, last = self.be, self.v, self.c, self.cfg.pp - 1
        v.emb = be.new_int(0, self.e_hi, "emb")
        for end, other in ((0, last), (last, 0)):
            for o in self.O:
                p = c.pool_of[o]
                k = c.pools[p].k
                one_node = last + 1 <= c.pools[p].place.stages_per_node
                both = self._all_on(p) if one_node else 0
                for j in sorted(self.pool_of_type):
                    e = self.res.t_down(c.embedding_sync(o, j, False))
                    if e:
                        be.add(v.emb >= e * (v.y[end, o] + self._on_pool(other, self.pool_of_type[j]) - 1
                                           - (both if j == k else 0)))
                e = self.res.t_down(c.embedding_sync(o, k, True))
                if one_node and e:
                    be.add(v.emb >= e * (v.y[end, o] + both - 1))

    def _scaled_hop(self, s: int, factor: int):
        return self._hop_expr(self.v.hop_terms[s], lambda x: self.res.t_down(factor * x))

    def add_steady_period(self) -> None:
        """The steady-period term P of the step (costmodel.pipeline_time_s), each stage time and
        hop multiplied by its weight before rounding:
          1F1B:        P = (m-1) z, (c-a+1) z >= sum_{a..c} t + 2 sum_{a..c-1} h for every window
                       a..c (schedules.steady_period_s): P >= floor((m-1) window / (c-a+1));
          interleaved: P = (m vpp - 1) z, z >= t_s;
          GPipe:       P = (m-1) (zf + zb), zf >= f_s, h_s and zb >= b_s, h_s (two flow shops).
        P is at most the cost model's (a relaxation, exact up to a few ticks)."""
        be, v, cfg, m, pp = self.be, self.v, self.cfg, self.c.m, self.cfg.pp
        hi = m * v_scale(cfg) * (self.t_hi + 2 * self.h_hi)
        if cfg.sched.period is Period.BOTTLENECK:
            w = m * cfg.vpp - 1
            v.pipe = be.new_int(0, hi, "P")
            for s in self.S:
                be.add(v.pipe >= self._stage_expr(s, 0, w))
            self.add_pool_work(v.pipe, 0, w, hi)
            self.period_weight = w
            return
        w = m - 1
        if cfg.sched.period is Period.FLOW_SHOP:
            zf, zb = be.new_int(0, hi, "(m-1)zf"), be.new_int(0, hi, "(m-1)zb")
            for s in self.S:
                be.add(zf >= self._stage_expr(s, 2, w))
                be.add(zb >= self._stage_expr(s, 1, w))
            self.add_pool_work(zf, 2, w, hi)
            self.add_pool_work(zb, 1, w, hi)
            for s in range(pp - 1):  # a link is a machine of both flow shops
                be.add(zf >= self._scaled_hop(s, w))
                be.add(zb >= self._scaled_hop(s, w))
            v.pipe = be.sum([zf, zb])
            self.period_weight = w
            return
        v.pipe = be.new_int(0, hi, "P")
        ts = [self._stage_expr(s, 0, w) for s in self.S]
        for s in self.S:
            be.add(v.pipe >= ts[s])
        self.add_pool_work(v.pipe, 0, w, hi)
        self.period_weight = w
        if pp < 2 or w == 0:
            return
        Q = [0]
        for s in range(pp - 1):
            q = be.new_int(0, hi * pp, f"Q[{s + 1}]")
            be.add(q == (Q[-1] if s else 0) + ts[s] + 2 * self._scaled_hop(s, w))
            Q.append(q)
        for a in range(pp):
            for c in range(a + 1, pp):
                k = c - a + 1  # k P >= window - (k - 1)  <=>  P >= floor(window / k)
                be.add(k * v.pipe >= Q[c] - (Q[a] if a else 0) + ts[c] - (k - 1))

    def add_bottleneck_floor(self, least_stage: float) -> None:
        """On a built model with a steady-period term P (the closed form; `period_weight` w),
        P >= w x least_stage less the rounding. least_stage (seconds) is at most the largest
        stage time of every plan of the config within memory and the limits
        (solvers.bounds.least_stage_time); P is at least w t_s on every stage (GPipe's
        (m-1)(zf + zb): zf >= f_s and zb >= b_s of the same stage), each of t_s's terms rounded
        down by less than a tick per unit of n, r or y (at most 2 L + 1 ticks, twice that in
        GPipe's two sums). Removes no plan, only the LP relaxation's points that spread the
        layers more evenly than whole layers can be (formulations/pipeline.md, "The bottleneck
        floor")."""
        w = self.period_weight
        if least_stage <= 0 or w <= 0:
            return
        floor = math.floor(w * least_stage * self.res.tps * (1 - 1e-9)) - 2 * (2 * self.L + 1)
        if floor > 0:
            self.be.add(self.v.pipe >= floor)

    def add_pool_work(self, z, part: int, w: int, hi: int) -> None:
        """A pool's stages each take at most the bottleneck: with z >= w x_s on every stage
        (x = t, b or f by `part`, weight w applied before rounding, as the caller's), the beta
        stages of pool p sum to at most beta z:
            sum_s sum_{o in p} w x_{s,o}  <=  sum_beta beta z_{p,beta},
        with z = sum_beta z_{p,beta}, 0 <= z_{p,beta} <= hi u[p,beta] (exact: one beta is on).
        Implied by z >= w x_s (x_{s,o} is 0 off option o): a redundant family that removes no
        plan, only fractional points of the LP relaxation, which otherwise spreads a pool's
        layers over every stage (one 32-GPU A100 stage of mixed-128 holding 40 layers at a
        fortieth of each of 8 stages). pipeline.md, "add_pool_work"."""
        be, v = self.be, self.v
        for p in self.P:
            betas = sorted(beta for (q, beta) in v.u if q == p)
            lhs = be.sum([self._stage_expr(s, part, w, options=self.opts_of[p]) for s in self.S])
            if len(betas) == 1:
                be.add(lhs <= betas[0] * z)
                continue
            parts = []
            for beta in betas:
                zb = be.new_int(0, hi, f"z[{p},{beta}]")
                be.add(zb <= hi * v.u[p, beta])
                parts.append((beta, zb))
            be.add(be.sum([zb for _, zb in parts]) == z)
            be.add(lhs <= be.sum([beta * zb for beta, zb in parts if beta]))

    def add_optimizer(self) -> None:
        """opt >= opt_s for every stage: the optimizer steps run side by side after the barrier."""
        be, v = self.be, self.v
        v.opt = be.new_int(0, self.opt_hi, "o")
        for s in self.S:
            for o in self.O:
                be.add(v.opt >= self._aff_ticks(self.c.opt_time(o, s), s, o))

    def add_dp_optimizer(self) -> None:
        """D >= scale (dp_s - sum_{k<s} (b_k / v + h_k)) and opt >= opt_s for every stage
        (costmodel.dp_tail_s; D is scale x the reduction tail), dp_s with emb on the end stages
        (PlanCosts.tail_s). The subtracted b_k and h_k are rounded up, dp_s down, so D is at
        most the cost model's. One row per stage and piece, its dp_s summed over the options, the
        hidden prefix one variable (pipeline.md, "add_dp_optimizer"), not a row per option with
        the prefix written out: mixed-128's free proof 21.7 -> 16.2 work units."""
        be, v = self.be, self.v
        sc = v_scale(self.cfg)
        v.D = be.new_int(0, sc * (self.dp_hi + self.e_hi), "D")
        self.add_optimizer()
        hidden = self._hidden_before()
        for s in self.S:
            pieces = {o: self.c.dp_time(o, s) for o in self.O}
            for i in range(max(len(p) for p in pieces.values())):   # the exposed reduction is their max
                # piece i of the option stage s runs as: the others' terms are 0 (n, rr, y are);
                # an option with fewer pieces repeats its last (its max holds)
                dp = be.sum([self._aff_ticks(p[min(i, len(p) - 1)], s, o) for o, p in pieces.items()])
                if s in self._end_stages():
                    dp = be.sum([dp, v.emb])
                be.add(v.D >= be.sum([sc * dp, -1 * hidden[s]]) if s else v.D >= sc * dp)

    def _hidden_before(self) -> list:
        """B[s] = sum_{k<s} (b_k + scale h_k), b and h rounded up (bwd_up, h_up): how much of
        stage s's reduction stage 0's later end hides (costmodel.dp_tail_s). A variable per
        stage, defined once, so that each reduction row reads one term, not the whole prefix
        over every option of the earlier stages (pipeline.md, "add_dp_optimizer"). Its domain
        holds every value: one option per stage is on, so b_k is at most the largest |a| L +
        |rho| L + |c| of its options' rounded-up b, and a hop at most the slowest transfer
        (h_hi)."""
        be, v, sc, L, up_ = self.be, self.v, v_scale(self.cfg), self.L, self.res.t_up
        out: list = [0]
        most = 0
        for k in list(self.S)[:-1]:
            most += max(abs(up_(b.a)) * L + abs(up_(b.rho)) * L + abs(up_(b.c))
                        for b in (self.c.time(o, k)[1] for o in self.O)) + sc * self.h_hi
            x = be.new_int(-most, most, f"B[{k + 1}]")
            be.add(x == be.sum([out[-1], v.bwd_up[k], sc * v.h_up[k]]))
            out.append(x)
        return out

    def add_paths(self) -> None:
        """Simulated step (pipeline.md, "add_paths"): T >= the length of every known path of
        the config's step graph (Coefficients.paths), each a linear function of the stage,
        transfer, reduction and optimizer times. The simulated step is the longest path, so T
        is at most it (a relaxation) and equals it once the plan's critical path is among
        them; the driver adds the critical path of every plan that the model underestimates."""
        be, v = self.be, self.v
        v.scale = v_scale(self.cfg)
        v.step = be.new_int(0, self._step_upper_bound(), "T")
        for path in self.c.paths():
            self.add_path(path)
        if self.lim.time_limit_s is not None:
            be.add(v.step <= down(v.scale * self.lim.time_limit_s * self.res.tps))

    def _weighted_term(self, key: tuple, make):
        """One expression per (what, index, weight): many paths weigh a stage, a hop or a
        reduction alike."""
        if key not in self._weighted:
            self._weighted[key] = make()
        return self._weighted[key]

    def add_path(self, path: PathTerms) -> bool:
        """scale T >= scale x the path's length, each term's weight applied before rounding
        (down). False when the model already has this path. Added after a solve (the driver's
        path rounds), the last plan read from the model (`extract`) becomes the next run's hint:
        it is still a solution, now with its own path counted."""
        be, v, sc = self.be, self.v, v_scale(self.cfg)
        if path in v.paths:
            return False
        v.paths.add(path)
        if self._last is not None and hasattr(be, "clear_hints"):
            be.clear_hints()
            self.hint(*self._last)
        terms = []
        for s in self.S:
            for part, share in ((2, path.fwd[s]), (1, path.bwd[s])):
                k = round(sc * share)
                assert abs(k - sc * share) < 1e-9, "a modelled schedule's paths take whole chunks"
                if k:  # many paths weigh a stage alike: one expression each
                    terms.append(self._weighted_term((part, s, k), lambda s=s, part=part, k=k: self._stage_expr(s, part, k)))
            if path.dp[s]:
                terms.append(self._weighted_term(("dp", s, sc * path.dp[s]),
                                                 lambda k=sc * path.dp[s], s=s: self._dp_expr(s, k)))
                if s in self._end_stages():
                    k = round(sc * path.dp[s])
                    assert abs(k - sc * path.dp[s]) < 1e-9, "a path takes a whole reduction"
                    terms.append(k * v.emb)
        for h, count in enumerate(path.hop):
            if count:
                k = round(sc * count)
                terms.append(self._weighted_term(("h", h, k), lambda h=h, k=k: self._scaled_hop(h, k)))
        if path.wrap:
            k = round(sc * path.wrap)
            terms.append(self._weighted_term(("w", 0, k), lambda k=k: self._hop_expr(
                v.wrap_terms, lambda x: self.res.t_down(k * x))))
        if sum(path.opt):
            terms.append(sc * v.opt)  # the path's optimizer step is at most the largest: T >= ... + max opt
        be.add(v.step >= be.sum(terms))
        return True

    def _dp_expr(self, s: int, k: float):
        """k x stage s's exposed reduction in ticks: the sum over its options of the one piece
        (no overlap); with several pieces (costmodel.stage_dp_pieces_s) a variable E >= each
        piece's sum, exact where the step is minimised (E only lower-bounds T)."""
        be, pieces = self.be, {o: self.c.dp_time(o, s) for o in self.O}
        count = max(len(p) for p in pieces.values())   # an option with fewer repeats its last (its max holds)
        sums = [be.sum([self._aff_ticks(_scaled(pieces[o][min(i, len(pieces[o]) - 1)], k), s, o) for o in self.O])
                for i in range(count)]
        if count == 1:
            return sums[0]
        hi = max(self._aff_hi(_scaled(a, k)) for p in pieces.values() for a in p)
        e = be.new_int(0, hi, f"E[{s},{k}]")
        for x in sums:
            be.add(e >= x)
        return e

    def add_step_time(self) -> None:
        """T (scaled): costmodel.pipeline_time_s + p2p_time_s + dp_tail_s + max optimizer."""
        be, v, cfg = self.be, self.v, self.cfg
        hops = be.sum(v.h) if v.h else 0
        if cfg.sched.chunks > 1:
            vp = cfg.vpp
            v.scale = vp  # vpp T = (m vpp - 1) z + sum t + vpp (2 (vpp sum h + (vpp-1) wrap) + o) + D
            v.step = be.sum([v.pipe, be.sum(v.t), 2 * vp * vp * hops, 2 * vp * (vp - 1) * v.wrap, v.D, vp * v.opt])
        else:  # 1F1B: (m-1) z + sum t + 2 sum h;  GPipe: (m-1)(zf + zb) + sum t + 2 sum h
            v.step = be.sum([v.pipe, be.sum(v.t), 2 * hops, v.D, v.opt])
        if self.lim.time_limit_s is not None:
            be.add(v.step <= down(v.scale * self.lim.time_limit_s * self.res.tps))

    def add_cost(self) -> None:
        """$/h from pool sizes (prices rounded down); W[p,beta] = T u[p,beta] (binary x
        bounded integer, exact) for $/step, written as its convex hull: every pool splits T over
        its one-hot u, sum_beta W[p,beta] = T with 0 <= W[p,beta] <= hi u[p,beta] (the big-M
        W >= T - hi (1 - u) alone left the LP a bound near 0, and CP-SAT under a cutoff crept
        up 1-tick bounds for minutes: pipeline.md, "add_cost")."""
        be, v, lim, res = self.be, self.v, self.lim, self.res
        # each pool's price on one one-hot: its stage count u[p,beta], or, where its price follows
        # its node count (_node_priced: several runs may use more nodes), nn[p,c]
        onehot = {key: var for key, var in v.u.items() if not self._node_priced(key[0])}
        onehot.update({key: var for key, var in v.nn.items() if self._node_priced(key[0])})
        price = {(p, x): res.usd_down(self.c.usd_per_hour_nodes(p, x) if self._node_priced(p)
                                      else self.c.usd_per_hour(p, x)) for (p, x) in onehot}
        v.usd_h = be.sum([price[key] * onehot[key] for key in onehot])
        if lim.budget_usd_per_hour is not None:
            be.add(v.usd_h <= down(lim.budget_usd_per_hour * res.money))
        if self.prices_step():
            hi = self._step_upper_bound()
            if lim.time_limit_s is not None:  # T <= the limit in every plan the model admits
                hi = min(hi, down(v.scale * lim.time_limit_s * res.tps))
            split: dict[int, list] = {}
            for (p, beta), var in onehot.items():
                w = be.new_int(0, hi, f"W[{p},{beta}]")
                be.add(w <= hi * var)
                be.add(w >= v.step - hi * (1 - var))
                split.setdefault(p, []).append(w)
                if beta and price[p, beta]:
                    v.W[p, beta] = (price[p, beta], w)
            for ws in split.values():
                be.add(be.sum(ws) == v.step)
            if lim.budget_usd_per_step is not None:
                # sum price W / (SECONDS_PER_HOUR scale tps money) <= budget
                be.add(be.sum([usd * w for usd, w in v.W.values()])
                       <= down(lim.budget_usd_per_step * SECONDS_PER_HOUR * v.scale * res.tps * res.money))

    def _step_upper_bound(self) -> int:
        """An upper bound of the scaled step expression (ticks) over every plan of the config."""
        return self._step_bound(self.t_hi, self.h_hi, self.dp_hi + self.e_hi, self.opt_hi) + 1

    def set_objective(self) -> None:
        be, v = self.be, self.v
        if self.lim.objective == "min-cost":
            v.objective = be.sum([usd * w for usd, w in v.W.values()]) if v.W else 0
        else:
            v.objective = v.step
        if self.cutoff is not None and not isinstance(v.objective, int):
            # a plan better than the cutoff has model objective <= its own < cutoff (a relaxation)
            be.add(v.objective <= down(self.cutoff * self._objective_scale()))
        be.minimize(v.objective)

    def _objective_scale(self) -> float:
        """Model objective units per second (min-time) or per $/step (min-cost)."""
        if self.lim.objective == "min-cost":
            return SECONDS_PER_HOUR * self.v.scale * self.res.tps * self.res.money
        return self.v.scale * self.res.tps

    def build(self) -> Vars:
        step = ((self.add_optimizer, self.add_paths) if self.simulated else
                (self.add_steady_period, self.add_dp_optimizer, self.add_step_time))
        for family in (self.add_stage_type, self.add_layer_cover, self.add_pins, self.add_recompute, self.add_contiguity,
                       self.add_device_count, self.add_shared_nodes, self.add_memory_capacity, self.add_stage_time,
                       self.add_hops,
                       self.add_embedding_sync, *step, self.add_cost, self.set_objective):
            family()
        return self.v

    def hint(self, options: Sequence[int], layers: Sequence[int], rs: Sequence[int]) -> None:
        """Start the search from a known plan of this config (option index, layers and
        recomputed layers per stage)."""
        be, v = self.be, self.v
        for s in self.S:
            for o in self.O:
                on = options[s] == o
                be.hint(v.y[s, o], int(on))
                be.hint(v.n[s, o], layers[s] if on else 0)
                if (s, o) in v.rr:
                    be.hint(v.rr[s, o], rs[s] if on else 0)

    def add_objective_floor(self, bound: float) -> None:
        """objective >= `bound` (model units), a bound a run of this model proved: the driver's
        later rounds only add paths and no-goods, which remove solutions, so the model's
        optimum cannot fall below it; stated, it spares the solver proving it again."""
        if not isinstance(self.v.objective, int):
            self.be.add(self.v.objective >= math.ceil(bound - 1e-9))

    def add_no_good(self, options: Sequence[int], layers: Sequence[int], rs: Sequence[int]) -> None:
        """Cut off one plan of this config (option, layers and recomputed layers per stage):
        some stage takes another option, or another layer or recomputed-layer count
        (indicator d = 1 only if the count lies below, or above, the cut plan's)."""
        be, v, L = self.be, self.v, self.L
        k = len(v.cuts)
        differs = []
        for s, (o, n, r) in enumerate(zip(options, layers, rs)):
            differs.append(1 - v.y[s, o])
            counts = [(v.n[s, o], n)] + ([(v.rr[s, o], r)] if (s, o) in v.rr else [])
            for i, (var, val) in enumerate(counts):
                lo, hi = be.new_bool(f"cut{k}<[{s},{i}]"), be.new_bool(f"cut{k}>[{s},{i}]")
                be.add(var <= val - 1 + (L + 1) * (1 - lo))
                be.add(var >= (val + 1) * hi)
                differs += [lo, hi]
        be.add(be.sum(differs) >= 1)
        v.cuts.append((tuple(options), tuple(layers), tuple(rs)))

    def rounding_error(self, options: Sequence[int], layers: Sequence[int], rs: Sequence[int],
                       usd_per_hour: float, step_s: float, objective: str | None = None) -> float:
        """Most the model objective of this plan lies below the cost model's (model units):
        a rounded coefficient errs by < 1 unit per unit of its multiplier (n, r, y), counted
        through every term of the step time (pipeline.md, "Rounding")."""
        cfg, sc = self.cfg, v_scale(self.cfg)
        e_t = [n + r + 1 for n, r in zip(layers, rs)]
        if self.simulated:  # one path: f and b of each stage, each hop and the wrap, a reduction, sc x opt
            err = 2 * sum(e_t) + cfg.pp + (self.L + 1) + sc * (self.L + 1) + 1
        else:
            hops = 2 * sc * sc * (cfg.pp - 1) + 2 * sc * (sc - 1)
            if cfg.sched.period is Period.BOTTLENECK:
                pipe = max(e_t)
            elif cfg.sched.period is Period.FLOW_SHOP:
                pipe = 2 * (max(e_t) + 1)
            else:  # a window's mean errs by < max e_t + 2 hops' worth, and the floor by < 1
                pipe = max(e_t) + 3
            tail = sc * (self.L + 1) + sum(e_t) + sc * cfg.pp
            err = pipe + sum(e_t) + hops + tail + sc * (self.L + 1) + 1
        if self.e_hi:  # E's coefficient, rounded down by < 1 tick, taken scale times
            err += sc
        if (objective or self.lim.objective) == "min-cost":  # price (floored, < 1 unit a pool) x W
            pools = len({self.c.pool_of[o] for o in options})
            err = usd_per_hour * self.res.money * err + pools * step_s * sc * self.res.tps
        return err * (1 + 1e-9)

    def step_short(self, raw_step: float, plan, options: Sequence[int], layers: Sequence[int],
                   rs: Sequence[int]) -> bool:
        """Simulated step: the model's T (`raw_step`, ticks x scale) lies below the plan's
        simulated step by more than the rounding, so its paths miss the plan's critical path."""
        p = plan.predicted
        err = self.rounding_error(options, layers, rs, p.usd_per_hour, p.step_time_s, "min-time")
        return raw_step < p.step_time_s * self.v.scale * self.res.tps - err - 1

    def objective_drift(self, raw: float, value: float, err: float, tight: bool) -> str | None:
        """None when the model's objective `raw` (model units) lies in [value - err, value] for
        the cost model's `value` (seconds or $/step), up to float noise; else what is wrong.
        Only a proven optimum (`tight`) has every maximum (P, D, o, W) at its least, so only
        there may the objective not exceed the cost model's. A backend that reads its values
        back inexactly (CBC: 8 significant digits) widens both sides by its value_rel_tol."""
        return _drift("objective", raw, value * self._objective_scale(), err, tight,
                      getattr(self.be, "value_rel_tol", 0.0))

    def usd_per_hour_drift(self, raw: float, usd_per_hour: float, options: Sequence[int]) -> str | None:
        """The same for the plan's $/h: each pool's price is rounded down by < 1 unit."""
        return _drift("$/h", raw, usd_per_hour * self.res.money, len({self.c.pool_of[o] for o in options}))

    def limit_drift(self, plan, options: Sequence[int], layers: Sequence[int], rs: Sequence[int]) -> str | None:
        """A plan the model accepted may break a limit or memory only by the rounding (the model
        is a relaxation): by more, the model's constraint has drifted from the cost model."""
        p, lim, res, sc = plan.predicted, self.lim, self.res, self.v.scale
        for s, sp in enumerate(p.stages):  # bytes: a n + rho r + c, < 1 byte per unit of n, r, y
            slack = (layers[s] + rs[s] + 2) / GIB + sp.capacity_gib * 1e-9
            if sp.peak_memory_gib > sp.capacity_gib + slack:
                return f"stage {s} needs {sp.peak_memory_gib:.9g} GiB, over the {sp.capacity_gib:.9g} the model allowed"
        t_err = self.rounding_error(options, layers, rs, p.usd_per_hour, p.step_time_s, "min-time") / (sc * res.tps)
        usd_err = self.rounding_error(options, layers, rs, p.usd_per_hour, p.step_time_s, "min-cost") \
            / (SECONDS_PER_HOUR * sc * res.tps * res.money)
        pools = len({self.c.pool_of[o] for o in options})
        checks = [(lim.time_limit_s, p.step_time_s, t_err, "s/step"),
                  (lim.budget_usd_per_hour, p.usd_per_hour, (pools + 1) / res.money, "$/h"),
                  (lim.budget_usd_per_step, p.usd_per_step, usd_err, "$/step")]
        for limit, value, slack, unit in checks:
            if limit is not None and value > limit * (1 + 1e-9) + slack:
                return f"the plan's {value:.9g} {unit} breaks the limit {limit:.9g} by more than the rounding"
        return None

    # ---- reading a solution --------------------------------------------------------------
    def objective_in_units(self, raw: float) -> float:
        """Model objective -> seconds (min-time) or $/step (min-cost)."""
        return raw / self._objective_scale()

    def units_of(self, objective: float) -> float:
        """Seconds (min-time) or $/step (min-cost) -> model objective units."""
        return objective * self._objective_scale()

    def extract(self, value) -> tuple[list[int], list[int], list[int]]:
        """(option per stage, layers per stage, recomputed layers per stage) from a value(var) function."""
        opts, layers, rs = [], [], []
        for s in self.S:
            o = max(self.O, key=lambda oo: value(self.v.y[s, oo]))
            opts.append(o)
            layers.append(int(round(value(self.v.n[s, o]))))
            rs.append(int(round(value(self.v.rr[s, o]))) if (s, o) in self.v.rr else 0)
        self._last = (opts, layers, rs)
        return opts, layers, rs


def _drift(what: str, raw: float, exact: float, err: float, tight: bool = True, rel_tol: float = 0.0) -> str | None:
    if tight and raw > exact * (1 + 1e-9 + rel_tol) + 1:
        return f"the model's {what} {raw:.0f} exceeds the cost model's {exact:.0f} (a rounded model must not)"
    if raw < exact - err - 1 - rel_tol * abs(exact):
        return (f"the model's {what} {raw:.0f} lies {exact - raw:.0f} below the cost model's {exact:.0f}, "
                f"more than its rounding ({err:.0f})")
    return None


def _pieces(value) -> tuple[Affine, ...]:
    """A per-stage coefficient as its pieces (dp_time gives several, opt_time one Affine)."""
    return value if isinstance(value, tuple) else (value,)


def _scaled(aff: Affine, k: float) -> Affine:
    return Affine(k * aff.a, k * aff.rho, k * aff.c)


def v_scale(cfg) -> int:
    """The model's time scale: the step is modelled as chunks x T (whole ticks for T / vpp terms)."""
    return cfg.sched.chunks
