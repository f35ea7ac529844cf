"""A plan another planner chose (one ranked row of FASOP or Metis), as a milp-plan Plan.

`import_plan(spec, inst, rank)` reads `fasop:FILE` or `metis:FILE` (the format modules
`fasop_plan` and `metis_plan` know the files), takes the row ranked `rank` (1 = the
peer's best), lays its GPUs out on the instance's cluster and returns a Plan that milp-plan
scores with its own cost model (`plan.predicted`), beside the peer's own estimate.

What every format module gives back is a `PeerLayout`: per stage, the cluster devices in
Megatron rank order (tp fastest, then dp), tp, dp, micro-batch size and the layer *slots*
it holds. Peers count layer slots, not blocks: FASOP and Metis put the embedding and the
head (post-process) in slots of their own, so

    blocks of stage s = slots of stage s that hold a transformer block

(stage 0 loses its embedding slot, the last stage its head slot; milp-plan puts
embedding and head on those stages implicitly). A stage whose GPUs are of several types
(FASOP and Metis allow it) becomes a mixed-type stage, its `gpu` the types' names joined by
'+' in the order of its devices; the cost model paces it by its slowest replica. What
milp-plan cannot represent is an
InputError that says so, exit 2:

* a stage that holds no transformer block (only the embedding or the head);
* a structure the checker rejects outright (devices, batch split, layer cover).

Anything else the checker finds (memory, tp divisibility, tp groups across nodes) does
not stop the import: the plan is written and the violations are returned, so that
`milp-plan verify` can show them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from milp_plan import check, predict
from milp_plan.cluster import Cluster, joined_gpu_name
from milp_plan.errors import InputError
from milp_plan.formulations.space import plan_fills
from milp_plan.importers import fasop_plan, metis_plan
from milp_plan.importers.peer_rows import PeerLayout
from milp_plan.instance import Instance
from milp_plan.job import Objective
from milp_plan.plan import Device, Plan, SolverRecord, Stage
from milp_plan.result import objective_of
from milp_plan.schedules import OneFOneB


@dataclass(frozen=True)
class Imported:
    plan: Plan
    instance: Instance
    layout: PeerLayout
    violations: tuple[check.Violation, ...]


def stage_gpu(cluster: Cluster, devices: Sequence[Device]) -> str:
    """The `gpu` of a stage on these devices: its GPU type, or a mixed-type stage's types in the
    order of its devices (cluster.joined_gpu_name)."""
    return joined_gpu_name(cluster.nodes[d.node].type.gpu.name for d in devices)


# ---- the Plan ----------------------------------------------------------------------------
FORMATS = {"fasop": fasop_plan, "metis": metis_plan}   # each: NAME, read_layout(path, inst, rank)


def parse_spec(spec: str) -> tuple[str, str]:
    """'fasop:FILE' / 'metis:FILE' -> (format, path)."""
    tool, sep, path = spec.partition(":")
    formats = FORMATS
    if not sep or tool not in formats or not path:
        raise InputError(f"'{spec}' is not a peer plan; write {' or '.join(f'{t}:FILE' for t in formats)}",
                         field="SPEC")
    return tool, path


def import_plan(spec: str, inst: Instance, rank: int = 1) -> Imported:
    """Read the row, lay it out on inst's cluster, score it; see the module docstring."""
    if inst.spec.global_batch_size is None:
        raise InputError("FASOP and Metis results do not record the global batch; pass the one the peer "
                         "searched with (FASOP's GPT-2 XL runs use 64, Metis' default is 128)", field="global-batch")
    tool, path = parse_spec(spec)
    layout = FORMATS[tool].read_layout(path, inst, rank)
    return to_plan(inst, layout, path)


def to_plan(inst: Instance, layout: PeerLayout, source: str) -> Imported:
    where = f"{layout.tool} row {layout.rank}"
    stages, first = [], 0
    for s, ps in enumerate(layout.stages):
        stages.append(Stage(stage_gpu(inst.cluster, ps.devices), ps.devices, first, ps.blocks, ps.tp, ps.dp,
                            ps.micro_batch_size))
        first += ps.blocks
    uniform = all(len({getattr(s, a) for s in stages}) == 1 for a in ("tp", "dp", "micro_batch_size"))
    mode = "megatron" if uniform else "free"
    inst = replace(inst, objective=Objective(kind="min-time", mode=mode))
    plan = Plan(tuple(stages), inst.job.global_batch_size, layout.num_microbatches, OneFOneB.name, 1, False, False,
                mode, inputs=inst.inputs_record())
    broken = check.check_structure(inst, plan)
    if broken:
        raise InputError(f"{where}: milp-plan cannot represent this row on cluster '{inst.cluster.name}': "
                         f"{broken[0]}" + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""),
                         source=source)
    # the profile points the times rest on that no profile measured (e.g. FASOP's mbs > 1), listed as solve does
    plan = plan.with_(predicted=predict.evaluate(inst, plan), profile_fills=plan_fills(inst, plan))
    limits = inst.objective.limits()
    plan = plan.with_(solver=SolverRecord(f"{layout.tool}-import", "evaluated", objective_of(plan, limits), None,
                                          None))
    return Imported(plan, inst, layout, tuple(check.check_plan(inst, plan)))
