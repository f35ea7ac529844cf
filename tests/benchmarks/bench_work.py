"""Work units against CPU time: what `--work-limit` measures (milp_plan/deadline.py).

Not a test (pytest does not collect tests/benchmarks). Each planner runs on a few shipped
instances under a wall-clock limit; the script counts the operations it charged (bounds,
models, heuristic steps, plans, CP-SAT's deterministic time), prints its CPU time, the
work charged and their ratio, and refits the per-operation amounts by non-negative least
squares (relative error), to compare with deadline.WORK.

    python tests/benchmarks/bench_work.py [--planners cpsat,warm-start,aceso,fasop,metis] [--limit 15]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
from scipy.optimize import nnls

from milp_plan import planners
from milp_plan.deadline import WORK, Deadline
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Objective

CASES = [  # (cluster, model, mode, objective, step-time limit)
    ("default", "gpt3-2.7b", "megatron", "min-time", None),
    ("default", "gpt3-1.3b", "free", "min-time", None),
    ("two-type-32", "gpt3-2.7b", "megatron", "min-time", None),
    ("default", "gpt3-2.7b", "megatron", "min-cost", 1.2),
]
KINDS = ("bound", "model", "step", "plan", "cp-sat")


def counted(tally: Counter):
    """Deadline.charge, also counting each charge by kind (CP-SAT's by its amount)."""
    amount = {getattr(WORK, k): k for k in KINDS[:4]}
    plain = Deadline.charge

    def charge(self, units):
        kind = amount.get(units)
        tally[kind or "cp-sat"] += 1 if kind else units
        plain(self, units)
    return charge


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--planners", default="cpsat,warm-start,aceso,fasop,metis")
    ap.add_argument("--limit", type=float, default=15.0, help="wall-clock seconds per run")
    args = ap.parse_args()
    tally: Counter = Counter()
    Deadline.charge = counted(tally)
    rows = []
    print(f"{'instance':40s} {'planner':10s} {'CPU s':>7s} {'work':>7s} {'work/CPU':>8s}")
    for cluster, model, mode, kind, t in CASES:
        inst = build_instance(InstanceSpec(cluster=cluster, model=model), Objective(kind, t, mode=mode))
        for name in args.planners.split(","):
            tally.clear()
            dl = Deadline(args.limit)
            c0 = time.process_time()
            planners.get(name).plan(inst, inst.objective.limits(), dl)
            cpu = time.process_time() - c0
            rows.append(([tally[k] for k in KINDS], cpu))
            print(f"{cluster + '/' + model + '/' + mode + '/' + kind:40s} {name:10s} {cpu:7.2f} "
                  f"{dl.work_used():7.2f} {dl.work_used() / cpu:8.2f}", flush=True)
    a = np.array([r[0] for r in rows], dtype=float)
    b = np.array([r[1] for r in rows])
    fit, _ = nnls(a / b[:, None], np.ones_like(b))
    print("\nper-operation CPU seconds (fit)   deadline.WORK")
    for k, x in zip(KINDS, fit):
        print(f"  {k:8s} {x:10.3g}   {getattr(WORK, k) if k != 'cp-sat' else 1.0:10.3g}")


if __name__ == "__main__":
    main()
