"""A strategy per sequence-length bucket, switched inside the step (HotSPa, SOSP'24), decided
by the exact switching model (formulations/switching.py) on milp-plan's own cost model.

1. Candidate strategies: for each bucket, the exact planner's best plan for that bucket
   alone (its row length, its sequences as the global batch); duplicates dropped.
2. Every candidate is evaluated on every bucket (`evaluate_on`): the same stages at the
   bucket's row length, with ceil(sequences / samples per micro-batch) micro-batches (the
   last one padded: the model's rows are whole micro-batches), by `predict.evaluate`:
     time[b][k] = step - fill - reduction - optimizer   (the micro-batches' steady work)
     fill[b][k] = the prediction's bubble (fill and drain)
     home_time[k] = reduction + optimizer (once a step, in the home layout)
   k cannot run b when the checker rejects the reshaped plan or a stage is over memory.
3. room[b][k][h]: every GPU holds k's weights, gradients and activations at b plus home h's
   optimizer state for the layers h gives it, within its capacity.
4. switch[k][k2]: every GPU receives the weights and gradient accumulators k2 gives it
   (an upper bound: some may already be there; HotSPa's own planner sends less), each node
   over its inter-node link (intra-node on a one-node cluster); the slowest node sets it.

The static plan (every bucket on one strategy, no switch) is a point of the same model, so
the answer says whether switching pays; `break_even` scales every switch cost until it
stops paying.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from milp_plan import check, predict
from milp_plan.errors import InputError
from milp_plan.formulations.switching import Switching, SwitchingProblem, solve as solve_switching, step_time
from milp_plan.instance import Instance, InstanceSpec, build_instance
from milp_plan.job import Objective
from milp_plan.plan import Plan
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
    buckets: tuple[Bucket, ...]
    strategies: tuple[Plan, ...]
    problem: SwitchingProblem
    best: Switching                  # the switching model's optimum
    static: tuple[int, float] | None  # the best single strategy and its step time
    break_even: float | None         # the switch-cost factor at which switching stops paying


def layout_key(plan: Plan) -> tuple:
    return (plan.schedule, plan.vpp, tuple((s.gpu, s.devices, s.num_layers, s.tp, s.dp, s.micro_batch_size,
                                            s.recompute, s.recompute_layers) for s in plan.stages))


def bucket_instance(spec: InstanceSpec, edge: int, rows: int, cache: dict) -> Instance:
    key = (edge, rows)
    if key not in cache:
        cache[key] = build_instance(replace(spec, seq_length=edge, global_batch_size=rows), Objective("min-time"))
    return cache[key]


def evaluate_on(spec: InstanceSpec, plan: Plan, bucket: Bucket, cache: dict) -> Evaluation:
    """The plan's stages on the bucket: the fewest micro-batches (of the plan's samples) that
    hold the bucket's sequences and that the schedule runs (interleaving wants a multiple of
    pp: up to pp - 1 more, padded)."""
    samples = plan.global_batch_size // plan.num_microbatches
    least = math.ceil(bucket.sequences / samples)
    for m in range(least, least + plan.pp):
        inst = bucket_instance(spec, bucket.edge, m * samples, cache)
        shaped = plan.with_(global_batch_size=m * samples, num_microbatches=m, predicted=None, solver=None)
        if not check.check_structure(inst, shaped):
            break
    else:
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


def _room(ev_k: Evaluation, ev_h: Evaluation) -> bool:
    """Every GPU: k's memory without its optimizer state, plus h's optimizer state."""
    if ev_k.plan is None or ev_h.plan is None:
        return False
    own = _per_gpu(ev_k.plan, lambda sp: sp.peak_memory_gib - sp.optimizer_gib)
    cap = _per_gpu(ev_k.plan, lambda sp: sp.capacity_gib) | _per_gpu(ev_h.plan, lambda sp: sp.capacity_gib)
    opt = _per_gpu(ev_h.plan, lambda sp: sp.optimizer_gib)
    return all(own.get(g, 0.0) + opt.get(g, 0.0) <= cap[g] * (1 + 1e-12) for g in cap)


def _switch_s(inst: Instance, target: Evaluation) -> float:
    """Seconds to move into layout `target`: each node receives its GPUs' new weights and
    gradients over its inter-node link (intra-node per GPU on a one-node cluster)."""
    per_gpu = _per_gpu(target.plan, lambda sp: (sp.weights_gib + sp.gradients_gib) * GIB)
    nodes = inst.cluster.nodes
    if len(nodes) == 1:
        nt = nodes[0].type
        return max(per_gpu.values()) / (nt.intra_node_gb_per_s * 1e9)
    by_node: dict[int, float] = {}
    for (n, _), b in per_gpu.items():
        by_node[n] = by_node.get(n, 0.0) + b
    return max(b / (nodes[n].type.inter_node_gb_per_s * 1e9) for n, b in by_node.items())


def build_problem(spec: InstanceSpec, buckets: tuple[Bucket, ...],
                  strategies: list[Plan]) -> tuple[SwitchingProblem, list[list[Evaluation]]]:
    cache: dict = {}
    ev = [[evaluate_on(spec, k, b, cache) for k in strategies] for b in buckets]
    K = len(strategies)
    # the largest bucket a strategy can run stands for it (its weights do not depend on the length)
    rep = [next((ev[b][k] for b in reversed(range(len(buckets))) if ev[b][k].plan is not None), None)
           for k in range(K)]
    inst = next(iter(cache.values()))  # every bucket's instance has the same cluster
    switch = tuple(tuple(0.0 if k == k2 or rep[k2] is None else _switch_s(inst, rep[k2]) for k2 in range(K))
                   for k in range(K))
    room = tuple(tuple(tuple(ev[b][k].time_s is not None and (k == h or (rep[h] is not None
                                                                         and _room(ev[b][k], rep[h])))
                             for h in range(K)) for k in range(K)) for b in range(len(buckets)))
    home = tuple(r.home_s if r is not None else 0.0 for r in rep)
    problem = SwitchingProblem(tuple(tuple(e.time_s for e in row) for row in ev),
                               tuple(tuple(e.fill_s for e in row) for row in ev), switch, room, home)
    return problem, ev


def candidates(spec: InstanceSpec, buckets: tuple[Bucket, ...], req) -> list[Plan]:
    """Each bucket's own best plans (the exact planner at its row length, under `req`: solver,
    limits, seed, pins): with its sequences as the global batch, and with them padded up to a
    multiple of the cluster's GPUs (a count such as 13 admits dp 1 and 13 only)."""
    from milp_plan import solve as solving
    out, cache = [], {}
    for b in buckets:
        gpus = bucket_instance(spec, b.edge, b.sequences, cache).cluster.num_gpus
        for rows in sorted({b.sequences, -(-b.sequences // gpus) * gpus}):
            try:
                got = solving.run(bucket_instance(spec, b.edge, rows, cache), req)
            except InputError:  # no config passes the rules (or the pins) at this batch
                continue
            if got.plan is not None:
                out.append(got.plan)
    return out


def plan_buckets(spec: InstanceSpec, buckets: tuple[Bucket, ...], candidates: list[Plan],
                 backend: str = "cpsat") -> HotSwitchResult:
    """The best strategy per bucket among `candidates` (deduplicated), the best static plan,
    and the switch-cost factor at which switching stops paying."""
    seen, strategies = set(), []
    for plan in candidates:
        if layout_key(plan) not in seen:
            seen.add(layout_key(plan))
            strategies.append(plan)
    if not strategies:
        raise InputError("no candidate strategy: no bucket has a plan on this cluster", field="lengths")
    problem, _ = build_problem(spec, buckets, strategies)
    best = solve_switching(problem, backend)
    static = None
    for k in range(problem.strategies):
        t = step_time(problem, (k,) * problem.buckets, k)
        if t is not None and all(problem.room is None or problem.room[b][k][k] for b in range(problem.buckets)) \
                and (static is None or t < static[1]):
            static = (k, t)
    return HotSwitchResult(buckets, tuple(strategies), problem, best, static, break_even(problem, static, backend))


def break_even(problem: SwitchingProblem, static: tuple[int, float] | None, backend: str = "cpsat",
               steps: int = 30) -> float | None:
    """The least factor f on every switch cost at which the best plan is static (no switch),
    by bisection on f in [0, 2^steps/2^10]; None when switching never pays (f = 0 is static)
    or no static plan exists."""
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


def to_dict(r: HotSwitchResult, hist) -> dict:
    """switching.json: the buckets, the strategies (full plans at their own bucket), the
    assignment and what it gains over the best static plan."""
    p, best = r.problem, r.best
    doc = {"kind": "switching", "version": 1,
           "lengths": {"source": hist.source, "sequences": hist.sequences, "tokens": hist.tokens,
                       "longest": hist.longest},
           "rows": "each sequence padded to its bucket's edge",
           "status": best.status, "scope": f"the {len(r.strategies)} candidate strategies (each bucket's own optimum)",
           "step_time_s": best.step_time_s, "bound_s": best.bound_s,
           "home": best.home, "switches": best.switches,
           "buckets": [{"edge": b.edge, "sequences": b.sequences, "tokens": b.tokens, "padding": b.padding,
                        "strategy": None if best.assignment is None else best.assignment[i],
                        "time_s": None if best.assignment is None else p.time[i][best.assignment[i]],
                        "fill_s": None if best.assignment is None else p.fill[i][best.assignment[i]]}
                       for i, b in enumerate(r.buckets)],
           "strategies": [{"label": label(k), "home_time_s": (p.home_time or (0.0,) * p.strategies)[i],
                           "plan": k.to_dict()} for i, k in enumerate(r.strategies)],
           "switch_s": [list(row) for row in p.switch],
           "static": None if r.static is None else {"strategy": r.static[0], "step_time_s": r.static[1]},
           "gain": None if r.static is None or best.step_time_s is None else 1 - best.step_time_s / r.static[1],
           "break_even_factor": r.break_even,
           "notes": ["switch costs: every GPU receives the weights and gradients its new layout gives it, each node "
                     "over its inter-node link (an upper bound)",
                     "stock Megatron-LM cannot switch layouts inside a step: this needs a runtime that can "
                     "(HotSPa); each strategy's plan runs on Megatron-LM alone"]}
    return doc
