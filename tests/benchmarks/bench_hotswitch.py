"""Hot switching across length buckets (issue 18's note figures): LLaMA-2 7B and 13B on 8 and
16 A100-80GB GPUs, a long-tailed length distribution capped at 16k and 32k tokens.

Not a test (pytest does not collect tests/benchmarks). For each case: the best static plan
(one strategy for every bucket), the best switching plan (a strategy per bucket, the bucket
edges chosen by the model among powers of two), its gain
and the switch-cost factor at which it stops paying; for LLaMA-2 7B on 8 GPUs at 16k also
HotSPa's hand-written strategies (buckets 16384/8192/4096/0 with <dp,tp,pp> = <1,4,2>,
<2,2,2>, <8,1,1>), scored by the same model on the same buckets.

    python tests/benchmarks/bench_hotswitch.py [--sequences 128] [--mean 2048] [--work 10]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from milp_plan import hotswitch, workload
from milp_plan.instance import InstanceSpec
from milp_plan import solve as solving

CLUSTER = """name: a100x{n}
node_types:
  - {{name: a100-node, gpu: A100-80GB, gpus_per_node: 8, count: {nodes}, intra_node_gb_per_s: 300,
     inter_node_gb_per_s: 50, usd_per_hour: 40.966}}
"""
HOTSPA_7B_8 = {4096: "dp=8,tp=1,pp=1", 8192: "dp=2,tp=2,pp=2", 16384: "dp=1,tp=4,pp=2"}


def show(title: str, r: hotswitch.HotSwitchResult, wall: float) -> None:
    best = r.best
    if best.assignment is None:
        print(f"{title}: no assignment ({best.status}: no layout leaves room for another's optimizer state, or "
              f"a bucket no strategy runs)  [{wall:.0f} s]")
        return
    ranges = r.problem.item_ranges
    per = ", ".join(f"{r.items[i].edge}:{r.items[i].sequences}->{best.assignment[ranges[i][0]]}" for i in best.items)
    be = r.break_even
    print(f"{title}: switching {best.step_time_s:.4f} s ({best.status}, {best.switches} switches; {per}); "
          + (f"static {r.static[1]:.4f} s (strategy {r.static[0]}); gain {1 - best.step_time_s / r.static[1]:.1%}; "
             + ("pays at any switch cost" if be == float("inf") else
                "switching does not pay" if be is None else f"break-even x{be:.3g}")
             if r.static else "no static plan")
          + f"  [{wall:.0f} s]")
    used = sorted({best.assignment[ranges[i][0]] for i in best.items})
    for k in used:
        print(f"    strategy {k}: {hotswitch.label(r.strategies[k])}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--mean", type=float, default=2048)
    ap.add_argument("--work", type=float, default=10.0, help="work limit of each bucket's own solve")
    args = ap.parse_args()
    req = solving.SolveRequest("cpsat", None, 86400.0, work_limit=args.work)
    tmp = Path(tempfile.mkdtemp())
    for nodes in (1, 2):
        path = tmp / f"a100x{8 * nodes}.yaml"
        path.write_text(CLUSTER.format(n=8 * nodes, nodes=nodes))
        for model in ("llama2-7b", "llama2-13b"):
            for cap in (16384, 32768):
                hist = workload.lognormal(args.mean, cap, args.sequences, seed=1)
                spec = InstanceSpec(cluster=str(path), model=model)
                t0 = time.perf_counter()
                bks = workload.buckets(hist)
                r = hotswitch.plan_buckets(spec, bks, hotswitch.candidates(spec, bks, req, choose_edges=True),
                                           choose_edges=True)
                show(f"{model}, {8 * nodes} GPUs, cap {cap} ({hist.sequences} sequences, {hist.tokens} tokens)",
                     r, time.perf_counter() - t0)
                if (model, nodes, cap) == ("llama2-7b", 1, 16384):
                    hotspa(spec, hist, req)


def hotspa(spec: InstanceSpec, hist, req) -> None:
    """HotSPa's buckets and hand-written strategies, each planned (layers, micro-batch) by the
    exact planner with its (dp, tp, pp) pinned at its own bucket, then assigned by the model."""
    t0 = time.perf_counter()
    bks = workload.buckets(hist, tuple(HOTSPA_7B_8))
    plans = []
    for b in bks:
        got = hotswitch.candidates(spec, (b,), replace(req, fix=HOTSPA_7B_8[b.edge]))
        if not got:
            print(f"  HotSPa's {HOTSPA_7B_8[b.edge]} has no plan for bucket {b.edge}")
            return
        plans += got
    show("  HotSPa's hand-written strategies on its buckets", hotswitch.plan_buckets(spec, bks, plans),
         time.perf_counter() - t0)
    ours = hotswitch.plan_buckets(spec, bks, hotswitch.candidates(spec, bks, req))
    show("  milp-plan's strategies on HotSPa's buckets", ours, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
