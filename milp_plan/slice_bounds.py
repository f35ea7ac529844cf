"""Lower bounds on the step of token-sliced plans (TeraPipe), over every slicing of an allowed
set: for one plan (`plan_bound`) and for every plan of a GPipe config (`config_bound`). The
joint search (slice_plan.py) prunes and proves with them (formulations/pipeline.md, "Token
slices").

**Paths of the sliced step.** A sliced plan runs m sequences cut into n slices, N = m n items,
in TeraPipe's order (schedules.GPipe.sliced_rank_order): every forward in item order, then the
backwards sequence by sequence, each sequence's slices reversed. Item (q, k) is slice k of
sequence q; p_{s,k} = f_{s,k} + b_{s,k} is stage s's time on slice k (every sequence alike),
W_s = sum_k p_{s,k}. For every stage s and slice k this is a path of the simulator's graph:

    forward:  stage 0 runs (0,0)..(0,k); (0,k) goes down to stage s; stage s runs (0,k)..(m-1,k);
              (m-1,k) goes down to stage K-1, which runs (m-1,k)..(m-1,n-1);
    backward: stage K-1 (after its last forward) runs (0,n-1)..(0,k); (0,k) goes back to stage s;
              stage s runs (0,k)..(m-1,k) in backward order; (m-1,k) goes back to stage 0,
              which runs (m-1,k)..(m-1,0);
    then stage 0's reduction, the barrier and the optimizer step.

Each step of it is an edge of the graph (a stage's order, or an item passing a hop), so

    T >= P(s, k) = (m - 1) W_s + C_k + R_k + 2 sum_h hop_{h,k} + max_r opt_r,
        C_k = sum_r p_{r,k},   R_k = sum_{i<k} p_{0,i} + sum_{i>k} p_{K-1,i}

(K = 1: P = m W_0). At equal stages without transfers max_{s,k} P = m sum_k t_k + (K - 1)
max_k t_k: TeraPipe's step, the makespan. The machine path of stage s (slice 0 down to s, all of
s's forwards and backwards, the last item's way back; the last slice to the end and back) adds

    T >= M(s) = m W_s + sum_{r<s} p_{r,0} + sum_{r>s} p_{r,n-1} + 2 sum_{h<s} hop_{h,0}
                + 2 sum_{h>=s} hop_{h,n-1} + max_r opt_r.

The reduction is not counted (a bucketed reduction may hide under the backwards): the bounds
hold for the simulated step, and the sliced closed form (schedules.GPipe.sliced_pipeline_time
and the tail, predict.sliced_closed_form) is at least the simulated step, so for it too.

**Every plan of a config** (`config_bound`): with per-slice times per layer alpha_k (the least
over the config's stage options and the model's block kinds; recompute only adds), the least
embedding and head times emb_k, head_k, the least hop per token, and e = min(n_0, n_{K-1}), the
layers of the lighter end stage:

    max_s W_s >= max(g(e) A, e A + max(Emb, Head)),   A = sum_k alpha_k,
        g(e) = min over M >= e of max(M, ceil((L - e - M) / (K - 2)))   (K >= 3; K = 2: L - e)
    C_k >= L alpha_k + emb_k + head_k,   R_k >= e (A - alpha_k) + sum_{i<k} emb_i + sum_{i>k} head_i,

so every plan whose end stage holds e layers has T >= (m - 1) g(e) A + max_k [...] + opt_lb,
and the config's bound is the least over e = 1..ceil(L/K) (past ceil(L/K), g(e) = e and the
bound grows with e) and over the allowed slicings. The slicings are enumerated (all 2^(U-1)
compositions of U <= 16 token units, vectorised), so the bound is exact over the slicing set,
not a relaxation of it. $ per step: at least the config's least $/h (K stages at the cheapest
stage price) times T / 3600.

**Per-type speeds and the layer split** (heterogeneous configs): with A_o the per-layer time of
option o on a slicing, the heaviest stage takes at least z, the least max_s n_s A_{o(s)} over
every placement within the pools' stage counts and the memory rooms (`ConfigBounds._bottleneck`),
and sum_r p_{r,k}'s layers at least LS_k(Y), the least sum_s n_s alpha_{o(s),k} with every stage
under the plan's own bottleneck Y >= z, taken over a grid of intervals of Y (`_refined`). Stage
0's tail holds the tied embedding's all-reduce (`_embedding_sync`: the unsliced bound's term, one formula).

**The work bound** (`WorkBounds`, no slicing enumerated): per option and slice count n the least
per-layer sum A*_{o,n} over the cuts into n slices (`count_sums`, a shortest path), the bottleneck
Z_n and least layer sum S_n of the placements at those times, and T >= max(m Z_n, (m - 1) Z_n +
S_n / n, fill, ends) + tails (`work_step`: the machine path M(s) of the heaviest stage, and P(s, k)
at the slice of most work; `fill_step`: M(s) with the other stages' first or last slices;
`ends_step`: P(s, k) with R_k through the end stages), and the same paths with the end stages'
options and layers enumerated (`WorkBounds.end_steps`, `end_paths`, `slice_paths`). `full` takes it too
(the paths have no m W term at m = 1); the default's
decision reads its least over the configs (`quick_bound`). formulations/pipeline.md, "Token
slices", gives the proofs; tests/test_slice_search.py checks each part against enumeration."""
from __future__ import annotations

import collections
import functools
import heapq
import math
from typing import Iterable, Sequence

import numpy as np

from milp_plan import costmodel
from milp_plan.cluster import MixedNodeType
from milp_plan.deadline import WORK, Deadline
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import Plan
from milp_plan.slicing import compositions
from milp_plan.units import SECONDS_PER_HOUR

MAX_ENUM_UNITS = 16   # slicings are enumerated (2^(U-1) of them); slicing.units_for gives U <= 16
CHAIN_MAX_STATES = 4096   # _least_chain: usage vectors at most, else the pools' caps are dropped
TERMS_KEPT = 8        # ConfigBounds: sets of stage options whose gathered terms are kept (the last used)
BISECT_STEPS = 40     # ConfigBounds._bottleneck: z to within 2^-40 of its range
GRID_RATIO, GRID_STEPS = 1.04, 6   # ConfigBounds._refined: bottleneck intervals z 1.04^j, j <= 6, then beyond
PATH_CHUNK = 4096     # path_bounds: slicing rows at a time (its passes' arrays 0.5 MB, not 4 MB at U = 16)
REFINE_CHUNK = 1024   # ConfigBounds._refine_lazily: slicing rows refined at a time
WORK_PER_COUNT = 2e-4   # work charged per slice count x option of WorkBounds.config (about its wall time)
SECONDS_PER_CELL = 6e-8   # work charged per row x option x step of the bounds' numpy passes (about its wall time)
PATH_SECONDS_PER_CELL = 8e-8   # quick_bound: work charged per array cell WorkBounds.end_steps touches ...
PATH_WORK_PER_PAIR = 3e-4      # ... and per pair of end options (default instance: 0.43 s CPU for 92 configs,
# 368 pairs, 3.8e6 cells; every config without a cutoff: 19.5 s for 2.2e8 cells)
SPLIT_SECONDS_PER_CELL = 2e-9   # sliced_search: work charged per cell of WorkBounds.config with its paths and the
# middle split, beside WORK_PER_COUNT per count x option (GPT-3 175B on mixed-128 at batch 8: 12.6 s CPU for 74
# calls and 6.5e9 cells, 1.8e-9 s a cell; 2.6e-9 before slice_paths and _middle_sums ran on the arcs alone;
# the shipped default's 24 calls: 0.53 s, 6.2e-9 a cell, its calls small)
QUICK_WORK_PER_OPTION = 1.6e-4   # quick_bound: work charged per config option of its WorkBounds.config stages
# (0.75 s CPU for 4,580 options at scale-1024: 1.6e-4 s each)


def paths_work(options: int, cells: int) -> float:
    """Work units of one WorkBounds.config with the end stages' paths and no middle split, on a
    config of `options` stage options whose paths touched `cells` array cells (quick_bound's
    stage 3, sliced_search's "paths" step)."""
    return QUICK_WORK_PER_OPTION * options + cells * PATH_SECONDS_PER_CELL + options ** 2 * PATH_WORK_PER_PAIR


@functools.lru_cache(maxsize=8)
def _rows(units: int, counts: tuple[int, ...]) -> tuple[list[tuple[int, int]], np.ndarray]:
    arcs, idx, n = _table(units)
    return arcs, idx[np.isin(n, counts)]


@functools.lru_cache(maxsize=8)
def _table(units: int) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """(arcs (i, j), arc ids of each composition padded with len(arcs), slice count of each)."""
    if units > MAX_ENUM_UNITS:
        raise ValueError(f"slicings are enumerated up to {MAX_ENUM_UNITS} units, got {units}")
    arcs = [(i, j) for i in range(units) for j in range(i + 1, units + 1)]
    aid = {a: n for n, a in enumerate(arcs)}
    comps = list(compositions(units))
    idx = np.full((len(comps), units), len(arcs), dtype=np.int64)
    for row, lengths in enumerate(comps):
        start = 0
        for k, n in enumerate(lengths):
            idx[row, k] = aid[(start, start + n)]
            start += n
    return arcs, idx, np.array([len(c) for c in comps])


def slicing_rows(units: int, counts: Iterable[int]) -> tuple[list[tuple[int, int]], np.ndarray]:
    """(arcs, the arc-id rows of every composition whose slice count is in `counts`)."""
    return _rows(units, tuple(sorted(set(counts))))


def row_index(units: int, counts: Iterable[int]) -> dict[tuple[int, ...], int]:
    """Each slicing's lengths (units) -> its row in `slicing_rows(units, counts)`."""
    return _row_index(units, tuple(sorted(set(counts))))


@functools.lru_cache(maxsize=4)
def _row_index(units: int, counts: tuple[int, ...]) -> dict[tuple[int, ...], int]:
    arcs, rows = _rows(units, counts)
    return {lengths_of(row, arcs): r for r, row in enumerate(rows)}


def lengths_of(row: np.ndarray, arcs: list[tuple[int, int]]) -> tuple[int, ...]:
    """Slice lengths (units) of one composition row."""
    return tuple(arcs[a][1] - arcs[a][0] for a in row if a < len(arcs))


def _gather(values: Sequence[float], rows: np.ndarray) -> np.ndarray:
    """values per arc gathered per composition and slice; pads 0."""
    return np.append(np.asarray(values, dtype=float), 0.0)[rows]


def _excl_prefix(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x, axis=1) - x


def _excl_suffix(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x[:, ::-1], axis=1)[:, ::-1] - x


def path_bounds(p: Sequence[Sequence[float]], hop: Sequence[Sequence[float]], m: int, rows: np.ndarray,
                arcs_n: int, f: Sequence[Sequence[float]] | None = None, dp: Sequence[float] | None = None
                ) -> np.ndarray:
    """max over a <= s <= b and k of P(a, s, b, k) (module docstring, without the reduction and
    the optimizer), per composition row: p[s][arc] stage s's f + b on an arc, hop[h][arc] one
    transfer; with f (forward times, as p) and dp (each stage's reduction), a path may also end
    at stage a after its last backward and take a's reduction (then it skips the way back to
    stage 0); without them no reduction is counted. P splits into (m - 1) W_s + X_a(k) + Y_b(k), so a running maximum of X over a <= s
    and of Y over b >= s gives the maximum over (a, b) for each s in O(K) passes."""
    out = np.empty(len(rows))
    for lo in range(0, len(rows), PATH_CHUNK):   # each row on its own: the same values in chunks
        r = rows[lo:lo + PATH_CHUNK]
        P = [_gather(ps, r) for ps in p]                               # K of (chunk x U)
        Hk = [_gather(h, r) for h in hop]                              # K-1 of (chunk x U)
        F = [_gather(fs, r) for fs in f] if f is not None else None
        out[lo:lo + len(r)] = gathered_paths(P, Hk, m, r < arcs_n, F, dp)
    return out


def gathered_paths(P: list[np.ndarray], Hk: list[np.ndarray], m: int, valid: np.ndarray,
                   F: list[np.ndarray] | None = None, dp=None) -> np.ndarray:
    """`path_bounds` on gathered terms: P[s] (N x U) stage s's f + b per row and slice (0 past
    a row's last slice, where valid is False), Hk[h] one transfer of hop h, F[s] the forwards,
    dp[s] stage s's reduction (a float, or one per row). The rows may be slicings of one plan or
    plans on one slicing."""
    K = len(P)
    W = [x.sum(axis=1) for x in P]
    dp = [np.asarray(d, dtype=float) for d in ([0.0] * K if dp is None else dp)]
    if K == 1:
        return m * W[0] + dp[0]
    dp = [d[:, None] if d.ndim else d for d in dp]
    ar, last = np.arange(len(valid)), valid.sum(axis=1) - 1

    def at_last(x):
        return x[ar, last][:, None]
    # X_a(k) = H0(a) - S_k(a) + Pre_a(k) + 2 (sum_{h<a} hop_h(0) - HS_k(a))
    # Y_b(k) = S_k(b+1) + Suf_b(k) + Tl(b) + 2 (HS_k(b) + sum_{h>=b} hop_h(last))
    X, Y = [], [None] * K
    S = np.zeros(valid.shape)       # S_k(a): sum_{r<a} p_{r,k}
    HS = np.zeros(valid.shape)      # HS_k(a): sum_{h<a} hop_h(k)
    H0 = np.zeros((len(valid), 1))  # sum_{r<a} p_{r,0} + 2 sum_{h<a} hop_h(0)
    Hf = np.zeros((len(valid), 1))  # sum_{r<a} f_{r,0} + sum_{h<a} hop_h(0): the way down only
    for a in range(K):
        x = H0 - S + _excl_prefix(P[a]) - 2 * HS + dp[0]
        if F is not None:   # or end at stage a with its reduction
            x = np.maximum(x, Hf - S + _excl_prefix(P[a]) - 2 * HS + dp[a])
        X.append(x)
        S = S + P[a]
        if a < K - 1:
            H0 = H0 + P[a][:, :1] + 2 * Hk[a][:, :1]
            if F is not None:
                Hf = Hf + F[a][:, :1] + Hk[a][:, :1]
            HS = HS + Hk[a]
    S_next = S                                # S_k(K)
    HS_b = HS                                 # HS_k(K-1)
    Tl = np.zeros((len(valid), 1))             # sum_{r>b} p_{r,last} + 2 sum_{h>=b} hop_h(last)
    for b in range(K - 1, -1, -1):
        Y[b] = S_next + _excl_suffix(P[b]) + Tl + 2 * HS_b
        S_next = S_next - P[b]
        Tl = Tl + at_last(P[b])
        if b > 0:
            HS_b = HS_b - Hk[b - 1]
            Tl = Tl + 2 * at_last(Hk[b - 1])
    best = np.full(len(valid), -np.inf)
    px = np.full(valid.shape, -np.inf)
    sy = [None] * K
    run = np.full(valid.shape, -np.inf)
    for b in range(K - 1, -1, -1):
        run = np.maximum(run, Y[b])
        sy[b] = run
    for s in range(K):
        px = np.maximum(px, X[s])
        cross = np.where(valid, px + sy[s], -np.inf).max(axis=1)
        best = np.maximum(best, (m - 1) * W[s] + cross)
    return best


def _value(T, usd_h, limits: Limits):
    """The objective at step T (seconds) and at least usd_h $/h (each an array, or a float); inf
    where a limit is broken."""
    out = T * usd_h / SECONDS_PER_HOUR if limits.objective == "min-cost" else T
    bad = False if limits.budget_usd_per_hour is None else usd_h > limits.budget_usd_per_hour * (1 + 1e-9)
    if limits.time_limit_s is not None:
        bad = bad | (T > limits.time_limit_s * (1 + 1e-6))
    if limits.budget_usd_per_step is not None:
        bad = bad | (T * usd_h / SECONDS_PER_HOUR > limits.budget_usd_per_step * (1 + 1e-9))
    if isinstance(T, np.ndarray) or isinstance(usd_h, np.ndarray):
        return np.where(bad, np.inf, out)
    return math.inf if bad else float(out)


def unit_tokens(inst: Instance) -> tuple[int, int]:
    """(U, tokens per unit) the planner slices at (slicing.units_for)."""
    from milp_plan.slicing import units_for
    units = units_for(inst.job.seq_length)
    return units, inst.job.seq_length // units


def plan_row_bounds(inst: Instance, plan: Plan, limits: Limits, counts: Iterable[int]
                    ) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray]:
    """(per slicing row of `counts`, at least the objective of `plan` cut by it, by the path
    bounds (inf: it breaks the limits); the arcs; the rows). The plan's memory is not read
    (slicing leaves it as it is)."""
    units, unit = unit_tokens(inst)
    arcs, rows = slicing_rows(units, counts)
    nts = [costmodel.stage_node_type(inst, st) for st in plan.stages]
    memo: dict = {}

    def stage_arc(s: int, i: int, j: int) -> tuple[float, float]:
        st = plan.stages[s]
        key = (nts[s].name, st.tp, st.micro_batch_size, st.first_layer if s == 0 else -1, st.num_layers,
               s == 0, s == plan.pp - 1, st.recompute, st.recompute_layers, i, j)
        if key not in memo:
            f, b = costmodel.stage_slice_time(inst, nts[s], st, plan.pp, s, (j - i) * unit, i * unit)
            memo[key] = (f, f + b)
        return memo[key]
    p = [[stage_arc(s, i, j)[1] for i, j in arcs] for s in range(plan.pp)]
    f = [[stage_arc(s, i, j)[0] for i, j in arcs] for s in range(plan.pp)]
    hop = [[costmodel.hop_between(inst, plan, plan.stages[h], plan.stages[h + 1], (j - i) * unit) for i, j in arcs]
           for h in range(plan.pp - 1)]
    c = costmodel.plan_costs(inst, plan)
    T = path_bounds(p, hop, plan.num_microbatches, rows, len(arcs), f, c.tail_s) + max(c.opt_s)
    return _value(T, costmodel.plan_usd_per_hour(inst, plan), limits), arcs, rows


def plan_bounds(inst: Instance, plan: Plan, limits: Limits, counts: Iterable[int]
                ) -> dict[int, tuple[float, tuple[int, ...]]]:
    """For each slice count in `counts`: (the least objective any slicing of `plan` with that
    count can reach, by the path bounds; the slicing (tokens) where the bound is least). inf:
    none meets the limits. The plan's memory is not read (slicing leaves it as it is)."""
    vals, arcs, rows = plan_row_bounds(inst, plan, limits, counts)
    _, unit = unit_tokens(inst)
    n = (rows < len(arcs)).sum(axis=1)
    out = {}
    for cnt in sorted(set(int(x) for x in n)):
        where = np.flatnonzero(n == cnt)
        at = int(where[np.argmin(vals[where])])
        out[cnt] = (float(vals[at]), tuple(x * unit for x in lengths_of(rows[at], arcs)))
    return out


def plan_bounds_work(inst: Instance, pp: int, counts: Iterable[int]) -> float:
    """Work units (deadline.py) of one `plan_bounds` of a pp-stage plan: its numpy passes touch
    every slicing row x unit about pp + 2 times (the stages' gathers and the running maxima),
    at SECONDS_PER_CELL each (0.12, 0.20 and 0.35 s measured at pp 2, 4 and 8 on U = 16 units,
    32,767 slicings; this charges 0.13, 0.19 and 0.31)."""
    units, _ = unit_tokens(inst)
    _, rows = slicing_rows(units, counts)
    return rows.size * (pp + 2) * SECONDS_PER_CELL


def plan_bound(inst: Instance, plan: Plan, limits: Limits, counts: Iterable[int]) -> tuple[float, tuple[int, ...]]:
    """(the least objective any slicing of `plan` with a count in `counts` can reach, by the
    path bounds; the slicing (tokens) where it is least)."""
    return min(plan_bounds(inst, plan, limits, counts).values())


def _g(e: int, L: int, K: int) -> int:
    """The least max_s n_s of K stages holding L layers whose end stages hold >= e each."""
    if K == 2:
        return L - e
    return min(max(M, -(-(L - e - M) // (K - 2))) for M in range(e, L - e - (K - 2) + 1))


def _least_hop_per_token(coef) -> float:
    """The least transfer time per token any hop of the config takes (seconds): every hop is
    one of its pools' intra-node (where a node fits two of its stages) or inter-node transfers,
    and a transfer's bytes are linear in the tokens (costmodel.p2p_bytes)."""
    if coef.cfg.pp == 1:
        return 0.0
    types = {pool.k for pool in coef.pools}
    # inside a node only where a node holds two of the pool's stages (solvers/bounds._p2p_lower_bound)
    hops = [coef.hop_intra(q) for q, pool in enumerate(coef.pools) if pool.place.stages_per_node >= 2] + \
           [coef.hop_inter(q, k2) for q in range(len(coef.pools)) for k2 in types]
    return min(hops) / coef.inst.job.seq_length


def _hop_costs(coef) -> tuple[tuple[float, ...], ...]:
    """`_hop_chain`'s least cost of a hop from a stage of pool p to the next stage, of pool q,
    both ways (its docstring), as c[p][q]: found once per config, for every end pair's chain.
    The simulator runs a hop's backward transfer at its forward time (costmodel.slice_costs:
    hop_between(stage h, stage h + 1) both ways; sim/pipeline.py), so the cost is twice the
    forward one, p's senders to q's node type: hop_inter(p, type of q), or hop_intra(p) where the
    two pools are of one node type and one of them puts two stages on a node (they may share it).
    Directed: p's senders per node set it (costmodel.link_s), so c[p][q] and c[q][p] differ where
    the pools' stages sit on their nodes unlike (an earlier sum of both directions overstated a
    hop from the pool of fewer senders per node; tests/test_slice_search.py caught it)."""
    pools = range(len(coef.pools))

    def cost(p, q):
        got = 2 * coef.hop_inter(p, coef.pools[q].k)
        if coef.pools[p].k == coef.pools[q].k and max(coef.pools[r].place.stages_per_node for r in (p, q)) >= 2:
            got = min(got, 2 * coef.hop_intra(p))     # they may share a node
        return got
    return tuple(tuple(cost(p, q) for q in pools) for p in pools)


def _hop_chain(coef, caps: dict[int, int], p0: int, p1: int, memo: dict,
               c: tuple[tuple[float, ...], ...]) -> float:
    """At least sum_h (hop_{h} forward + hop_{h} back) per token of any plan of the config whose
    stage 0 is in pool p0 and stage K-1 in pool p1 (seconds per token): a path through every
    stage on one slice crosses each hop down and back (M(s), P(s, k)); the pools of the middle
    stages are chosen, each pool at most caps[p] stages in all, for the least sum (a shortest path
    over (pool of the stage, stages used per pool)), a hop from a stage of pool p to one of pool
    q costing at least c[p][q] (`_hop_costs`: twice its forward transfer; `_least_hop_per_token`
    allows the intra-node hop likewise). Where the states would
    be many (more than 4 pools, or more than CHAIN_MAX_STATES usage vectors), the caps are dropped
    (lower: `_least_chain`). The shortest path is kept in
    `memo` by what it reads (stage count, caps, ends, hop costs): at pp 20-32 on four pools its
    states run to tens of thousands, and a config's end-option pairs share a few pool pairs.
    `c`: the hop costs (`_hop_costs(coef)`)."""
    K, pools = coef.cfg.pp, range(len(coef.pools))
    key = (K, tuple(caps.get(q, 0) for q in pools), p0, p1, c)
    if key not in memo:
        memo[key] = _least_chain(K, key[1], p0, p1, c)
    return memo[key] / coef.inst.job.seq_length


def _least_chain(K: int, caps: tuple[int, ...], p0: int, p1: int, c: tuple[tuple[float, ...], ...]) -> float:
    """`_hop_chain`'s shortest path: the least sum of c[p][q] over the consecutive stages of K
    stages whose first is in pool p0 and last in p1, each pool at most caps[p] stages. Where the
    usage vectors could number more than CHAIN_MAX_STATES (or with more than 4 pools) the caps
    are dropped: a lower sum, still a bound."""
    pools = range(len(caps))
    used0 = [0] * len(caps)
    used0[p0] += 1
    used0[p1] += 1
    capped = len(caps) <= 4 and math.prod(min(cap, K) + 1 for cap in caps) <= CHAIN_MAX_STATES
    if capped and any(u > caps[q] for q, u in enumerate(used0)):
        return math.inf
    states = {(p0, tuple(used0)): 0.0}
    for _ in range(K - 2):
        nxt: dict = {}
        for (last, used), v in states.items():
            for q in pools:
                if capped and used[q] >= caps[q]:
                    continue
                key = (q, tuple(u + (i == q) for i, u in enumerate(used)) if capped else ())
                nxt[key] = min(nxt.get(key, math.inf), v + c[last][q])
        states = nxt
    return min((v + c[last][p1] for (last, _), v in states.items()), default=math.inf)


def _embedding_sync(coef, limits: Limits, memory: bool = True) -> float:
    """At least the tied embedding's all-reduce of any sliced plan of the config (seconds): the
    unsliced bound's term, solvers/bounds._tied_sync_lower_bound (one formula: the ends run
    usable options of pools with a stage to offer, within one node only where one pool's node
    holds all pp stages), over the config's usable options within the memory rooms (a sliced
    plan holds what unsliced GPipe holds, and its tail is PlanCosts.tail_s, as unsliced). 0 where
    no placement fits (the bound's other parts say so). memory=False: every option with a stage
    to offer may be an end (lower, without the rooms' memory fits)."""
    from milp_plan.solvers import bounds
    found = bounds.usable_options(coef, limits, memory=memory)
    return 0.0 if found is None else bounds._tied_sync_lower_bound(coef, found[0], found[3])


def _option_arcs(inst: Instance, coef, arcs, unit: int) -> tuple[list[float], list[float], list[float], list[float],
                                                                dict[tuple, list[float]]]:
    """Per arc: the least per-layer f + b over the options and block kinds, the least embedding
    and head f + b, (full recompute) the least block forward (seconds), and per (node type, tp,
    micro-batch size) of the options the least per-layer f + b over the block kinds."""
    kinds = sorted({inst.model.block_kind(i) for i in range(inst.model.num_layers)})
    opts = sorted({(o.k, o.tp, o.mbs) for o in coef.options})

    def times(k, tp, mbs, kd, i, j):
        return costmodel.layer_times(inst, coef.types[k], tp, mbs, kd, (j - i) * unit, i * unit)

    def least(kind_list, i, j, among=opts):
        return min(lt.fwd_s + lt.bwd_s for k, tp, mbs in among for kd in kind_list
                   for lt in [times(k, tp, mbs, kd, i, j)])
    per = {o: [least(kinds, i, j, [o]) for i, j in arcs] for o in opts}
    alpha = [min(per[o][n] for o in opts) for n in range(len(arcs))]
    # full recompute: every stage recomputes >= 1 layer (check.py), a block's forward again
    full = all(o.recompute == "full" for o in coef.options)
    phi = [min(times(k, tp, mbs, kd, i, j).fwd_s for k, tp, mbs in opts for kd in kinds) if full else 0.0
           for i, j in arcs]
    emb = [least(["embedding"], i, j) for i, j in arcs]
    head = [least(["head"], i, j) for i, j in arcs]
    return alpha, emb, head, phi, per


def _by_alpha(stages, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the options of each row and slice in increasing alpha, those alphas) (rows x U x options)."""
    alpha = np.stack([al[rows] for _, al, _, _ in stages], axis=2)
    idx = np.argsort(alpha, axis=2, kind="stable")
    return idx, np.take_along_axis(alpha, idx, axis=2)


def _placement(A: dict[int, float], rooms: dict[int, int], caps: dict[int, int], pool_of, K: int, L: int
               ) -> tuple[list[int], list[int]] | None:
    """(option per stage, layers per stage) of K stages holding L layers with the least max n A_o
    (seconds per layer A_o, rooms, stages per pool): the least z at which the K largest holds
    min(floor(z / A_o), room_o) reach L (z among the breakpoints n A_o), then one layer off the
    stage of largest n A at a time down to L. None: no placement."""
    cands = sorted({n * a for o, a in A.items() for n in range(1, min(rooms[o], L) + 1)})

    def pick(z):
        left = dict(caps)
        holds = sorted(((min(int(z / a + 1e-9), rooms[o]), -a, o) for o, a in A.items()), reverse=True)
        opts, layers = [], []
        for v, _, o in holds:
            while v >= 1 and left[pool_of[o]] > 0 and len(opts) < K:
                opts.append(o)
                layers.append(v)
                left[pool_of[o]] -= 1
        return (opts, layers) if len(opts) == K and sum(layers) >= L else None
    for z in cands:
        got = pick(z)
        if got is not None:
            opts, layers = got
            while sum(layers) > L:
                i = max((i for i in range(K) if layers[i] > 1), key=lambda i: (layers[i] * A[opts[i]], -i))
                layers[i] -= 1
            return opts, layers
    return None


def _least_price(coef, K: int) -> float:
    """At least the $/h of any plan of the config: K stages at its cheapest stage price."""
    return min(coef.stage_usd_per_hour(o.k, o.group) for o in coef.options) * K


class ConfigBounds:
    """Sliced bounds of GPipe configs (module docstring) over the slicings whose count is in
    `counts`: `cheap` (the work path alone: T >= m max_s W_s + the reduction and optimizer
    terms) and `full` (the paths P(0, s, K-1, k) over every end-stage size e). Per-arc terms
    and their gathers are made once per set of stage options (configs of every pp and
    micro-batch count share them)."""

    def __init__(self, inst: Instance, limits: Limits, counts: Iterable[int]):
        self.inst, self.limits = inst, limits
        counts = sorted(set(counts))
        self.units, self.unit = unit_tokens(inst)
        self.arcs, self.rows = slicing_rows(self.units, counts)
        self.valid = self.rows < len(self.arcs)
        self.tokens = _gather([(j - i) * self.unit for i, j in self.arcs], self.rows)
        self.sums: dict = {}           # A and Phi per set of stage options (`cheap`: one float a row)
        self.memo: collections.OrderedDict = collections.OrderedDict()   # gathered terms, TERMS_KEPT last used
        self.arcs_memo: dict = {}
        self.row_bounds: dict = {}     # config -> the bound per slicing row (full)
        self.work = 0.0                # work units (deadline.py) of the last `full`, beyond WORK.bound
        self.work_bounds = WorkBounds(inst, limits, counts)
        self.tails: dict = {}          # _dp by config (and its options), layers and memory

    @staticmethod
    def _terms_key(coef) -> tuple:
        """What the per-arc terms read of a config: its options' (node type, tp, micro-batch
        size) and whether every option recomputes fully."""
        return (tuple(sorted({(o.k, o.tp, o.mbs) for o in coef.options})),
                all(o.recompute == "full" for o in coef.options))

    def _arcs_of(self, key: tuple, coef) -> tuple:
        arcs = self.arcs_memo.get(key)
        if arcs is None:
            arcs = self.arcs_memo[key] = _option_arcs(self.inst, coef, self.arcs, self.unit)
        return arcs

    def _terms(self, coef, full: bool = True) -> dict:
        """The gathered per-arc terms of the config's options (what the arc times read: node
        type, tp, micro-batch size, full recompute); `full=False`: A and Phi alone (kept for every
        set of options). The gathered arrays (rows x U, 4 MB each at U = 16) are kept for the
        TERMS_KEPT sets used last: `--slices auto` on the shipped default's job kept them all,
        1.6 GB at its peak."""
        key = self._terms_key(coef)
        if not full:
            got = self.sums.get(key)
            if got is None:
                alpha, _, _, phi, per = self._arcs_of(key, coef)
                got = self.sums[key] = dict(A=_gather(alpha, self.rows).sum(axis=1),
                                            Phi=_gather(phi, self.rows).sum(axis=1))
                if self.limits.objective == "min-cost":   # `_cost_work`'s: each option's A
                    got["per"] = {o: _gather(v, self.rows).sum(axis=1) for o, v in per.items()}
            return got
        got = self.memo.get(key)
        if got is not None:
            self.memo.move_to_end(key)
            return got
        alpha, emb, head, phi, per = self._arcs_of(key, coef)
        a, ph = _gather(alpha, self.rows), _gather(phi, self.rows)
        per_a = {o: _gather(v, self.rows) for o, v in per.items()}
        e_, h_ = _gather(emb, self.rows), _gather(head, self.rows)
        E, H = e_.sum(axis=1), h_.sum(axis=1)
        got = self.memo[key] = dict(a=a, ph=ph, A=a.sum(axis=1), Phi=ph.sum(axis=1), per_a=per_a,
                                    per={o: v.sum(axis=1) for o, v in per_a.items()}, ends=E + H,
                                    big_end=np.maximum(E, H), c0=e_ + h_ + _excl_prefix(e_) + _excl_suffix(h_) - ph)
        if len(self.memo) > TERMS_KEPT:
            self.memo.popitem(last=False)
        return got

    def _stages(self, coef, t: dict) -> list[tuple[np.ndarray, np.ndarray, int, int]] | None:
        """Per usable option o of the config: (A_o per row, alpha_o per row and slice, room_o, the
        most stages of its pool within the limits) (solvers.bounds.usable_options; memory: a
        sliced plan holds unsliced GPipe's); None when no placement fits."""
        from milp_plan.solvers import bounds
        found = bounds.usable_options(coef, self.limits, memory=True)
        if found is None:
            return None
        caps, _, rooms, usable = found
        out = []
        for o in usable:
            opt = coef.options[o]
            key = (opt.k, opt.tp, opt.mbs)
            out.append((t["per"][key], t["per_a"][key], rooms[o], caps[coef.pool_of[o]]))
        return out

    def _bottleneck(self, coef, stages) -> np.ndarray:
        """Per row: at least max_s n_s A_{o(s)} (seconds) over every placement of the L layers on
        the config's pp stages (`_stages`): each option offers at most its pool's stages, a stage
        of option o holds at most min(floor(z / A_o), room_o) layers when n A_o <= z, and z is
        feasible when the pp largest stage holds sum to >= L. Bisection on z per row
        (BISECT_STEPS, vectorised); the lower end, which never fits, is returned, so the value is
        at most the least feasible z. Relaxations (each only lowers z): the options of one pool,
        and the pools of one node type, count their stages apart; a type the config must use may
        be left out. inf where no placement fits."""
        K, L = coef.cfg.pp, self.inst.model.num_layers
        if stages is None:
            return np.full(len(self.rows), np.inf)
        cap = np.array([c for _, _, _, c in stages], dtype=float)

        def holds(z: np.ndarray) -> np.ndarray:
            v = np.stack([np.minimum(np.floor(z / A + 1e-9), room) for A, _, room, _ in stages], axis=1)
            idx = np.argsort(-v, axis=1, kind="stable")
            v_sorted = np.take_along_axis(v, idx, axis=1)
            c_sorted = cap[idx]
            taken = np.minimum(c_sorted, np.maximum(K - (np.cumsum(c_sorted, axis=1) - c_sorted), 0))
            return (v_sorted * taken).sum(axis=1) >= L
        hi = np.full(len(self.rows), max(float(A.max()) for A, _, _, _ in stages) * L)
        ok = holds(hi)
        lo = np.zeros(len(self.rows))
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            f = holds(mid)
            hi, lo = np.where(f, mid, hi), np.where(f, lo, mid)
        return np.where(ok, lo, np.inf)

    def _layer_sums(self, stages, y: np.ndarray | None, rows: np.ndarray, order=None) -> np.ndarray:
        """LS_k(y) per row (of `rows`) and slice: at least sum_s n_s alpha_{o(s),k} over every
        placement whose stages all have n_s A_{o(s)} <= y (None: unbounded): option o holds at
        most cap_o min(floor(y / A_o), room_o) layers in all (stage counts not coupled across
        options: a relaxation), and the L layers go to the options of least alpha on slice k
        first (greedy: a fractional knapsack of unit items). inf where they do not fit."""
        L = self.inst.model.num_layers
        hold = np.stack([c * (np.full(len(rows), float(room)) if y is None else
                              np.minimum(np.floor(y / A[rows] + 1e-9), room)) for A, _, room, c in stages], axis=1)
        idx, al_sorted = order if order is not None else _by_alpha(stages, rows)
        h_sorted = np.take_along_axis(np.broadcast_to(hold[:, None, :], idx.shape), idx, axis=2)
        taken = np.minimum(h_sorted, np.maximum(L - (np.cumsum(h_sorted, axis=2) - h_sorted), 0))
        out = (al_sorted * taken).sum(axis=2)
        return np.where(taken.sum(axis=2) >= L, out, np.inf)

    def _opt(self, coef, e: int = 0) -> float:
        """At least the largest optimizer step: some stage holds ceil(L / K) layers, and (e >= 1)
        each end stage holds >= e layers and its embedding or head (Coefficients.opt_time)."""
        K, L, n = coef.cfg.pp, self.inst.model.num_layers, range(len(coef.options))
        got = min(coef.opt_time(o, 0).a for o in n) * -(-L // K)
        if e:
            got = max(got, *(min(coef.opt_time(o, s)(e) for o in n) for s in (0, K - 1)))
        return got

    def _finish(self, coef, T, K: int) -> float | None:
        """The objective's bound from the step's (T without the optimizer term: the least over an
        array of them, or a float)."""
        vals = _value(T + self._opt(coef), _least_price(coef, K), self.limits)
        best = (float(vals.min()) if len(vals) else math.inf) if isinstance(vals, np.ndarray) else vals
        return None if best == math.inf else best

    def _dp(self, coef, layers: int, memory: bool = True) -> float:
        """At least stage 0's tail (PlanCosts.tail_s) when it holds >= `layers` layers: piece 0
        of its exposed reduction (Coefficients.dp_time; it never decreases with the layers)
        plus the tied embedding's all-reduce, which follows it (`_embedding_sync`; memory=False:
        without the memory rooms, lower and cheaper)."""
        key = (coef.cfg, tuple(coef.options), layers, memory)
        got = self.tails.get(key)
        if got is None:
            got = self.tails[key] = max(0.0, min(coef.dp_time(o, 0)[0](layers) for o in range(len(coef.options)))) + \
                _embedding_sync(coef, self.limits, memory)
        return got

    def cheap(self, coef) -> float | None:
        """T >= m (ceil(L / K) A + Phi) + stage 0's reduction at one layer + the optimizer term;
        under min-cost at least `_cost_work` too."""
        K, L = coef.cfg.pp, self.inst.model.num_layers
        m = coef.cfg.num_microbatches(self.inst.job.global_batch_size)
        t = self._terms(coef, full=False)
        got = self._finish(coef, m * (-(-L // K) * t["A"] + t["Phi"]) + self._dp(coef, 1 if K > 1 else L), K)
        if got is None or self.limits.objective != "min-cost":
            return got
        return max(got, self._cost_work(coef, m, t))

    def _cost_work(self, coef, m: int, t: dict) -> float:
        """min-cost: at least the $/step of every sliced plan of the config from its stages' work.
        Each stage s runs m W_s within the step (its machine path M(s)) and rents at least
        Coefficients.stage_usd_per_hour, so T sum_s $/h_s >= m sum_s $/h_s (n_s A_{o_s} + Phi) >=
        m (L min_o $/h_o A_o + K min_o $/h_o Phi): every layer on the option of least $/h x
        time (the rooms and the pools' stage counts relaxed), on the least slicing row. The
        config bound prices the least step at the cheapest stages instead, far under plans whose
        cheap stages are slow."""
        K, L = coef.cfg.pp, self.inst.model.num_layers
        prices = {(o.k, o.tp, o.mbs, o.group): coef.stage_usd_per_hour(o.k, o.group) for o in coef.options}
        layer = np.min([p * t["per"][k[:3]] for k, p in prices.items()], axis=0)
        return float((m * (L * layer + K * min(prices.values()) * t["Phi"])).min()) / SECONDS_PER_HOUR

    def full(self, coef, cutoff: float = math.inf) -> float | None:
        """The config's bound (module docstring): at least `cheap` and the work bound
        (`WorkBounds.config`: the heaviest stage's machine path, which the paths P(s, k) miss at
        m = 1, and the per-count sums with context). With `cutoff`, rows whose
        bound before the layer sums already reaches it are not refined (the bound stays valid;
        it only matters below the cutoff)."""
        K, L = coef.cfg.pp, self.inst.model.num_layers
        m = coef.cfg.num_microbatches(self.inst.job.global_batch_size)
        t = self._terms(coef)
        a, A, Phi = t["a"], t["A"], t["Phi"]
        if K == 1:
            return self._finish(coef, m * (L * A + Phi + t["ends"]) + self._dp(coef, L), K)
        hop = 2 * _least_hop_per_token(coef) * self.tokens
        rest = K * t["ph"] + t["c0"] + Phi[:, None] + (K - 1) * hop
        stages = self._stages(coef, t)
        z = self._bottleneck(coef, stages)     # seconds: at least max_s n_s A_{o(s)}
        machine = self._machine_path(coef, t, stages)

        def bound(rows: np.ndarray, layers: np.ndarray, y: np.ndarray) -> np.ndarray:
            """min over e of the path bound on `rows`, C_k's layers >= `layers`, heaviest >= y,
            and at least the heaviest stage's machine path (`_machine_path`)."""
            base = np.where(self.valid[rows], layers + rest[rows], -np.inf)
            a_, A_, Phi_ = a[rows], A[rows], Phi[rows]
            T = np.full(len(rows), np.inf)
            for e in range(1, -(-L // K) + 1):
                if K > 2 and L - e - (K - 2) < e:
                    break
                cross = e * A_ + (base - e * a_).max(axis=1)
                # the heaviest stage holds g(e) layers, or is an end stage: >= e layers and its
                # embedding or head; and its layers take at least the bottleneck y
                heavy = np.maximum(np.maximum(_g(e, L, K) * A_, e * A_ + t["big_end"][rows]), y) + Phi_
                fin = np.isfinite(heavy)        # inf: no placement (m = 1 too)
                work = np.where(fin, (m - 1) * np.where(fin, heavy, 0.0), np.inf)
                T = np.minimum(T, work + cross + self._dp(coef, e) + self._opt(coef, e) - self._opt(coef))
            return np.maximum(T, machine(rows, y))
        every = np.arange(len(self.rows))
        T = bound(every, L * a, z)
        self.work = len(self.rows) * (BISECT_STEPS + 1) * len(stages or ()) * SECONDS_PER_CELL
        if stages and len(stages) > 1:     # one option: LS_k = L alpha_k, no more than L a_k
            T = self._refine_lazily(coef, stages, T, z, bound, self._time_cutoff(coef, cutoff) - self._opt(coef))
        self.row_bounds[coef.cfg] = T
        got = self._finish(coef, T, K)
        cheap = self.cheap(coef)
        work, _ = self.work_bounds.config(coef, self, paths=True)
        self.work += len(self.work_bounds.counts) * len(coef.options) * WORK_PER_COUNT
        return None if got is None or cheap is None or work is None else max(got, cheap, work)

    def _machine_path(self, coef, t: dict, stages):
        """(rows, y) -> per row, at least the step of every plan whose heaviest stage's layers
        take >= y on that slicing (seconds, without the optimizer term): the heaviest stage s's
        machine path (module docstring, M(s)) on the row's own slices, `fill_step` with
        W_s >= y + Phi (its layers, and the forward every stage recomputes under full recompute),
        u = the least per-layer f + b of the row's first or last slice over the usable options,
        rho = u / the least per-layer sum A_o of the row (n_s <= W_s / A), the embedding's first
        slice or the head's last (whichever end is not s: the least of the two), 2 (K - 1) hops
        of one unit, then stage 0's tail at one layer; and the work path m W_s. A slicing with
        small end slices makes this fill cheap but its other slices dear (the paths P(s, k)),
        so the two bound each row together. No usable option: no bound (0)."""
        K, L = coef.cfg.pp, self.inst.model.num_layers
        m = coef.cfg.num_microbatches(self.inst.job.global_batch_size)
        if not stages:
            return lambda rows, y: np.zeros(len(rows))
        ar, last = np.arange(len(self.rows)), self.valid.sum(axis=1) - 1
        alpha = np.stack([al for _, al, _, _ in stages], axis=2)          # rows x slices x options
        u = np.minimum(alpha[:, 0, :].min(axis=1), alpha[ar, last, :].min(axis=1))
        least = np.min([A for A, _, _, _ in stages], axis=0)
        _, emb, head, _, _ = self.arcs_memo[self._terms_key(coef)]
        v = np.minimum(_gather(emb, self.rows)[:, 0], _gather(head, self.rows)[ar, last])
        extra = v + 2 * (K - 1) * _least_hop_per_token(coef) * self.unit
        tail, Phi = self._dp(coef, 1), t["Phi"]

        def machine(rows: np.ndarray, y: np.ndarray) -> np.ndarray:
            w = y + Phi[rows]
            return np.maximum(m * w, fill_step(m, w, L, u[rows], least[rows], extra[rows])) + tail
        return machine

    def balanced(self, coef, per_count: int = 2) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Candidate placements (option per stage, layers per stage) that balance the per-type
        times on the slicings where the config's bound (`full`, run first) is least: for each of
        the `per_count` slice counts of least bound, its least row's bottleneck placement (the
        pp stages of largest holds at the least feasible z, trimmed to L layers from the stage of
        largest n A), in three orders: fastest stages first, last, and at both ends (the end stages
        hold the embedding and the head, whose tied all-reduce and reductions then run over the
        fast nodes' links, and the slow stages' reductions hide under the drain). Candidates, not
        bounds."""
        T, t = self.row_bounds.get(coef.cfg), self._terms(coef)
        from milp_plan.solvers import bounds
        found = bounds.usable_options(coef, self.limits, memory=True)
        if T is None or found is None or coef.cfg.pp < 2:
            return []
        caps, _, rooms, usable = found
        K, L = coef.cfg.pp, self.inst.model.num_layers
        counts = self.valid.sum(axis=1)
        best = {}
        for r in np.argsort(T, kind="stable"):
            if np.isfinite(T[r]) and int(counts[r]) not in best:
                best[int(counts[r])] = int(r)
            if len(best) == per_count:
                break
        out = []
        for r in best.values():
            A = {o: float(t["per"][(coef.options[o].k, coef.options[o].tp, coef.options[o].mbs)][r]) for o in usable}
            got = _placement(A, rooms, caps, coef.pool_of, K, L)
            if got is not None:
                order = sorted(range(K), key=lambda i: A[got[0][i]])
                ends = order[0::2] + order[1::2][::-1]     # fastest at the ends, slowest in the middle
                for seq in (order, order[::-1], ends):
                    cand = (tuple(got[0][i] for i in seq), tuple(got[1][i] for i in seq))
                    if cand not in out:
                        out.append(cand)
        return out

    def _refine_lazily(self, coef, stages, T: np.ndarray, z: np.ndarray, bound, cutoff: float) -> np.ndarray:
        """T with rows refined (`_refined`) in increasing order of T, REFINE_CHUNK at a time,
        until the least T not refined is at least the least refined one (then no row left can
        lower the minimum: a refined row's bound is at least its T) or the cutoff (rows at or
        above it need no refinement). Charges self.work for the refinement."""
        T = T.copy()
        order = np.argsort(T, kind="stable")
        best = np.inf
        for start in range(0, len(order), REFINE_CHUNK):
            rows = order[start:start + REFINE_CHUNK]
            if T[rows[0]] >= min(best, cutoff):
                break
            T[rows] = self._refined(coef, stages, rows, z[rows], bound)
            best = min(best, float(T[rows].min()))
            self.work += len(rows) * (GRID_STEPS + 1) * len(stages) * self.rows.shape[1] * SECONDS_PER_CELL
        return T

    def _refined(self, coef, stages, rows: np.ndarray, z: np.ndarray, bound) -> np.ndarray:
        """The bound on `rows` with C_k's layers at least LS_k (`_layer_sums`) at the plan's own
        bottleneck Y = max_s n_s A_{o(s)} >= z: for Y in [y_j, y_{j+1}) (y_j = z GRID_RATIO^j,
        j < GRID_STEPS) the heaviest stage takes >= y_j and LS_k(Y) >= LS_k(y_{j+1}) (fewer
        layers fit under a lower bottleneck); for Y >= the last y, LS_k unbounded. The least
        over the intervals."""
        T = np.full(len(rows), np.inf)
        ys = [z * GRID_RATIO ** j for j in range(GRID_STEPS + 1)]
        order = _by_alpha(stages, rows)
        for j in range(GRID_STEPS + 1):
            upper = ys[j + 1] if j < GRID_STEPS else None
            ls = self._layer_sums(stages, upper, rows, order)
            T = np.minimum(T, bound(rows, ls, ys[j]))
        return T

    def _time_cutoff(self, coef, cutoff: float, price: float | None = None) -> float:
        """The step (seconds) at and above which an objective of at least `cutoff` follows, or no
        plan meets --time-limit (`_value`: a step over it by more than 1e-6 of it; here 2e-6, so
        that no admissible step is cut). min-cost: at a $/h of at least `price` (default: the
        config's least, `_least_price`)."""
        limit = math.inf if self.limits.time_limit_s is None else self.limits.time_limit_s * (1 + 2e-6)
        if cutoff == math.inf:
            return limit
        if self.limits.objective != "min-cost":
            return min(cutoff, limit)
        price = _least_price(coef, coef.cfg.pp) if price is None else price
        return min(cutoff * SECONDS_PER_HOUR / price if price > 0 else math.inf, limit)


def config_bound(coef, limits: Limits, counts: Iterable[int]) -> float | None:
    """A lower bound on the objective of every sliced plan (count in `counts`) of the GPipe
    config of `coef` (ConfigBounds.full); None when none meets the limits."""
    return ConfigBounds(coef.inst, limits, counts).full(coef)


def least_sums(units: int, t) -> list[float]:
    """For n = 0..units: the least sum_k t(x_{k-1}, x_k) over the slicings 0 = x_0 < ... < x_n =
    units into exactly n slices (inf at n = 0): a shortest path over (unit, slices used),
    F_c[j] = min_{i < j} F_{c-1}[i] + t(i, j), F_0 = (0, inf, ..., inf), the answer F_n[units]
    (Bellman: the slice times add, and each depends on its own start and end alone): column
    `units` of `prefix_sums`, one numpy pass over the (i, j) table per slice count. `t`: a
    callable t(i, j), or the table itself ((units + 1) x (units + 1), inf off the arcs)."""
    if callable(t):
        T = np.full((units + 1, units + 1), np.inf)
        for i in range(units):
            for j in range(i + 1, units + 1):
                T[i, j] = t(i, j)
    else:
        T = t
    return [math.inf] + [float(x) for x in prefix_sums(T)[1:, units]]


def _kind_parts(inst: Instance, nt, tp: int, mbs: int, kind: str) -> tuple[np.ndarray, float]:
    """(t(l) = layer_times(l units).fwd + .bwd for l = 0..U (t(0) = 0), ctx(1, 1): the context
    term of one unit after one unit, costmodel.slice_context_s) of one kind on a plain node type:
    U + 1 cost-model calls, shared by the tables with and without context."""
    units, unit = unit_tokens(inst)
    base = np.array([0.0] + [lt.fwd_s + lt.bwd_s for lt in
                             (costmodel.layer_times(inst, nt, tp, mbs, kind, x * unit) for x in range(1, units + 1))])
    return base, sum(costmodel.slice_context_s(inst, nt, tp, mbs, kind, unit, unit))


@functools.lru_cache(maxsize=4)
def _arc_indices(units: int) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) of every arc i < j <= units (numpy's triu_indices, made once)."""
    return np.triu_indices(units + 1, 1)


def _kind_arcs(inst: Instance, nt, tp: int, mbs: int, kind: str, context: bool, memo: dict | None = None
               ) -> np.ndarray:
    """arc_times of one kind: T[i, j] = t(j - i units) + ctx(j - i, i) on a plain node type, with
    the context term linear in the slice's tokens times its context, ctx(l, c) = l c ctx(1, 1)
    (costmodel.slice_context_s: kappa core_f(L) l c / L^2, and backward a fixed multiple;
    `_kind_parts`, kept in `memo` by node type, tp, micro-batch size and kind when given); on a
    mixed type (its members' maxima) each arc whole."""
    units, unit = unit_tokens(inst)
    T = np.full((units + 1, units + 1), np.inf)
    i, j = _arc_indices(units)
    if context and isinstance(nt, MixedNodeType):
        for a, b in zip(i, j):
            lt = costmodel.layer_times(inst, nt, tp, mbs, kind, int(b - a) * unit, int(a) * unit)
            T[a, b] = lt.fwd_s + lt.bwd_s
        return T
    memo = {} if memo is None else memo
    key = (nt.name, tp, mbs, kind)
    if key not in memo:
        memo[key] = _kind_parts(inst, nt, tp, mbs, kind)
    base, one = memo[key]
    T[i, j] = base[j - i] + (one * (j - i) * i if context else 0.0)
    return T


def arc_times(inst: Instance, nt, tp: int, mbs: int, kinds: Sequence[str] | None = None,
              context: bool = True, memo: dict | None = None) -> np.ndarray:
    """The per-layer f + b of every slice at the planner's units: T[i, j] for the slice of units
    i..j-1 after i units of context, the least over `kinds` (default: the model's block kinds) of
    costmodel.layer_times (node type nt, tp, micro-batch size; `_kind_arcs`); inf off the arcs
    (j <= i). context=False: each slice as a sequence of its length (at most the above: the
    context only adds, costmodel.slice_context_s)."""
    if kinds is None:
        kinds = sorted({inst.model.block_kind(i) for i in range(inst.model.num_layers)})
    return np.min([_kind_arcs(inst, nt, tp, mbs, kd, context, memo) for kd in kinds], axis=0)


def count_sums(inst: Instance, nt, tp: int, mbs: int, context: bool = True) -> list[float]:
    """A*_n for n = 0..U (`least_sums` over `arc_times`): at most the per-layer f + b summed over
    the slices of every slicing into exactly n slices at the planner's units, with context (node
    type nt, tp, micro-batch size; each slice at the least over the model's block kinds of
    costmodel.layer_times with its context). A*_0 = inf. context=False: each slice as a sequence
    of its length (at most the above)."""
    units, _ = unit_tokens(inst)
    return least_sums(units, arc_times(inst, nt, tp, mbs, context=context))


def work_step(m: int, z: float, S: float, n: int) -> float:
    """The work bound's step term (WorkBounds): T >= max(m Z, (m - 1) Z + S / n) for m
    micro-batches, the heaviest stage's work Z and the stages' work S, cut into n slices."""
    return np.maximum(m * z, (m - 1) * z + S / n)


def fill_step(m: int, z: float, L: int, u: float, least: float, extra: float) -> float:
    """The machine path of the heaviest stage s with its fill and drain (slice_bounds docstring,
    M(s)): T >= m W_s + sum_{r<s} p_{r,0} + sum_{r>s} p_{r,n-1} + the hops. Every other stage's
    layers each take at least u on a first or last slice (u: the least per-layer f + b of a
    slice 0..j or i..U, any option), so the fill is at least (L - n_s) u, plus `extra` (the
    embedding's first slice or the head's last, whichever end is not s, and the 2 (K - 1) hops of
    at least one unit of tokens). n_s u <= rho W_s with rho = u / least, `least` the least per-
    layer sum A*_{o,n} of any option (W_s >= n_s A*_{o(s),n}), so
        T >= m W_s + (L - n_s) u + extra >= (m - rho) W_s + L u + extra >= (m - rho) Z + L u + extra
    (m >= 1 >= rho: u is one slice of a per-layer sum)."""
    return (m - u / least) * z + L * u + extra


def ends_step(m: int, z: float, S: float, n: int, Q: float, hops: float) -> float:
    """The path through the end stages and the slice k of most work (slice_bounds docstring,
    P(s, k)): T >= (m - 1) W_s + C_k + R_k + the hops, with R_k = sum_{i<k} p_{0,i} + sum_{i>k}
    p_{K-1,i} >= sum_{i != k} q_i, q_i = min(p_{0,i}, p_{K-1,i}). Taking k of the largest C_k - q_k
    (at least the mean, (S - Q) / n over the n slices, S = sum_r W_r, Q = sum_i q_i):
        T >= (m - 1) Z + (S - Q) / n + Q + hops = (m - 1) Z + S / n + (1 - 1 / n) Q + hops,
    non-decreasing in Z, S and Q, so their lower bounds give a bound (Q >= Q_n: every end stage
    holds a layer and its embedding or head, WorkBounds.ends; hops: 2 (K - 1) transfers of at
    least one unit of tokens)."""
    return (m - 1) * z + S / n + (1 - 1 / n) * Q + hops


class WorkBounds:
    """The work bound of the sliced plans of GPipe configs (`config`), with the per-option count
    sums (`count_sums`) memoised across configs. For a slice count n, every option o's per-layer
    sum is at least A*_{o,n}, so every stage has W_s >= n_s A*_{o(s),n}, and

        T >= max(m Z_n, (m - 1) Z_n + S_n / n) + stage 0's tail + the optimizer term,

    Z_n = the least max_s n_s A*_{o(s),n} over the config's placements within the memory rooms
    (the unsliced bounds' bottleneck, solvers/bounds.py, with A*_{o,n} as per-layer times) and
    S_n = their least layer sum (every type at most the layers its stages hold): the machine path
    of the heaviest stage, T >= m W_max (slice_bounds docstring, M(s)), and its path through the
    slice k of most work, T >= (m - 1) W_max + max_k C_k >= (m - 1) W_max + sum_r W_r / n (C_k
    sums to sum_r W_r over the n slices; P(s, k) with R_k and the hops dropped); and, K > 1, the
    same paths with the fill and the end stages kept (`fill_step`, `ends_step`, with `ends`' u, v
    and Q_n and 2 (K - 1) hops of one unit of tokens). The config's bound is the least over the
    allowed counts: slicing finer shrinks the bubble term S_n / n,
    and each slice's own work (A*_{o,n}) grows. No slicing is enumerated: a few dozen arcs per
    option."""

    def __init__(self, inst: Instance, limits: Limits, counts: Iterable[int]):
        self.inst, self.limits = inst, limits
        self.counts = sorted(set(counts))
        self.sums: dict = {}
        self.quicks: dict = {}
        self.tables: dict = {}
        self.parts: dict = {}       # _kind_parts by node type, tp, micro-batch size and kind
        self.end_terms: dict = {}
        self.placements: dict = {}  # (slots, stages) -> (Z, S) or None (`placement`)
        self.quick_terms: dict = {}
        self.cells = 0              # array cells `end_steps` touched (its work: PATH_SECONDS_PER_CELL each)
        self.middles: dict = {}     # `_middle` by stage count and the usable options' kinds, stages and rooms
        self.chains: dict = {}      # `_hop_chain`'s shortest paths by what they read

    def table(self, coef, o: int, context: bool = True, kind: str | None = None) -> np.ndarray:
        """arc_times of option o (its blocks, or `kind`: "embedding", "head"), memoised by node
        type, tp and micro-batch size."""
        opt = coef.options[o]
        nt = coef.types[opt.k]
        key = (nt.name, opt.tp, opt.mbs, context, kind)
        if key not in self.tables:
            self.tables[key] = arc_times(self.inst, nt, opt.tp, opt.mbs, None if kind is None else [kind], context,
                                         self.parts)
        return self.tables[key]

    def per_count(self, coef, o: int, context: bool = True) -> list[float]:
        """count_sums of option o (memoised by node type, tp, micro-batch size)."""
        opt = coef.options[o]
        key = (coef.types[opt.k].name, opt.tp, opt.mbs, context)
        if key not in self.sums:
            self.sums[key] = least_sums(len(self.table(coef, o, context)) - 1, self.table(coef, o, context))
        return self.sums[key]

    def ends(self, coef, usable: list[int], context: bool = True) -> tuple[float, float, list[float]]:
        """(u, v, Q_n) of the usable options, memoised by their (node type, tp, micro-batch size):
        u = the least per-layer f + b of a first slice (units 0..j) or a last slice (i..U) of any
        option, v = the least of the embedding's time on a first slice and the head's on a last
        one, and Q_n (n = 0..U) = the least over the slicings into n slices of sum_k (alpha_k
        + min(emb_k, head_k)), alpha_k the least per-layer time of slice k over the options and
        emb_k, head_k the least embedding and head times (`fill_step`, `ends_step`); context=False:
        each slice as a sequence of its length (lower)."""
        key = (frozenset((coef.types[coef.options[o].k].name, coef.options[o].tp, coef.options[o].mbs)
                         for o in usable), context)
        got = self.end_terms.get(key)
        if got is None:
            block = np.min([self.table(coef, o, context) for o in usable], axis=0)
            emb = np.min([self.table(coef, o, context, "embedding") for o in usable], axis=0)
            head = np.min([self.table(coef, o, context, "head") for o in usable], axis=0)
            units = len(block) - 1
            u = float(min(block[0, 1:].min(), block[:units, units].min()))
            v = float(min(emb[0, 1:].min(), head[:units, units].min()))
            got = self.end_terms[key] = (u, v, least_sums(units, block + np.minimum(emb, head)))
        return got

    def quick(self, coef, context: bool = True) -> dict[int, float]:
        """Per count n: the work bound's step term with every layer at the fastest option's
        A*_{o,n} (Z_n >= ceil(L / K) min_o A*_{o,n}, S_n >= L min_o A*_{o,n}; seconds), and (K > 1)
        the fill and end paths (`fill_step`, `ends_step`) over every option, without the hops
        and the ends' own fill; context=False: with count_sums without context (lower, cheaper)."""
        return self.quick_at(coef, coef.cfg.num_microbatches(self.inst.job.global_batch_size), coef.cfg.pp, context)

    def quick_at(self, coef, m: int, K: int, context: bool = True) -> dict[int, float]:
        """`quick` of a config with coef's options, m micro-batches and K stages (memoised)."""
        key = (self._kinds(coef), m, K, context)
        got = self.quicks.get(key)
        if got is None:
            steps = self.quick_steps(coef, np.array([m]), np.array([K]), context)[0]
            got = self.quicks[key] = {n: float(t) for n, t in zip(self.counts, steps) if t < math.inf}
        return got

    def quick_steps(self, coef, m: np.ndarray, K: np.ndarray, context: bool = True) -> np.ndarray:
        """`quick`'s step per config (rows: m micro-batches and K stages, with coef's options) and
        count (columns, self.counts); inf where a count has no slicing."""
        a, u, Q = self._quick_terms(coef, context)
        m, K, L = m[:, None], K[:, None], self.inst.model.num_layers
        z, S, n = -(-L // K) * a, L * a, np.array(self.counts)
        with np.errstate(invalid="ignore"):      # inf - inf where a count has no slicing: dropped
            T = work_step(m, z, S, n)
            paths = np.maximum(fill_step(m, z, L, u, a, 0.0), ends_step(m, z, S, n, Q, 0.0))
            T = np.where(K > 1, np.maximum(T, paths), T)
        return np.where(np.isfinite(a), T, np.inf)

    def _kinds(self, coef) -> frozenset:
        return frozenset((coef.types[o.k].name, o.tp, o.mbs) for o in coef.options)

    def _quick_terms(self, coef, context: bool) -> tuple[np.ndarray, float, np.ndarray]:
        """(min_o A*_{o,n} per count, and `ends`' u and Q_n over every option) (memoised)."""
        key = (self._kinds(coef), context)
        got = self.quick_terms.get(key)
        if got is None:
            every = list(range(len(coef.options)))
            a = np.min([np.asarray(self.per_count(coef, o, context))[self.counts] for o in every], axis=0)
            u, _, Q = self.ends(coef, every, context)
            got = self.quick_terms[key] = (a, u, np.asarray(Q)[self.counts])
        return got

    def placement(self, coef, caps: dict, rooms: dict, usable: list[int], n: int) -> tuple[float, float] | None:
        """(Z_n, S_n) of the config at count n (class docstring; solvers/bounds.py's bottleneck and
        least layer sum over stage_slots with A*_{o,n} as the per-layer times), memoised by the
        slots and the stage count (configs that differ in what the slots do not read, e.g. a
        recompute setting whose memory rooms agree, share them). None: no placement fits."""
        from milp_plan.solvers import bounds
        K, L = coef.cfg.pp, self.inst.model.num_layers
        slots = bounds.stage_slots(coef, self.limits, True, caps, rooms, usable, lambda o: self.per_count(coef, o)[n])
        key = (tuple(slots), K)
        if key not in self.placements:
            z = bounds._bottleneck_bound(slots, K, L, 1, bounds._breakpoints(slots, L, 1))
            self.placements[key] = None if z is None else (z, bounds._least_layer_sum(math.inf, slots, K, L, 1))
        return self.placements[key]

    def option_ends(self, coef, o: int) -> tuple:
        """(A*_{o,n}, E*_{o,n}, H*_{o,n} for n = 0..U, uf, ul, ef, hl, by_slice) of option o,
        memoised by its node type, tp and micro-batch size: the least per-layer, embedding and
        head sums over the cuts into n slices (`least_sums`, each on its own), the least per-layer
        f + b of a first slice (units 0..j) and of a last one (i..U), the least embedding on a
        first slice and head on a last one (seconds); by_slice: the per-layer and head sums with
        the first slice 0..j fixed (`with_first`, [n, j]), the per-layer and embedding sums with
        the last slice i..U fixed (`with_last`, [n, i]), and the first slices' per-layer and
        embedding times (j = 1..U) and the last slices' per-layer and head times (i = 0..U-1)."""
        opt = coef.options[o]
        key = ("ends", coef.types[opt.k].name, opt.tp, opt.mbs)
        got = self.end_terms.get(key)
        if got is None:
            T, Te, Th = (self.table(coef, o, True, kd) for kd in (None, "embedding", "head"))
            U = len(T) - 1
            pre, pre_e, suf, suf_h = prefix_sums(T), prefix_sums(Te), suffix_sums(T), suffix_sums(Th)
            got = self.end_terms[key] = (np.asarray(self.per_count(coef, o)), np.asarray(least_sums(U, Te)),
                                         np.asarray(least_sums(U, Th)), float(T[0, 1:].min()),
                                         float(T[:U, U].min()), float(Te[0, 1:].min()), float(Th[:U, U].min()),
                                         dict(A_first=with_first(T, suf), H_first=with_first(Th, suf_h),
                                              A_last=with_last(T, pre), E_last=with_last(Te, pre_e),
                                              first=(T[0, 1:], Te[0, 1:]), last=(T[:U, U], Th[:U, U])),
                                         dict(T=T, Te=Te, Th=Th, pre=pre, pre_e=pre_e, suf=suf, suf_h=suf_h,
                                              arcs=slice_arcs(T)))
        return got

    def end_steps(self, coef, cb: "ConfigBounds", caps: dict, rooms: dict, usable: list[int], paths: bool = False,
                  limit: float = math.inf, split: bool = True) -> dict[int, float]:
        """Per count n: at least the step of every plan of the config (K >= 2) cut into n slices,
        less the optimizer term cb._opt (so that cb._finish adds it back), with the end stages'
        options and layers enumerated (`end_paths`); a count absent: no plan. paths: each (a, b)
        whose bound is below the count's least so far (and `limit`, a step) is raised by every
        path through the end stages and one slice, over every cut (`_lazy_paths`; dearer); split:
        with several middle options, those paths with the middle's layers split by its
        bottleneck's intervals (`_lazy_paths`' split; about 3x dearer again)."""
        K, L = coef.cfg.pp, self.inst.model.num_layers
        m = coef.cfg.num_microbatches(self.inst.job.global_batch_size)
        n_ = np.array(self.counts)
        terms = {o: self.option_ends(coef, o) for o in usable}
        U = len(terms[usable[0]][0]) - 1
        unit = self.inst.job.seq_length // U
        alpha = np.min([self.table(coef, o) for o in usable], axis=0)
        _, _, Qn = self.ends(coef, usable)
        Qn, An = np.asarray(Qn)[n_], np.asarray(least_sums(U, alpha))[n_]
        from milp_plan.solvers import bounds
        sync = bounds._sync_by_end(coef, caps, usable) if self.inst.model.tied_embeddings else {}
        pairs, hop_costs = [], _hop_costs(coef)
        tails = {o: np.array([max(0.0, coef.dp_time(o, 0)[0](a)) for a in range(1, rooms[o] + 1)]) + sync.get(o, 0.0)
                 for o in usable}     # stage 0's tail at a = 1..room layers, run as o
        for o0 in usable:
            for o1 in usable:
                left = dict(caps)
                left[coef.pool_of[o0]] -= 1
                left[coef.pool_of[o1]] -= 1
                if min(left.values()) < 0:
                    continue
                tail = tails[o0]
                opt = np.maximum.outer([coef.opt_time(o0, 0)(a) for a in range(1, rooms[o0] + 1)],
                                       [coef.opt_time(o1, K - 1)(b) for b in range(1, rooms[o1] + 1)])
                mkey = (K, tuple((coef.types[coef.options[o].k].name, coef.options[o].tp, coef.options[o].mbs,
                                  left[coef.pool_of[o]], rooms[o]) for o in usable))
                middle = self.middles.get(mkey)
                if middle is None:
                    middle = self.middles[mkey] = _middle(terms, usable, {o: left[coef.pool_of[o]] for o in usable},
                                                          rooms, K - 2, L, n_)
                hop = _hop_chain(coef, caps, coef.pool_of[o0], coef.pool_of[o1], self.chains, hop_costs) * unit
                extra = tail[:, None] + np.maximum(opt, cb._opt(coef)) - cb._opt(coef)
                T, Wmax, base = end_paths(m, K, L, n_, terms[o0], terms[o1], rooms[o0], rooms[o1], middle, Qn, An,
                                    hop * np.arange(1, U + 1), tail, extra - tail[:, None], coupled=not paths)
                self.cells += T.size * (1 if paths else U)
                pairs.append((o0, o1, T, Wmax, extra, middle, hop, base, left))
        best = np.min([p[2].min(axis=(0, 1)) for p in pairs], axis=0) if pairs else np.full(len(n_), np.inf)
        if paths:     # the counts in increasing bound, each raised while it can lower the least
            least = limit
            for c in np.argsort(best, kind="stable"):
                if best[c] >= least:
                    break
                raised = math.inf
                for o0, o1, T, Wmax, extra, middle, hop, base, left in pairs:
                    mids = [usable[i] for i in middle[6]]
                    mid_t = np.min([self.table(coef, o) for o in mids], axis=0) if mids else None
                    parts = None
                    if split and len(mids) >= 2:     # the middle's layers split by the bottleneck's intervals
                        parts = (base[:, :, c], middle[0][:, c], np.array([self.table(coef, o) for o in mids]),
                                 np.array([terms[o][0][n_[c]] for o in mids]), np.array([rooms[o] for o in mids]),
                                 np.array([min(left[coef.pool_of[o]], K - 2) for o in mids]))
                    got, cells = _lazy_paths(T[:, :, c], Wmax[:, :, c], extra, min(raised, least), m, L,
                                             int(n_[c]), terms[o0][8], terms[o1][8], mid_t, hop, parts)
                    raised, self.cells = min(raised, got), self.cells + cells
                best[c] = max(best[c], raised)
                least = min(least, best[c])
        return {int(n): float(t) for n, t in zip(n_, best) if t < math.inf}

    def config(self, coef, cb: "ConfigBounds", cutoff: float = math.inf, memory: bool = True, ends: bool = True,
               paths: bool = False, split: bool = True) -> tuple[float | None, bool]:
        """(the least over the counts of the work bound (class docstring) of the config's plans,
        as an objective: T plus stage 0's tail (cb._dp) and the optimizer term, priced
        (cb._finish); whether it is the whole bound). None: no placement fits or none meets the
        limits. Counts whose `quick` term (plus the tail) reaches `cutoff`, or whose terms at the
        scaled Z and S of the counts already placed (`scale_from`) reach it or the best, are not
        placed: then the value is a bound at least `cutoff`, not the whole one (False); below the
        cutoff it is the whole one. memory=False: every stage may hold every layer and every option
        with a stage to offer is usable (stage 0's tail likewise): at most the bound with the rooms.
        ends (K > 1): each count's bound is at least `end_steps`' (the end stages enumerated);
        without: lower, and cheaper (quick_bound raises a config to it only when it tops the heap).
        paths: `end_steps` with every path through the end stages and one slice (dearer); split:
        and the middle's layers split by its bottleneck's intervals (dearer again)."""
        from milp_plan.solvers import bounds
        K, L = coef.cfg.pp, self.inst.model.num_layers
        m = coef.cfg.num_microbatches(self.inst.job.global_batch_size)
        quick = self.quick(coef)
        if not quick:
            return None, True
        limit = cb._time_cutoff(coef, cutoff) - cb._opt(coef)    # a step (seconds) at or above it cannot matter
        if min(quick.values()) >= limit:
            return cb._finish(coef, min(quick.values()), K), False
        found = bounds.usable_options(coef, self.limits, memory=memory)
        if found is None:
            return None, True
        caps, _, rooms, usable = found
        tail = cb._dp(coef, 1 if K > 1 else L, memory)
        if K > 1:
            u, v, Q = self.ends(coef, usable)
            hops = 2 * (K - 1) * _least_hop_per_token(coef) * (self.inst.job.seq_length // (len(Q) - 1))
        ends = self.end_steps(coef, cb, caps, rooms, usable, paths, limit, split) if K > 1 and ends else {}
        key = {n: max(quick[n] + tail, ends.get(n, -math.inf)) for n in quick}
        counts = sorted(quick, key=lambda n: (key[n], n))      # by the quick term and the end stages' bound
        n_, q = np.array(counts), np.array([key[n] for n in counts])
        e_ = np.array([ends.get(n, -math.inf) for n in counts])
        R = np.array([self.per_count(coef, o) for o in usable])[:, n_]       # A*_{o,n}
        least = R.min(axis=0)
        Q_ = np.asarray(Q)[n_] if K > 1 else None

        def step(z: np.ndarray, S: np.ndarray) -> np.ndarray:     # per count, at its Z and S
            got = work_step(m, z, S, n_)
            if K > 1:
                got = np.maximum(got, np.maximum(fill_step(m, z, L, u, least, v + hops),
                                                 ends_step(m, z, S, n_, Q_, hops)))
            return got
        best, floor, whole = math.inf, math.inf, True   # floor: the least bound of a count not placed
        lb = q.copy()         # each count's bound so far: its quick term, then the placed counts' scaled Z, S
        Z, S = np.zeros(len(counts)), np.zeros(len(counts))
        for j, n in enumerate(counts):
            if q[j] >= best:
                break      # the counts left bound at least as high
            if q[j] >= limit:
                best, whole = q[j], False
                break
            if lb[j] >= best:
                continue
            if lb[j] >= limit:
                floor, whole = min(floor, float(lb[j])), False
                continue
            got = self.placement(coef, caps, rooms, usable, n)
            if got is None:
                continue
            lam = scale_from(R, j)
            Z, S = np.maximum(Z, got[0] * lam), np.maximum(S, got[1] * lam)
            Z[j], S[j] = got
            T = np.maximum(step(Z, S) + tail, e_)
            best = min(best, float(T[j]))      # count n's own bound, at its Z and S
            lb = np.maximum(lb, T)
        best = min(best, floor)
        return (None if best == math.inf else cb._finish(coef, best, K)), whole


def with_first(T: np.ndarray, suf: np.ndarray | None = None) -> np.ndarray:
    """F[n, j] (n, j = 0..U): the least sum_k T[x_{k-1}, x_k] over the cuts 0 = x_0 < x_1 = j <
    ... < x_n = U into n slices whose first slice is units 0..j (inf where none): T[0, j] plus
    the least sum of n - 1 slices covering j..U (`suffix_sums`, or `suf`, its value)."""
    U = len(T) - 1
    suf = suffix_sums(T) if suf is None else suf
    out = np.full((U + 1, U + 1), np.inf)
    out[1:, 1:] = T[0, 1:] + suf[:U, 1:]
    return out


def with_last(T: np.ndarray, pre: np.ndarray | None = None) -> np.ndarray:
    """L[n, i] (n, i = 0..U): the least sum over the cuts into n slices whose last slice is
    units i..U (inf where none): T[i, U] plus the least sum of n - 1 slices covering 0..i
    (`prefix_sums`, or `pre`, its value)."""
    U = len(T) - 1
    pre = prefix_sums(T) if pre is None else pre
    out = np.full((U + 1, U + 1), np.inf)
    out[1:, :U] = T[:U, U] + pre[:U, :U]
    return out


def prefix_sums(T: np.ndarray) -> np.ndarray:
    """F[k, x] (k, x = 0..U): the least sum of k slices covering units 0..x (F[0] = 0 at 0, inf
    elsewhere; inf where none): a shortest path over (unit, slices used), F_k[x] = min_{x' < x}
    F_{k-1}[x'] + T[x', x] (`least_sums` reads its column U)."""
    U = len(T) - 1
    out = np.full((U + 1, U + 1), np.inf)
    out[0, 0] = 0.0
    for k in range(1, U + 1):
        out[k] = (out[k - 1][:, None] + T).min(axis=0)
    return out


def suffix_sums(T: np.ndarray) -> np.ndarray:
    """G[c, x] (c, x = 0..U): the least sum of c slices covering units x..U (G[0] = 0 at U)."""
    U = len(T) - 1
    out = np.full((U + 1, U + 1), np.inf)
    out[0, U] = 0.0
    for c in range(1, U + 1):
        out[c] = (T + out[c - 1][None, :]).min(axis=1)
    return out


PATH_BATCH = 64   # _lazy_paths: end-stage layer pairs raised at a time


def _lazy_paths(T: np.ndarray, Wmax: np.ndarray, extra: np.ndarray, cutoff: float, m: int, L: int, n: int,
                t0: dict, t1: dict, mid: np.ndarray | None, hop: float, split: tuple | None = None
                ) -> tuple[float, int]:
    """The least over the end stages' layers (a, b) of max(T[a, b], `slice_paths` + (m - 1) W_max
    + extra[a, b]), raising the pairs in increasing T, PATH_BATCH at a time, while T is below the
    least found and `cutoff` (a pair's value is at least its T, so the pairs left cannot lower
    it; at or above the cutoff it need not be known: then the cutoff, a bound, is returned; inf
    where no pair fits); and the array cells the paths touched.

    split (several middle options): (base[a, b], Zm[L'], the middle options' per-layer tables,
    A*_{o,n}, rooms, stages): the middle's bottleneck Y = max_s n_s A*_{o(s),n} >= Zm(L') is split
    into intervals [y_j, y_{j+1}), y_j = Zm GRID_RATIO^j (j < GRID_STEPS; the last unbounded), as
    ConfigBounds._refined: within one, the heaviest middle stage's machine path is at least
    m y_j + base and W_max >= y_j, and option o holds at most stages_o min(floor(y_{j+1} / A_o),
    room_o) middle layers, so each slice's middle sum is at least the least sum of L' layers
    under those holds (`_middle_sums`, the cheapest option of the slice first) instead of L'
    times the least per-layer time. Every plan lies in one interval: the least over (a, b, j)."""
    if split is None:
        keys, Wj, Tj = T, Wmax, T
    else:
        base, Zm, tabs, A, room, cap = split
        ra, rb = T.shape
        Lp = L - np.arange(1, ra + 1)[:, None] - np.arange(1, rb + 1)[None, :]
        Zc = Zm[np.clip(Lp, 0, L)]
        ys = Zc[..., None] * GRID_RATIO ** np.arange(GRID_STEPS + 1)                 # a x b x J
        upper = np.concatenate([ys[..., 1:], np.full(ys.shape[:2] + (1,), np.inf)], axis=2)
        with np.errstate(invalid="ignore"):
            holds = cap * np.minimum(np.floor(upper[..., None] / A + 1e-9), room)     # a x b x J x options
        Tj = np.maximum(T[..., None], m * ys + base[..., None])
        Tj = np.where(np.isfinite(Zc)[..., None] & (holds.sum(axis=3) >= Lp[..., None]), Tj, np.inf)
        keys, Wj = Tj, np.maximum(Wmax[..., None], ys)
    flat = np.argsort(keys, axis=None, kind="stable")
    best, cells = math.inf, 0
    src, dst = t0["arcs"][:2]
    cheapest = None if split is None else _cheapest_first(tabs[:, src, dst])
    for start in range(0, flat.size, PATH_BATCH):
        idx = flat[start:start + PATH_BATCH]
        idx = idx[keys.flat[idx] < min(best, cutoff)]
        if not len(idx):
            break
        at = np.unravel_index(idx, keys.shape)
        a, b = at[0], at[1]
        sums = None if split is None else _middle_sums(holds[at], Lp[a, b], *cheapest)
        V = slice_paths(a + 1, b + 1, L, n, t0, t1, mid, hop, sums)
        cells += len(idx) * n * len(t0["T"]) ** 2 * (1 if split is None else 1 + len(tabs))
        got = np.maximum(keys.flat[idx], V + (m - 1) * Wj.flat[idx] + extra[a, b])
        best = min(best, float(got.min()))
    if best < cutoff:
        return best, cells
    return max(cutoff, float(keys.min())), cells     # every value is at least the cutoff (inf: none fits)


def slice_arcs(T: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The arcs of a slicing table T[x', x] (a slice of units x'..x-1, finite where one exists),
    by their end x, then x': (x', x, the ends that have arcs, where each end's run of arcs
    starts), for a least over each end's arcs in one pass (np.minimum.reduceat)."""
    ends, starts = np.nonzero(np.isfinite(T).T)
    xs, runs = np.unique(ends, return_index=True)
    return starts, ends, xs, runs


def _cheapest_first(tabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per arc (tabs: options x arcs, the middle options' per-layer times): the options in
    increasing time (`_middle_sums`' order) and their times, 0 where an option has none."""
    z = np.where(np.isfinite(tabs), tabs, 0.0)
    order = np.argsort(z, axis=0, kind="stable")
    return order, np.take_along_axis(z, order, axis=0)


def _middle_sums(holds: np.ndarray, Lp: np.ndarray, order: np.ndarray, al: np.ndarray) -> np.ndarray:
    """Per row (P x options holds, P layer counts L'): each slice's least sum_o t_o T_o[x', x]
    over t_o <= holds_o, sum_o t_o = L' (the cheapest option of the slice first: a fractional
    knapsack of unit items; `order`, `al`: `_cheapest_first` of the options' times on the arcs),
    P x arcs."""
    h = holds[:, order]                                                          # P x options x arcs
    taken = np.minimum(h, np.maximum(Lp[:, None, None] - (np.cumsum(h, axis=1) - h), 0))
    return (taken * al[None]).sum(axis=1)


def slice_paths(a: np.ndarray, b: np.ndarray, L: int, n: int, t0: dict, t1: dict, mid: np.ndarray | None,
                hop: float, sums: np.ndarray | None = None) -> np.ndarray:
    """Per (a, b): at least min over the cuts into n slices of max_k of the path through stage 0,
    slice k and stage K-1 (slice_bounds docstring, P(0, s, K-1, k) without (m - 1) W_s):
        sum_{i<=k} p_{0,i} + sum_{0<r<K-1} p_{r,k} + sum_{i>=k} p_{K-1,i} + 2 sum_h hop_{h,k},
    stage 0 holding a layers and the embedding (option tables t0: per-layer T, embedding Te,
    prefix sums pre, pre_e, T's arcs `slice_arcs`), stage K-1 b layers and the head (t1: T, Th,
    suffix sums suf, suf_h), the L - a - b middle layers each at least `mid` (the least per-layer f + b of a middle option
    per slice; None: no middle stage; or `sums`, each row's least middle sum per arc), every hop
    down and back `hop` per unit of the slice. The
    slices before k on stage 0 take at least the least sum of k slices covering their units, and
    those after k on stage K-1 likewise (`prefix_sums`, `suffix_sums`), so each path's term reads
    only slice k's ends (x', x); the least over the cuts of the largest term is a bottleneck path
    over the unit positions: V_0[x] = c_0(0, x), V_k[x] = min_{x' < x} max(V_{k-1}[x'], c_k(x', x)),
    the answer V_{n-1}[U]. Each term is evaluated on the arcs alone (x' < x where T is finite),
    each end's least over its arcs in one reduceat."""
    U = len(t0["T"]) - 1
    src, dst, xs, runs = t0["arcs"]
    on = lambda x: x[src, dst]                                                   # noqa: E731
    a_, b_ = a[:, None].astype(float), b[:, None].astype(float)
    ends = a_ * on(t0["T"]) + on(t0["Te"]) + b_ * on(t1["T"]) + on(t1["Th"]) + hop * (dst - src)
    if sums is not None:       # the middle's least sum on each slice (`_middle_sums`)
        ends = ends + sums
    elif mid is not None:
        ends = ends + (L - a_ - b_) * on(mid)
    ends = np.where(np.isnan(ends), np.inf, ends)     # no middle layers at an infinite time: no path
    first = src == 0
    pre, pre_e = t0["pre"][:n, src], t0["pre_e"][:n, src]                        # at x', per k
    suf, suf_h = t1["suf"][n - 1::-1, dst], t1["suf_h"][n - 1::-1, dst]         # at x, per k
    V = None
    for k in range(n):
        c = ends + (a_ * pre[k] + pre_e[k]) + (b_ * suf[k] + suf_h[k])
        W = np.full((len(a), U + 1), np.inf)
        if V is None:
            W[:, dst[first]] = c[:, first]
        else:
            W[:, xs] = np.minimum.reduceat(np.maximum(V[:, src], c), runs, axis=1)
        V = W
    return V[:, U]


def _middle(terms: dict, usable: list[int], caps: dict[int, int], rooms: dict[int, int], stages: int, L: int,
            n_: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """What `end_paths` reads of the middle stages (K - 2 of them, `stages`) holding L' = 0..L
    layers, per count (columns of n_): (Zm[L', count] = the least max_s n_s A*_{o(s),n} over
    their placements, inf where none holds L'; LSm[L', count] = the least sum_s n_s A*_{o(s),n};
    A_min[count] = the least A*_{o,n} of an option with a middle stage to offer; (mf, ml) = the
    least per-layer f + b of such an option on each first slice 0..j (j = 1..U) and on each last
    slice i..U (i = 0..U-1); the most layers a middle stage holds; (lam_f[count, j - 1],
    lam_l[count, i]) = the least over those options of A_o(n, first slice 0..j) / A*_{o,n} and of
    A_o(n, last slice i..U) / A*_{o,n} (`with_first`, `with_last`): every per-layer sum of a cut
    with that first (last) slice is at least lam times the option's A*, so the middle's heaviest
    stage on such a cut takes at least lam Zm (the bottleneck scales with the per-layer times,
    as `scale_from`)). Option o offers min(caps[o], stages) stages of at most rooms[o] layers (options of
    one pool counted apart: a relaxation, as ConfigBounds._bottleneck). Zm: a placement whose
    largest n_s A_o is z holds at most the `stages` largest min(floor(z / A_o), room_o), and that
    total never falls as z grows, so the least z among the breakpoints k A_o whose total reaches
    L' is at most every placement's maximum. LSm: the L' layers to the least A first (a
    fractional knapsack of unit items, each option at most its stages x room). Last, the middle
    options' places in `usable` (the result is shared by configs with the same options' kinds,
    stages and rooms, WorkBounds.middles)."""
    opts = [o for o in usable if caps[o] > 0 and rooms[o] > 0] if stages > 0 else []
    C = len(n_)
    Zm, LSm = np.full((L + 1, C), np.inf), np.full((L + 1, C), np.inf)
    Zm[0], LSm[0] = 0.0, 0.0
    if not opts:
        U = len(terms[usable[0]][0]) - 1     # no middle layer: its slice terms count 0 times
        return Zm, LSm, np.full(C, np.inf), (np.zeros(U), np.zeros(U)), 0, (np.ones((C, U)),) * 2, []
    A = np.array([terms[o][0][n_] for o in opts])                       # options x counts
    room = np.array([rooms[o] for o in opts])
    cap = np.array([min(caps[o], stages) for o in opts])
    # every count at once (columns): the candidates k A_o, sorted per count (duplicates are harmless)
    z = np.sort(np.concatenate([A[i][None, :] * np.arange(1, room[i] + 1)[:, None] for i in range(len(opts))]),
                axis=0)                                                              # cands x counts
    hold = np.minimum(np.floor(z[:, :, None] / A.T[None, :, :] + 1e-9), room)         # cands x counts x options
    idx = np.argsort(-hold, axis=2, kind="stable")
    h, cp = np.take_along_axis(hold, idx, axis=2), cap[idx]
    taken = np.minimum(cp, np.maximum(stages - (np.cumsum(cp, axis=2) - cp), 0))
    total = np.maximum.accumulate((h * taken).sum(axis=2), axis=0)                   # cands x counts
    need = np.arange(1, L + 1)
    reach = total[:, :, None] >= need[None, None, :]                                  # cands x counts x L
    at = reach.argmax(axis=0)                                                         # counts x L
    Zm[1:] = np.where(reach.any(axis=0).T, np.take_along_axis(z, at.T, axis=0), np.inf)
    order = np.argsort(A, axis=0, kind="stable")                                     # options x counts
    offer = (cap * room)[order]
    before = np.cumsum(offer, axis=0) - offer
    take = np.clip(need[:, None, None] - before[None], 0, offer[None])                # L x options x counts
    LSm[1:] = np.where(take.sum(axis=1) >= need[:, None],
                       (take * np.take_along_axis(A, order, axis=0)[None]).sum(axis=1), np.inf)
    u = tuple(np.min([terms[o][7][side][0] for o in opts], axis=0) for side in ("first", "last"))
    U = len(u[0])
    with np.errstate(invalid="ignore"):
        lam = tuple(np.min([terms[o][7][name][n_][:, cols] / A[i][:, None] for i, o in enumerate(opts)], axis=0)
                    for name, cols in (("A_first", slice(1, U + 1)), ("A_last", slice(0, U))))
    return Zm, LSm, A.min(axis=0), u, int(room.max()), lam, [usable.index(o) for o in opts]


def _fill_path(m: int, a: np.ndarray, b: np.ndarray, mid: np.ndarray, n_: np.ndarray, Aw: np.ndarray,
               Ew: np.ndarray, blk: np.ndarray, end: np.ndarray, mids: np.ndarray, hop: np.ndarray) -> np.ndarray:
    """M(K-1) (a x b x counts), the heaviest end stage's machine path with the first slice's
    length j enumerated: the end stage (b layers) runs every item, W >= b Aw[n, j] + Ew[n, j]
    (its per-layer and head sums over the cuts with that first slice, `with_first`; Aw, Ew
    [n, j - 1] for j = 1..U), and slice 0
    (j units) passes the a layers and the embedding of stage 0 (blk[j - 1], end[j - 1]), the mid
    middle layers (each at least mids[j - 1]) and every hop down and back (hop[j - 1]):
        M >= min_j m (b Aw[n, j] + Ew[n, j]) + a blk[j] + end[j] + mid mids[j] + hop[j].
    With the stages' roles swapped and the last slice's start i for j (`with_last`; the arrays
    over i = 0..U-1, hop reversed: U - i units) it is M(0). The other first slice terms without
    a fill are dropped (at least 0)."""
    n = n_[None, None, :, None]
    W = b[..., None] * Aw[n, np.arange(len(blk))] + Ew[n, np.arange(len(blk))]
    fill = a[..., None] * blk + end + mid[..., None] * mids + hop
    with np.errstate(invalid="ignore"):
        got = m * W + fill
    return np.where(np.isnan(got), np.inf, got).min(axis=3)


def _least(x: np.ndarray) -> np.ndarray:
    """The least over the last axis, nan (0 x inf: no slice of that length) read as inf."""
    return np.where(np.isnan(x), np.inf, x).min(axis=-1)


def end_paths(m: int, K: int, L: int, n_: np.ndarray, first: tuple, last: tuple, room0: int, room1: int,
              middle: tuple, Qn: np.ndarray, An: np.ndarray, hop: float, tail: np.ndarray, opt: np.ndarray,
              coupled: bool = True) -> np.ndarray:
    """Per count n (of n_): at least the step of every plan (K >= 2 stages, m micro-batches)
    whose stage 0 runs the option of `first` with a = 1..room0 layers and stage K-1 the option
    of `last` with b = 1..room1 layers, cut into n slices; the least over a and b. first, last:
    WorkBounds.option_ends of the two options (A, E, H per count; uf, ul, ef, hl); middle:
    `_middle` of the K - 2 middle stages with the ends' stages taken from their pools; Qn, An:
    per count the least sum_k (alpha_k + min(emb_k, head_k)) and sum_k alpha_k (alpha, emb, head
    the least over the options); hop: every hop down and back with one unit of tokens
    (`_hop_chain`); tail[a - 1]:
    stage 0's tail at a layers (its reduction's piece 0, Coefficients.dp_time, and the tied
    all-reduce with that option at stage 0, bounds._sync_by_end); opt[a - 1, b - 1]: the optimizer
    term's excess over the config's (cb._opt). With L' = L - a - b layers in the middle,
    W_0 >= a A_0 + E_0, W_{K-1} >= b A_1 + H_1 and max_mid W_s >= Zm(L') (`_middle`):

        M(K-1) >= m W_{K-1} + a uf_0 + ef_0 + L' uf + hop   (the fill: slice 0 above K-1)
        M(0)   >= m W_0 + b ul_1 + hl_1 + L' ul + hop       (the drain: the last slice below 0)
        M(s)   >= m W_s + a uf_0 + ef_0 + b ul_1 + hl_1 + (L' - n_s) min(uf, ul) + hop   (s the heaviest
                  middle stage; n_s <= min(W_s / A_min, room), L' - n_s >= K - 3; the term
                  never falls as W_s grows, so W_s = Zm(L') bounds it); and with the first
                  slice's length j enumerated, W_s >= lam_f[n, j] Zm(L') and stage 0's part
                  a t_0(0, j) + emb_0(0, j) (L' - n_s >= max(K - 3, L' - room)), or the last
                  slice's with lam_l and stage K-1's part
        P      >= (m - 1) W_max + S / n + (1 - 1/n) Q + hop   (ends_step: S >= W_0 + W_{K-1} +
                  LSm(L'), Q = sum_k min(p_{0,k}, p_{K-1,k}) >= Qn + (min(a, b) - 1) An)
        m W_max

    (slice_bounds docstring, M(s) and P(s, k); each first- or last-slice term at its own least
    over the slice's length, uf and ul those of a middle option), and T >= the largest + tail[a]
    + opt[a, b]. inf where no placement fits.
    Returns (T[a - 1, b - 1, count], the lower bound on W_max used, and (K >= 3) the heaviest
    middle stage's machine path less m W_s, with the tail and the optimizer). coupled=False: the machine
    paths with each first or last slice term at its own least (cheaper; `slice_paths` then
    couples them)."""
    A0, E0, _, uf0, _, ef0, _, by0, _ = first
    A1, _, H1, _, ul1, _, hl1, by1, _ = last
    Zm, LSm, Amin, (mf, ml), rmax, (lam_f, lam_l), _ = middle
    uf, ul = mf.min(), ml.min()
    a = np.arange(1, room0 + 1)[:, None, None]
    b = np.arange(1, room1 + 1)[None, :, None]
    mid = L - a - b                                                       # a x b x 1
    ok = (mid >= K - 2) & (mid >= 0)
    midc = np.clip(mid, 0, L)
    Zc, LSc = Zm[midc[..., 0]], LSm[midc[..., 0]]                         # a x b x counts
    n = n_[None, None, :].astype(float)
    W0, W1 = a * A0[n_] + E0[n_], b * A1[n_] + H1[n_]
    fill0, drain1 = a * uf0 + ef0, b * ul1 + hl1
    U = len(mf)
    if coupled:
        T = np.maximum(_fill_path(m, a, b, mid, n_, by1["A_first"][:, 1:], by1["H_first"][:, 1:], *by0["first"], mf,
                                  hop),
                       _fill_path(m, b, a, mid, n_, by0["A_last"][:, :U], by0["E_last"][:, :U], *by1["last"], ml,
                                  hop[::-1]))
    else:     # each first or last slice term at its own least
        T = np.maximum(m * W1 + fill0 + mid * uf, m * W0 + drain1 + mid * ul) + hop[0]
    Wmax = np.maximum(W0, W1)
    if K >= 3:
        with np.errstate(invalid="ignore", divide="ignore"):
            rest = np.maximum(np.maximum(K - 3, mid - rmax), mid - Zc / Amin)
        T = np.maximum(T, m * Zc + fill0 + drain1 + rest * min(uf, ul) + hop[0])
        Wmax = np.maximum(Wmax, Zc)
        # the heaviest middle stage with the first (last) slice's length enumerated: W_s >= lam Zm
        others = np.maximum(K - 3, mid - rmax) * min(uf, ul) + hop[0]
        if coupled:
            with np.errstate(invalid="ignore"):
                fj = m * lam_f[None, None] * Zc[..., None] + (a[..., None] * by0["first"][0] + by0["first"][1])
                di = m * lam_l[None, None] * Zc[..., None] + (b[..., None] * by1["last"][0] + by1["last"][1])
            T = np.maximum(T, np.maximum(_least(fj) + drain1, _least(di) + fill0) + others)
    S = W0 + W1 + LSc
    Q = Qn + (np.minimum(a, b) - 1) * An
    bubble = (m - 1) * Wmax if m > 1 else 0.0      # (0 x inf where no placement: masked below)
    T = np.maximum(T, np.maximum(m * Wmax, bubble + S / n + (1 - 1 / n) * Q) + hop[0])
    T = T + tail[:, None, None] + opt[:, :, None]
    T = np.where(ok & np.isfinite(Zc) & np.isfinite(LSc), T, np.inf)
    # the heaviest middle stage's machine path at a bottleneck y >= Zm: m y + this
    base = np.broadcast_to(fill0 + drain1 + others + tail[:, None, None] + opt[:, :, None], T.shape) if K >= 3 else None
    return T, Wmax, base


def scale_from(R: np.ndarray, j: int) -> np.ndarray:
    """Per count (a column of R, R[o][i] = A*_{o,i} of each usable option o): lambda_i = min_o
    A*_{o,i} / A*_{o,j}, so Z_i >= lambda_i Z_j and S_i >= lambda_i S_j: the bottleneck and the
    least layer sum never fall when a per-layer time grows and scale with the per-layer times
    (a placement's n_s a_s does: the breakpoints a n move with them and floor(z / a) is
    unchanged), and every A*_{o,i} >= lambda_i A*_{o,j}. Every term of the work bound is
    non-decreasing in Z and S, so a count placed bounds the others from below."""
    return (R / R[:, j:j + 1]).min(axis=0)


def _initial_keys(prepared, work: WorkBounds, limits: Limits) -> list[tuple[float, int, int]]:
    """quick_bound's first keys, a heap of (bound, config index, 0): per GPipe config,
    `WorkBounds.quick_steps` at its micro-batch count and stages, least over the counts, valued at
    the config's least price (`_least_price`), without the optimizer term (>= 0). Configs that
    share the uniform choice, the samples per micro-batch and the stage sizes share their options
    (Coefficients: OptionsKey), so one config's coefficients serve them all, in one numpy pass
    over the group's configs and the counts: the others' are made only when the search opens them."""
    gbs = prepared.inst.job.global_batch_size
    if not work.counts:      # a sequence of one unit: no slicing
        return []
    groups: dict = {}
    for i, cfg in enumerate(prepared.configs):
        if cfg.sched.slices_ok:
            groups.setdefault((cfg.uniform, cfg.samples, cfg.sizes) if cfg.uniform is not None else i, []).append(i)
    heap = []
    for members in groups.values():
        rep = prepared.coef(members[0])
        K = np.array([prepared.configs[i].pp for i in members])
        m = np.array([prepared.configs[i].num_microbatches(gbs) for i in members])
        got = _value(work.quick_steps(rep, m, K).min(axis=1), _least_price(rep, 1) * K, limits)
        heap += [(v, i, 0) for v, i in zip(got.tolist(), members) if v < math.inf]
    heapq.heapify(heap)
    return heap


def quick_bound(inst: Instance, limits: Limits, fix: str, where: list | None = None, refine: float = 0.0,
                work_limit: float | None = None, refine_if=None) -> tuple[float | None, int]:
    """(at least the objective of every GPipe plan cut into 2..U token slices, within --fix `fix`
    (its schedule pinned to GPipe: slice_plan._gpipe_fix); the configs whose work bound within
    the memory rooms was computed): the least over the configs of `WorkBounds.config`, found best
    first over bounds of rising cost, each at most the next: `WorkBounds.quick` (every layer at
    the fastest option; the first keys, `_initial_keys`, one numpy pass per options group), the
    same plus stage 0's tail without the memory rooms (ConfigBounds._dp), `WorkBounds.config`
    without the memory rooms, then with them, then with the end stages enumerated and the paths
    through them and one slice too (`WorkBounds.end_steps`). A config is refined when it is the least on the
    heap, keyed by the largest of its bounds so far; the first final bound popped is the least
    (no other config can lower it), and a config whose bound reaches the least final bound pushed
    so far is dropped. For the default's decision (`default_line`): cheap enough to run after
    every solve. None: no GPipe config (or none meets the limits). `where` (a list): the config
    whose bound is returned is appended to it, as its coefficients. refine > 0: a last stage,
    `ConfigBounds.full` (every slicing enumerated), within `refine` work units (deadline.py);
    `refine_if` (a function of the bound without it, the first final key of stage 4): whether
    to go on to it, in the same search (its stages 0-3 are not redone). `work_limit`: the whole
    search's work units (its stages charged by QUICK_WORK_PER_OPTION per config option); when
    they run out, as when `refine`'s do, the least key on the heap (every config's bound is at
    least it)."""
    from milp_plan.solve import job_fix
    from milp_plan.formulations.space import parse_fix
    from milp_plan.solvers import driver
    from milp_plan.errors import InputError
    try:
        prepared = driver.prepare(inst, job_fix(inst, parse_fix(fix)), "megatron")
    except InputError:   # no GPipe config passes the pins: nothing to bound
        return None, 0
    units, _ = unit_tokens(inst)
    cb = ConfigBounds.__new__(ConfigBounds)     # its per-config terms alone, no slicing rows
    cb.inst, cb.limits, cb.tails = inst, limits, {}
    work = WorkBounds(inst, limits, range(2, units + 1))
    heap = _initial_keys(prepared, work, limits)   # (bound, config index, stage): 0 quick without
    # context, 1 with, 2 WorkBounds.config without the memory rooms, 3 with them, 4 with the end
    # stages enumerated and the paths through them and one slice too (the middle not split), 5
    # full (its work bound splits the middle)
    last = 5 if refine > 0 else 4
    dl = Deadline(math.inf, work=work_limit)
    rl = Deadline(math.inf, work=refine) if refine > 0 else None
    full = None
    read, final = 0, math.inf    # final: the least last-stage bound pushed; the answer is at most it
    unrefined = math.inf         # the least stage-4 bound pushed: stages 1-3 are cut there (a bound cut at a
    # value is still a bound, at least that value; without the refinement the answer is at most it)
    while heap:
        key, i, stage = heapq.heappop(heap)
        if stage == 4 and refine_if is not None:   # the first final key: the bound without the refinement
            last, refine_if = (5 if refine_if(key) else 4), None
        if stage == last or dl.expired() or (rl is not None and rl.expired()):
            if where is not None:
                where.append(prepared.coef(i))
            return key, read
        coef = prepared.coef(i)
        if stage in (1, 2):
            dl.charge(QUICK_WORK_PER_OPTION * len(coef.options))
        if stage == 0:   # with context, and stage 0's tail without the memory rooms (at most config's)
            quick = work.quick(coef)
            tail = cb._dp(coef, 1 if coef.cfg.pp > 1 else inst.model.num_layers, memory=False)
            got = cb._finish(coef, min(quick.values()) + tail, coef.cfg.pp) if quick else None
        elif stage == 1:
            got, _ = work.config(coef, cb, min(final, unrefined), memory=False, ends=False)
        elif stage == 2:
            read += 1
            # cut at `final`: a value at or above it (whole or not) cannot be the least
            got, _ = work.config(coef, cb, min(final, unrefined), ends=False)
        elif stage == 3:
            cells = work.cells
            got, _ = work.config(coef, cb, min(final, unrefined), paths=True, split=False)
            dl.charge(paths_work(len(coef.options), work.cells - cells))
        else:
            full = full or ConfigBounds(inst, limits, range(2, units + 1))
            got = full.full(coef, final)
            rl.charge(WORK.bound + full.work)
            dl.charge(WORK.bound + full.work)
        if got is not None and max(got, key) < final:
            heapq.heappush(heap, (max(got, key), i, stage + 1))
            if stage + 1 == last:
                final = max(got, key)
            if stage + 1 == 4:
                unrefined = min(unrefined, max(got, key))
    return None, read
