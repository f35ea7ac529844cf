"""Exact planning: hand-derived optima on every backend, and brute-force cross-checks.

Every test that solves also checks the plan with the solver-independent checker and
recomputes its objective from the plan alone (predict.evaluate via objective_of).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings

from milp_plan import check
from milp_plan.errors import InputError
from milp_plan.job import Limits
from milp_plan.formulations.space import parse_fix
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.solvers import bruteforce
from milp_plan.result import objective_of
from milp_plan.deadline import Deadline
from milp_plan.solvers.driver import solve
from instances import (BACKENDS, EXAMPLES, FIX, assert_agrees, issue_scale_free_instances, limits_for,
                       small_free_instances, small_instances, write_instance)


def solve_checked(inst, limits, backend, fix=FIX):
    res = bruteforce.solve(inst, limits, fix=fix) if backend == "brute-force" else \
        solve(inst, limits, backend=backend, fix=fix, time_limit_s=30)
    assert res.status == "optimal", res.status
    assert check.check_plan(inst, res.plan) == []
    assert objective_of(res.plan, limits) == pytest.approx(res.objective, rel=1e-12)
    return res


@pytest.mark.parametrize("backend", BACKENDS + ("brute-force",))
def test_hand_derived_min_time(tmp_path, backend):
    # L = 4 layers, m = 4 micro-batches (global batch 4, mbs 1, dp 1), t = f + b per layer:
    # fast 3 ms, slow 6 ms; 1F1B: T = (m - 1) max_s t_s + sum_s t_s.
    #   pp=1 fast [4]:            3*12 + 12 = 48
    #   pp=2 fast,fast [2,2]:     3*6  + 12 = 30   <- optimum
    #   pp=2 fast,slow [3,1]:     3*9  + 15 = 42
    #   pp=3 fast,fast,slow [2,1,1]: 3*6 + 15 = 33
    #   pp=4 f,f,s,s [1,1,1,1]:   3*6  + 18 = 36
    inst = build_instance(write_instance(tmp_path))
    res = solve_checked(inst, Limits(), backend)
    assert res.objective == pytest.approx(0.030, abs=2e-5)
    assert [(s.gpu, s.num_layers) for s in res.plan.stages] == [("A100-80GB", 2), ("A100-80GB", 2)]


@pytest.mark.parametrize("backend", BACKENDS + ("brute-force",))
def test_hand_derived_min_cost_under_time_limit(tmp_path, backend):
    # Same instance, fast node 8 $/h, slow node 2 $/h (a node with any used GPU is paid whole).
    # Under 65 ms/step: slow,slow [2,2] takes 3*12 + 24 = 60 ms at 2 $/h -> 2 * 0.060 / 3600 $/step,
    # cheaper than any plan touching the fast node (>= 8 $/h x 30 ms = 0.24/3600).
    inst = build_instance(write_instance(tmp_path))
    res = solve_checked(inst, Limits("min-cost", time_limit_s=0.065), backend)
    assert res.objective == pytest.approx(2 * 0.060 / 3600, rel=1e-3)
    assert {s.gpu for s in res.plan.stages} == {"A10"}
    assert res.plan.predicted.step_time_s <= 0.065


@pytest.mark.parametrize("backend", BACKENDS + ("brute-force",))
def test_hand_derived_budget_per_hour(tmp_path, backend):
    # Budget 5 $/h excludes the fast node: best slow-only plan is pp=2 [2,2], 60 ms (pp=1: 3*24+24 = 96).
    inst = build_instance(write_instance(tmp_path))
    res = solve_checked(inst, Limits(budget_usd_per_hour=5.0), backend)
    assert res.objective == pytest.approx(0.060, abs=2e-5)
    assert res.plan.predicted.usd_per_hour == pytest.approx(2.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_infeasible_time_limit(tmp_path, backend):
    # Nothing beats 30 ms, so a 20 ms limit has no plan.
    inst = build_instance(write_instance(tmp_path))
    res = solve(inst, Limits("min-cost", time_limit_s=0.020), backend=backend, fix=FIX)
    assert res.status == "infeasible" and res.plan is None


@pytest.mark.parametrize("mode", ["megatron", "free"])
def test_configs_are_solved_in_the_order_of_their_full_bounds(monkeypatch, mode):
    """Best-first: a config popped at its cheap bound whose full bound passes the next entry of
    the heap goes back at it (driver._solve), so the bounds configs are solved from never fall
    (every later entry of the heap is at least the one popped). On two-type-32 (GPT-3 6.7B, batch
    256), when each config was solved at once after its full bound, the bound fell between two
    solves 10 times in Megatron mode (2.5995 -> 2.4616 s first) and 11 in free mode; the proof
    took 21 solves and 1.39 work units in Megatron mode, now 15 and 1.21 (free: 5.54 -> 5.36)."""
    from milp_plan.solvers import driver
    inst = build_instance(InstanceSpec(cluster="two-type-32", model="gpt3-6.7b", global_batch_size=256))
    lbs = []
    solve_config = driver._solve_config

    def recorded(coef, limits, backend, cutoff, hint, dl, seed, lb, trace=None):
        if (coef.cfg.uniform is None) == (mode == "free"):   # free mode: not its Megatron-mode start's
            lbs.append(lb)
        return solve_config(coef, limits, backend, cutoff, hint, dl, seed, lb, trace)
    monkeypatch.setattr(driver, "_solve_config", recorded)
    r = solve(inst, Limits(), mode=mode, dl=Deadline(600.0, work=30.0))
    assert r.status == "optimal" and len(lbs) > 10
    assert all(b >= a * (1 - 1e-9) for a, b in zip(lbs, lbs[1:])), lbs


@pytest.mark.parametrize("objective", ["min-time", "min-cost"])
def test_the_configs_of_a_search_add_up_and_none_ruled_out_has_a_plan(tmp_path, objective):
    """What became of each config (result.SolveResult's counts): solved, pruned by
    a bound, ruled out by a bound (no plan fits memory and the limits) or, in free mode, opened
    into its stage sizes; at the proof they add up to the total (the Solver line printed "623
    pruned" of 10,214 where 9,501 more were ruled out). Brute force checks the ruled-out ones:
    no more than the configs without an admitted plan. Cut short by work, the rest is left
    open, and the line says how many. The warm-start heuristic's counts add up too."""
    from milp_plan.formulations.space import enumerate_configs
    from milp_plan.report import configs_line
    spec = write_instance(tmp_path, layers=6, fast_ms=(1.0, 2.0), slow_ms=(2.0, 4.0), gpn=2, counts=(2, 1),
                          memory_gib=(None, 0.004, None))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    limits = limits_for(objective, bruteforce.solve(inst, Limits()).plan)
    configs = list(enumerate_configs(inst))
    without = sum(not any(limits.admit(p) for p in bruteforce.candidate_plans(inst, c)) for c in configs)
    r = solve(inst, limits)
    assert r.status == "optimal" and r.configs_total == len(configs) == r.configs_examined
    assert r.configs_solved >= 1 and r.configs_opened == 0 and r.configs_ruled_out <= without
    assert r.configs_ruled_out > 0 or objective == "min-time"   # under the time limit most configs are too slow
    ruled = f", {r.configs_ruled_out} ruled out (no plan fits memory and the limits)" if r.configs_ruled_out else ""
    assert configs_line(r) == (f"{r.configs_solved} of {r.configs_total} configurations solved, {r.configs_pruned} "
                               f"pruned by bounds{ruled}")
    free = solve(inst, limits, mode="free")
    assert free.status == "optimal" and free.configs_opened > 0 and free.configs_examined == free.configs_total
    short = solve(inst, limits, mode="free", dl=Deadline(600.0, work=0.05))
    left = short.configs_total - short.configs_examined
    assert left > 0 and configs_line(short).endswith(f", {left} left open")
    # the warm-start heuristic stops at the first config whose cheap bound reaches its best plan:
    # the rest are pruned by bounds, not left open
    from milp_plan import planners
    heur = planners.get("warm-start").plan(inst, limits, Deadline(600.0, work=30.0))
    assert heur.plan is not None and heur.configs_examined == heur.configs_total == len(configs)
    assert heur.configs_pruned > 0 and heur.configs_ruled_out <= without


def test_brute_force_refuses_large_instances():
    # the refusal counts candidates in closed form (count_type_sequences), never enumerating them
    inst = build_instance(InstanceSpec(cluster="mixed-128", model="gpt3-13b"))
    with pytest.raises(InputError, match="brute force would enumerate"):
        bruteforce.solve(inst, Limits())


def test_brute_force_keeps_one_instance_s_candidates_and_answers_as_a_fresh_enumeration(tmp_path, monkeypatch):
    """bruteforce.config_plans keeps the evaluated candidates of the last instance only. The hand
    instance of test_hand_derived_min_cost_under_time_limit and the same with the slow type 4x
    slower: under 65 ms/step the first rents the slow node alone, the second cannot (its slow
    layers take 24 ms each), so candidates kept across the two would change an answer."""
    for name in "ab":
        (tmp_path / name).mkdir()
    fast = build_instance(write_instance(tmp_path / "a"))
    slow = build_instance(write_instance(tmp_path / "b", slow_ms=(8.0, 16.0)))
    limits = (Limits(), Limits("min-cost", time_limit_s=0.065))

    def answers():   # and the fast one at pp 2, its layers pinned 1 + 3 (its optimum: 3 + 1), and not
        return [(r.objective, [(s.gpu, s.num_layers) for s in r.plan.stages])
                for r in [bruteforce.solve(i, lim) for i in (fast, slow, fast) for lim in limits] +
                [bruteforce.solve(fast, Limits(), fix={"pp": 2, "layers": (1, 3)}),
                 bruteforce.solve(fast, Limits(), fix={"pp": 2})]]
    kept = answers()
    cfg = bruteforce.solved_configs(fast)[0]
    assert bruteforce.config_plans(fast, cfg) is bruteforce.config_plans(fast, cfg)
    monkeypatch.setattr(bruteforce, "KEPT_PLANS", 0)   # nothing kept: every solve enumerates
    assert kept == answers()
    assert {g for g, _ in kept[1][1]} == {"A10"} and "A10" not in {g for g, _ in kept[3][1]}
    assert [n for _, n in kept[6][1]] == [1, 3] and [n for _, n in kept[7][1]] == [3, 1]


def test_plans_share_their_instance_s_inputs_record_and_write_a_copy(tmp_path):
    inst = build_instance(write_instance(tmp_path))
    plan = bruteforce.solve(inst, Limits()).plan
    assert plan.inputs is inst.inputs_record()
    written = plan.to_dict()
    written["inputs"]["model"]["name"] = "changed"
    assert inst.inputs_record()["model"]["name"] != "changed"


@pytest.mark.parametrize("mode", ["megatron", "free"])
@pytest.mark.parametrize("third", [False, True])
@pytest.mark.parametrize("gpn", [1, 2, 4])
def test_option_sequence_count_matches_enumeration(tmp_path, third, gpn, mode):
    from milp_plan.formulations.space import stage_options
    inst = build_instance(write_instance(tmp_path, layers=8 if mode == "megatron" else 4, gpn=gpn, counts=(2, 2),
                                         third=third))
    configs = bruteforce.solved_configs(inst, mode=mode)
    assert configs
    for cfg in configs[::7 if mode == "free" else 1]:
        opts = stage_options(inst, cfg)
        assert bruteforce.count_option_sequences(inst, cfg, opts) == \
            sum(1 for _ in bruteforce.option_sequences(inst, cfg, opts))


# ---- random small instances: every backend agrees with brute force ----------------------

@settings(max_examples=8 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(small_instances())
# found by a longer hunt (MILP_PLAN_EXAMPLES=8, random): HiGHS with its presolve returned a
# non-optimal "optimal" solution of a min-cost config model (backends.HIGHS_OPTIONS)
@example(({"layers": 8, "fast_ms": (0.5, 1.0), "slow_ms": (0.75, 1.5), "gpn": 1, "counts": (2, 2), "prices": (4.0, 1.0),
           "third": False, "bw": (1e9, 1e9), "billing": ("node", "node"), "memory_gb_per_s": None}, 4, "min-cost",
          False))
def test_backends_agree_with_brute_force(tmp_path_factory, case):
    kw, gbs, objective, flash = case
    tmp = tmp_path_factory.mktemp("inst")
    spec = write_instance(tmp, **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs, "flash_attention": flash}))
    from milp_plan.formulations.space import enumerate_configs
    # keep brute force to seconds: at most 20,000 candidate plans (~1 ms each)
    assume(sum(bruteforce.count_candidates(inst, c) for c in enumerate_configs(inst)) <= 20_000)
    fastest = bruteforce.solve(inst, Limits()).plan
    limits = limits_for(objective, fastest)
    ref = bruteforce.solve(inst, limits)
    for backend in BACKENDS:
        assert_agrees(inst, solve(inst, limits, backend=backend, time_limit_s=60), ref, limits)


@pytest.mark.parametrize("objective", ["min-time", "budget-step"])
def test_fixed_gpipe_agrees_with_brute_force(tmp_path, objective):
    """GPipe (two flow shops: zf, zb) is searched only with --fix; its step-time family in
    the model must still equal predict.evaluate on the chosen plan."""
    schedule = "gpipe"
    spec = write_instance(tmp_path, layers=6, fast_ms=(1.0, 3.0), slow_ms=(2.5, 4.0), gpn=2, counts=(2, 1),
                          third=True)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 8}))
    fix = {"schedule": schedule}
    fastest = bruteforce.solve(inst, Limits(), fix=fix).plan
    limits = limits_for(objective, fastest)
    ref = bruteforce.solve(inst, limits, fix=fix)
    for backend in BACKENDS:
        res = solve(inst, limits, backend=backend, fix=fix, time_limit_s=60)
        assert ref.status == "optimal" and res.plan.schedule == schedule
        assert_agrees(inst, res, ref, limits)


def test_selective_recompute_is_dominated_under_flash_attention(tmp_path):
    # flash attention never stores the s^2 terms, so selective saves nothing and costs the
    # attention-core recompute: the search leaves it out, and pinning it gives a worse optimum
    from milp_plan.formulations.space import enumerate_configs
    spec = write_instance(tmp_path, layers=4)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "flash_attention": True}))
    assert {c.uniform.recompute for c in enumerate_configs(inst)} == {"none", "full"}
    best = bruteforce.solve(inst, Limits()).objective
    assert bruteforce.solve(inst, Limits(), fix={"recompute": "selective"}).objective >= best
    no_flash = build_instance(InstanceSpec(**{**spec.__dict__, "flash_attention": False}))
    assert {c.uniform.recompute for c in enumerate_configs(no_flash)} == {"none", "selective", "full"}


def test_zb_h1_is_refused_in_megatron_mode(tmp_path):
    inst = build_instance(write_instance(tmp_path))
    with pytest.raises(InputError, match="zero-bubble fork"):
        solve(inst, Limits(), fix={"schedule": "zb-h1"})
    with pytest.raises(InputError, match="verify PLAN --schedule zb-h1"):
        bruteforce.solve(inst, Limits(), fix=parse_fix("schedule=zb-h1"))


def test_cli_solve_default_is_deterministic(tmp_path):
    """`milp-plan solve` with no arguments prints a plan; the same inputs and seed give identical bytes."""
    exe = Path(sys.executable).parent / "milp-plan"
    outs = []
    for i in range(2):
        out = tmp_path / f"plan{i}.json"
        r = subprocess.run([str(exe), "solve", "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "Step time" in r.stdout and "optimal" in r.stdout
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    plan = json.loads(outs[0])
    # the gap is the integer model's rounding, honestly reported (driver.PROOF_TOL)
    assert plan["solver"]["status"] == "optimal" and 0.0 <= plan["solver"]["gap"] <= 1e-6


def test_cli_infeasible_exit_1_with_diagnosis(tmp_path):
    exe = Path(sys.executable).parent / "milp-plan"
    out = tmp_path / "plan.json"
    out.write_text("previous")
    r = subprocess.run([str(exe), "solve", "--objective", "min-cost", "--time-limit", "10ms/step", "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1
    assert "fastest plan takes" in r.stderr and "Traceback" not in r.stderr
    # the fix, with a limit that admits the fastest plan (1.306 s/step, Megatron mode)
    assert "(proven)" in r.stderr and "raise --time-limit to 1.306s/step or more" in r.stderr, r.stderr
    assert "--mode free" in r.stderr
    assert out.read_text() == "previous"  # a failed run overwrites nothing


def test_a_time_limit_diagnosis_says_what_is_proven_and_the_limit_to_give():
    """solve._too_slow on the fastest plan's result: proven (status optimal), or the fastest
    found with the bound the search proved (status feasible: a diagnosis cut short); the
    --time-limit it suggests is the plan's step rounded up, and free mode only from Megatron mode."""
    import dataclasses
    from milp_plan.job import Objective
    from milp_plan.solve import _too_slow
    inst = build_instance(InstanceSpec())
    fastest = solve(inst, Limits(), time_limit_s=60)
    assert fastest.status == "optimal"
    said = _too_slow(inst, 1.2, fastest)
    assert said.startswith("the fastest plan takes 1.306 s/step (proven), more than the --time-limit 1.200 s/step")
    assert "raise --time-limit to 1.306s/step or more, or try --mode free" in said
    cut = dataclasses.replace(fastest, status="feasible", best_bound=1.25)
    said = _too_slow(build_instance(InstanceSpec(), Objective(mode="free")), 1.2, cut)
    assert said.startswith("the fastest plan found takes 1.306 s/step (none is faster than 1.250 s/step, proven)")
    assert said.endswith("raise --time-limit to 1.306s/step or more")


def test_cli_mission_command_on_the_default(tmp_path):
    """README's first contact: `milp-plan solve --objective min-cost --time-limit 1.4s/step` then
    `milp-plan verify plan.json`, on the shipped default (GPT-3 2.7B, global batch 80, on 2 x 8
    A100-80GB at 40.966 $/node-h + 2 x 8 A10 at 16.288 $/node-h, billed by the node). The plan
    keeps the limit, rents fewer than the 32 GPUs, costs (sum of the rented nodes' $/h) x step /
    3600, and the limit binds: a plan on one node (pp 1, dp 8) is cheaper per step but slower
    than 1.4 s, so without the limit min-cost would choose differently. `--max-solve-time` is
    only a guard: with one worker the search runs to its proof, whatever the machine's load."""
    exe = Path(sys.executable).parent / "milp-plan"
    guard = ["--max-solve-time", "600s"]
    r = subprocess.run([str(exe), "solve", "--objective", "min-cost", "--time-limit", "1.4s/step", *guard],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["solver"]["status"] == "optimal"
    pred = plan["predicted"]
    assert pred["step_time_s"] <= 1.4
    devices = [(d["node"], d["local_gpu"]) for st in plan["stages"] for d in st["devices"]]
    assert len(devices) == len(set(devices)) < 32
    prices = [nt["usd_per_hour"] for nt in plan["inputs"]["cluster"]["definition"]["node_types"]
              for _ in range(nt["count"])]          # node index -> $/node-h, in the cluster's order
    assert prices == [40.966, 40.966, 16.288, 16.288]
    rent = sum(prices[n] for n in {n for n, _ in devices})   # billing: node
    assert pred["usd_per_hour"] == pytest.approx(rent, rel=1e-12)
    assert pred["usd_per_step"] == pytest.approx(rent * pred["step_time_s"] / 3600, rel=1e-9)
    # the limit binds: the fastest plan on one node (8 GPUs, one stage) is cheaper and too slow
    one = subprocess.run([str(exe), "solve", "--fix", "tp=1,pp=1,dp=8", "--json", "--out", "-", *guard],
                         capture_output=True, text=True, cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    alone = json.loads(one.stdout)["predicted"]
    assert alone["step_time_s"] > 1.4 and alone["usd_per_step"] < pred["usd_per_step"]
    v = subprocess.run([str(exe), "verify", "plan.json"], capture_output=True, text=True, cwd=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "Checks: all rules pass" in v.stdout and v.stdout.rstrip().endswith("PASS")


@pytest.mark.parametrize("fix, message", [
    ({"tp": 3}, "tp=3 must divide the 32 attention heads"),
    ({"tp": 16}, "exceeds the largest node (8 GPUs)"),
    ({"pp": 100}, "pp=100 exceeds the model's 32 layers"),
    ({"dp": 7}, "dp=7 does not divide the global batch 80"),
    ({"tp": 8, "pp": 8, "dp": 8}, "512 GPUs but the cluster has 32"),
])
def test_an_impossible_fix_names_the_broken_rule(fix, message):
    inst = build_instance(InstanceSpec())
    with pytest.raises(InputError, match=re.escape(message)):
        solve(inst, Limits(), fix=fix)


# ---- --mode free: tp, dp and recompute per stage ------------------------------------------

def free_recompute_instance(tmp: Path):
    """4 layers, global batch 4, fast node of 2 A100s (t = 1 + 2 = 3 ms a layer), slow node of
    2 A10s at 10 + 20 ms a layer (never worth a stage), both GPUs with 2180 KiB usable."""
    from milp_plan.units import GIB
    usable_kib = 2180
    memory_gib = usable_kib * 1024 / GIB / 0.9  # the default headroom keeps 10% free
    spec = write_instance(tmp, layers=4, slow_ms=(10.0, 20.0), memory_gib=(memory_gib, memory_gib, None))
    return build_instance(spec), usable_kib


@pytest.mark.parametrize("backend", BACKENDS + ("brute-force",))
def test_hand_derived_free_mode_recomputes_only_where_memory_binds(tmp_path, backend):
    # Pinned tp=1, dp=1, mbs=1 (m = 4), 1F1B: T = (m - 1) max_s t_s + sum_s t_s. Full recompute of
    # r layers adds r forwards (1 ms each) to a stage's backward. Memory per GPU (asserted below
    # from the cost model): stage 0 of 2 holds 2 micro-batches in flight, stage 1 one.
    #   pp=2 [2,2], stage 0 r=0: 2213 KiB > 2180   (must recompute)
    #   pp=2 [2,2], stage 0 r=1: 2153 KiB <= 2180; stage 1 r=0: 2064 KiB <= 2180
    # Megatron mode (one r for all stages): [2,2] with r=1 twice: t = 7, 7 -> 3*7 + 14 = 35 ms;
    #   pp=1 [4] needs recompute of most layers (>= 3*16 + 16 = 64), [1,3] and [3,1] need more
    #   recompute on their 3-layer stage (>= 3*10 + 13), any slow stage costs >= 30 ms a layer.
    # Free mode: [2,2] with stage 0 r=1 (f 2, b 5), stage 1 r=0 (f 2, b 4): the closed form says
    #   3*7 + 13 = 34 ms, the simulation (the step proven) 33 ms  <- optimum:
    #   rank 0: F0 [0,2] F1 [2,4] B0 [8,13] F2 [13,15] B1 [15,20] F3 [20,22] B2 [22,27] B3 [28,33]
    #   rank 1: F0 [2,4] B0 [4,8] F1 [8,10] B1 [10,14] F2 [15,17] B2 [17,21] F3 [22,24] B3 [24,28]
    # (Megatron mode's equal stages simulate at the closed form's 35 ms.)
    from milp_plan import costmodel as cm
    inst, usable_kib = free_recompute_instance(tmp_path)

    def kib(stage, r):
        return sum(cm.stage_memory_bytes(inst, schedule="1f1b", pp=2, stage=stage, m=4, vpp=1, kinds=["block"] * 2,
                                         tp=1, dp=1, mbs=1, sequence_parallel=False, distributed_optimizer=False,
                                         recompute="full" if r else "none", recompute_layers=r)[:4]) / 1024
    assert kib(0, 0) > usable_kib >= kib(0, 1) and kib(1, 0) <= usable_kib
    fix = {"tp": 1, "dp": 1, "mbs": 1, "schedule": "1f1b"}
    if backend == "brute-force":
        free = bruteforce.solve(inst, Limits(), fix=fix, mode="free")
        megatron = bruteforce.solve(inst, Limits(), fix=fix, mode="megatron")
    else:
        free = solve(inst, Limits(), backend=backend, fix=fix, mode="free")
        megatron = solve(inst, Limits(), backend=backend, fix=fix, mode="megatron")
    assert megatron.objective == pytest.approx(0.035, abs=2e-5)
    assert free.status == "optimal" and free.objective == pytest.approx(0.033, abs=2e-5)
    plan = free.plan
    assert check.check_plan(inst, plan) == [] and plan.mode == "free"
    assert objective_of(plan, Limits()) == pytest.approx(free.objective, rel=1e-12)
    assert [(s.gpu, s.num_layers, s.recompute, s.recompute_layers) for s in plan.stages] == \
        [("A100-80GB", 2, "full", 1), ("A100-80GB", 2, "none", 0)]
    assert plan.to_dict()["needs_per_stage_runtime"] and not plan.to_dict()["megatron_compatible"]


@settings(max_examples=6 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(small_free_instances())
def test_free_mode_backends_agree_with_brute_force(tmp_path_factory, case):
    kw, gbs, objective, flash = case
    spec = write_instance(tmp_path_factory.mktemp("inst"), **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs, "flash_attention": flash}))
    assume(sum(bruteforce.count_candidates(inst, c) for c in bruteforce.solved_configs(inst, mode="free")) <= 20_000)
    fastest = bruteforce.solve(inst, Limits(), mode="free")
    assume(fastest.plan is not None)
    limits = limits_for(objective, fastest.plan)
    ref = bruteforce.solve(inst, limits, mode="free")
    uniform = bruteforce.solve(inst, limits, mode="megatron")
    if uniform.plan is not None:  # Megatron-mode plans are free plans too
        assert ref.objective <= uniform.objective * (1 + 1e-9)
    for backend in BACKENDS:
        res = solve(inst, limits, backend=backend, mode="free", time_limit_s=60)
        assert_agrees(inst, res, ref, limits)
        assert res.plan is None or res.plan.mode == "free"


@settings(max_examples=2 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(issue_scale_free_instances())
@example(({"layers": 12, "fast_ms": (1.0, 2.0), "slow_ms": (2.5, 5.0), "gpn": 4, "counts": (2, 1), "prices": (8.0, 2.0),
           "third": True, "memory_gib": (0.004, 0.003, None)}, 4, "min-cost"))  # 16 GPUs, 12 layers
@example(({"layers": 11, "fast_ms": (0.5, 1.0), "slow_ms": (0.75, 1.5), "gpn": 4, "counts": (1, 2), "prices": (4.0, 1.0),
           "third": True, "memory_gib": (None, 0.003, 0.004)}, 8, "budget-step"))
# found by a longer hunt (MILP_PLAN_EXAMPLES=6, random): CBC with its cutting planes called a plan 3.2%
# dearer than brute force's optimal (backends.CBC_OPTIONS)
@example(({"layers": 12, "fast_ms": (0.5, 1.0), "slow_ms": (1.25, 2.5), "gpn": 4, "counts": (1, 1), "prices": (8.0, 1.0),
           "third": True, "memory_gib": (None, None, 0.003), "bw": (0.05, 0.005), "billing": ("gpu", "gpu"),
           "memory_gb_per_s": 1.0}, 4, "min-cost"))
def test_free_mode_agrees_with_brute_force_at_the_issue_scale(tmp_path_factory, case):
    kw, gbs, objective = case
    spec = write_instance(tmp_path_factory.mktemp("inst"), **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs}))
    fix = {"pp": 2, "recompute": "none"}
    assume(sum(bruteforce.count_candidates(inst, c, fix) for c in bruteforce.solved_configs(inst, fix, "free"))
           <= 15_000)
    fastest = bruteforce.solve(inst, Limits(), fix=fix, mode="free")
    assume(fastest.plan is not None)
    limits = limits_for(objective, fastest.plan)
    ref = bruteforce.solve(inst, limits, fix=fix, mode="free")
    for backend in BACKENDS:
        res = solve(inst, limits, backend=backend, fix=fix, mode="free", time_limit_s=60)
        assert_agrees(inst, res, ref, limits)
        assert res.plan is None or res.plan.mode == "free"


def test_cli_free_mode_is_deterministic_and_says_it_needs_a_per_stage_runtime(tmp_path):
    """The hand instance above through the CLI: the same inputs and seed give identical bytes."""
    free_recompute_instance(tmp_path)
    exe = Path(sys.executable).parent / "milp-plan"
    args = [str(exe), "solve", "--mode", "free", "--cluster", str(tmp_path / "cluster.yaml"), "--model",
            str(tmp_path / "model.yaml"), "--profiles", str(tmp_path / "profiles"), "--global-batch", "4",
            "--fix", "tp=1,dp=1,mbs=1,schedule=1f1b"]
    outs = []
    for i in range(2):
        out = tmp_path / f"plan{i}.json"
        r = subprocess.run(args + ["--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "Needs a per-stage runtime" in r.stdout and "full x1" in r.stdout and "optimal" in r.stdout
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    plan = json.loads(outs[0])
    assert plan["mode"] == "free" and [s["recompute_layers"] for s in plan["stages"]] == [1, 0]


def test_free_mode_under_a_short_time_limit_returns_its_start_with_an_honest_gap():
    inst = build_instance(InstanceSpec(cluster="mixed-128", model="gpt3-13b", global_batch_size=512))
    res = solve(inst, Limits(), time_limit_s=1e-3, mode="free")  # honoured (issue 13): no plan yet
    assert res.wall_time_s < 0.5 and res.plan is None and res.status == "timeout"
    # a short deterministic limit (a wall-clock one found no plan on a loaded machine)
    res = solve(inst, Limits(), mode="free", dl=Deadline(1e9, work=2.0))
    assert res.plan is not None and res.plan.mode == "free" and res.status in ("feasible", "optimal")
    assert res.start == "Megatron-mode" and res.objective <= res.heuristic_objective
    assert res.best_bound <= res.objective and 0 <= res.gap <= 1
    assert check.check_plan(inst, res.plan) == []


def test_a_search_runs_without_full_collections_and_restores_the_thresholds(monkeypatch):
    """driver.solve raises gc's third threshold (no full collections: a search keeps millions of
    objects and makes no long-lived cycles) and restores all three after it, also when it raises;
    the young collections keep their thresholds."""
    import gc
    from milp_plan.solvers import driver
    before, seen = gc.get_threshold(), []

    def search(*args):
        seen.append(gc.get_threshold())
        if len(seen) > 1:
            raise KeyboardInterrupt
        return "answer"
    monkeypatch.setattr(driver, "_solve", search)
    assert driver.solve(None, Limits()) == "answer"
    assert seen[0][:2] == before[:2] and seen[0][2] >= driver.NO_FULL_COLLECTIONS > before[2]
    assert gc.get_threshold() == before
    with pytest.raises(KeyboardInterrupt):
        driver.solve(None, Limits())
    assert gc.get_threshold() == before
