"""A step in phases (plan.Phases: a strategy per length bucket) simulated event by event.

Each segment of the step (a maximal run of one layout in step order) is one pipeline fed the
micro-batches of its phases back to back, in step order, each with its own row length's
per-stage times (costmodel.plan_costs of its phase's plan): the simulator, not the model's
"one fill per segment, the largest of its phases'", says what the segment takes. Between the
segments come the switches around the step's cycle (the plan's switch costs, a cost-model
estimate: nothing is simulated there), and once a step the home layout's gradient reduction
and optimizer step (the slowest stage's reduction, then the slowest optimizer step: the
simulator's barrier after drained pipelines).

Sampled batches (verify) run the same phases with other counts: plan.fewest_micro_batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from milp_plan import costmodel
from milp_plan.instance import Instance
from milp_plan.plan import Phase, Phases, segments, transitions
from milp_plan.sim.pipeline import PipelineSpec, simulate_pipeline


@dataclass(frozen=True)
class PhaseStep:
    step_time_s: float
    segments: tuple[tuple[int, int], ...]     # (first, last) phase of each segment that ran
    segment_s: tuple[float, ...]              # each segment's pipeline, simulated
    switches_s: float
    home_s: float
    micro_batches: tuple[int, ...]            # per phase (0: no sequence in it)


def phase_costs(phases: Phases, insts: Sequence[Instance]) -> list[costmodel.PlanCosts]:
    """Each phase's per-stage costs (costmodel.plan_costs of its plan on its instance)."""
    return [costmodel.plan_costs(inst, ph.plan) for inst, ph in zip(insts, phases.phases)]


def segment_spec(phases: Sequence[Phase], costs: Sequence[costmodel.PlanCosts],
                 counts: Sequence[int]) -> PipelineSpec:
    """One pipeline running `counts[j]` micro-batches of phases[j] (one layout, costs[j]) in order."""
    first, c0 = phases[0].plan, costs[0]
    pp, v = first.pp, first.vpp

    def rows(get) -> tuple:
        return tuple(tuple(x for c, n in zip(costs, counts) for x in [get(c, r)] * n) for r in range(pp))
    hops = tuple(tuple(x for c, n in zip(costs, counts) for x in [c.hop_s[h] if h < pp - 1 else c.wrap_hop_s] * n)
                 for h in range(pp if v > 1 else pp - 1))
    return PipelineSpec(schedule=first.schedule, num_microbatches=sum(counts), fwd_s=c0.fwd_s, bwd_s=c0.bwd_s,
                        hop_s=c0.hop_s, vpp=v, wrap_hop_s=c0.wrap_hop_s if v > 1 else 0.0,
                        item_fwd_s=rows(lambda c, r: c.fwd_s[r]), item_bwd_s=rows(lambda c, r: c.bwd_s[r]),
                        item_hop_s=hops)


def simulate_step(phases: Phases, costs: Sequence[costmodel.PlanCosts],
                  counts: Sequence[int] | None = None) -> PhaseStep:
    """The step with counts[i] micro-batches in phase i (default: the plan's own); costs from
    `phase_costs`."""
    counts = list(counts) if counts is not None else [ph.plan.num_microbatches for ph in phases.phases]
    live = [i for i, n in enumerate(counts) if n > 0]
    order = [phases.phases[i].strategy for i in live]
    segs, seg_s = [], []
    for a, z in segments(order):
        idx = live[a:z + 1]
        spec = segment_spec([phases.phases[i] for i in idx], [costs[i] for i in idx], [counts[i] for i in idx])
        seg_s.append(simulate_pipeline(spec).pipeline_time_s)
        segs.append((idx[0], idx[-1]))
    switches = sum((phases.switch_s[a][b] for _, a, b in transitions(order)), 0.0)
    hc = costs[next(i for i, ph in enumerate(phases.phases) if ph.strategy == phases.home)]
    home_s = max(hc.tail_s) + max(hc.opt_s)
    return PhaseStep(sum(seg_s) + switches + home_s, tuple(segs), tuple(seg_s), switches, home_s, tuple(counts))
