"""Terminal rendering: plain fixed-width tables (deterministic, pipe-friendly)."""
from __future__ import annotations

from typing import Any, Sequence

from milp_plan.instance import Instance


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
        sub = prof.table[prof.table.gpu == g]
        coverage.append({
            "gpu": g, "rows": int(len(sub)),
            "tp": sorted(int(x) for x in sub.tp.unique()),
            "micro_batch_size": sorted(int(x) for x in sub.micro_batch_size.unique()),
            "seq_length": sorted(int(x) for x in sub.seq_length.unique()),
            "kinds": sorted(sub.kind.unique()),
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
        "job": j.to_dict(),
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
            f"Job: global batch {j['global_batch_size']}, sequence {j['seq_length']}, {j['precision']}, "
            f"{j['optimizer']}, flash attention {'on' if j['flash_attention'] else 'off'}, memory headroom "
            f"{j['memory_headroom']:.0%}", ""]
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
