"""Benchmark: wall time to simulate one step with pp=64 stages and m=1024 micro-batches.

Run: python tests/benchmarks/bench_sim.py [--schedule 1f1b] [--pp 64] [--m 1024] [--vpp 2] [--repeats 3]
Prints the best of `repeats` wall and CPU times (target: under 2 s for 1f1b on 2 cores). Stage times
are uneven and every hop, reduction and optimizer step costs time, so every code path runs.
Not collected by pytest (no test_ prefix).
"""
from __future__ import annotations

import argparse
import time

from milp_plan.sim import PipelineSpec, simulate_pipeline


def bench_spec(schedule: str, pp: int, m: int, vpp: int) -> PipelineSpec:
    fwd = tuple(0.030 + 0.001 * (s % 5) for s in range(pp))
    return PipelineSpec(schedule, m, fwd, tuple(2 * f for f in fwd), hop_s=(0.002,) * (pp - 1), vpp=vpp,
                        wrap_hop_s=0.002 if vpp > 1 else 0.0, dp_s=(0.05,) * pp, opt_s=(0.01,) * pp,
                        static_bytes=(1e9,) * pp, act_bytes=((1e8,) * vpp,) * pp, working_bytes=((0.0,) * vpp,) * pp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe", "interleaved", "zb-h1", "all"])
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--vpp", type=int, default=2, help="virtual stages per rank for interleaved")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    schedules = ["1f1b", "gpipe", "interleaved", "zb-h1"] if args.schedule == "all" else [args.schedule]
    for schedule in schedules:
        vpp = args.vpp if schedule == "interleaved" else 1
        spec = bench_spec(schedule, args.pp, args.m, vpp)
        best, best_cpu, result = float("inf"), float("inf"), None
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = simulate_pipeline(spec)
            best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
        ops = len(result.timing.end_s)
        print(f"{schedule:11s} pp={args.pp} m={args.m} vpp={vpp}: {ops} operations, simulated step "
              f"{result.step_time_s:.3f} s, wall {best:.3f} s, cpu {best_cpu:.3f} s (best of {args.repeats})")


if __name__ == "__main__":
    main()
