"""The GPU-budget bound: a lower bound for a free-mode config whose stage sizes are open (a
parent of the free search, driver.py), valid for every config (formulations/pipeline.md,
"The GPU-budget bound of a parent").

A parent's bound over all its stage sizes (bounds.config_lower_bound) lets every stage run at
the per-layer time of the largest stage size while pp stages share the cluster: it does not
couple how many GPUs each stage gets with how many stages there are. This bound does.

Stage s runs option o_s on g_s = tp x dp GPUs of its node type, and its stage time per
micro-batch is t_s >= a_s n_s + (the fixed parts, E in total: bounds' `extra`), a_s the
option's per-layer time. A stage cannot do a layer's micro-batch in fewer GPU-seconds than
the least of its type, w_k = min_o a_o g_o, so with x_s = a_s n_s: g_s >= w_k n_s / x_s. The
stages hold disjoint GPUs, at most G_r of node type r, so

    sum_s n_s / x_s <= C = sum_r G_r / omega_r

(omega_r: the least w of any host type using r's GPUs; C in layers x micro-batches per
second). With Z = max_s x_s, the least S_l = sum_s x_s over n_s >= 1 (sum L) and x_s in
(0, Z] meeting the budget is at least, for every lambda >= 0 (Lagrange duality),

    D(lambda) = -lambda C + min_n sum_s h(n_s),   h(n) = min_{0 < x <= Z} (x + lambda n / x),

h is concave in n (a minimum of affine functions of n), so the least sum over the simplex
{n_s >= 1, sum n_s = L} is at a vertex: pp - 1 stages of one layer and one of N = L - pp + 1
(`least_layer_sum`, maximising D over lambda exactly: D is concave and piecewise smooth). Every
stage also has x_s >= a_min n_s, so S_l >= L a_min, and some stage holds ceil(L / pp) layers, so
Z >= a_min ceil(L / pp). Then, as in the joint bound (bounds._pipeline_bound), for each weight
pair T >= w_z max(Z, S / pp) + w_sum S + rest with S = E + S_l, minimised over Z
(`_least_over_z`: S(Z) only falls as Z grows, so each interval [Z_i, Z_j] is bounded by its
left end's Z and its right end's S; intervals are split until the bound is within
`Z_TOL` of a point's value or `Z_SPLITS` are used: the least interval bound is returned).

At 1024 GPUs (gpt3-175b) a pp 77 parent of 64 samples per micro-batch has a bound of 8.9 s
over its stage sizes; its children's least full bound is 39 s; this bound gives 32 s.
"""
from __future__ import annotations

import heapq
import math
from typing import NamedTuple

from milp_plan.cluster import MixedNodeType
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.job import Limits
from milp_plan.solvers.bounds import (_least_hops, _tied_sync_lower_bound, _type_gpus, bounded_objective,
                                      may_hold_layers, shared_option_terms, usable_options)

Z_TOL = 1e-4     # _least_over_z: stop when the least interval bound is within this share of a value at a point
Z_SPLITS = 48    # ... or after this many splits


def least_layer_sum(Z: float, C: float, pp: int, L: int) -> float:
    """At most the least sum_s x_s of pp stages holding L layers (n_s >= 1) with x_s <= Z and
    sum_s n_s / x_s <= C: max over lambda of D(lambda) (module docstring); inf when L / Z > C
    (no x <= Z meets the budget). Z = inf: ((pp - 1) + sqrt(N))^2 / C."""
    N = L - pp + 1
    if Z == math.inf:
        return ((pp - 1) + math.sqrt(N)) ** 2 / C
    if L > C * Z * (1 + 1e-12):
        return math.inf

    # D(lambda) = -lambda C + (pp - 1) h(lambda, 1) + h(lambda, N), h(lambda, n) = 2 sqrt(lambda n)
    # where lambda n <= Z^2, else Z + lambda n / Z: concave; its pieces meet at lambda = Z^2 / N and
    # Z^2: the stationary point of each piece, clamped to it, and the joints hold the maximum
    # (written out, as least_step's interval bound: least_step took 0.82 s over scale-1024's
    # 8,292 calls with the nested functions, 0.55 s so, the same floats)
    zz = Z * Z
    lo, hi = zz / N, zz
    cands = [lo, hi, min(((pp - 1 + math.sqrt(N)) / C) ** 2, lo)]   # nothing capped
    if pp > 1 and C > N / Z:                                         # the big stage capped at Z
        cands.append(min(max(((pp - 1) / (C - N / Z)) ** 2, lo), hi))
    best = -math.inf
    for lam in cands:
        big = lam * N
        d = (-lam * C + (pp - 1) * (2.0 * math.sqrt(lam) if lam <= zz else Z + lam / Z)
             + (2.0 * math.sqrt(big) if big <= zz else Z + big / Z))
        if d > best:
            best = d
    return best


class CapacityKey(NamedTuple):
    """`capacity` reads the options, the ends of the positions (pp: 1, 2 or more) and the $/h
    budget (what it rents of each node type)."""
    options: tuple
    depth: int
    budget_usd_per_hour: float | None


def capacity(coef: Coefficients, limits: Limits) -> tuple[float, float]:
    """(C, a_min): C = sum_r G_r / omega_r over the node types r some option's host uses
    (module docstring; G_r: what a $/h budget rents of it alone, bounds._type_gpus), and the
    least per-layer time a_min of any option at any position; memoised (`CapacityKey`)."""
    key = CapacityKey(tuple(coef.options), min(coef.cfg.pp, 3), limits.budget_usd_per_hour)
    return coef.shared.get(key, lambda: _capacity(coef, limits))


def _capacity(coef: Coefficients, limits: Limits) -> tuple[float, float]:
    K = len(coef.inst.cluster.node_types)
    index = {nt: r for r, nt in enumerate(coef.inst.cluster.node_types)}
    omega: dict[int, float] = {}
    a_min = math.inf
    positions = sorted({0, min(1, coef.cfg.pp - 1), coef.cfg.pp - 1})
    for o, opt in enumerate(coef.options):
        a = min(coef.time(o, s)[0].a for s in positions)
        a_min = min(a_min, a)
        host = coef.types[opt.k]
        for r in ([index[nt] for nt, _ in host.members] if isinstance(host, MixedNodeType) else [opt.k]):
            omega[r] = min(omega.get(r, math.inf), a * opt.group)
    assert all(r < K for r in omega)
    C = sum(_type_gpus(coef, r, limits) / w for r, w in omega.items() if w > 0)
    return (math.inf if any(w <= 0 for w in omega.values()) else C), a_min


def _least_over_z(f, z_lo: float, z_hi: float, enough: float = math.inf) -> float:
    """At most min over Z >= z_lo of f(Z_left, Z_right) where f(a, b) bounds the objective of
    every Z in [a, b] (f(z, z): the value at z) and f(z_hi, z_hi) bounds every Z >= z_hi;
    split no further once that reaches `enough`."""
    if z_lo >= z_hi:
        return f(z_lo, z_lo)
    tail = f(z_hi, z_hi)
    best = min(tail, f(z_lo, z_lo))          # values at points: at least the minimum
    heap = [(f(z_lo, z_hi), z_lo, z_hi)]
    for _ in range(Z_SPLITS):
        lb, a, b = heap[0]
        if lb >= best * (1 - Z_TOL) or min(tail, lb) >= enough:
            break
        heapq.heappop(heap)
        mid = math.sqrt(a * b) if a > 0 else (a + b) / 2
        best = min(best, f(mid, mid))
        heapq.heappush(heap, (f(a, mid), a, mid))
        heapq.heappush(heap, (f(mid, b), mid, b))
    return min(tail, heap[0][0])


def least_step(w_z: float, w_sum: float, rest: float, extra: float, C: float, a_min: float, pp: int, L: int,
               enough: float = math.inf) -> float:
    """At most min over Z of w_z max(Z, S(Z) / pp) + w_sum S(Z) + rest, S(Z) = extra +
    max(least_layer_sum(Z), S(inf), L a_min), over Z >= max(L / C, a_min ceil(L / pp)): a lower
    bound on the step of every plan whose stages meet the GPU budget C (module docstring);
    searched no further than the first bound that reaches `enough`.
    Past Z_hi, the largest x of the unbounded optimum (the stage of N layers: x = sqrt(lambda N),
    sqrt(lambda) = ((pp - 1) + sqrt(N)) / C), S(Z) = S(inf) and the value only grows with Z."""
    N = L - pp + 1
    z_lo = max(L / C, a_min * math.ceil(L / pp))
    s_inf = max(least_layer_sum(math.inf, C, pp, L), L * a_min)
    z_hi = max(z_lo, ((pp - 1) + math.sqrt(N)) / C * math.sqrt(N))
    sums: dict[float, float] = {}   # S(Z) by Z

    def on(a: float, b: float) -> float:   # on [a, b]: Z >= a and S(Z) >= S(b)
        s = sums.get(b)
        if s is None:
            s = sums[b] = extra + max(least_layer_sum(b, C, pp, L), s_inf)   # S(Z) >= S(inf)
        return w_z * max(a, s / pp) + w_sum * s + rest
    return _least_over_z(on, z_lo, z_hi, enough)


def gpu_budget_bound(coef: Coefficients, limits: Limits, enough: float = math.inf) -> float | None:
    """A lower bound on the objective of every plan of the config (module docstring), or None
    when no plan meets the limits or its stages' model states leave no room for the layers
    (bounds.may_hold_layers). The fixed terms are config_lower_bound's, from the same
    helpers: E (ends, least recompute), stage 0's least reduction at vpp layers and the tied
    all-reduce, the largest stage's least optimizer step, the least transfers, and the least
    $/h of pp stages (min-cost: $ >= that $/h x T / 3600). `enough` (the search's incumbent):
    the bound is exact where it is below it, and at least it where the exact one is: a bound
    without the reduction, the all-reduce, the optimizer step and the transfers (each at
    least 0, so at most the exact one), its Z searched only until it reaches `enough`, is
    returned where it does, and those terms are not computed (on scale-1024, 3,425 of its
    4,520 root parents). Only where no limit could make the exact bound None (no plan) while
    this one is not: without a time limit or a $/step budget."""
    cfg, L, pp = coef.cfg, coef.inst.model.num_layers, coef.cfg.pp
    found = usable_options(coef, limits, memory=False)
    if found is None or not may_hold_layers(coef):   # the second: memory rules out every plan below
        return None
    caps, O, _, usable = found
    terms = shared_option_terms(coef, O, usable)
    C, a_min = capacity(coef, limits)
    if not 0 < C < math.inf:
        return bounded_objective(0.0, 0.0, limits) if C == math.inf else None
    extra = terms.extra(pp)
    gpu_usd = terms.gpu_usd(pp)
    # the bound reads Z and S as lower bounds: non-negative weights only
    weights = [(w_z, w_sum, hops, offset) for w_z, w_sum, hops, offset in coef.step_weights() if w_z >= 0 and w_sum >= 0]
    if enough < math.inf and limits.time_limit_s is None and limits.budget_usd_per_step is None:
        t_enough = enough if limits.objective == "min-time" else math.inf
        bare = max((least_step(w_z, w_sum, offset, extra, C, a_min, pp, L, t_enough)
                    for w_z, w_sum, _, offset in weights), default=0.0)
        got = bounded_objective(max(bare, 0.0), gpu_usd, limits)
        if got is None or got >= enough:
            return got
    fixed = min(d(cfg.vpp) for d in terms.dp0) + _tied_sync_lower_bound(coef, caps, usable) + terms.opt(L, pp)
    p2p = coef.step_p2p(*_least_hops(coef)) if pp >= 2 else 0.0
    best = 0.0
    for w_z, w_sum, hops, offset in weights:
        best = max(best, least_step(w_z, w_sum, fixed + offset + (p2p if hops else 0.0), extra, C, a_min, pp, L))
    return bounded_objective(best, gpu_usd, limits)
