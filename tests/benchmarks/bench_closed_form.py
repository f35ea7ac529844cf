"""How good is the planner's closed form? Figures, not a test (pytest does not collect this).

1. Error of costmodel's step-time closed form against the event simulator on random
   pipelines (uneven stages, hops), per schedule: min / mean / max of closed / sim - 1.
2. Regret on random small instances: every plan of the space is enumerated (brute
   force's candidates) and simulated; the regret is how much slower, in simulation, the
   closed form's optimum is than the simulation's optimum (what the planner proved before
   it proved the simulated step), and the same for the planner's plan now (cpsat).

    python tests/benchmarks/bench_closed_form.py [--pipelines 300] [--instances 12] [--seed 3]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from milp_plan import costmodel, predict
from milp_plan.job import Limits
from milp_plan.formulations.space import enumerate_configs
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.sim import PipelineSpec, simulate_plan, simulate_pipeline
from milp_plan.solvers import bruteforce, driver

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from instances import write_instance  # noqa: E402  (the tests' small-instance writer)


def pipeline_errors(schedule: str, n: int, rng: random.Random, big_hops: bool) -> list[float]:
    errs = []
    for _ in range(n):
        p = rng.randint(2, 6)
        v = rng.choice([2, 3, 4]) if schedule == "interleaved" else 1
        m = p * rng.randint(1, 4) if schedule == "interleaved" else rng.randint(1, 12)
        f = [rng.choice([1.0, 1.0, 1.05, 1.1, 1.3, 2.0]) for _ in range(p)]
        scale = 1.0 if big_hops else 0.1
        h = tuple(scale * rng.choice([0.0, 0.1, 0.3, 1.0]) for _ in range(p - 1))
        wrap = scale * rng.choice([0.0, 0.1, 0.3, 1.0]) if schedule == "interleaved" else 0.0
        spec = PipelineSpec(schedule, m, tuple(f), tuple(2 * x for x in f), hop_s=h, vpp=v, wrap_hop_s=wrap)
        closed = sum(costmodel.pipeline_time_s(spec.fwd_s, spec.bwd_s, m, schedule, v, h)) \
            + costmodel.p2p_time_s(h, wrap, schedule, v)
        errs.append(closed / simulate_pipeline(spec).pipeline_time_s - 1)
    return errs


def regret(rng: random.Random) -> tuple[float, float, int]:
    f = rng.choice([0.5, 1.0, 2.0])
    slow = rng.choice([1.0, 1.5, 2.5])
    spec = write_instance(Path(tempfile.mkdtemp()), layers=rng.randint(4, 8), fast_ms=(f, 2 * f),
                          slow_ms=(f * slow, 2 * f * slow), gpn=rng.choice([1, 2]),
                          counts=(rng.randint(1, 2), rng.randint(1, 2)), third=rng.random() < 0.5)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": rng.choice([4, 8, 16])}))
    best_closed, best_sim, n = None, None, 0
    for cfg in enumerate_configs(inst):
        for plan in bruteforce.candidate_plans(inst, cfg):
            if not Limits().admit(plan):
                continue
            n += 1
            sim = simulate_plan(inst, plan).step_time_s
            closed = predict.evaluate(inst, plan, predict.CLOSED_FORM).step_time_s
            if best_closed is None or closed < best_closed[0]:
                best_closed = (closed, sim)
            best_sim = sim if best_sim is None else min(best_sim, sim)
    planned = simulate_plan(inst, driver.solve(inst, Limits()).plan).step_time_s
    return best_closed[1] / best_sim - 1, planned / best_sim - 1, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipelines", type=int, default=300)
    ap.add_argument("--instances", type=int, default=12)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"closed form / simulation - 1 on {args.pipelines} random pipelines per row")
    print(f"{'schedule':12s} {'hops':6s} {'min':>8s} {'mean':>8s} {'max':>8s}")
    for schedule in ("1f1b", "gpipe", "interleaved", "zb-h1"):
        for big in (False, True):
            e = pipeline_errors(schedule, args.pipelines, rng, big)
            print(f"{schedule:12s} {'large' if big else 'small':6s} {min(e):+8.2%} {statistics.mean(e):+8.2%} "
                  f"{max(e):+8.2%}")
    print(f"\nregret in simulation on {args.instances} small instances: the closed form's optimum, the planner's plan")
    rs, ps = [], []
    for i in range(args.instances):
        r, p, n = regret(rng)
        rs.append(r)
        ps.append(p)
        print(f"  instance {i:2d}: {n:6d} plans, closed-form optimum {r:+.2%}, planner {p:+.2%}")
    for name, xs in (("closed-form optimum", rs), ("planner", ps)):
        print(f"  {name}: mean {statistics.mean(xs):+.2%}, worst {max(xs):+.2%}, zero on "
              f"{sum(x < 1e-9 for x in xs)} of {len(xs)}")


if __name__ == "__main__":
    main()
