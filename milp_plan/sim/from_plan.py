"""A plan as the simulator's input: every per-stage cost from the cost model (`spec_from_plan`)."""
from __future__ import annotations

from milp_plan import costmodel
from milp_plan.instance import Instance
from milp_plan.plan import Plan
from milp_plan.sim.pipeline import PipelineSpec, SimResult, simulate_pipeline
from milp_plan.units import GIB


def _chunk_memory(inst: Instance, plan: Plan, rank: int) -> tuple[list[float], list[float]]:
    """(activation bytes of one micro-batch, full-recompute working bytes) per chunk of `rank`.

    Chunk c holds the stage's layers c*n/v .. (c+1)*n/v (plan.layer_chunks); the embedding
    goes with chunk 0 of rank 0, the head with the last chunk of the last rank; full
    recompute of r layers recomputes r / v layers of every chunk (Megatron's block method
    counts per virtual chunk; the checker requires v | r)."""
    st, pp, v = plan.stages[rank], plan.pp, plan.vpp
    gpu = costmodel.stage_node_type(inst, st).gpu.name
    acts, works = [], []
    for c, (first, n) in enumerate(plan.layer_chunks(rank)):
        kinds = costmodel.stage_kinds(inst, first, n)
        r = min(st.recompute_layers // v, n) if st.recompute == "full" else 0
        args = (inst, kinds, rank == 0 and c == 0, rank == pp - 1 and c == v - 1, st.tp, st.micro_batch_size,
                plan.sequence_parallel, st.recompute if (st.recompute != "full" or r > 0) else "none", r)
        work = costmodel.stage_activation_bytes(*args, inflight=0.0, gpu=gpu)
        acts.append(costmodel.stage_activation_bytes(*args, inflight=1.0, gpu=gpu) - work)
        works.append(work)
    return acts, works


def spec_from_plan(inst: Instance, plan: Plan, dp_overlap: bool = False, costs: costmodel.PlanCosts | None = None,
                   memory: bool = True) -> PipelineSpec:
    """Every cost of `plan` from the cost model (plan_costs, p2p_s, stage_activation_bytes);
    `costs` when already computed; memory=False leaves the activation bytes out (times only)."""
    c = costs or costmodel.plan_costs(inst, plan)
    mem = [_chunk_memory(inst, plan, r) for r in range(plan.pp)] if memory else []
    static = tuple((sp.weights_gib + sp.gradients_gib + sp.optimizer_gib) * GIB for sp in c.stages)
    sliced = {}
    if plan.slices:   # token slices: per-slice times; each slice holds its tokens' share of the activations
        sc = costmodel.slice_costs(inst, plan)
        total = sum(plan.slices)
        sliced = dict(slice_fwd_s=sc.fwd_s, slice_bwd_s=sc.bwd_s, slice_hop_s=sc.hop_s,
                      slice_share=tuple(n / total for n in plan.slices))
    return PipelineSpec(**sliced,
        schedule=plan.schedule, num_microbatches=plan.num_microbatches, fwd_s=c.fwd_s, bwd_s=c.bwd_s,
        hop_s=c.hop_s, vpp=plan.vpp, wrap_hop_s=c.wrap_hop_s if plan.vpp > 1 else 0.0,
        dp_s=c.tail_s, opt_s=c.opt_s, dp_overlap=dp_overlap, static_bytes=static,
        act_bytes=tuple(tuple(a) for a, _ in mem), working_bytes=tuple(tuple(w) for _, w in mem),
        buckets=tuple(tuple(n for _, n in plan.layer_chunks(r)) for r in range(plan.pp)))


def simulate_plan(inst: Instance, plan: Plan, dp_overlap: bool = False) -> SimResult:
    """Simulate `plan` (run check.check_structure first: the simulator trusts the structure)."""
    return simulate_pipeline(spec_from_plan(inst, plan, dp_overlap))
