"""A plan's predicted step: the cost model's per-stage costs (costmodel.plan_costs) composed
into the step time, its breakdown, $ and throughput.

The step time is the simulated one wherever that is affordable: the simulator's step
(milp_plan/sim) is the longest path of a graph fixed by the schedule, pp, m and vpp, whose
operations take the cost model's stage, transfer, reduction and optimizer times. On an
instance whose plans have at most `STEP_SIM_MAX_OPERATIONS` pipeline operations every plan
is predicted by that longest path (`step_basis` "simulated"); on a larger one by the
schedule's closed form ("closed-form", schedules.py), which is exact at equal stages and
otherwise an approximation (the 1F1B form lies above the simulation on uneven pipelines).
The planner's model follows the same rule (formulations/pipeline.md, "add_paths"), so
`optimal` is a proof about the step time written here.
"""
from __future__ import annotations

import functools

from milp_plan import costmodel
from milp_plan.instance import Instance
from milp_plan.plan import Plan, Prediction
from milp_plan.schedules import TOKEN_SLICED, PathTerms, Schedule, schedule_of
from milp_plan.sim.from_plan import spec_from_plan
from milp_plan.sim.pipeline import PipelineSpec, longest_path, simulate_pipeline

# An instance whose plans may have more forward and backward operations than this (2 L B: pp
# vpp <= L layers, m <= B micro-batches) is predicted by the closed form: its longest paths
# take >= 15 ms each and its configs' bounds on the simulated step are too weak to prune at
# that scale (scale-8192: 5% gap after 60 s against a closed-form proof in 26 s)
STEP_SIM_MAX_OPERATIONS = 16_384
SIMULATED, CLOSED_FORM = "simulated", "closed-form"


def step_basis(inst: Instance) -> str:
    """How the step time of every plan of `inst` is predicted: one basis per instance, so a
    solve compares plans by one measure."""
    ops = 2 * inst.model.num_layers * inst.job.global_batch_size
    return SIMULATED if ops <= STEP_SIM_MAX_OPERATIONS else CLOSED_FORM


@functools.lru_cache(maxsize=4096)
def _step(spec: PipelineSpec) -> tuple[float, PathTerms]:
    """(makespan, critical path) of a times-only spec; memoised (the driver, the checker and
    the heuristics evaluate the same plans again)."""
    return longest_path(spec)


def simulate_step(inst: Instance, plan: Plan, costs: costmodel.PlanCosts | None = None) -> tuple[float, PathTerms]:
    """The simulated step of `plan` and its critical path (times only: the cost model gives memory)."""
    return _step(spec_from_plan(inst, plan, costs=costs, memory=False))


def critical_path(inst: Instance, plan: Plan) -> PathTerms:
    """The critical path of `plan`'s simulated step, as a linear function of its costs."""
    return simulate_step(inst, plan)[1]


def seed_paths(sched: Schedule, pp: int, m: int) -> list[PathTerms]:
    """Paths of the step graph to start a model with: each stage's own (Schedule.stage_paths,
    those the bounds rest on) and the critical path of a pipeline of equal stages. Any path is
    a valid lower bound; these spare the driver's cut loop its first rounds and give the
    model's relaxation the weight of every stage."""
    out: list[PathTerms] = []
    spec = PipelineSpec(schedule=sched.name, num_microbatches=m, fwd_s=(1 / 3,) * pp, bwd_s=(2 / 3,) * pp,
                        hop_s=(0.01,) * (pp - 1), vpp=sched.vpp, wrap_hop_s=0.01 if sched.chunks > 1 else 0.0,
                        dp_s=(0.1,) * pp, opt_s=(0.01,) * pp)
    for path in sched.stage_paths(pp, m) + [longest_path(spec)[1]]:
        learn_path(out, path)
    return out


def learn_path(paths: list[PathTerms], path: PathTerms) -> bool:
    """Add `path` to a list of paths none of which covers another (PathTerms.covers); False
    when one already covers it."""
    if any(p.covers(path) for p in paths):
        return False
    paths[:] = [p for p in paths if not path.covers(p)] + [path]
    return True


def sliced_closed_form(c: costmodel.PlanCosts, sc: costmodel.SliceCosts, m: int) -> tuple[float, float, float, float, float]:
    """(compute, bubble, transfers, dp, optimizer) of a token-sliced plan's closed form, an
    upper bound of its simulated step: the pipeline by schedules.GPipe.sliced_pipeline_time;
    the reduction tail by costmodel.dp_tail_s on the last backward item (slice 0 of the last
    sequence: stage s ends it sum_{k<s} (b_{k,0} + h_{k,0}) before stage 0 does); the optimizer
    step after the barrier."""
    compute, bubble, xfer = schedule_of(TOKEN_SLICED).sliced_pipeline_time(sc.fwd_s, sc.bwd_s, m, sc.hop_s)
    dp = costmodel.dp_tail_s(c.tail_s, [b[0] for b in sc.bwd_s], [h[0] for h in sc.hop_s], TOKEN_SLICED)
    return compute, bubble, xfer, dp, max(c.opt_s)


def _evaluate_sliced(inst: Instance, plan: Plan, c: costmodel.PlanCosts, basis: str) -> tuple:
    """(step, compute, bubble, p2p, dp, opt, basis) of a token-sliced plan. Simulated: the
    event simulation of its slices (compute = the form's, at most the pipeline's end; the
    transfers on the path are counted in the bubble); closed form: sliced_closed_form."""
    sc = costmodel.slice_costs(inst, plan)
    compute, bubble, xfer, dp, opt = sliced_closed_form(c, sc, plan.num_microbatches)
    if basis == SIMULATED:
        sim = simulate_pipeline(spec_from_plan(inst, plan, costs=c, memory=False))
        pipe = sim.pipeline_time_s
        compute = min(compute, pipe)
        return sim.step_time_s, compute, pipe - compute, 0.0, max(0.0, sim.step_time_s - pipe - opt), opt, SIMULATED
    return compute + bubble + xfer + dp + opt, compute, bubble, xfer, dp, opt, CLOSED_FORM


def evaluate(inst: Instance, plan: Plan, basis: str | None = None) -> Prediction:
    """Predicted step time, breakdown, memory per stage and cost, from the plan alone.

    Breakdown (summing to the step): compute m x the slowest stage's f + b (at most the
    compute on the critical path); bubble the rest of the compute on the critical path (fill
    and drain); the transfers, the reduction and the optimizer step on it. Closed form: the
    same terms of the schedule's form. `basis` forces one (default: step_basis)."""
    c = costmodel.plan_costs(inst, plan)
    m = plan.num_microbatches
    if plan.slices:
        step, compute, bubble, p2p, dp, opt, basis = _evaluate_sliced(inst, plan, c, basis or step_basis(inst))
    elif (basis or step_basis(inst)) == SIMULATED:
        step, path = simulate_step(inst, plan, c)
        p2p = sum(k * h for k, h in zip(path.hop, c.hop_s)) + path.wrap * c.wrap_hop_s
        dp = sum(k * d for k, d in zip(path.dp, c.tail_s))
        opt = sum(k * o for k, o in zip(path.opt, c.opt_s))
        on_path = step - p2p - dp - opt   # forward and backward work on the critical path
        compute = min(m * max(f + b for f, b in zip(c.fwd_s, c.bwd_s)), on_path)
        bubble = on_path - compute
        basis = SIMULATED
    else:
        compute, bubble = costmodel.pipeline_time_s(c.fwd_s, c.bwd_s, m, plan.schedule, plan.vpp, c.hop_s)
        p2p = costmodel.p2p_time_s(c.hop_s, c.wrap_hop_s, plan.schedule, plan.vpp)
        dp = costmodel.dp_tail_s(c.tail_s, c.bwd_s, c.hop_s, plan.schedule, plan.vpp)
        opt = max(c.opt_s)
        step = compute + bubble + p2p + dp + opt
        basis = CLOSED_FORM
    usd_h = costmodel.plan_usd_per_hour(inst, plan)
    tokens = plan.global_batch_size * costmodel.row_tokens(inst, None)
    return Prediction(step, compute, bubble, p2p, dp, opt, usd_h, costmodel.usd_per_step(usd_h, step), tokens / step,
                      c.stages, basis)
