"""Turn a solution (stage node types, layer counts, recomputed layers) into a Plan.

Canonical placement, the one every backend and the brute force share: stages of one
node type take that type's nodes in cluster order; a stage of g <= gpus_per_node GPUs
takes the next g local GPUs of the current node (so gpus_per_node / g stages share a
node), a larger stage takes g / gpus_per_node whole nodes. Devices are listed tp
fastest, then dp, so every tp group is g consecutive local GPUs of one node.
"""
from __future__ import annotations

from typing import Sequence

from milp_plan import costmodel
from milp_plan.formulations.coefficients import placement
from milp_plan.formulations.space import Config
from milp_plan.instance import Instance
from milp_plan.plan import Device, Plan, SolverRecord, Stage


def place_stages(inst: Instance, cfg: Config, types: Sequence[int]) -> list[tuple[Device, ...]]:
    nodes_of = {k: [n for n in inst.cluster.nodes if n.type is nt] for k, nt in enumerate(inst.cluster.node_types)}
    cursor = {k: 0 for k in nodes_of}  # next free GPU slot (global, over the type's nodes)
    out = []
    for k in types:
        nt = inst.cluster.node_types[k]
        pl = placement(nt, cfg.group)
        if pl is None:
            raise ValueError(f"stage of {cfg.group} GPUs does not pack into {nt.name}")
        gpn = nt.gpus_per_node
        start = cursor[k]
        slots = range(start, start + cfg.group)
        cursor[k] = start + cfg.group
        devs = []
        for slot in slots:
            node = nodes_of[k][slot // gpn]
            devs.append(Device(node.index, slot % gpn))
        out.append(tuple(devs))
    return out


def build_plan(inst: Instance, cfg: Config, types: Sequence[int], layers: Sequence[int], recompute_layers: int,
               solver: SolverRecord | None, mode: str = "megatron") -> Plan:
    devices = place_stages(inst, cfg, types)
    stages, first = [], 0
    for k, devs, n in zip(types, devices, layers):
        r = recompute_layers if cfg.recompute == "full" else 0
        stages.append(Stage(inst.cluster.node_types[k].gpu.name, devs, first, n, cfg.tp, cfg.dp, cfg.mbs,
                            cfg.recompute, r))
        first += n
    plan = Plan(tuple(stages), inst.job.global_batch_size, cfg.num_microbatches(inst.job.global_batch_size),
                cfg.schedule, cfg.vpp, cfg.distributed_optimizer, cfg.sequence_parallel, mode,
                solver=solver, inputs=inst.inputs_record())
    if cfg.vpp > 1:  # interleaved: stage s's first chunk starts after chunk 0 of stages < s
        plan = plan.with_schedule(cfg.schedule, cfg.vpp)
    return plan.with_(predicted=costmodel.evaluate(inst, plan))
