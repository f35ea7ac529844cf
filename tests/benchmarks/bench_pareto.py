"""Pareto benchmark: the exact step-time / $-per-step front of a FASOP-like instance.

    python tests/benchmarks/bench_pareto.py [--work-limit 30] [--cluster tests/benchmarks/fasop-8x8.yaml]
                                            [--model gpt2-xl] [--global-batch 64] [--fix ...] [--workers N]

FASOP (HPDC'24) sweeps gpt2-xl on up to 8 A100 + 8 A10 nodes (fasop-8x8.yaml, a
reconstruction) in about 1,230-1,470 s of CPU for 17 points; the target is the complete front in
<= 30 s wall on 2 cores. Each solve of the sweep (pareto.py: a min-time then a min-cost solve per
point) runs under the same deterministic work limit, so the front is the same on any machine;
the wall and CPU times move with the load (CPU less). Prints each solve (objective, status,
configs solved, work units: deterministic), each point, then whether the front is complete
(every solve proven, the end proven), the sums, wall and CPU time and the load. Not a test (pytest does not collect tests/benchmarks).
"""
from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.pareto import front_rows, pareto_front
from milp_plan.solve import MAX_SOLVE_TIME_S, SolveRequest

HERE = Path(__file__).resolve().parent


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (--workers' processes)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default=str(HERE / "fasop-8x8.yaml"))
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--work-limit", type=float, default=30.0, help="work units per solve of the sweep")
    ap.add_argument("--fix", default=None)
    ap.add_argument("--workers", type=int, default=1, help="processes solving configs side by side (same front)")
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), _cpu()
    inst = build_instance(InstanceSpec(cluster=args.cluster, model=args.model, global_batch_size=args.global_batch))
    req = SolveRequest(fix=args.fix, max_solve_time_s=MAX_SOLVE_TIME_S, work_limit=args.work_limit, workers=args.workers)
    front = pareto_front(inst, req)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    for i, r in enumerate(front.solves, 1):
        kind = "min-time" if i % 2 else "min-cost"
        obj = "none" if r.objective is None else f"{r.objective:.6g}"
        print(f"solve {i} {kind}: {r.status}, objective {obj}, {r.configs_solved} configs solved, {r.work:.2f} work units")
    print(f"{'step s':>9s} {'$/step':>9s} {'GPUs':>5s} {'pp':>3s} {'tp':>4s} {'dp':>4s} {'mbs':>4s} "
          f"{'schedule':>12s}  stages")
    for r in front_rows(front):
        print(f"{r['step_time_s']:9.4f} {r['usd_per_step']:9.5f} {r['gpus']:5d} {r['pp']:3d} {str(r['tp']):>4s} "
              f"{str(r['dp']):>4s} {str(r['micro_batch_size']):>4s} {r['schedule']:>12s}  {r['stages']}")
    print(f"{len(front.points)} points, complete={front.complete}; {len(front.solves)} solves, "
          f"{sum(r.configs_solved for r in front.solves)} configs solved, {sum(r.work for r in front.solves):.2f} work "
          f"units; wall {wall:.1f} s, cpu {cpu:.1f} s, load {os.getloadavg()[0]:.1f} "
          "(target: complete in <= 30 s wall on 2 cores)")


if __name__ == "__main__":
    main()
