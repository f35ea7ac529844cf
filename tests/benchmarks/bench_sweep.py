"""Where the proof holds: every shipped cluster x catalog model x global batch, one exact solve each.

    python tests/benchmarks/bench_sweep.py [--mode megatron|free] [--clusters default,mixed-128]
                                           [--models gpt3-13b,llama3-70b] [--batches 64,256,1024] [--work 30]

bench_solve.py times six instances to the proof; this one asks how often the default search
(30 work units, the CLI's default) proves its plan at all. Each row: status, gap, work units,
CPU seconds, configurations solved and the objective (s/step). Work units, status, gap and the
plan are the same on any machine and load; the CPU column is not. Rows that end "feasible"
name the instances whose bounds or solves fall short (README, "Current limits").
Not a test (pytest does not collect tests/benchmarks).
"""
from __future__ import annotations

import argparse
import itertools
import time

from milp_plan.deadline import Deadline
from milp_plan.errors import InputError
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers.driver import solve

MODELS = "gpt3-1.3b,gpt3-6.7b,gpt3-13b,llama2-7b,llama3-8b,llama2-70b,llama3-70b,gpt3-175b"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="megatron")
    ap.add_argument("--clusters", default="default,two-type-32,mixed-128,scale-1024")
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--batches", default="64,256,1024")
    ap.add_argument("--work", type=float, default=30.0, help="work units per solve (the CLI's default: 30)")
    args = ap.parse_args()
    print(f"{'mode':8s} {'cluster':12s} {'model':11s} {'batch':>5s} {'status':10s} {'gap':>7s} {'units':>6s} "
          f"{'cpu s':>6s} {'solved':>6s}  step s")
    counts: dict[str, int] = {}
    for cluster, model, batch in itertools.product(args.clusters.split(","), args.models.split(","),
                                                    [int(b) for b in args.batches.split(",")]):
        head = f"{args.mode:8s} {cluster:12s} {model:11s} {batch:5d}"
        try:
            inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=batch))
        except InputError as e:
            print(f"{head} input: {e}", flush=True)
            continue
        dl = Deadline(3600.0, work=args.work)
        c0 = time.process_time()
        r = solve(inst, Limits(), backend="cpsat", mode=args.mode, dl=dl)
        status = str(r.status.value if hasattr(r.status, "value") else r.status)
        counts[status] = counts.get(status, 0) + 1
        gap = "-" if r.gap is None else f"{r.gap:.2%}"
        obj = "-" if r.objective is None else f"{r.objective:.6g}"
        print(f"{head} {status:10s} {gap:>7s} {dl.work_used():6.2f} {time.process_time() - c0:6.2f} "
              f"{r.configs_solved:6d}  {obj}", flush=True)
    print("; ".join(f"{n} {s}" for s, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
