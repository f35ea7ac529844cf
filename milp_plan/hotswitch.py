"""A strategy per sequence-length bucket, switched inside the step (HotSPa, SOSP'24), decided
by the exact switching model (formulations/switching.py) on milp-plan's own cost model.

1. Candidate strategies (`candidates`): for each bin (the finest bucket), the exact
   planner's best plans for that bin alone (its row length, its sequences as the global
   batch, and padded to a multiple of the GPUs), under the objective's $/h budget; under
   min-cost or a $/step budget also the bin's cheapest plan within its share of the step
   limit; with chosen edges also the plan for all sequences padded to the longest edge (the
   static padded plan). Duplicates dropped.
2. Items: each bin alone (edges given), or every range of consecutive bins (edges chosen: a
   range is one bucket whose sequences are padded to its longest bin's edge).
3. Every candidate is evaluated on every item (`evaluate_on`): the same stages at the item's
   row length, with the fewest micro-batches that hold its sequences (the last padded), by
   `predict.evaluate`:
     time[r][k] = step - fill - reduction - optimizer   (the micro-batches' steady work)
     fill[r][k] = the prediction's bubble (fill and drain)
     home_time[k] = reduction + optimizer (once a step, in the home layout)
   k cannot run r when the checker rejects the reshaped plan or a stage is over memory.
4. room[r][k][h]: every GPU holds k's weights, gradients and activations at r plus home h's
   optimizer state for the layers h gives it, within its capacity.
5. switch[k][k2]: every GPU whose parameter shard differs between k and k2 (its layers or
   its place in the tp group) receives the weights and gradient accumulators k2 gives it (an
   upper bound: part may already be there; HotSPa's own planner sends less), each node over
   its inter-node link (intra-node on a one-node cluster); the slowest node sets it. Layouts
   that differ only in micro-batch size or recompute switch for free.
6. Money (`plan_buckets`): a step rents the GPUs its layouts use. For every union of the
   candidates' GPU sets S (closed under union), the model is solved over the candidates that
   stay inside S; S's rent times that step time is exact for S, so the least over the sets
   (within the $/h, $/step and step-time limits) is the optimum over the candidates.

The static plan (every bucket on one strategy, no switch) is a point of the same model, so
the answer says whether switching pays; `break_even` scales every switch cost until it
stops paying.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from milp_plan import check, costmodel, predict
from milp_plan.errors import InputError
from milp_plan.formulations.switching import Switching, SwitchingProblem, segment_fills, solve as solve_switching
from milp_plan.instance import Instance, InstanceSpec, build_instance
from milp_plan.job import Limits, Objective
from milp_plan.plan import Phase, Phases, Plan, Prediction, SolverRecord, fewest_micro_batches
from milp_plan.result import relative_gap
from milp_plan.workload import Bucket

GIB = 2**30


@dataclass(frozen=True)
class Evaluation:
    plan: Plan | None           # the strategy reshaped to the bucket (None: it cannot run it)
    time_s: float | None
    fill_s: float
    home_s: float


@dataclass(frozen=True)
class HotSwitchResult:
    bins: tuple[Bucket, ...]
    items: tuple[Bucket, ...]        # the buckets the model could form (problem.ranges over the bins)
    strategies: tuple[Plan, ...]
    problem: SwitchingProblem
    evaluations: tuple[tuple[Evaluation, ...], ...]   # [item][strategy]
    best: Switching                  # the optimum (over the candidates, within the limits)
    usd_per_hour: float | None       # the rent of the GPUs the best answer's layouts use
    static: tuple[int, float] | None  # the best single strategy and its objective (s or $/step)
    break_even: float | None         # the switch-cost factor at which switching stops paying
    objective: Objective = Objective()   # what was asked (the buckets' own solves record min-time)
    edges: str = "default"


def layout_key(plan: Plan) -> tuple:
    return (plan.schedule, plan.vpp, tuple((s.gpu, s.devices, s.num_layers, s.tp, s.dp, s.micro_batch_size,
                                            s.recompute, s.recompute_layers) for s in plan.stages))


def bucket_instance(spec: InstanceSpec, edge: int, rows: int, cache: dict) -> Instance:
    key = (edge, rows)
    if key not in cache:
        cache[key] = build_instance(replace(spec, seq_length=edge, global_batch_size=rows), Objective("min-time"))
    return cache[key]


def merged(bins: tuple[Bucket, ...], first: int, last: int) -> Bucket:
    """Bins first..last as one bucket: their sequences padded to the last bin's edge."""
    part = bins[first:last + 1]
    return Bucket(part[-1].edge, sum(b.sequences for b in part), sum(b.tokens for b in part))


def evaluate_on(spec: InstanceSpec, plan: Plan, bucket: Bucket, cache: dict) -> Evaluation:
    """The plan's stages on the bucket, with the fewest micro-batches (of the plan's samples)
    that hold the bucket's sequences and that its schedule runs (plan.fewest_micro_batches)."""
    samples = plan.global_batch_size // plan.num_microbatches
    m = fewest_micro_batches(plan, bucket.sequences)
    if m is None:
        return Evaluation(None, None, 0.0, 0.0)
    inst = bucket_instance(spec, bucket.edge, m * samples, cache)
    shaped = plan.with_(global_batch_size=m * samples, num_microbatches=m, predicted=None, solver=None,
                        inputs=inst.inputs_record())
    if check.check_structure(inst, shaped):
        return Evaluation(None, None, 0.0, 0.0)
    shaped = shaped.with_(predicted=predict.evaluate(inst, shaped))
    p = shaped.predicted
    home = p.dp_allreduce_s + p.optimizer_s
    if any(s.peak_memory_gib > s.capacity_gib for s in p.stages):
        return Evaluation(shaped, None, p.bubble_s, home)
    return Evaluation(shaped, p.step_time_s - p.bubble_s - home, p.bubble_s, home)


def _per_gpu(plan: Plan, value) -> dict:
    out = {}
    for st, sp in zip(plan.stages, plan.predicted.stages):
        for d in st.devices:
            out[(d.node, d.local_gpu)] = value(sp)
    return out


def room_for(k: Plan | None, home: Plan | None) -> bool:
    """Every GPU: k's memory without its optimizer state, plus the home's optimizer state."""
    if k is None or home is None:
        return False
    own = _per_gpu(k, lambda sp: sp.peak_memory_gib - sp.optimizer_gib)
    cap = _per_gpu(k, lambda sp: sp.capacity_gib) | _per_gpu(home, lambda sp: sp.capacity_gib)
    opt = _per_gpu(home, lambda sp: sp.optimizer_gib)
    return all(own.get(g, 0.0) + opt.get(g, 0.0) <= cap[g] * (1 + 1e-12) for g in cap)


def _shards(plan: Plan) -> dict:
    """Each GPU's parameter shard: its stage's layer chunks and its place in the tp group (dp
    replicas hold the same shard; the micro-batch size and recompute do not move weights)."""
    out = {}
    for i, st in enumerate(plan.stages):
        for j, d in enumerate(st.devices):
            out[(d.node, d.local_gpu)] = (tuple(plan.layer_chunks(i)), st.tp, j % st.tp, i == 0, i == plan.pp - 1)
    return out


def _switch_s(inst: Instance, source: Evaluation, target: Evaluation) -> float:
    """Seconds to move from layout `source` into `target`: each GPU whose shard changes
    receives its new weights and gradients, each node over its inter-node link (intra-node
    per GPU on a one-node cluster); an upper bound (a GPU may hold part of its new shard)."""
    old, new = _shards(source.plan), _shards(target.plan)
    per_gpu = {g: b for g, b in _per_gpu(target.plan, lambda sp: (sp.weights_gib + sp.gradients_gib) * GIB).items()
               if old.get(g) != new[g]}
    if not per_gpu:
        return 0.0
    nodes = inst.cluster.nodes
    if len(nodes) == 1:
        nt = nodes[0].type
        return costmodel.transfer_s(max(per_gpu.values()), nt.intra_node_gb_per_s, nt.intra_node_link)
    by_node: dict[int, float] = {}
    for (n, _), b in per_gpu.items():
        by_node[n] = by_node.get(n, 0.0) + b
    return max(costmodel.transfer_s(b, nodes[n].type.inter_node_gb_per_s, nodes[n].type.inter_node_link)
               for n, b in by_node.items())


def item_ranges(bins: int, choose_edges: bool) -> tuple[tuple[int, int], ...]:
    """The buckets the model may form: each bin alone, or every range of consecutive bins."""
    if not choose_edges:
        return tuple((b, b) for b in range(bins))
    return tuple((a, z) for a in range(bins) for z in range(a, bins))


def build_problem(spec: InstanceSpec, bins: tuple[Bucket, ...], strategies: list[Plan],
                  choose_edges: bool = False) -> tuple[SwitchingProblem, tuple[Bucket, ...], list[list[Evaluation]]]:
    cache: dict = {}
    ranges = item_ranges(len(bins), choose_edges)
    items = tuple(merged(bins, a, z) for a, z in ranges)
    ev = [[evaluate_on(spec, k, it, cache) for k in strategies] for it in items]
    K = len(strategies)
    # the largest bucket a strategy can run stands for it (its weights do not depend on the length)
    longest_first = sorted(range(len(items)), key=lambda r: -items[r].edge)
    rep = [next((ev[r][k] for r in longest_first if ev[r][k].plan is not None), None) for k in range(K)]
    inst = next(iter(cache.values()))  # every bucket's instance has the same cluster
    switch = tuple(tuple(0.0 if k == k2 or rep[k] is None or rep[k2] is None else _switch_s(inst, rep[k], rep[k2])
                         for k2 in range(K)) for k in range(K))
    room = tuple(tuple(tuple(ev[r][k].time_s is not None and (k == h or (rep[h] is not None
                                                                         and room_for(ev[r][k].plan, rep[h].plan)))
                             for h in range(K)) for k in range(K)) for r in range(len(items)))
    home = tuple(r.home_s if r is not None else 0.0 for r in rep)
    problem = SwitchingProblem(tuple(tuple(e.time_s for e in row) for row in ev),
                               tuple(tuple(e.fill_s for e in row) for row in ev), switch, room, home,
                               ranges=ranges if choose_edges else None)
    return problem, items, ev


def _bin_limits(objective: Objective, share: float) -> list[Limits]:
    """The limits a bin's candidates are solved under: min-time within the $/h budget, and
    under min-cost or a $/step budget the bin's share of the step's limit as well."""
    lim = objective.limits()
    out = [Limits("min-time", None, lim.budget_usd_per_hour, None)]
    if lim.objective == "min-cost":
        out.append(Limits("min-cost", lim.time_limit_s * share, None, None))
    elif lim.budget_usd_per_step is not None:
        out.append(Limits("min-time", None, lim.budget_usd_per_hour, lim.budget_usd_per_step * share))
    return out


def candidates(spec: InstanceSpec, bins: tuple[Bucket, ...], req, objective: Objective = Objective(),
               choose_edges: bool = False) -> list[Plan]:
    """Each bin's own best plans (the exact planner at its row length, under `req`: solver,
    limits, seed, pins): with its sequences as the global batch, and with them padded up to a
    multiple of the cluster's GPUs (a count such as 13 admits dp 1 and 13 only); see the
    module docstring for the limits and the static padded plan."""
    from milp_plan import solve as solving
    out, cache = [], {}
    padded = sum(b.edge * b.sequences for b in bins)
    jobs = [(b, b.edge * b.sequences / padded) for b in bins]
    if choose_edges and len(bins) > 1:
        jobs.append((merged(bins, 0, len(bins) - 1), 1.0))
    for b, share in jobs:
        gpus = bucket_instance(spec, b.edge, b.sequences, cache).cluster.num_gpus
        for rows in sorted({b.sequences, -(-b.sequences // gpus) * gpus}):
            for limits in _bin_limits(objective, share):
                try:
                    got = solving.run(bucket_instance(spec, b.edge, rows, cache), req, limits)
                except InputError:  # no config passes the rules (or the pins) at this batch
                    continue
                if got.plan is not None:
                    out.append(got.plan)
    return out


def gpu_set(plan: Plan) -> frozenset:
    return frozenset((d.node, d.local_gpu) for s in plan.stages for d in s.devices)


def rent(inst: Instance, gpus: frozenset) -> float:
    """$/h of renting `gpus` (costmodel.usd_per_hour: node or GPU billing)."""
    used: dict[int, int] = {}
    for n, _ in gpus:
        used[n] = used.get(n, 0) + 1
    return costmodel.usd_per_hour(inst.cluster.nodes, used)


def union_closure(sets: list[frozenset], cap: int = 256) -> list[frozenset]:
    """Every union of some of `sets`, smallest first (ties in a fixed order)."""
    out = set(sets)
    frontier = list(out)
    while frontier:
        new = {a | b for a in frontier for b in sets} - out
        if len(out) + len(new) > cap:
            raise InputError(f"the candidates use more than {cap} different GPU sets; pin the layout with --fix "
                             "or give --buckets with fewer buckets", field="lengths")
        out |= new
        frontier = list(new)
    return sorted(out, key=lambda s: (len(s), sorted(s)))


def restrict(p: SwitchingProblem, keep: list[int]) -> SwitchingProblem:
    """The problem over the strategies `keep` only (their indices renumbered in order)."""
    return replace(p, time=tuple(tuple(row[k] for k in keep) for row in p.time),
                   fill=tuple(tuple(row[k] for k in keep) for row in p.fill),
                   switch=tuple(tuple(p.switch[k][k2] for k2 in keep) for k in keep),
                   room=None if p.room is None else tuple(tuple(tuple(r[k][h] for h in keep) for k in keep)
                                                          for r in p.room),
                   home_time=None if p.home_time is None else tuple(p.home_time[k] for k in keep))


def _lift(ans: Switching, keep: list[int]) -> Switching:
    if ans.assignment is None:
        return ans
    return replace(ans, assignment=tuple(keep[k] for k in ans.assignment),
                   home=None if ans.home is None else keep[ans.home])


def _value(limits: Limits, t: float, usd_h: float) -> float | None:
    """The objective of step time t at rent usd_h, or None when a limit is broken."""
    per_step = costmodel.usd_per_step(usd_h, t)
    if (limits.time_limit_s is not None and t > limits.time_limit_s * (1 + 1e-12)) \
            or (limits.budget_usd_per_hour is not None and usd_h > limits.budget_usd_per_hour * (1 + 1e-12)) \
            or (limits.budget_usd_per_step is not None and per_step > limits.budget_usd_per_step * (1 + 1e-12)):
        return None
    return per_step if limits.objective == "min-cost" else t


def best_over_sets(problem: SwitchingProblem, sets: list[frozenset], rent_of, limits: Limits,
                   backend: str = "cpsat") -> tuple[tuple[Switching, frozenset, list[int]] | None, bool]:
    """The best answer within the limits over every union S of the strategies' GPU sets
    (`sets[k]`), each solved over the strategies inside S and charged S's rent (`rent_of`):
    (answer, S, the strategies kept) or None, and whether every set's model was proven."""
    best, best_key, proven = None, None, True
    for S in union_closure(sets):
        keep = [k for k in range(len(sets)) if sets[k] <= S]
        usd_h = rent_of(S)
        if limits.budget_usd_per_hour is not None and usd_h > limits.budget_usd_per_hour * (1 + 1e-12):
            continue
        ans = _lift(solve_switching(restrict(problem, keep), backend), keep)
        if ans.step_time_s is None:
            proven &= ans.status == "infeasible"
            continue
        proven &= ans.status == "optimal"
        value = _value(limits, ans.step_time_s, usd_h)
        if value is not None and (best_key is None or (value, usd_h) < best_key):
            best, best_key = (ans, S, keep), (value, usd_h)
    return best, proven


def plan_buckets(spec: InstanceSpec, bins: tuple[Bucket, ...], candidates: list[Plan],
                 objective: Objective = Objective(), choose_edges: bool = False,
                 backend: str = "cpsat", edges: str = "default") -> HotSwitchResult:
    """The best strategy per bucket among `candidates` (deduplicated) under the objective and
    its limits, the edges too when `choose_edges`, the best static plan, and the switch-cost
    factor at which switching stops paying."""
    seen, strategies = set(), []
    for plan in candidates:
        if layout_key(plan) not in seen:
            seen.add(layout_key(plan))
            strategies.append(plan)
    if not strategies:
        raise InputError("no candidate strategy: no bucket has a plan on this cluster", field="lengths")
    problem, items, ev = build_problem(spec, bins, strategies, choose_edges)
    limits = objective.limits()
    inst = bucket_instance(spec, bins[-1].edge, bins[-1].sequences, {})
    sets = [gpu_set(k) for k in strategies]
    best, proven = best_over_sets(problem, sets, lambda S: rent(inst, S), limits, backend)
    alone = [solve_switching(restrict(problem, [k]), backend).step_time_s for k in range(len(strategies))]
    static = None
    for k, t in enumerate(alone):
        value = None if t is None else _value(limits, t, rent(inst, sets[k]))
        if value is not None and (static is None or value < static[1]):
            static = (k, value)
    if best is None:
        return HotSwitchResult(bins, items, tuple(strategies), problem, tuple(map(tuple, ev)),
                               Switching(None, None, None, None, "infeasible" if proven else "timeout"), None,
                               static, None, objective, edges)
    ans, S, keep = best
    if not proven and ans.status == "optimal":
        ans = replace(ans, status="feasible")
    singles = [(alone[k], j) for j, k in enumerate(keep) if alone[k] is not None]
    sub_static = None if not singles else (min(singles)[1], min(singles)[0])
    return HotSwitchResult(bins, items, tuple(strategies), problem, tuple(map(tuple, ev)), ans, rent(inst, S),
                           static, break_even(restrict(problem, keep), sub_static, backend), objective, edges)


def break_even(problem: SwitchingProblem, static: tuple[int, float] | None, backend: str = "cpsat",
               steps: int = 20) -> float | None:
    """The least factor f on every switch cost at which the best plan is static (no switch),
    by bisection on f (relative precision 2^-steps); None when switching never pays (f = 0 is
    static) or no static plan exists; inf when it pays at every factor up to 2^20."""
    if static is None:
        return None

    def switches_pay(f: float) -> bool:
        scaled = replace(problem, switch=tuple(tuple(f * s for s in row) for row in problem.switch))
        got = solve_switching(scaled, backend)
        return got.step_time_s is not None and got.step_time_s < static[1] * (1 - 1e-9)
    if not switches_pay(0.0):
        return None
    lo, hi = 0.0, 1.0
    while switches_pay(hi):
        lo, hi = hi, hi * 2
        if hi > 2**20:
            return math.inf
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if switches_pay(mid) else (lo, mid)
    return hi


def label(plan: Plan) -> str:
    s = plan.stages[0]
    return (f"pp {plan.pp}, tp {s.tp}, dp {s.dp}, mbs {s.micro_batch_size}, {plan.num_gpus} GPUs, "
            f"{plan.schedule}" + (f", recompute {s.recompute}" if s.recompute != "none" else ""))


SCOPE = ("the candidate strategies (each bin's own optima, and the static padded plan with chosen edges), "
         "not every layout")


def to_plan(r: HotSwitchResult, hist, backend: str = "cpsat") -> Plan:
    """The answer as a plan with phases (plan.json schema 2): the top level is the home layout
    at its own bucket, its prediction the whole step (see plan.Phases)."""
    best, p = r.best, r.problem
    if best.assignment is None:
        raise InputError(f"no assignment of strategies to buckets meets the limits ({best.status})", field="lengths")
    kof = {it: best.assignment[p.item_ranges[it][0]] for it in best.items}   # each chosen item's strategy
    used = list(dict.fromkeys(kof.values()))                                  # in order of first use
    phases = tuple(Phase(edge=r.items[it].edge, sequences=r.items[it].sequences, tokens=r.items[it].tokens,
                         strategy=used.index(k), plan=r.evaluations[it][k].plan, time_s=p.time[it][k],
                         fill_s=p.fill[it][k]) for it, k in kof.items())
    home = used.index(best.home)
    min_cost = r.objective.limits().objective == "min-cost"
    value = costmodel.usd_per_step(r.usd_per_hour, best.step_time_s) if min_cost else best.step_time_s
    unit = "usd_per_step" if min_cost else "step_time_s"
    static = None if r.static is None else {"strategy": label(r.strategies[r.static[0]]), unit: r.static[1]}
    ph = Phases(phases=phases, strategies=tuple(label(r.strategies[k]) for k in used), home=home,
                home_time_s=p.home_time[best.home] if p.home_time else 0.0,
                switch_s=tuple(tuple(p.switch[a][b] for b in used) for a in used),
                lengths={"source": hist.source, "sequences": hist.sequences, "tokens": hist.tokens,
                         "longest": hist.longest, "counts": [list(c) for c in hist.counts]},
                edges=r.edges, scope=SCOPE, static=static,
                gain=None if r.static is None else 1 - value / r.static[1],
                break_even_factor="never" if r.break_even == math.inf else r.break_even)
    top = next(x.plan for x in phases if x.strategy == home)
    hp = top.predicted
    fills = sum(segment_fills(p, best.assignment, best.items))
    whole = Prediction(step_time_s=best.step_time_s, compute_s=sum(x.time_s for x in phases), bubble_s=fills,
                       p2p_s=0.0, dp_allreduce_s=hp.dp_allreduce_s, optimizer_s=hp.optimizer_s,
                       usd_per_hour=r.usd_per_hour,
                       usd_per_step=costmodel.usd_per_step(r.usd_per_hour, best.step_time_s),
                       tokens_per_s=hist.tokens / best.step_time_s, stages=hp.stages, step_basis="phases")
    scale = value / best.step_time_s
    bound = None if best.bound_s is None or best.status not in ("optimal", "feasible") else best.bound_s * scale
    rec = SolverRecord(backend, best.status, value, bound, None if bound is None else relative_gap(value, bound))
    # the top level records the objective asked for (its own bucket's solve was min-time)
    return top.with_(predicted=whole, solver=rec, phases=ph, inputs={**top.inputs, "objective": r.objective.to_dict()})
