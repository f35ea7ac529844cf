"""Terminal rendering: plain fixed-width tables (deterministic, pipe-friendly)."""
from __future__ import annotations

import re
from typing import Any, Sequence

from milp_plan.instance import Instance
from milp_plan.job import OVERLAP_FIELDS


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool] | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = right or [False] + [True] * (len(headers) - 1)
    def line(r):
        return "  ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right)).rstrip()
    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        return f"{c:,.2f}" if abs(c) >= 1 or c == 0 else f"{c:.4g}"
    return str(c)


def instance_report(inst: Instance) -> dict[str, Any]:
    c, m, j = inst.cluster, inst.model, inst.job
    prof = inst.profile
    coverage = []
    for g in c.gpu_types():
        sub = prof.rows.where("gpu", lambda x: x == g)
        coverage.append({
            "gpu": g, "rows": len(sub),
            "tp": sorted({int(x) for x in sub.column("tp")}),
            "micro_batch_size": sorted({int(x) for x in sub.column("micro_batch_size")}),
            "seq_length": sorted({int(x) for x in sub.column("seq_length")}),
            "kinds": sorted(set(sub.column("kind"))),
        })
    return {
        "cluster": {
            "name": c.name, "source": c.source, "description": c.description, "num_gpus": c.num_gpus,
            "node_types": [{"name": nt.name, "gpu": nt.gpu.name, "nodes": nt.count, "gpus_per_node": nt.gpus_per_node,
                            "memory_gib": nt.memory_gib, "peak_tflops": nt.gpu.peak_tflops,
                            "intra_node_gb_per_s": nt.intra_node_gb_per_s,
                            "inter_node_gb_per_s": nt.inter_node_gb_per_s, "usd_per_hour": nt.usd_per_hour,
                            "billing": nt.billing} for nt in c.node_types],
        },
        "model": {"name": m.name, "arch": m.arch, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                  "ffn_hidden_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
                  "num_query_groups": m.num_query_groups, "vocab_size": m.vocab_size,
                  "parameters": m.num_parameters, "flops_per_token": m.flops_per_token(j.seq_length),
                  "flops_per_step": m.flops_per_token(j.seq_length) * j.global_batch_size * j.seq_length},
        "job": {**j.to_dict(), **{k: getattr(j, k) for k in OVERLAP_FIELDS}},
        "profile": {"sources": prof.provenance and [{k: v for k, v in p.items() if k != "constants"}
                                                    for p in prof.provenance],
                    "gpu_map": dict(inst.gpu_map), "coverage": coverage},
        "notices": list(inst.notices),
    }


def _ranges(values: Sequence[int]) -> str:
    if not values:
        return "-"
    if len(values) > 3 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)


def render_instance(r: dict[str, Any]) -> str:
    c, m, j, p = r["cluster"], r["model"], r["job"], r["profile"]
    out = [f"Cluster {c['name']}: {c['num_gpus']} GPUs" + (f" ({c['description']})" if c["description"] else ""),
           f"  from {c['source']}", ""]
    out.append(table(["node type", "GPU", "nodes", "GPUs/node", "memory GiB", "TFLOP/s", "intra GB/s",
                      "inter GB/s", "$/node-h"],
                     [[n["name"], n["gpu"], n["nodes"], n["gpus_per_node"], n["memory_gib"], n["peak_tflops"],
                       n["intra_node_gb_per_s"], n["inter_node_gb_per_s"], n["usd_per_hour"]] for n in c["node_types"]],
                     right=[False, False] + [True] * 7))
    out += ["", f"Model {m['name']} ({m['arch']}): {m['parameters'] / 1e9:.3f} B parameters, {m['num_layers']} layers, "
            f"hidden {m['hidden_size']}, ffn {m['ffn_hidden_size']}, heads {m['num_attention_heads']} "
            f"(query groups {m['num_query_groups']}), vocab {m['vocab_size']}",
            f"  {m['flops_per_token'] / 1e9:.2f} GFLOP per token (fwd+bwd), {m['flops_per_step'] / 1e15:.2f} PFLOP "
            f"per step",
            f"Job: global batch {j['global_batch_size']} sequences x {j['seq_length']} tokens "
            f"= {j['global_batch_size'] * j['seq_length']:,} tokens, {j['precision']}, {j['optimizer']}, "
            f"flash attention {'on' if j['flash_attention'] else 'off'}, gradients reduced in "
            f"{j['grad_reduce_dtype']}, distributed optimizer "
            f"{'allowed' if j['distributed_optimizer'] else 'not allowed'}, memory headroom "
            f"{j['memory_headroom']:.0%}, communication overlapped: "
            f"{', '.join(k for k in OVERLAP_FIELDS if j.get(k)) or 'none'}", ""]
    out.append("Profile coverage:")
    out.append(table(["GPU", "rows", "tp", "micro-batch", "seq", "kinds"],
                     [[cv["gpu"], cv["rows"], _ranges(cv["tp"]), _ranges(cv["micro_batch_size"]),
                       _ranges(cv["seq_length"]), ",".join(cv["kinds"])] for cv in p["coverage"]],
                     right=[False, True, False, False, False, False]))
    out.append("Profile sources:")
    for s in p["sources"] or []:
        bits = [f"{k}={s[k]}" for k in ("file", "format", "origin", "device", "sha256") if s.get(k)]
        out.append("  " + ", ".join(bits))
    if p["gpu_map"]:
        out.append("GPU name mapping (profile -> cluster): " + ", ".join(f"{a} -> {b}" for a, b in p["gpu_map"].items()))
    return "\n".join(out)


def _devices(plan, inst) -> list[str]:
    """Compact device lists: host[0-7] per node."""
    out = []
    nodes = inst.cluster.nodes if inst is not None else None
    for st in plan.stages:
        by_node: dict[int, list[int]] = {}
        for d in st.devices:
            by_node.setdefault(d.node, []).append(d.local_gpu)
        parts = []
        for node, gpus in by_node.items():
            name = (nodes[node].host if nodes and nodes[node].host else f"node{node}")
            gpus = sorted(gpus)
            rng = f"{gpus[0]}-{gpus[-1]}" if gpus == list(range(gpus[0], gpus[-1] + 1)) and len(gpus) > 1 else \
                ",".join(map(str, gpus))
            parts.append((name, rng))
        out.append(" ".join(_merge_hosts(parts)))
    return out


def _merge_hosts(parts: list[tuple[str, str]]) -> list[str]:
    """Runs of >= 3 numbered hosts with the same GPUs: h100-12[0-7] ... h100-43[0-7] ->
    h100-[12-43][0-7]."""
    out: list[str] = []
    i = 0
    while i < len(parts):
        m = re.fullmatch(r"(.*?)(\d+)", parts[i][0])
        j = i + 1
        if m:
            prefix, first = m.group(1), int(m.group(2))
            while j < len(parts) and parts[j][1] == parts[i][1] and \
                    parts[j][0] == f"{prefix}{first + j - i}":
                j += 1
        if j - i >= 3:
            out.append(f"{prefix}[{first}-{first + j - i - 1}][{parts[i][1]}]")
        else:
            j = i + 1
            out.append(f"{parts[i][0]}[{parts[i][1]}]")
        i = j
    return out


def render_plan(plan, inst=None, result=None) -> str:
    from milp_plan.units import format_duration
    p = plan.predicted
    rows = []
    for i, (st, sp, devs) in enumerate(zip(plan.stages, p.stages, _devices(plan, inst))):
        chunks = plan.layer_chunks(i)
        layers = " ".join(f"{a}-{a + n - 1}" if n > 1 else f"{a}" for a, n in chunks)
        rec = st.recompute if st.recompute != "full" else f"full x{st.recompute_layers}"
        rows.append([i, st.gpu, devs, f"{st.num_layers} ({layers})", f"{st.tp}/{st.dp}", st.micro_batch_size, rec,
                     f"{sp.fwd_ms + sp.bwd_ms:.1f}", f"{sp.peak_memory_gib:.1f} / {sp.capacity_gib:.1f}"])
    sched = plan.schedule + (f" (vpp {plan.vpp})" if plan.vpp > 1 else "")
    if plan.slices:
        sched += f" with {len(plan.slices)} token slices {list(plan.slices)} per sequence (TeraPipe)"
    elif plan.pp == 1:
        sched = f"no pipeline ({sched})"
    st0 = plan.stages[0]
    split = (f"{plan.micro_batch_size} per replica" if plan.uniform("micro_batch_size")
             else f"{st0.micro_batch_size * st0.dp} samples, split per stage (mbs x dp)")
    out = [f"Plan: {plan.pp} stage{'s' if plan.pp != 1 else ''} on {plan.num_gpus} GPUs, {sched}, {plan.num_microbatches} micro-batch{'es' if plan.num_microbatches != 1 else ''} of "
           f"{split} (global batch {plan.global_batch_size})"
           + (", sequence parallel" if plan.sequence_parallel else "")
           + (", distributed optimizer" if plan.distributed_optimizer else ""), ""]
    out.append(table(["stage", "GPU", "devices", "layers", "tp/dp", "mbs", "recompute", "f+b ms", "mem GiB / usable"],
                     rows, right=[True, False, False, False, True, True, False, True, True]))
    out += ["", f"Step time {format_duration(p.step_time_s)}: compute {format_duration(p.compute_s)}, bubble "
            f"{format_duration(p.bubble_s)}, p2p {format_duration(p.p2p_s)}, dp all-reduce "
            f"{format_duration(p.dp_allreduce_s)}, optimizer {format_duration(p.optimizer_s)}",
            f"Throughput {p.tokens_per_s:,.0f} tokens/s; cost {p.usd_per_hour:.2f} $/h, {p.usd_per_step:.4f} $/step"]
    if plan.profile_fills:
        out.append(f"Extrapolated: {len(plan.profile_fills)} profile point(s) not measured, filled by the profile's rules "
                   "(--extrapolate):")
        out += [f"  {f.gpu} tp={f.tp} micro_batch={f.micro_batch_size} seq={f.seq_length} {f.kind}: {f.how}"
                for f in plan.profile_fills]
    reasons = plan.megatron_incompatibilities()
    out.append("Runs on stock Megatron-LM" if not reasons else "Needs a per-stage runtime: " + "; ".join(reasons))
    mixed = [str(i) for i, st in enumerate(plan.stages) if st.mixed_type]
    if mixed:
        out.append(f"Stage{'s' if len(mixed) > 1 else ''} {', '.join(mixed)} mix{'' if len(mixed) > 1 else 'es'} GPU "
                   "types across data-parallel replicas (stock Megatron-LM runs it; the slowest replica paces the "
                   "stage; `milp-plan launch` notes what every node needs)")
    if result is not None:
        bound = "-" if result.best_bound is None else f"{result.best_bound:.6g}"
        gap = "-" if result.gap is None else format_gap(result.gap)
        step = f"{p.step_basis} step time"
        what = step if result.objective is None or result.objective == p.step_time_s else f"$/step ({step})"
        out.append(f"Solver {result.backend}: {result.status} for the {what}, objective {result.objective:.6g}, "
                   f"bound {bound}, gap "
                   f"{gap}, {result.wall_time_s:.2f} s ({result.work:.2f} work units), seed {result.seed} "
                   f"({configs_line(result)}"
                   + (f"; {result.start} start {result.heuristic_objective:.6g})"
                      if result.heuristic_objective is not None else ")"))
    return "\n".join(out)


def configs_line(result) -> str:
    """What became of the configurations searched (result.SolveResult's counts), adding up to the total."""
    parts = [f"{result.configs_solved} of {result.configs_total} configurations solved",
             f"{result.configs_pruned} pruned by bounds"]
    if result.configs_ruled_out:
        parts.append(f"{result.configs_ruled_out} ruled out (no plan fits memory and the limits)")
    if result.configs_opened:
        parts.append(f"{result.configs_opened} opened into stage sizes")
    left = result.configs_total - result.configs_examined
    if left > 0:
        parts.append(f"{left} left open")
    return ", ".join(parts)


def format_gap(gap: float) -> str:
    """A relative gap as a percentage; below 0.01% (the integer models' rounding) in full."""
    return f"{gap:.2%}" if gap == 0 or gap >= 1e-4 else f"{gap:.1e}"


def render_front(doc: dict, wall_time_s: float, max_points: int) -> str:
    """The Pareto sweep's table (pareto.front_document)."""
    rows = doc["points"]
    head = (f"Pareto front: {len(rows)} non-dominated plans"
            + ("" if doc["complete"] else " (not proven complete: a solve was not proven optimal within "
                                          f"--max-solve-time, or the sweep stopped at {max_points} points)")
            + f", {wall_time_s:.1f} s")
    return head + "\n" + table(
        ["step s", "$/step", "$/h", "tokens/s", "GPUs", "tp/dp/pp", "mbs", "schedule", "stages"],
        [[f"{r['step_time_s']:.3f}", f"{r['usd_per_step']:.4f}", f"{r['usd_per_hour']:.2f}",
          f"{r['tokens_per_s']:,.0f}", r["gpus"], f"{r['tp']}/{r['dp']}/{r['pp']}",
          r["micro_batch_size"], r["schedule"] + (f"/v{r['vpp']}" if r["vpp"] > 1 else ""),
          r["stages"]] for r in rows],
        right=[True, True, True, True, True, True, True, False, False])


def render_simulation(check) -> str:
    """The line that sets a plan's prediction beside its event-by-event simulation
    (verify.SimulationCheck), or the reason it was not simulated (a string)."""
    if isinstance(check, str):
        return check
    return (f"Simulated event by event: step {check.step_time_s:.4g} s (prediction, {check.basis}: "
            f"{check.prediction_error:+.2%}); peak memory within {check.memory_error_gib:.2g} "
            "GiB of the prediction")


SWITCH_NOTES = ("switch costs: every GPU whose parameter shard changes receives the weights and gradients its new "
                "layout gives it, each node over its inter-node link (an upper bound); layouts that differ only in "
                "micro-batch size or recompute switch for free",
                "stock Megatron-LM cannot switch layouts inside a step: this needs a runtime that can (HotSPa); "
                "`milp-plan launch` writes one Megatron-LM configuration per bucket and a manifest")


def render_phases(plan) -> str:
    """solve --lengths: the buckets, their strategies, the step against the best static plan."""
    ph, pr, rec = plan.phases, plan.predicted, plan.solver
    ln = ph.lengths
    out = [f"Lengths: {ln['source']}: {ln['sequences']} sequences, {ln['tokens']} tokens, longest {ln['longest']} "
           f"(each sequence padded to its bucket's edge; edges {ph.edges})"]
    def s4(v: float) -> str:   # the cost model's differences leave ~1e-15 s where a fill is none
        return "0" if abs(v) < 1e-9 else f"{v:.4g}"
    rows = [[i, x.edge, x.sequences, f"{1 - x.tokens / (x.edge * x.sequences):.0%}", x.strategy,
             x.plan.num_microbatches, s4(x.time_s), s4(x.fill_s)] for i, x in enumerate(ph.phases)]
    out.append(table(["phase", "bucket edge", "sequences", "padding", "strategy", "micro-batches", "time s",
                      "fill s"], rows, right=[True] * 8))
    out += [f"  strategy {i}: {lab}" + (" (home: optimizer state, reduction and optimizer step)" if i == ph.home
                                        else "") for i, lab in enumerate(ph.strategies)]
    sw = ph.switches()
    unit = "$/step" if plan.inputs.get("objective", {}).get("kind") == "min-cost" else "s"
    out.append(f"Step time {pr.step_time_s:.6g} s = work {pr.compute_s:.6g} + fills {s4(pr.bubble_s)} + "
               f"{len(sw)} switches {s4(sum(t for *_, t in sw))} + reduction and optimizer "
               f"{pr.dp_allreduce_s + pr.optimizer_s:.4g}")
    out.append(f"{rec.status} over {ph.scope}" + ("" if rec.best_bound is None else
                                                  f" (bound {rec.best_bound:.6g} {unit})"))
    out.append(f"Rent {pr.usd_per_hour:.2f} $/h, {pr.usd_per_step:.4g} $/step, {pr.tokens_per_s:,.0f} tokens/s "
               "(unpadded)")
    if ph.static is not None:
        key = "step_time_s" if "step_time_s" in ph.static else "usd_per_step"
        be = ph.break_even_factor
        pays = ("; it pays at any switch cost" if be == "never" else
                f"; it stops paying at {be:.3g}x the estimated switch costs")
        out.append(f"Best static plan: {ph.static['strategy']}, {ph.static[key]:.6g} "
                   f"{'s' if key == 'step_time_s' else '$/step'}; "
                   + ("switching gains nothing" if ph.gain <= 1e-9 else f"switching gains {ph.gain:.1%}{pays}"))
    out += [f"Note: {n}" for n in SWITCH_NOTES]
    return "\n".join(out)


def render_comparison(c) -> str:
    """compare.Comparison as a table: one row per planner."""
    unit = "s/step" if c.objective == "min-time" else "$/step"
    if c.best_bound is None:
        head = "no planner proved a bound: gaps are not known"
    elif c.best_bound == float("inf"):
        head = "proven: no plan meets the limits"
    else:
        head = f"best proven bound {c.best_bound:.6g} {unit}"
    rows = []
    for r in c.rows:
        rows.append([r.planner, r.status, "-" if r.objective is None else f"{r.objective:.6g}",
                     "-" if r.gap is None else format_gap(r.gap),
                     "-" if r.step_time_s is None else f"{r.step_time_s:.4g}",
                     "-" if r.simulated_step_s is None else f"{r.simulated_step_s:.4g}",
                     "-" if r.usd_per_hour is None else f"{r.usd_per_hour:.2f}",
                     "-" if r.gpus is None else r.gpus, "-" if r.valid is None else ("yes" if r.valid else "NO"),
                     f"{r.search_s:.2f}", f"{r.work:.2f}"])
    limit = (f"{c.time_limit_s:g} s" if c.work_limit is None else
             f"{c.work_limit:g} work units (deterministic)" + (f" and {c.time_limit_s:g} s" if c.time_limit_s < 86400
                                                               else ""))
    return (f"Objective {c.objective} ({unit}); {head}; each planner limited to {limit}\n"
            + table(["planner", "status", "objective", "gap", "step s", "simulated s", "$/h", "GPUs", "valid",
                     "search s", "work"], rows,
                    right=[False, False, True, True, True, True, True, True, False, True, True]))
