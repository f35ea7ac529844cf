"""The tests' small instances, random-instance strategies and brute-force cross-check helpers
(shared by test_solve, test_bounds, test_trust, test_space, test_heuristic, test_pins,
test_backends, the mutation probe and the closed-form benchmark)."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

from hypothesis import strategies as st

from milp_plan import check, planners
from milp_plan.instance import InstanceSpec
from milp_plan.job import Limits
from milp_plan.result import objective_of
from milp_plan.solvers.driver import PROOF_TOL

BACKENDS = tuple(n for n, p in planners.PLANNERS.items() if isinstance(p, planners.ExactPlanner))
HUGE_BW = 1e9  # GB/s: communication ~0, so the hand derivation is pure compute


GPUS = {"A100-80GB": (312.0, 2039), "A10": (125.0, 600), "L40S": (362.05, 864)}  # catalog TFLOP/s, GB/s


# (intra, inter) GB/s at which the tiny model's hops (4 KiB per micro-batch) and gradient
# reductions (~100 kB a layer) take about as long as a stage (0.5-5 ms): the terms that the
# steady-period windows, the reduction tail and the interleaved wrap price
COMPARABLE_BW = ((0.05, 0.005), (0.02, 0.002))
SLOW_MEMORY_GB_PER_S = 1.0  # the optimizer step (16 B a parameter) then costs ~1 ms a layer


def _gpu(name: str, memory_gib: float | None, memory_gb_per_s: float | None = None) -> str:
    """A catalog GPU, or the same GPU inline with `memory_gib` of memory (to make memory bind)
    and `memory_gb_per_s` of memory bandwidth (to make the optimizer step count)."""
    if memory_gib is None and memory_gb_per_s is None:
        return name
    tflops, bw = GPUS[name]
    mem = 80 if memory_gib is None else memory_gib
    return f"{{name: {name}, memory_gib: {mem}, peak_tflops: {tflops}, memory_gb_per_s: {memory_gb_per_s or bw}}}"


PROFILED_TPS = (1, 2, 4, 8)
PROFILED_MBS = tuple(range(1, 33))


def write_instance(tmp: Path, *, layers=4, fast_ms=(1.0, 2.0), slow_ms=(2.0, 4.0), prices=(8.0, 2.0),
                   gpn=2, counts=(1, 1), third: bool = False,
                   memory_gib: tuple[float | None, float | None, float | None] = (None, None, None),
                   bw: tuple[float, float] = (HUGE_BW, HUGE_BW), billing: tuple[str, str] = ("node", "node"),
                   memory_gb_per_s: float | None = None, vocab: int = 128,
                   slow_bw: tuple[float, float] | None = None) -> InstanceSpec:
    """Two node types of `gpn` GPUs: 'fast' (A100-80GB) and 'slow' (A10), and with `third` a
    single 'mid' node of L40S; a tiny GPT whose block costs fwd/bwd ms as given at tp 1,
    micro-batch 1, and mbs / tp times that at the other profiled points (PROFILED_TPS x
    PROFILED_MBS: what the fill rules would give, written out so that the default space, which
    keeps to profiled points, holds them); embedding and head cost nothing.
    memory_gib overrides each type's GPU memory (the model needs about 1 MiB a layer); bw is
    (intra, inter) GB/s of the first two types (`slow_bw`: the slow type's own); billing their `billing`; vocab the
    vocabulary (the tied embedding's gradient, all-reduced between the ends, grows with it)."""
    mbw = memory_gb_per_s
    (tmp / "cluster.yaml").write_text(f"""
name: hand
node_types:
  - {{name: fast, gpu: {_gpu("A100-80GB", memory_gib[0], mbw)}, gpus_per_node: {gpn}, count: {counts[0]},
      intra_node_gb_per_s: {bw[0]}, inter_node_gb_per_s: {bw[1]}, usd_per_hour: {prices[0]}, billing: {billing[0]}}}
  - {{name: slow, gpu: {_gpu("A10", memory_gib[1], mbw)}, gpus_per_node: {gpn}, count: {counts[1]},
      intra_node_gb_per_s: {(slow_bw or bw)[0]}, inter_node_gb_per_s: {(slow_bw or bw)[1]}, usd_per_hour: {prices[1]}, billing: {billing[1]}}}
""" + (f"""  - {{name: mid, gpu: {_gpu("L40S", memory_gib[2], mbw)}, gpus_per_node: {gpn}, count: 1, intra_node_gb_per_s: 50,
      inter_node_gb_per_s: 5, usd_per_hour: 3.0}}
""" if third else ""))
    (tmp / "model.yaml").write_text(f"""
name: hand-gpt
arch: gpt
num_layers: {layers}
hidden_size: 64
ffn_hidden_size: 256
num_attention_heads: 4
vocab_size: {vocab}
seq_length: 32
""")
    prof = tmp / "profiles"
    prof.mkdir(exist_ok=True)
    rows = ["# format: native", "# origin: hand-written test profile",
            "model,gpu,tp,micro_batch_size,seq_length,kind,fwd_ms,bwd_ms,attn_core_fwd_ms"]
    mid = ((fast_ms[0] + slow_ms[0]) / 2, (fast_ms[1] + slow_ms[1]) / 2)
    for gpu, (f, b) in (("A100-80GB", fast_ms), ("A10", slow_ms), ("L40S", mid)):
        for tp, mbs in itertools.product(PROFILED_TPS, PROFILED_MBS):  # profiled, so inside the default space
            rows += [f"hand-gpt,{gpu},{tp},{mbs},32,embedding,0,0,0",
                     f"hand-gpt,{gpu},{tp},{mbs},32,block,{f * mbs / tp!r},{b * mbs / tp!r},0",
                     f"hand-gpt,{gpu},{tp},{mbs},32,head,0,0,0"]
    (prof / "hand.csv").write_text("\n".join(rows) + "\n")
    return InstanceSpec(cluster=str(tmp / "cluster.yaml"), model=str(tmp / "model.yaml"), profiles=str(prof),
                        global_batch_size=4)


FIX = {"tp": 1, "dp": 1, "mbs": 1, "recompute": "none", "schedule": "1f1b"}


def _realism(draw) -> dict:
    """Bandwidth (near infinite, or hops and reductions comparable to stage time), optimizer
    memory speed, and per-node or per-GPU billing of the first two node types."""
    return dict(bw=draw(st.sampled_from(((HUGE_BW, HUGE_BW),) + COMPARABLE_BW)),
                billing=(draw(st.sampled_from(["node", "gpu"])), draw(st.sampled_from(["node", "gpu"]))),
                memory_gb_per_s=draw(st.sampled_from([None, SLOW_MEMORY_GB_PER_S])))


OBJECTIVES = ["min-time", "min-cost", "min-cost-loose", "min-cost-on-limit", "budget-h", "budget-step",
              "budget-step-on-limit"]


@st.composite
def small_instances(draw):
    """Up to 3 node types (the third: L40S), 1-4 GPUs per node (up to 20 GPUs), up to 12 layers, free tp/dp/mbs/pp,
    recompute and schedule: every global choice the planner enumerates; realistic transfers,
    per-GPU billing, limits exactly on a plan's value, and loose min-cost limits (pp = 1 wins)."""
    layers = draw(st.integers(2, 12))
    f = draw(st.sampled_from([0.5, 1.0, 1.5, 2.0]))
    slow = draw(st.sampled_from([1.0, 1.5, 2.5]))  # slow / fast speed ratio
    gpn = draw(st.sampled_from([1, 2, 4]))
    counts = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    prices = (draw(st.sampled_from([4.0, 8.0])), draw(st.sampled_from([1.0, 2.0, 6.0])))
    third = draw(st.booleans())
    gbs = draw(st.sampled_from([2, 4, 8]))
    objective = draw(st.sampled_from(OBJECTIVES))
    flash = draw(st.booleans())  # without flash attention selective recompute is in the space
    return dict(layers=layers, fast_ms=(f, 2 * f), slow_ms=(f * slow, 2 * f * slow), gpn=gpn, counts=counts,
                prices=prices, third=third, **_realism(draw)), gbs, objective, flash


def limits_for(objective: str, fastest) -> Limits:
    """Limits for a random instance, given brute force's fastest plan: off round numbers, on
    a plan's exact value ("-on-limit": that plan must be found), or so loose that the
    cheapest plan is a single stage."""
    t, usd = fastest.predicted.step_time_s, fastest.predicted.usd_per_step
    return {"min-cost": Limits("min-cost", time_limit_s=t * 1.613),
            "min-cost-loose": Limits("min-cost", time_limit_s=t * 50),
            "min-cost-on-limit": Limits("min-cost", time_limit_s=t),
            "budget-h": Limits(budget_usd_per_hour=6.37),
            "budget-step": Limits(budget_usd_per_step=6.37 * t * 1.47 / 3600),
            "budget-step-on-limit": Limits(budget_usd_per_step=usd)}.get(objective, Limits())


def assert_agrees(inst, res, ref, limits) -> None:
    """Brute force is exhaustive: no backend may beat it, and the gap a backend reports must
    cover its distance to brute force (so `optimal` is within driver.PROOF_TOL of it). The
    plan meets every limit by the cost model's own numbers."""
    assert (res.plan is None) == (ref.plan is None), (res.status, ref.status)
    if res.status in ("optimal", "infeasible"):   # every config settled: the Solver line's counts add up
        assert res.configs_examined == res.configs_total, res
    if ref.plan is None:
        assert res.status == ref.status
        return
    assert check.check_plan(inst, res.plan) == [] and limits.admit(res.plan)
    got = objective_of(res.plan, limits)
    assert got == res.objective and res.best_bound <= got
    assert ref.objective * (1 - 1e-9) <= got <= ref.objective + res.gap * got + 1e-15, (got, ref.objective, res.gap)
    assert res.best_bound <= ref.objective * (1 + 1e-9)  # the bound is a bound
    if res.status == "optimal":
        assert got <= ref.objective * (1 + PROOF_TOL)


# The random brute-force cross-checks (here, test_bounds.py and test_trust.py) draw this many times
# their base number of examples; the base keeps `pytest -n 2` under 10 minutes on 2 busy cores.
# MILP_PLAN_EXAMPLES=2 gives the counts of before (15, 12 and 4 here), more for a longer hunt
# (with MILP_PLAN_HYPOTHESIS=random for fresh examples each run: tests/conftest.py).
EXAMPLES = int(os.environ.get("MILP_PLAN_EXAMPLES", "1"))


@st.composite
def small_free_instances(draw):
    """Free mode's space grows with the per-stage choices, so smaller draws than in Megatron
    mode: up to 3 node types, 1-2 GPUs per node (up to 6 GPUs), up to 6 layers, GPU memory
    that may bind (then tp, dp and recompute differ between the best stages)."""
    layers = draw(st.integers(2, 6))
    f = draw(st.sampled_from([0.5, 1.0]))
    slow = draw(st.sampled_from([1.0, 1.5, 2.5]))
    memory = tuple(draw(st.sampled_from([None, 0.0024, 0.003, 0.004])) for _ in range(3))
    return dict(layers=layers, fast_ms=(f, 2 * f), slow_ms=(f * slow, 2 * f * slow), gpn=draw(st.sampled_from([1, 2])),
                counts=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                prices=(draw(st.sampled_from([4.0, 8.0])), draw(st.sampled_from([1.0, 2.0, 6.0]))),
                third=draw(st.booleans()), memory_gib=memory, **_realism(draw)), \
        draw(st.sampled_from([2, 4])), draw(st.sampled_from(OBJECTIVES)), draw(st.booleans())


@st.composite
def issue_scale_free_instances(draw):
    """The largest draws the issue names, in free mode: 3 node types, up to 16 GPUs (4 a
    node, the third type one node), 8-12 layers. Brute force stays at seconds with pp = 2
    and no recompute pinned (both sides get the same --fix); tp, dp and the micro-batch
    stay free per stage, with every objective."""
    layers = draw(st.integers(8, 12))
    f = draw(st.sampled_from([0.5, 1.0]))
    slow = draw(st.sampled_from([1.0, 1.5, 2.5]))
    memory = tuple(draw(st.sampled_from([None, 0.003, 0.004])) for _ in range(3))
    return dict(layers=layers, fast_ms=(f, 2 * f), slow_ms=(f * slow, 2 * f * slow), gpn=draw(st.sampled_from([2, 4])),
                counts=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                prices=(draw(st.sampled_from([4.0, 8.0])), draw(st.sampled_from([1.0, 2.0, 6.0]))),
                third=True, memory_gib=memory, **_realism(draw)), \
        draw(st.sampled_from([4, 8])), draw(st.sampled_from(OBJECTIVES))
