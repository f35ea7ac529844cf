"""Solver benchmark: status, objective, gap and wall time per backend and cluster.

Not a test (pytest does not collect tests/benchmarks). Targets on 2 cores: proven optimum
for <= 64 GPUs in under 1 s; gap <= 1% in 10 s at 1024 GPUs; gap <= 2% in 60 s at 8192
GPUs; the exact Pareto front of the default instance in under 30 s.

    python tests/benchmarks/bench_solve.py [--backends cpsat,highs,cbc] [--modes megatron,free] [--skip-pareto]
        [--workers N] [--only default,scale-8192] [--work UNITS]

The targets are wall-clock ones, so by default each case runs under its wall-clock limit and
its gap depends on the machine's load. --work UNITS adds a deterministic work limit
(deadline.py; cpsat only, the other
backends keep their wall-clock limit): configs solved, gap and work units are then the same on any
machine and load, the figures to compare code by.

The cpu column is the process's CPU time (steadier than wall time on a shared machine; the
backends may add threads of their own). Free mode (tp, dp and recompute per stage) has no
target; its rows show how far the larger space gets in the same limits (it starts from the
Megatron-mode optimum).
"""
from __future__ import annotations

import argparse
import resource
import time

from milp_plan.deadline import Deadline
from milp_plan.job import Limits
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.solvers.driver import DETERMINISTIC_BACKENDS, solve

CASES = [  # (label, cluster, model, global batch, time limit s)
    ("default (32 GPUs, 2 types)", "default", "gpt3-6.7b", 256, 30),
    ("shipped-default (2.7B, batch 80)", "default", "gpt3-2.7b", 80, 30),   # what `milp-plan solve` runs
    ("two-type-32 (32 GPUs)", "two-type-32", "gpt3-6.7b", 256, 30),
    ("mixed-128 (128 GPUs, 4 types)", "mixed-128", "gpt3-13b", 512, 30),
    ("scale-1024", "scale-1024", "gpt3-175b", 1536, 10),
    ("scale-8192", "scale-8192", "gpt3-175b", 1536, 60),
]


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (--workers' processes)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="cpsat,highs,cbc")
    ap.add_argument("--modes", default="megatron,free")
    ap.add_argument("--skip-pareto", action="store_true")
    ap.add_argument("--workers", type=int, default=1, help="processes solving configs side by side")
    ap.add_argument("--only", default=None,
                    help="comma-separated instance labels' first words, e.g. default,scale-8192")
    ap.add_argument("--work", type=float, default=None,
                    help="also stop each search after this many work units (deterministic; cpsat only)")
    args = ap.parse_args()
    print(f"{'instance':32s} {'mode':8s} {'backend':7s} {'status':9s} {'step s':>9s} {'gap':>7s} {'wall s':>7s} "
          f"{'cpu s':>7s} {'units':>6s} {'configs solved/pruned/ruled out/opened/total':>45s}")
    for mode in args.modes.split(","):
        for label, cluster, model, gbs, limit in CASES:
            if args.only and label.split()[0] not in args.only.split(","):
                continue
            inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
            for backend in args.backends.split(","):
                t0, c0 = time.perf_counter(), _cpu()
                work = args.work if backend in DETERMINISTIC_BACKENDS else None  # the others: wall clock
                dl = Deadline(limit if work is None else 3600.0, work=work)
                r = solve(inst, Limits(), backend=backend, mode=mode, workers=args.workers, dl=dl)
                wall, cpu = time.perf_counter() - t0, _cpu() - c0
                gap = "-" if r.gap is None else f"{r.gap:.2%}"
                obj = "-" if r.objective is None else f"{r.objective:.4f}"
                print(f"{label:32s} {mode:8s} {backend:7s} {r.status:9s} {obj:>9s} {gap:>7s} {wall:7.2f} {cpu:7.2f} "
                      f"{dl.work_used():6.2f} {r.configs_solved:>10d}/{r.configs_pruned}/{r.configs_ruled_out}/{r.configs_opened}/"
                      f"{r.configs_total}", flush=True)
    if not args.skip_pareto:
        from milp_plan.pareto import pareto_front
        from milp_plan.solve import SolveRequest
        front = pareto_front(build_instance(), SolveRequest())
        print(f"pareto front of the default: {len(front.points)} points, complete={front.complete}, "
              f"{front.wall_time_s:.1f} s")


if __name__ == "__main__":
    main()
