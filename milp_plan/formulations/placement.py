"""Turn a solution (stage options, layer counts, recomputed layers) into a Plan.

Canonical placement, the one every backend and the brute force share: a pool (a node
type and a stage size g) runs in one or more runs of consecutive stages (one where its
stages share nodes), and each run takes nodes of its own: its first stage starts on the
next unused node of its type (in cluster order). Inside
the run a stage of g <= gpus_per_node GPUs takes the next g local GPUs of the current
node (so gpus_per_node / g stages share a node), a larger stage takes g / gpus_per_node
whole nodes. Devices are listed tp fastest, then dp, so every tp group is tp consecutive
local GPUs of one node. In Megatron mode every node type has one pool, whose first run
starts on the type's first node. A mixed-type stage (--mixed-stages) takes its bundle's whole
nodes of each member type from the back of that type's nodes (the last unused ones, in
cluster order), so it never meets a run; the model keeps each type's nodes enough for both
(add_shared_nodes).
"""
from __future__ import annotations

from typing import Sequence

from milp_plan import predict
from milp_plan.cluster import Cluster, MixedNodeType, Node
from milp_plan.formulations.space import Config, StageOption, host_types, placement
from milp_plan.instance import Instance
from milp_plan.plan import Device, Plan, SolverRecord, Stage


_SLOTS: dict[int, tuple] = {}   # id(cluster) -> (cluster, its nodes and GPUs by node type)


def _slots(cluster: Cluster) -> tuple[dict[int, list[Node]], dict[int, tuple[Device, ...]]]:
    """(each node type's nodes, and their GPUs slot by slot: node by node, local GPU fastest),
    in cluster order, made once per cluster (place_stages builds every plan from them)."""
    got = _SLOTS.get(id(cluster))
    if got is None or got[0] is not cluster:
        if len(_SLOTS) >= 16:
            _SLOTS.clear()
        nodes_of = {k: [n for n in cluster.nodes if n.type is nt] for k, nt in enumerate(cluster.node_types)}
        gpus_of = {k: tuple(Device(n.index, g) for n in nodes for g in range(cluster.node_types[k].gpus_per_node))
                   for k, nodes in nodes_of.items()}
        got = _SLOTS[id(cluster)] = (cluster, nodes_of, gpus_of)
    return got[1], got[2]


def place_stages(inst: Instance, options: Sequence[StageOption]) -> list[tuple[Device, ...]]:
    """Each stage's devices in the canonical placement; ValueError when a type's nodes run out
    (more mixed bundles than the nodes their runs leave)."""
    nodes_of, gpus_of = _slots(inst.cluster)
    cursor = {k: 0 for k in nodes_of}  # next free GPU slot (global, over the type's nodes)
    back = {k: len(v) for k, v in nodes_of.items()}  # mixed bundles take nodes below this, from the back
    hosts = host_types(inst, {"mixed": True})
    index = {nt: k for k, nt in enumerate(inst.cluster.node_types)}
    out, prev = [], None
    for opt in options:
        nt = hosts[opt.k]
        if isinstance(nt, MixedNodeType):
            if placement(nt, opt.group) is None:
                raise ValueError(f"stage of {opt.group} GPUs is not the bundle {nt.name}")
            devs = []
            for member, n in nt.members:
                k = index[member]
                back[k] -= n
                devs += gpus_of[k][back[k] * member.gpus_per_node:(back[k] + n) * member.gpus_per_node]
            out.append(tuple(devs))
            prev = (opt.k, opt.group)
            continue
        gpn = nt.gpus_per_node
        if placement(nt, opt.group) is None:
            raise ValueError(f"stage of {opt.group} GPUs does not pack into {nt.name}")
        if (opt.k, opt.group) != prev:  # a new run starts on a fresh node
            cursor[opt.k] = -(-cursor[opt.k] // gpn) * gpn
            prev = (opt.k, opt.group)
        start = cursor[opt.k]
        cursor[opt.k] = start + opt.group
        if cursor[opt.k] > len(nodes_of[opt.k]) * gpn:
            raise ValueError(f"{nt.name}: the stages' runs need more than its {nt.count} nodes")
        out.append(gpus_of[opt.k][start:start + opt.group])
    for k, nt in enumerate(inst.cluster.node_types):
        if -(-cursor[k] // nt.gpus_per_node) > back[k]:
            raise ValueError(f"{nt.name}: the stages need more than its {nt.count} nodes")
    return out


def fits(inst: Instance, options: Sequence[StageOption]) -> bool:
    """The stages place on the cluster's nodes (place_stages): always, but where mixed-type
    bundles and their member types' own stages together want more nodes than a type has."""
    try:
        place_stages(inst, options)
    except ValueError:
        return False
    return True


def build_plan(inst: Instance, cfg: Config, options: Sequence[StageOption], layers: Sequence[int],
               recompute_layers: Sequence[int], solver: SolverRecord | None) -> Plan:
    """recompute_layers: per stage, used where the stage's option recomputes fully. The plan's
    mode is the config's (megatron when it is uniform)."""
    devices = place_stages(inst, options)
    hosts = host_types(inst, {"mixed": True})
    stages, first = [], 0
    for opt, devs, n, r in zip(options, devices, layers, recompute_layers):
        stages.append(Stage(hosts[opt.k].gpu.name, devs, first, n, opt.tp, opt.dp, opt.mbs,
                            opt.recompute, r if opt.recompute == "full" else 0))
        first += n
    # the switches are recorded only where a stage uses them (no effect at tp 1 or dp 1)
    sp = cfg.sequence_parallel and any(o.tp > 1 for o in options)
    distopt = cfg.distributed_optimizer and any(o.dp > 1 for o in options)
    plan = Plan(tuple(stages), inst.job.global_batch_size, cfg.num_microbatches(inst.job.global_batch_size),
                cfg.schedule, cfg.vpp, distopt, sp, cfg.mode, solver=solver, inputs=inst.inputs_record())
    if cfg.vpp > 1:  # interleaved: stage s's first chunk starts after chunk 0 of stages < s
        plan = plan.with_schedule(cfg.schedule, cfg.vpp)
    return plan.with_(predicted=predict.evaluate(inst, plan))
