"""`optimal` is a proof about the plan that is written (issues 12 and 21).

Each reproduction from the issues is a test here, with its instance written by the test:
the model is a relaxation of the cost model (no plan lost to rounding), every returned plan
meets every limit by the cost model's own numbers, tp groups never span nodes, and the
model's objective agrees with the cost model's within its documented rounding.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings

from milp_plan import check, predict
from milp_plan.deadline import Deadline
from milp_plan.errors import InternalError
from milp_plan.formulations import pipeline
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.formulations.pipeline import PipelineModel
from milp_plan.job import Limits
from milp_plan.formulations.space import enumerate_configs, stage_options
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.solvers import driver
from milp_plan.solvers.backends import make_backend
from milp_plan.result import objective_of
from milp_plan.solvers.driver import PROOF_TOL, solve
from test_bounds import config_optimum
from instances import COMPARABLE_BW, EXAMPLES, small_free_instances, small_instances, write_instance

BACKENDS = ("cpsat", "highs", "cbc")

RAND34_CLUSTER = """\
name: rand34
node_types:
- {name: t0-t4, gpu: T4, gpus_per_node: 2, count: 1, intra_node_gb_per_s: 300, inter_node_gb_per_s: 50,
   usd_per_hour: 1.891, billing: node}
- {name: t1-a10, gpu: A10, gpus_per_node: 4, count: 2, intra_node_gb_per_s: 64, inter_node_gb_per_s: 12.5,
   usd_per_hour: 5.42, billing: node}
"""
RAND34_MODEL = """\
name: m34
arch: gpt
num_layers: 8
hidden_size: 4096
ffn_hidden_size: 16384
num_attention_heads: 32
num_query_groups: 32
vocab_size: 32000
seq_length: 1024
"""


def _instance(tmp: Path, cluster: str, model: str, gbs: int, **spec):
    (tmp / "cluster.yaml").write_text(cluster)
    model_arg = model
    if "\n" in model:
        (tmp / "model.yaml").write_text(model)
        model_arg = str(tmp / "model.yaml")
    return build_instance(InstanceSpec(cluster=str(tmp / "cluster.yaml"), model=model_arg,
                                       global_batch_size=gbs, **spec))


def assert_admitted(inst, plan, limits: Limits) -> None:
    assert check.check_plan(inst, plan) == []
    assert limits.admit(plan), plan.predicted


# ---- issue 21 §1: a stage holding every layer was cut off by its own variable bounds ----------
@pytest.mark.parametrize("backend", BACKENDS)
def test_min_cost_finds_the_single_stage_plan(tmp_path, backend):
    """rand34 (issue 21): `--solver brute-force` finds 0.00376258 $/step (1F1B, one A10 stage
    of 8 layers, dp 4, 2.499 s at 5.42 $/h; with the fitted analytic constants of issue 20, was
    0.00373606 at 2.482 s before them); the models reported a dearer plan `optimal` (interleaved, two A10
    stages) because the reduction's and optimizer's upper bounds were the rounded value of all
    L layers plus one tick, below the model's own rounded sum."""
    inst = _instance(tmp_path, RAND34_CLUSTER, RAND34_MODEL, 64)
    limits = Limits("min-cost", time_limit_s=4.12773770899638)
    res = solve(inst, limits, backend=backend, time_limit_s=120)
    assert res.objective == pytest.approx(0.00376258, rel=2e-6)
    assert res.plan.pp == 1 and res.plan.stages[0].gpu == "A10" and res.plan.stages[0].dp == 4
    assert_admitted(inst, res.plan, limits)


def test_every_pp1_config_with_a_plan_is_feasible_in_the_model(tmp_path):
    """Of rand34's pp = 1 configs, each one whose heuristic finds a plan must be feasible
    in the model too (the audit: the model alone declared 670 of 2,413 such configs infeasible)."""
    from milp_plan.heuristics import warmstart
    inst = _instance(tmp_path, RAND34_CLUSTER, RAND34_MODEL, 64)
    limits = Limits("min-cost", time_limit_s=4.12773770899638)
    checked = 0
    for cfg in enumerate_configs(inst, {"pp": 1}):
        coef = Coefficients(inst, cfg)
        if not coef.options or warmstart.best_plan(coef, limits) is None:
            continue
        be = make_backend("cpsat")
        PipelineModel(coef, limits, be).build()
        assert be.solve(10, 1).status == "optimal", cfg.label()
        checked += 1
    assert checked >= 10


# ---- issue 21 §2: tp groups over nodes of one or two GPUs -------------------------------------
ONE_GPU_NODES = """\
name: rand26
node_types:
- {name: h100x1, gpu: H100-PCIe, gpus_per_node: 1, count: 4, intra_node_gb_per_s: 300, inter_node_gb_per_s: 25,
   usd_per_hour: 2.5, billing: node}
- {name: v100x4, gpu: V100-32GB, gpus_per_node: 4, count: 2, intra_node_gb_per_s: 150, inter_node_gb_per_s: 12.5,
   usd_per_hour: 6.0, billing: gpu}
"""
MIXED_SIZES = """\
name: t4h100
node_types:
- {name: t4x8, gpu: T4, gpus_per_node: 8, count: 1, intra_node_gb_per_s: 32, inter_node_gb_per_s: 12.5,
   usd_per_hour: 4.0, billing: node}
- {name: h100x4, gpu: H100-SXM, gpus_per_node: 4, count: 2, intra_node_gb_per_s: 450, inter_node_gb_per_s: 50,
   usd_per_hour: 16.0, billing: node}
"""


@pytest.mark.parametrize("cluster", [ONE_GPU_NODES, MIXED_SIZES])
@pytest.mark.parametrize("mode", ["megatron", "free"])
def test_no_stage_option_lets_a_tp_group_span_nodes(tmp_path, cluster, mode):
    inst = _instance(tmp_path, cluster, "gpt3-1.3b", 8)
    types = inst.cluster.node_types
    seen = 0
    for cfg in enumerate_configs(inst, mode=mode):
        for o in stage_options(inst, cfg):
            assert types[o.k].gpus_per_node % o.tp == 0, (cfg, o)
            seen += o.tp > 1
    assert seen  # tp > 1 is in the space, on the nodes that hold it


@pytest.mark.parametrize("cluster, gbs, fix", [(ONE_GPU_NODES, 8, {"tp": 2, "pp": 4}),
                                               (MIXED_SIZES, 1, {"tp": 8})])
def test_clusters_with_small_nodes_solve_without_a_checker_rejection(tmp_path, cluster, gbs, fix):
    """Issue 21: the first raised `the heuristic returned a plan the checker rejects ...
    [tp_within_node] stage 3: tp group 0 spans nodes [3, 4]`; the second (tp 8 fits only the
    8 x T4 node, Megatron mode checked tp against the largest node only) crashed in CP-SAT."""
    inst = _instance(tmp_path, cluster, "gpt3-1.3b", gbs)
    for limits in (Limits(), Limits("min-cost", time_limit_s=1e4)):
        res = solve(inst, limits, fix=fix, time_limit_s=60)
        assert res.plan is not None
        assert_admitted(inst, res.plan, limits)
        assert all(inst.cluster.node_types[0].gpus_per_node % st.tp == 0 or st.gpu != "H100-PCIe"
                   for st in res.plan.stages)


# ---- issue 21 §4 and 12 §1: limits hold exactly, and a plan on a limit is not lost -----------
# These reproduce the reports on the job they were filed against, the former default (GPT-3
# 6.7B, global batch 256, on clusters/default.yaml): pinned explicitly, so that a change of the
# shipped default job does not change what they test.
GUARD_S = 600.0  # a guard, not a limit: these solves prove their optimum in 5-20 s on 2 idle cores


@pytest.fixture(scope="module")
def issue21_inst():
    return build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))


@pytest.fixture(scope="module")
def issue21_prepared(issue21_inst):
    return driver.prepare(issue21_inst)


def test_a_plan_just_inside_the_time_limit_is_found(issue21_inst, issue21_prepared):
    """Issue 21 §4: at 7.91984 s/step the 7.91981 s plan (0.1802 $/step, closed form) was
    missed; a limit equal to the plan's own step time must find it too. Simulated (the step
    proven since issue 12 §3), with the fitted analytic constants (issue 20) and the tied
    embedding's all-reduce (issue 15) the optimum under 7.91984 s is a 7.78476 s plan at
    0.212394 $/step, A100, A10, A100 (CP-SAT and HiGHS agree; 6.45643 s at 0.205365 before the
    all-reduce, 7.89966 s at 0.179787 before the refit), and a limit on its own step time finds
    it again."""
    limits = Limits("min-cost", time_limit_s=7.91984)
    res = solve(issue21_inst, limits, prepared=issue21_prepared, time_limit_s=GUARD_S)
    assert res.status == "optimal" and res.plan.predicted.step_basis == "simulated"
    t = res.plan.predicted.step_time_s
    assert t == pytest.approx(7.78476, abs=1e-5) and res.objective == pytest.approx(0.212394, rel=1e-5)
    on_it = Limits("min-cost", time_limit_s=t)
    again = solve(issue21_inst, on_it, prepared=issue21_prepared, time_limit_s=GUARD_S)
    assert again.objective == res.objective and again.plan.predicted.step_time_s <= t
    assert_admitted(issue21_inst, again.plan, on_it)


def test_a_budget_below_a_plan_is_never_exceeded(issue21_inst, issue21_prepared):
    """Issue 12 §1: a budget 1e-4 below a plan's $/step returned that plan, over budget, as
    `optimal`. Just below the min-cost plan's $/step (here at the next float down) the result
    must cost strictly less."""
    cheapest = solve(issue21_inst, Limits("min-cost", time_limit_s=7.91984), prepared=issue21_prepared,
                     time_limit_s=GUARD_S).plan
    c = cheapest.predicted.usd_per_step
    for budget in (math.nextafter(c, 0.0), c * (1 - 1e-7)):
        limits = Limits("min-time", budget_usd_per_step=budget)
        # a min-time search under a $/step budget is not proven here in a test's time; whatever
        # it returns within 10 s (any status) must keep the budget, which is what broke
        res = solve(issue21_inst, limits, prepared=issue21_prepared, time_limit_s=10)
        if res.plan is not None:
            assert res.plan.predicted.usd_per_step <= budget
            assert_admitted(issue21_inst, res.plan, limits)
        assert res.status in ("optimal", "infeasible", "feasible", "timeout")


def test_the_gap_covers_rounding_and_optimal_means_within_the_proof_tolerance(issue21_inst, issue21_prepared):
    res = solve(issue21_inst, Limits(), prepared=issue21_prepared, time_limit_s=GUARD_S)
    assert res.status == "optimal" and 0.0 <= res.gap <= PROOF_TOL
    assert res.best_bound <= res.objective == objective_of(res.plan, Limits())


# ---- issue 12 §2: the model cannot drift from the cost model unnoticed ------------------------
@pytest.mark.parametrize("basis,message", [(predict.SIMULATED, "though it holds the plan's critical path"),
                                           (predict.CLOSED_FORM, "below the cost model")])
def test_a_drifting_model_term_is_an_internal_error(tmp_path, monkeypatch, basis, message):
    """The audit's mutation, hops counted at half their weight, must fail loudly. Two equal
    stages of 2 layers (3 ms a layer) on two 1-GPU nodes, one 0.8 ms hop (4 KiB at 0.005
    GB/s). Closed form: the window (t0 + t1 + 2 h) / 2 = 6.8 ms beats max t = 6 ms, so the
    mutated model prices (m - 1) x 0.8 ms less than the cost model. Simulated: every path
    crossing the hop is priced short, so the plan's critical path, once added, still leaves
    the model below the simulation."""
    if basis == predict.CLOSED_FORM:
        monkeypatch.setattr(predict, "STEP_SIM_MAX_OPERATIONS", 0)
    spec = write_instance(tmp_path, layers=4, fast_ms=(1.0, 2.0), gpn=1, counts=(2, 1), bw=COMPARABLE_BW[0])
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    fix = {"tp": 1, "dp": 1, "mbs": 1, "pp": 2, "schedule": "1f1b", "recompute": "none"}
    honest = solve(inst, Limits(), fix=fix)
    assert honest.status == "optimal" and [s.num_layers for s in honest.plan.stages] == [2, 2]
    orig = PipelineModel._scaled_hop
    monkeypatch.setattr(PipelineModel, "_scaled_hop", lambda self, s, factor: orig(self, s, factor // 2))
    with pytest.raises(InternalError, match=message):
        solve(inst, Limits(), fix=fix)


def test_resolution_fits_the_backend(issue21_inst):
    """min-time: CP-SAT at 1 ns ticks on the issue-21 job (GPT-3 6.7B, batch 256), HiGHS coarser (its doubles); with a
    $/step term the step bound stays below W_MAGNITUDE ticks (CP-SAT proves fast there)."""
    cfg = next(iter(enumerate_configs(issue21_inst, {"tp": 1, "dp": 8, "pp": 4, "mbs": 1, "schedule": "1f1b",
                                                     "recompute": "none"})))
    coef = Coefficients(issue21_inst, cfg)
    cp = PipelineModel(coef, Limits(), make_backend("cpsat"))
    assert cp.res.tps == 10**9 and cp._step_upper_bound() < make_backend("cpsat").magnitude
    mi = PipelineModel(coef, Limits(), make_backend("highs"))
    assert mi.res.tps < cp.res.tps and mi._step_upper_bound() <= 2**30 * 1.01
    for limits in (Limits("min-cost", time_limit_s=20.0), Limits(budget_usd_per_step=1.0)):
        for be in ("cpsat", "highs"):
            m = PipelineModel(coef, limits, make_backend(be))
            assert m._step_upper_bound() <= pipeline.W_MAGNITUDE * 1.01 and m.res.tps <= cp.res.tps



def test_rounding_helpers_are_directed():
    assert pipeline.down(2.9999999999999996) == 3   # float noise below an integer counts as it
    assert pipeline.down(2.5) == 2 and pipeline.up(2.5) == 3 and pipeline.up(3.0000000000000004) == 3
    assert pipeline.down(-2.5) == -3 and pipeline.up(-2.5) == -2


# ---- issue 12 §1: the Pareto front never repeats a point and is complete only when proven -----
def test_pareto_front_is_strict_complete_and_matches_brute_force(tmp_path):
    """A 6-layer model on 2 x 2 fast (8 $/node-h) and 2 x 2 slow (2 $/GPU-h) GPUs with transfers and
    reductions comparable to stage time. Every point is strictly faster or cheaper than its
    neighbours, the sweep proves its end (complete), each point is brute force's min-cost
    optimum at its own step time, and the front equals the one brute force sweeps."""
    from milp_plan.pareto import pareto_front
    from milp_plan.solve import SolveRequest
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), bw=COMPARABLE_BW[0],
                          billing=("node", "gpu"))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    front = pareto_front(inst, SolveRequest("cpsat", None, 60.0))
    pts = [(p.predicted.step_time_s, p.predicted.usd_per_step) for p in front.points]
    assert front.complete and len(pts) >= 3, pts
    assert all(t1 > t0 and c1 < c0 for (t0, c0), (t1, c1) in zip(pts, pts[1:])), pts
    # brute force's front is its own min-cost sweep: equal fronts make each point brute force's
    # min-cost optimum at its own step time
    exhaustive = pareto_front(inst, SolveRequest("brute-force", None, 60.0))
    assert exhaustive.complete
    assert [(pytest.approx(t, rel=PROOF_TOL), pytest.approx(c, rel=PROOF_TOL)) for t, c in pts] == \
        [(p.predicted.step_time_s, p.predicted.usd_per_step) for p in exhaustive.points]


# ---- every config's model against that config's exhaustive optimum ----------------------------
# The driver's heuristic start and bounds often prove an optimum before a config's model runs,
# so a model formula can be wrong while every `solve` still agrees with brute force. Here the
# model of every config is solved on its own (no cutoff, no hint) and must equal the config's
# best admitted plan, found by enumeration (its objective and plan checked by the driver's
# drift and limit checks on the way). Objectives without a $/step term: with one, the big-M
# of W = T u leaves CP-SAT a near-zero bound on some configs without a cutoff (honest, but
# not proven in a test's time); those are cross-checked through `solve` in test_solve.py.
def without_usd_per_step(limits: Limits) -> Limits:
    if limits.objective == "min-cost" or limits.budget_usd_per_step is not None:
        return Limits(budget_usd_per_hour=6.37)
    return limits


def assert_every_config_model_exact(inst, limits, mode, fix=None) -> int:
    prepared = driver.prepare(inst, fix, mode)
    coefs = [c for c in prepared.coefs if c.cfg.complete]
    if mode == "free":
        coefs = [kid for c in prepared.coefs for kid in _completions(prepared, c)]
    solved = 0
    for coef in coefs:
        best = config_optimum(inst, coef, limits)
        if not coef.options:  # no node type can host this config's stages: the driver never builds it
            assert best == math.inf
            continue
        plan, bound = driver._solve_config(coef, limits, "cpsat", None, None, Deadline(60.0), 1, 0.0)
        if best == math.inf:
            assert plan is None, coef.cfg.label()
            continue
        got = objective_of(plan, limits)
        assert best * (1 - 1e-9) <= got <= best * (1 + PROOF_TOL), (coef.cfg.label(), got, best)
        assert bound is None or bound <= best * (1 + 1e-9)
        solved += 1
    return solved


def _completions(prepared, coef):
    if coef.cfg.complete:
        return [coef]
    return [c for kid in prepared.children(coef) for c in _completions(prepared, kid)]


def check_every_config_model(tmp, case, mode: str, most: int) -> None:
    """A random instance (test_solve's strategies) whose brute force stays under `most` candidates."""
    from milp_plan.solvers import bruteforce
    from instances import limits_for
    kw, gbs, objective, flash = case
    spec = write_instance(tmp, **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs, "flash_attention": flash}))
    assume(sum(bruteforce.count_candidates(inst, c) for c in bruteforce.solved_configs(inst, mode=mode)) <= most)
    fastest = bruteforce.solve(inst, Limits(), mode=mode)
    assume(fastest.plan is not None)
    assert_every_config_model_exact(inst, without_usd_per_step(limits_for(objective, fastest.plan)), mode)


@settings(max_examples=4 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(small_instances())
def test_every_megatron_config_model_equals_its_exhaustive_optimum(tmp_path_factory, case):
    check_every_config_model(tmp_path_factory.mktemp("inst"), case, "megatron", 3_000)


@settings(max_examples=3 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(small_free_instances())
def test_every_free_config_model_equals_its_exhaustive_optimum(tmp_path_factory, case):
    check_every_config_model(tmp_path_factory.mktemp("inst"), case, "free", 2_000)


@pytest.mark.parametrize("basis", [predict.SIMULATED, predict.CLOSED_FORM])
@pytest.mark.parametrize("schedule", ["gpipe", "interleaved", "1f1b"])
def test_every_config_model_of_a_fixed_schedule_with_slow_links(tmp_path, schedule, basis, monkeypatch):
    """Each schedule's terms on 2-GPU nodes, where hops inside a node and between nodes both
    occur, per-GPU billing: the paths of the simulated step, and (as for plans too large to
    simulate) the closed form's GPipe flow shops, interleaved chunks and wrap, 1F1B windows,
    with the bottleneck floor from the first run and after a probe of 0.001 units (the driver's
    two paths; a floor 3% too high fails both)."""
    floors = [driver.FLOOR_AFTER]
    if basis == predict.CLOSED_FORM:
        monkeypatch.setattr(predict, "STEP_SIM_MAX_OPERATIONS", 0)
        floors = [0.0, 1e-6]
    spec = write_instance(tmp_path, layers=8, gpn=2, counts=(2, 2), bw=COMPARABLE_BW[1], billing=("gpu", "node"),
                          memory_gb_per_s=1.0)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 8}))
    fix = {"schedule": schedule, "recompute": "none"}
    for after in floors:
        monkeypatch.setattr(driver, "FLOOR_AFTER", after)
        for limits in (Limits(), Limits(budget_usd_per_hour=5.9)):
            assert assert_every_config_model_exact(inst, limits, "megatron", fix) >= 3


def test_free_mode_min_cost_at_the_free_optimum_s_own_time(tmp_path):
    """Issue 21 §4: a free-mode min-cost solve at the free optimum's own step time exited 1
    ("no plan meets all limits together"); the optimum itself meets that limit."""
    spec = write_instance(tmp_path, layers=4, gpn=2, counts=(1, 2), bw=COMPARABLE_BW[0], billing=("node", "gpu"),
                          memory_gib=(0.003, None, None))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    fastest = solve(inst, Limits(), mode="free", time_limit_s=60)
    t = fastest.plan.predicted.step_time_s
    limits = Limits("min-cost", time_limit_s=t)
    res = solve(inst, limits, mode="free", time_limit_s=60)
    assert res.plan is not None and res.plan.predicted.step_time_s <= t
    assert res.objective <= fastest.plan.predicted.usd_per_step
    assert_admitted(inst, res.plan, limits)


def test_tied_embedding_all_reduce_is_modelled_both_ways_in_free_mode(tmp_path):
    """The tied embedding's all-reduce costs the slower of its two directions
    (costmodel.tied_embedding_sync_s): in free mode the ends may differ in tp (shard V h / tp) and
    in GPUs per node (senders sharing a link), so the last stage's direction can be the slower
    one. hand-gpt ties its embeddings; on 0.002 GB/s links a 32 KiB shard takes 16 ms, several
    times a stage. Every config's model of pp 2 must equal its exhaustive optimum (a model that
    prices only the first stage's direction undercharges the plans whose last stage is slower)."""
    spec = write_instance(tmp_path, layers=4, gpn=2, counts=(1, 1), bw=COMPARABLE_BW[1], billing=("gpu", "gpu"))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    assert inst.model.tied_embeddings
    assert assert_every_config_model_exact(inst, Limits(), "free", {"pp": 2, "recompute": "none"}) >= 4


def test_the_bottleneck_floor_waits_for_a_probe(tmp_path, monkeypatch):
    """The floor (PipelineModel.add_bottleneck_floor) is valid, but with it from the first run
    CP-SAT (linearization level 2) stalled on this 3-layer GPipe config of pp 2 (found by the
    hunt with every plan on the closed form): 0.05357 s/step after 60 s against the optimum's
    0.03106, its bound stuck at 0.02999 (without the floor, or at level 1, at once). The driver's
    probe of FLOOR_AFTER units settles it before the floor is added."""
    monkeypatch.setattr(predict, "STEP_SIM_MAX_OPERATIONS", 0)
    spec = write_instance(tmp_path, layers=3, fast_ms=(0.5, 1.0), slow_ms=(1.25, 2.5), gpn=4, counts=(1, 1),
                          prices=(4.0, 1.0), third=True, bw=(1e9, 1e9), billing=("node", "node"), memory_gb_per_s=1.0)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 8}))
    limits = Limits(budget_usd_per_hour=6.37)
    coef = next(c for c in driver.prepare(inst, None, "megatron").coefs
                if c.cfg.label() == "tp=1 dp=1 pp=2 mbs=2 recompute=none gpipe")
    best = config_optimum(inst, coef, limits)
    assert best == pytest.approx(0.0310608, rel=1e-6)
    plan, bound = driver._solve_config(coef, limits, "cpsat", None, None, Deadline(60.0), 1, 0.0)
    assert objective_of(plan, limits) == pytest.approx(best, rel=PROOF_TOL) and bound <= best * (1 + 1e-9)
