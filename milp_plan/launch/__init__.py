"""From plan to a running job: `milp-plan launch plan.json --out DIR`.

For a plan stock Megatron-LM can run, DIR gets
  megatron_args.sh      the flags and environment (launch/README.md is the contract)
  node_<host>.sh        per host: the torchrun agent(s) with static rendezvous, explicit
                        --node-rank/--master-addr/--master-port, CUDA_VISIBLE_DEVICES in rank order
  run_node.sh           finds this host's node script by host name
  rank_table.csv/.json  global rank -> host, node, torchrun node rank, local rank, GPU, stage, tp/dp rank
  slurm.sbatch          with --scheduler slurm (a heterogeneous job when the plan spans node types)
  launch.json           what was written and why
and otherwise per_stage.json (the per-stage description a per-stage runtime needs, with
the reasons) plus launch.json, instead of pretending.

A plan with phases (solve --lengths: a strategy per length bucket) gets one such directory
per phase, phase<i>-<edge>/ (its Megatron-LM configuration: that bucket's row length, rows
and micro-batches under its layout), and launch.json as the manifest a switching runtime
reads: the phases in step order, their layouts, the switches and the home layout. Stock
Megatron-LM cannot switch layouts inside a step, and the manifest says so.

Order of work: read the plan, rebuild its instance (this validates the recorded cluster,
hosts included), run the checker, render every file in memory, refuse to clobber, then
write each file atomically. Nothing is written when any step fails.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from milp_plan import schedules
from milp_plan.check import check_plan
from milp_plan.cluster import Cluster
from milp_plan.importers import load_cluster
from milp_plan.errors import InputError
from milp_plan.fileio import sha256_file, write_atomic
from milp_plan.instance import Instance, instance_from_inputs
from milp_plan.launch import megatron, scripts
from milp_plan.launch.ranks import RANK_TABLE_COLUMNS, RankLayout, assign_ranks, plan_ranks, rank_table_rows
from milp_plan.plan import Plan, read_plan

SCHEDULERS = ("torchrun", "slurm")
LAUNCH_FORMAT = 1


@dataclass(frozen=True)
class LaunchOptions:
    out: str | Path
    scheduler: str = "torchrun"
    force: bool = False
    megatron_path: str | None = None
    master_port: int = 29500
    hosts_cluster: str | None = None                  # cluster file that supplies the hosts
    partitions: tuple[tuple[str, str], ...] = ()      # node type -> Slurm partition


@dataclass(frozen=True)
class LaunchResult:
    out: Path
    files: tuple[str, ...]
    compatible: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...]
    layout: RankLayout


# ---- inputs ------------------------------------------------------------------------------
def plan_instance(plan: Plan, source: str) -> Instance:
    """The instance the plan records; its cluster definition is validated (hosts included)."""
    if not plan.inputs or "model" not in plan.inputs or "cluster" not in plan.inputs:
        raise InputError("the plan records no inputs (cluster, model, job); launch needs them: write the plan "
                         "with `milp-plan solve`", source=source, field="inputs")
    return instance_from_inputs(plan.inputs, source)


def hosts_cluster(recorded: Cluster, path: str | None) -> Cluster:
    """The cluster whose hosts are used: the recorded one, or `path` when it describes the
    same node types (everything but the hosts equal)."""
    if path is None:
        return recorded
    other = load_cluster(path)

    def shape(c: Cluster) -> list[dict[str, Any]]:
        return [{k: v for k, v in nt.items() if k != "hosts"} for nt in c.to_dict()["node_types"]]
    if shape(other) != shape(recorded):
        raise InputError(f"its node types differ from those of the plan's cluster '{recorded.name}'; --cluster "
                         "may only add or change hosts", source=path)
    return other


def check_launchable(inst: Instance, plan: Plan, source: str) -> None:
    """The checker is the gate: a plan with any violation is refused before anything is written."""
    violations = check_plan(inst, plan)
    if violations:
        shown = "; ".join(str(v) for v in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        raise InputError(f"the plan fails the checker, refusing to launch it: {shown}{more}; fix the plan or "
                         "solve again", source=source)


def require_hosts(plan: Plan, cluster: Cluster) -> None:
    """Every node the plan uses needs a valid host (decision: an error, never a placeholder)."""
    used = sorted({d.node for st in plan.stages for d in st.devices})
    missing = [n for n in used if cluster.nodes[n].host is None]
    if missing:
        types = sorted({cluster.nodes[n].type.name for n in missing})
        raise InputError(f"cluster '{cluster.name}': node type(s) {', '.join(types)} list no hosts, and the plan "
                         f"uses node(s) {', '.join(map(str, missing))}; add `hosts: [...]` (one per node) to a copy "
                         "of the cluster file and pass it with --cluster FILE")
    for n in used:
        scripts.check_host(cluster.nodes[n].host, f"cluster '{cluster.name}': node {n}")


# ---- rendering ---------------------------------------------------------------------------
def _notes(plan: Plan, layout: RankLayout) -> list[str]:
    notes = []
    note = schedules.schedule_of(plan.schedule, plan.vpp).megatron_note
    if note:
        notes.append(note)
    mixed = [f"{i} ({st.gpu})" for i, st in enumerate(plan.stages) if st.mixed_type]
    if mixed:
        notes.append(f"stage{'s' if len(mixed) > 1 else ''} {', '.join(mixed)} put{'' if len(mixed) > 1 else 's'} "
                     "data-parallel replicas on different GPU types: stock Megatron-LM runs this (a data-parallel "
                     "group is a list of ranks, and NCCL spans GPU generations); every replica gets the same "
                     "micro-batch, so the slowest paces the stage, as the plan assumes. Install one CUDA, NCCL and "
                     "PyTorch build on every type and train in a precision all of them support (bf16 needs "
                     "compute capability 8.0 or newer)")
    if plan.sequence_parallel and plan.stages[0].tp == 1:
        notes.append("sequence parallelism needs tp > 1; --sequence-parallel is not emitted")
    for host in layout.hosts():
        agents = [a for a in layout.agents if a.host == host]
        if len(agents) > 1:
            notes.append(f"host {host} runs {len(agents)} torchrun agents (node ranks "
                         f"{', '.join(str(a.node_rank) for a in agents)}): its GPUs hold non-consecutive ranks")
    return notes


def _summary(plan: Plan) -> list[str]:
    st, model = plan.stages[0], plan.inputs["model"]["definition"]
    counts = "/".join(str(s.num_layers) for s in plan.stages)
    sched = plan.schedule + (f", {plan.vpp} virtual stages per rank" if plan.vpp > 1 else "")
    return [f"Plan: pp {plan.pp} x tp {st.tp} x dp {st.dp} = {plan.num_gpus} GPUs; layers per stage {counts};",
            f"schedule {sched}; {plan.num_microbatches} micro-batch{'es' if plan.num_microbatches != 1 else ''} of {st.micro_batch_size} per replica;",
            f"recompute {st.recompute}" + (f" ({st.recompute_layers} layers per stage)" if st.recompute == "full"
                                           else "") + ".",
            f"Model {scripts.comment_text(model.get('name', 'model'))}: the plan assumed a vocabulary of "
            f"{int(model['vocab_size'])} tokens."]


def _rank_table_csv(layout: RankLayout) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RANK_TABLE_COLUMNS)
    w.writerows(rank_table_rows(layout))
    return buf.getvalue()


def _rank_table_json(layout: RankLayout) -> str:
    rows = [dict(zip(RANK_TABLE_COLUMNS, row)) for row in rank_table_rows(layout)]
    return json.dumps(rows, indent=1) + "\n"


def _agents_json(layout: RankLayout) -> list[dict[str, Any]]:
    return [{"node_rank": a.node_rank, "host": a.host, "node": a.node, "nproc_per_node": len(a.gpus),
             "first_rank": a.first_rank, "cuda_visible_devices": a.cuda_visible_devices} for a in layout.agents]


def _stages_json(plan: Plan) -> list[dict[str, Any]]:
    out, offset = [], 0
    for i, st in enumerate(plan.stages):
        out.append({"stage": i, "gpu": st.gpu, "layers": [list(c) for c in plan.layer_chunks(i)],
                    "ranks": [offset, offset + len(st.devices) - 1]})
        offset += len(st.devices)
    return out


def slurm_components(plan: Plan, cluster: Cluster, layout: RankLayout,
                     partitions: Mapping[str, str]) -> list[scripts.SlurmComponent]:
    """One component per node type the plan uses, in order of its first agent."""
    hosts: dict[str, list[str]] = {}
    for a in layout.agents:
        same_type = hosts.setdefault(cluster.nodes[a.node].type.name, [])
        if a.host not in same_type:
            same_type.append(a.host)
    unknown = sorted(set(partitions) - set(hosts))
    if unknown:
        raise InputError(f"--partition names node type '{unknown[0]}', which the plan does not use; it uses "
                         f"{', '.join(hosts)}", field="partition")
    comps = []
    for name, names in hosts.items():
        nt = cluster.node_type(name)
        part = partitions.get(name)
        comps.append(scripts.SlurmComponent(name, nt.gpu.name, tuple(names), nt.gpus_per_node,
                                            None if part is None else scripts.check_token(part, "--partition")))
    return comps


def render_megatron(plan: Plan, cluster: Cluster, options: LaunchOptions,
                    manifest: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Every file of a Megatron launch directory: name -> (text, executable)."""
    require_hosts(plan, cluster)
    layout = assign_ranks(plan, cluster)
    model, job = plan.inputs["model"]["definition"], plan.inputs["job"]
    groups = megatron.flag_groups(plan, model, job)
    mpath = scripts.check_path(options.megatron_path, "--megatron-path") if options.megatron_path else None
    master = layout.agents[0].host
    files = {scripts.ARGS_FILE: (scripts.render_args_file(groups, _summary(plan)), True)}
    entries = scripts.host_entries([h for h in layout.hosts() if h is not None])
    for e in entries:
        agents = [a for a in layout.agents if a.host == e.host]
        gpu = cluster.nodes[agents[0].node].type.gpu.name
        files[e.script] = (scripts.render_node_script(e.host, agents, layout, master, options.master_port, mpath,
                                                      gpu), True)
    files[scripts.DISPATCHER] = (scripts.render_dispatcher(entries), True)
    if options.scheduler == "slurm":
        comps = slurm_components(plan, cluster, layout, dict(options.partitions))
        files[scripts.SLURM_FILE] = (scripts.render_slurm(comps, mpath), True)
    files["rank_table.csv"] = (_rank_table_csv(layout), False)
    files["rank_table.json"] = (_rank_table_json(layout), False)
    manifest.update({
        "model": {"name": model.get("name"), "vocab_size": model["vocab_size"]},
        "megatron": {"version": megatron.MEGATRON_VERSION, "compatible": True, "reasons": [],
                     "training_script": megatron.TRAINING_SCRIPT, "args": [f for _, g in groups for f in g],
                     "env": dict(megatron.ENV)},
        "world_size": layout.world_size, "master": {"addr": master, "port": options.master_port},
        "agents": _agents_json(layout), "stages": _stages_json(plan), "notes": _notes(plan, layout)})
    return files


def per_stage_json(plan: Plan, cluster: Cluster, reasons: list[str]) -> str:
    """The plan per stage for a runtime that takes per-stage tp/dp/recompute (not stock Megatron)."""
    info = plan_ranks(plan)
    stages, i = [], 0
    for s, st in enumerate(plan.stages):
        devices = []
        for d in st.devices:
            rank, _, tp_rank, dp_rank = info[i]
            devices.append({"rank": rank, "node": d.node, "host": cluster.nodes[d.node].host,
                            "local_gpu": d.local_gpu, "tp_rank": tp_rank, "dp_rank": dp_rank})
            i += 1
        stages.append({"stage": s, "gpu": st.gpu, "layers": [list(c) for c in plan.layer_chunks(s)],
                       "tp": st.tp, "dp": st.dp, "micro_batch_size": st.micro_batch_size,
                       "recompute": st.recompute, "recompute_layers": st.recompute_layers, "devices": devices})
    doc = {"megatron_compatible": False, "reasons": reasons, "mode": plan.mode, "schedule": plan.schedule,
           "vpp": plan.vpp, "global_batch_size": plan.global_batch_size, "num_microbatches": plan.num_microbatches,
           "distributed_optimizer": plan.distributed_optimizer, "sequence_parallel": plan.sequence_parallel,
           **({"token_slices": list(plan.slices)} if plan.slices else {}),
           "model": plan.inputs["model"]["definition"], "job": plan.inputs["job"], "stages": stages}
    return json.dumps(doc, indent=2) + "\n"


def render_launch(plan: Plan, cluster: Cluster, options: LaunchOptions,
                  plan_file: str = "plan.json", plan_sha256: str = "") -> tuple[dict[str, tuple[str, bool]], dict]:
    """All files of the launch directory, in memory, and the manifest (launch.json's content).
    The model and job come from plan.inputs; `cluster` supplies the hosts."""
    if options.scheduler not in SCHEDULERS:
        raise InputError(f"unknown scheduler {options.scheduler!r}; use torchrun or slurm", field="scheduler")
    if not 1 <= options.master_port <= 65535:
        raise InputError(f"must be a TCP port 1..65535, got {options.master_port}", field="master-port")
    reasons = megatron.incompatibilities(plan, plan.inputs["model"]["definition"])
    manifest: dict[str, Any] = {"milp_plan_launch": LAUNCH_FORMAT, "plan": {"file": plan_file, "sha256": plan_sha256},
                                "scheduler": options.scheduler}
    if reasons:
        files = {"per_stage.json": (per_stage_json(plan, cluster, reasons), False)}
        manifest["megatron"] = {"version": megatron.MEGATRON_VERSION, "compatible": False, "reasons": reasons}
    else:
        files = render_megatron(plan, cluster, options, manifest)
    manifest["files"] = sorted([*files, "launch.json"])
    files["launch.json"] = (json.dumps(manifest, indent=2) + "\n", False)
    return files, manifest


# ---- writing -----------------------------------------------------------------------------
def write_files(out: Path, files: Mapping[str, tuple[str, bool]], force: bool) -> None:
    """Refuse to clobber any existing file unless `force`; then write each atomically."""
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory; choose another --out", source=str(out))
    existing = sorted(name for name in files if (out / name).exists())
    if existing and not force:
        raise InputError(f"would overwrite {', '.join(existing[:4])}{' ...' if len(existing) > 4 else ''}; pass "
                         "--force to replace them or choose another --out", source=str(out))
    for name, (text, executable) in sorted(files.items()):
        write_atomic(out / name, text)
        if executable:
            os.chmod(out / name, os.stat(out / name).st_mode | 0o111)


SWITCH_REASON = ("the plan switches layouts inside a step (a strategy per length bucket); stock Megatron-LM "
                 "cannot: each phase directory runs on Megatron-LM alone, and a switching runtime (HotSPa) "
                 "follows launch.json")


def render_phases(plan: Plan, cluster: Cluster, options: LaunchOptions, plan_file: str, plan_sha256: str,
                  source: str) -> tuple[dict[str, tuple[str, bool]], dict]:
    """A directory per phase (render_launch of the phase's plan; `cluster` supplies the hosts)
    and the switching manifest."""
    ph, files, rows = plan.phases, {}, []
    for i, x in enumerate(ph.phases):
        where = f"{source} (phase {i})"
        check_launchable(plan_instance(x.plan, where), x.plan, where)
        sub, man = render_launch(x.plan, cluster, options, f"{plan_file}#phases.{i}", plan_sha256)
        d = f"phase{i}-{x.edge}"
        files.update({f"{d}/{n}": v for n, v in sub.items()})
        rows.append({"phase": i, "dir": d, "edge": x.edge, "sequences": x.sequences, "strategy": x.strategy,
                     "global_batch_size": x.plan.global_batch_size, "num_microbatches": x.plan.num_microbatches,
                     "megatron_compatible": man["megatron"]["compatible"], "reasons": man["megatron"]["reasons"]})
    manifest = {"milp_plan_launch": LAUNCH_FORMAT, "plan": {"file": plan_file, "sha256": plan_sha256},
                "scheduler": options.scheduler,
                "megatron": {"version": megatron.MEGATRON_VERSION, "compatible": False, "reasons": [SWITCH_REASON]},
                "step": "phases in order, phase 0 first; each segment of one layout is one pipeline; after the last "
                        "phase the gradient reduction and optimizer step run in the home layout",
                "strategies": list(ph.strategies), "home": ph.home,
                "switches": [{"after_phase": i, "to_strategy": k, "seconds": t} for i, k, t in ph.switches()],
                "phases": rows}
    manifest["files"] = sorted([*files, "launch.json"])
    files["launch.json"] = (json.dumps(manifest, indent=2) + "\n", False)
    return files, manifest


def write_launch(plan_path: str | Path, options: LaunchOptions) -> LaunchResult:
    """Read, check, render and write a launch directory; raise InputError before writing anything."""
    source = str(plan_path)
    plan = read_plan(plan_path)
    inst = plan_instance(plan, source)
    cluster = hosts_cluster(inst.cluster, options.hosts_cluster)
    out = Path(options.out)
    if plan.phases is not None:   # every phase runs on the plan's cluster
        files, _ = render_phases(plan, cluster, options, Path(plan_path).name, sha256_file(plan_path), source)
        write_files(out, files, options.force)
        return LaunchResult(out, tuple(sorted(files)), False, (SWITCH_REASON,), (), assign_ranks(plan, cluster))
    check_launchable(inst, plan, source)
    files, manifest = render_launch(plan, cluster, options, Path(plan_path).name, sha256_file(plan_path))
    write_files(out, files, options.force)
    mega = manifest["megatron"]
    return LaunchResult(out, tuple(sorted(files)), mega["compatible"], tuple(mega["reasons"]),
                        tuple(manifest.get("notes", ())), assign_ranks(plan, cluster))
