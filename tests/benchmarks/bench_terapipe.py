"""The token-slicing note's figures: GPT-3 175B at sequence 2048 with a global batch small enough
that micro-batches are few (TeraPipe's regime), on a homogeneous cluster (a100-128.yaml beside
this file: 16 x 8 A100-80GB) and on the shipped mixed one (mixed-128: 32 H100, 32 A100-80GB,
32 L40S, 32 A10). For each: the best plan without slicing (the whole space), the best GPipe
plan unsliced, and the slicing of that GPipe plan for every slice count (slice_plan), each
candidate's step simulated; then what `solve --slices auto` writes (the joint search over every
GPipe config's sliced plans, slice_plan.sliced_search), with its bound and gap.

    python tests/benchmarks/bench_terapipe.py [--global-batch 8] [--max-solve-time 120s] [--fix ...]

tp = 8, dp = 1, mbs = 1 are pinned by default (FIX): tp 8 is what every plan of these instances
takes, and dp = mbs = 1 makes the micro-batch count the global batch (TeraPipe's regime: few
micro-batches, each one sequence); the pins keep the mixed cluster's search short. The
statuses say what is proven."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from milp_plan import solve as solving
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Objective
from milp_plan.result import objective_of
from milp_plan.slice_plan import slice_candidates, solve_with_slices
from milp_plan.units import parse_duration_s

HERE = Path(__file__).parent
FIX = "tp=8,dp=1,mbs=1"   # one sequence per micro-batch, no data parallelism: m = global batch
CLUSTERS = {"homogeneous a100-128": str(HERE / "a100-128.yaml"), "mixed-128": "mixed-128"}


def describe(plan) -> str:
    gpus = {}
    for st in plan.stages:
        gpus[st.gpu] = gpus.get(st.gpu, 0) + len(st.devices)
    layers = "/".join(str(st.num_layers) for st in plan.stages)
    sched = plan.schedule + (f" v{plan.vpp}" if plan.vpp > 1 else "")
    return (f"pp {plan.pp} {sched} m {plan.num_microbatches} on {'+'.join(f'{n} {g}' for g, n in gpus.items())}; "
            f"layers {layers}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--max-solve-time", default="120s")
    ap.add_argument("--fix", default=FIX, help=f"pins of every solve (default {FIX})")
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help="which of them, comma-separated")
    a = ap.parse_args()
    for label in a.clusters.split(","):
        cluster = CLUSTERS[label]
        inst = build_instance(InstanceSpec(cluster=cluster, model="gpt3-175b", global_batch_size=a.global_batch),
                              Objective())
        limits = inst.objective.limits()
        req = solving.SolveRequest("auto", a.fix, parse_duration_s(a.max_solve_time, field="max-solve-time"), 1, 1)
        greq = solving.SolveRequest("auto", f"{a.fix},schedule=gpipe", req.max_solve_time_s, 1, 1)
        print(f"== GPT-3 175B, seq {inst.job.seq_length}, global batch {a.global_batch}, {label} ==")
        t0 = time.perf_counter()
        best = solving.run(inst, req, limits)
        gp = solving.run(inst, greq, limits)
        for name, r in (("best unsliced plan", best), ("best GPipe plan, unsliced", gp)):
            gap = "-" if r.gap is None else f"{r.gap:.2%}"
            print(f"{name:28s} step {objective_of(r.plan, limits):8.4f} s  [{r.status}, gap {gap}]  {describe(r.plan)}")
        cands = sorted(slice_candidates(inst, gp.plan, limits), key=lambda c: c.count)
        print("GPipe plan cut into c slices (each the exact DP optimum of TeraPipe's J for c; step simulated):")
        for c in cands:
            print(f"  c {c.count:2d}  step {c.objective:8.4f} s  slices {list(c.slices) or [inst.job.seq_length]}")
        t1 = time.perf_counter()
        result, line = solve_with_slices(inst, req, limits, "auto")
        p = result.plan
        gap = "-" if result.gap is None else f"{result.gap:.2%}"
        bound = "-" if result.best_bound is None else f"{result.best_bound:.4f}"
        print(f"--slices auto writes: step {objective_of(p, limits):.4f} s, slices {list(p.slices) or 'none'} "
              f"[{result.status}, bound {bound}, gap {gap}, {time.perf_counter() - t1:.0f} s]  {describe(p)}")
        print(f"  {line}")
        if p.slices:
            from milp_plan import predict
            form = predict.evaluate(inst, p, basis=predict.CLOSED_FORM).step_time_s
            print(f"  sliced closed form {form:.4f} s against the simulated {p.predicted.step_time_s:.4f} s "
                  f"(+{form / p.predicted.step_time_s - 1:.1%}); peak memory per stage "
                  f"{max(sp.peak_memory_gib for sp in p.predicted.stages):.1f} GiB, as unsliced GPipe")
        print(f"  ({time.perf_counter() - t0:.0f} s)\n")


if __name__ == "__main__":
    main()
