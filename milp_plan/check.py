"""The solver-independent plan checker: the source of truth for any plan.

`check_plan(instance, plan)` returns every violation, each naming its rule and the
numbers. One function per rule family, named like the constraint family it checks in
the formulations (`check_memory_capacity` <-> `add_memory_capacity`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from milp_plan import predict, schedules
from milp_plan.cluster import gpu_names, joined_gpu_name
from milp_plan.instance import Instance
from milp_plan.plan import Plan

REL_TOL = 1e-6


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


def check_device_exists(inst: Instance, plan: Plan) -> list[Violation]:
    out, nodes = [], inst.cluster.nodes
    for i, st in enumerate(plan.stages):
        for d in st.devices:
            if not 0 <= d.node < len(nodes):
                out.append(Violation("device_exists", f"stage {i}: node {d.node} does not exist (cluster has "
                                                      f"{len(nodes)} nodes)"))
            elif not 0 <= d.local_gpu < nodes[d.node].type.gpus_per_node:
                out.append(Violation("device_exists", f"stage {i}: node {d.node} has GPUs 0..."
                                                      f"{nodes[d.node].type.gpus_per_node - 1}, not {d.local_gpu}"))
            elif nodes[d.node].type.gpu.name not in gpu_names(st.gpu):
                out.append(Violation("device_exists", f"stage {i} is declared {st.gpu} but node {d.node} holds "
                                                      f"{nodes[d.node].type.gpu.name}"))
        held = joined_gpu_name(nodes[d.node].type.gpu.name for d in st.devices if 0 <= d.node < len(nodes))
        if st.mixed_type and held and st.gpu != held:
            out.append(Violation("device_exists", f"stage {i} is declared {st.gpu} but its devices hold {held} (a "
                                                  "mixed-type stage names its GPU types in the order of its devices)"))
    return out


def check_device_count(inst: Instance, plan: Plan) -> list[Violation]:
    used, nodes = Counter(), inst.cluster.nodes
    for st in plan.stages:
        for d in st.devices:
            used[nodes[d.node].type.gpu.name if 0 <= d.node < len(nodes) else st.gpu] += 1
    avail = Counter()
    for nt in inst.cluster.node_types:
        avail[nt.gpu.name] += nt.count * nt.gpus_per_node
    return [Violation("device_count", f"{g}: plan uses {n} GPUs, cluster has {avail[g]}")
            for g, n in sorted(used.items()) if n > avail[g]]


def check_device_unique(inst: Instance, plan: Plan) -> list[Violation]:
    seen = Counter((d.node, d.local_gpu) for st in plan.stages for d in st.devices)
    return [Violation("device_unique", f"device node {n} GPU {g} is used {c} times")
            for (n, g), c in sorted(seen.items()) if c > 1]


def check_stage_shape(inst: Instance, plan: Plan) -> list[Violation]:
    return [Violation("stage_shape", f"stage {i}: tp {st.tp} x dp {st.dp} = {st.tp * st.dp} but {len(st.devices)} "
                                     "devices are listed")
            for i, st in enumerate(plan.stages) if len(st.devices) != st.tp * st.dp]


def check_layer_cover(inst: Instance, plan: Plan) -> list[Violation]:
    """Blocks 0..L-1 covered exactly once, in order, no empty stage."""
    out, L = [], inst.model.num_layers
    if sum(st.num_layers for st in plan.stages) != L:
        out.append(Violation("layer_cover", f"stages hold {sum(st.num_layers for st in plan.stages)} layers, "
                                            f"the model has {L}"))
    for i, st in enumerate(plan.stages):
        if st.num_layers < 1:
            out.append(Violation("layer_cover", f"stage {i} holds no layer"))
    if plan.vpp > 1:
        return out  # chunk order is checked by check_schedule
    expect = 0
    for i, st in enumerate(plan.stages):
        if st.first_layer != expect:
            out.append(Violation("layer_cover", f"stage {i} starts at layer {st.first_layer}, expected {expect} "
                                                "(stages must be contiguous, in model order)"))
        expect = st.first_layer + st.num_layers
    return out


def check_batch_split(inst: Instance, plan: Plan) -> list[Violation]:
    out, gbs = [], inst.job.global_batch_size
    if plan.global_batch_size != gbs:
        out.append(Violation("batch_split", f"plan global batch {plan.global_batch_size} != job's {gbs}"))
    for i, st in enumerate(plan.stages):
        if gbs % (st.micro_batch_size * st.dp):
            out.append(Violation("batch_split", f"stage {i}: global batch {gbs} is not divisible by micro-batch "
                                                f"{st.micro_batch_size} x dp {st.dp}"))
        elif st.micro_batch_size * st.dp * plan.num_microbatches != gbs:
            out.append(Violation("batch_split", f"stage {i}: micro-batch {st.micro_batch_size} x dp {st.dp} x "
                                                f"{plan.num_microbatches} micro-batches != global batch {gbs}"))
    return out


def check_tp_divisibility(inst: Instance, plan: Plan) -> list[Violation]:
    return [Violation("tp_divisibility", f"stage {i}: {why}")
            for i, st in enumerate(plan.stages) for why in inst.model.tp_violations(st.tp)]


def check_tp_within_node(inst: Instance, plan: Plan) -> list[Violation]:
    out = []
    for i, st in enumerate(plan.stages):
        for r in range(st.dp):
            group = st.devices[r * st.tp:(r + 1) * st.tp]
            nodes = {d.node for d in group}
            if len(nodes) > 1:
                out.append(Violation("tp_within_node", f"stage {i}: tp group {r} spans nodes {sorted(nodes)}"))
    return out


def check_recompute(inst: Instance, plan: Plan) -> list[Violation]:
    out = []
    for i, st in enumerate(plan.stages):
        if st.recompute == "full" and not 1 <= st.recompute_layers <= st.num_layers:
            out.append(Violation("recompute", f"stage {i}: full recompute of {st.recompute_layers} layers, must be "
                                              f"1..{st.num_layers}"))
        if st.recompute == "full" and plan.vpp > 1 and st.recompute_layers % plan.vpp:
            out.append(Violation("recompute", f"stage {i}: {st.recompute_layers} recomputed layers are not a multiple "
                                              f"of vpp {plan.vpp} (Megatron recomputes the same count per chunk)"))
        if st.recompute != "full" and st.recompute_layers != 0:
            out.append(Violation("recompute", f"stage {i}: recompute_layers={st.recompute_layers} needs "
                                              "recompute 'full'"))
    return out


def check_schedule(inst: Instance, plan: Plan) -> list[Violation]:
    if not schedules.known(plan.schedule):
        return [Violation("schedule", f"unknown schedule {plan.schedule!r}; use {', '.join(schedules.NAMES)}")]
    sched = schedules.schedule_of(plan.schedule, plan.vpp)
    return [Violation("schedule", msg) for msg in sched.violations(
        plan.pp, plan.num_microbatches, [st.num_layers for st in plan.stages],
        plan.stages[0].first_layer if plan.stages else 0)]


def check_slices(inst: Instance, plan: Plan) -> list[Violation]:
    """Token slices (TeraPipe): whole tokens that add up to the sequence, under gpipe (vpp 1)."""
    if not plan.slices:
        return []
    out, seq = [], inst.job.seq_length
    if sum(plan.slices) != seq or min(plan.slices) < 1:
        out.append(Violation("slices", f"token slices {list(plan.slices)} must be >= 1 token each and add up to the "
                                       f"sequence length {seq}"))
    if not schedules.schedule_of(plan.schedule, plan.vpp).slices_ok:
        out.append(Violation("slices", f"token slices run under the gpipe schedule (vpp 1), not {plan.schedule}"))
    return out


def check_megatron_rules(inst: Instance, plan: Plan) -> list[Violation]:
    """Stock Megatron-LM (reference/ecosystem.md section 1.6), in megatron mode only."""
    if plan.mode != "megatron":
        return []
    return [Violation("megatron", f"{r}; use --mode free or make it uniform") for r in plan.megatron_incompatibilities()]


def check_memory_capacity(inst: Instance, plan: Plan) -> list[Violation]:
    pred = predict.evaluate(inst, plan)
    return [Violation("memory_capacity", f"stage {i} ({plan.stages[i].gpu}): {sp.peak_memory_gib:.2f} GiB per GPU "
                                         f"> usable {sp.capacity_gib:.2f} GiB (weights {sp.weights_gib:.2f}, grads "
                                         f"{sp.gradients_gib:.2f}, optimizer {sp.optimizer_gib:.2f}, activations "
                                         f"{sp.activations_gib:.2f})")
            for i, sp in enumerate(pred.stages) if sp.peak_memory_gib > sp.capacity_gib * (1 + REL_TOL)]


def check_prediction(inst: Instance, plan: Plan) -> list[Violation]:
    """The plan's recorded prediction equals the cost model's recomputation from the plan alone."""
    if plan.predicted is None:
        return []
    fresh = predict.evaluate(inst, plan)
    out = []
    for name in ("step_time_s", "usd_per_hour", "usd_per_step"):
        a, b = getattr(plan.predicted, name), getattr(fresh, name)
        if abs(a - b) > REL_TOL * max(1.0, abs(b)) and abs(a - b) > 1e-9:
            out.append(Violation("prediction", f"recorded {name} {a:.6g} but the plan evaluates to {b:.6g}"))
    return out


STRUCTURE = (check_device_exists, check_stage_shape, check_layer_cover, check_batch_split, check_schedule, check_slices)
RULES = (check_device_count, check_device_unique, check_tp_divisibility, check_tp_within_node, check_recompute,
         check_megatron_rules)


def check_structure(inst: Instance, plan: Plan) -> list[Violation]:
    """The rules without which a plan cannot be evaluated at all."""
    return [v for rule in STRUCTURE for v in rule(inst, plan)]


def check_plan(inst: Instance, plan: Plan) -> list[Violation]:
    """Every violation of every rule; evaluation-based rules run once the structure is sound."""
    out = check_structure(inst, plan)
    out += [v for rule in RULES for v in rule(inst, plan)]
    if not out:
        out += check_memory_capacity(inst, plan)
        out += check_prediction(inst, plan)
    return out
