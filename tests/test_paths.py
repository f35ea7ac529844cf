"""The simulated step as the planner's objective (issue 12 §3; formulations/pipeline.md,
"Which step time is proven", "add_paths", "Bounds on the simulated step"):

* the critical path of the step's graph, read as a linear function of the spec (PathTerms),
  has the event engine's makespan as its length, and as a path of the fixed graph it bounds every other spec of the same
  schedule, pp, m and vpp from below;
* every weight pair of Schedule.path_weights bounds the simulation from below;
* the planner proves the simulated optimum where the closed form ranks plans wrongly (hand
  derivation), and falls back to the closed form above predict.STEP_SIM_MAX_OPERATIONS.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from milp_plan import costmodel, predict
from milp_plan.instance import build_instance
from milp_plan.job import Limits
from milp_plan.solvers.driver import solve
from milp_plan.schedules import ForwardShare, schedule_of
from milp_plan.sim.pipeline import PipelineSpec, longest_path, simulate_pipeline
from instances import BACKENDS, write_instance

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")


def _random_spec(rng: random.Random, schedule: str, pp: int | None = None, m: int | None = None,
                 vpp: int | None = None) -> PipelineSpec:
    """Stage, hop, reduction and optimizer times of comparable size (hops up to a stage)."""
    if schedule == "interleaved":
        pp = pp or rng.randint(2, 5)
        vpp = vpp or rng.choice([2, 3, 4])
        m = m or pp * rng.randint(1, 3)
    else:
        pp, vpp, m = pp or rng.randint(1, 5), 1, m or rng.randint(1, 9)
    f = [rng.uniform(0.2, 1.0) for _ in range(pp)]
    hop = rng.choice([0.0, 0.05, 0.5, 1.0])
    return PipelineSpec(schedule=schedule, num_microbatches=m, fwd_s=tuple(f),
                        bwd_s=tuple(x * rng.uniform(1.5, 3.0) for x in f),
                        hop_s=tuple(rng.uniform(0, hop) for _ in range(pp - 1)), vpp=vpp,
                        wrap_hop_s=rng.uniform(0, hop) if vpp > 1 else 0.0,
                        dp_s=tuple(rng.uniform(0, 1.0) for _ in range(pp)),
                        opt_s=tuple(rng.uniform(0, 0.3) for _ in range(pp)))


def _slow_last_reduction_specs(rng: random.Random, schedule: str, draws: int = 200):
    """`_random_spec`s of two stages or more (of `draws`), each with a last-stage reduction up to
    a few stage times (a slow type's links at the end), where the last stage's own tail path
    (Schedule.tail_path) can be the critical one."""
    for _ in range(draws):
        spec = _random_spec(rng, schedule)
        if spec.pp >= 2:
            yield dataclasses.replace(spec, dp_s=spec.dp_s[:-1] + (rng.uniform(0.0, 4.0),))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_critical_path_has_the_makespans_length(schedule):
    """The longest-path evaluator's critical path, read as a PathTerms, is as long as the event
    engine's makespan."""
    rng = random.Random(f"length-{schedule}")
    for _ in range(150):
        spec = _random_spec(rng, schedule)
        assert longest_path(spec)[1].length_s(spec) == pytest.approx(simulate_pipeline(spec).step_time_s, rel=1e-12)


@pytest.mark.parametrize("schedule", ("1f1b", "gpipe", "interleaved"))
def test_every_stage_path_is_a_path(schedule):
    """Schedule.stage_paths (the model's first paths, the ones the bounds rest on) are never
    longer than the simulation, and some are as long (they are real paths)."""
    rng = random.Random(f"stage-{schedule}")
    tight = 0
    for _ in range(300):
        spec = _random_spec(rng, schedule)
        sim = simulate_pipeline(spec).step_time_s
        lengths = [p.length_s(spec) for p in schedule_of(schedule, spec.vpp).stage_paths(spec.pp, spec.num_microbatches)]
        assert max(lengths) <= sim * (1 + 1e-12)
        tight += max(lengths) >= sim * (1 - 1e-12)
    assert tight > 0


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_last_stages_tail_path_is_a_path(schedule):
    """Schedule.tail_path (the full bound's path through the last stage's own reduction,
    bounds._EndStages) is never longer than the simulation, and is its critical path in some
    specs (a last stage whose reduction outlasts the drain back to stage 0)."""
    tight = 0
    for spec in _slow_last_reduction_specs(random.Random(f"tail-{schedule}"), schedule):
        sim = simulate_pipeline(spec).step_time_s
        length = schedule_of(schedule, spec.vpp).tail_path(spec.pp, spec.num_microbatches).length_s(spec)
        assert length <= sim * (1 + 1e-12)
        tight += length >= sim * (1 - 1e-12)
    assert tight > 0


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_longest_path_evaluator_agrees_with_the_simulator(schedule):
    """predict's step (sim.pipeline.longest_path over the simulator's own graph, links'
    order made edges) equals the event engine's makespan, and its critical path's length."""
    rng = random.Random(f"longest-{schedule}")
    for _ in range(200):
        spec = _random_spec(rng, schedule)
        step, path = longest_path(spec)
        assert step == pytest.approx(simulate_pipeline(spec).step_time_s, rel=1e-12)
        assert path.length_s(spec) == pytest.approx(step, rel=1e-12)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_path_bounds_every_spec_with_the_same_graph(schedule):
    """The graph is fixed by (schedule, pp, m, vpp), links included (each link's transfers come
    from one sender in its order): a path of one spec is a path of another."""
    rng = random.Random(f"graph-{schedule}")
    for _ in range(100):
        a = _random_spec(rng, schedule)
        b = _random_spec(rng, schedule, a.pp, a.num_microbatches, a.vpp)
        path, sim_b = longest_path(a)[1], simulate_pipeline(b)
        assert path.length_s(b) <= sim_b.step_time_s * (1 + 1e-12)


@pytest.mark.parametrize("schedule", ("1f1b", "gpipe", "interleaved"))
def test_every_path_weight_pair_bounds_the_simulation(schedule):
    """T_sim >= w_z max_s t_s + w_sum sum_s t_s + [path_p2p] + offset + dp_0 + max opt for
    every quadruple (the first run of this test caught the transfers added to the chain path's
    pair, which crosses only the hops above its stage). The forward share is given both ways:
    hi the largest f_s / t_s (excess 0), and a hi below some stages' shares with the excess
    they need (f_s <= hi t_s + excess), as Coefficients.forward_share gives it when the ends'
    constant parts are forward-heavy."""
    rng = random.Random(f"weights-{schedule}")
    tight = 0
    for _ in range(400):
        spec = _random_spec(rng, schedule)
        sim = simulate_pipeline(spec).step_time_s
        sched = schedule_of(schedule, spec.vpp)
        t = [f + b for f, b in zip(spec.fwd_s, spec.bwd_s)]
        shares = [f / x for f, x in zip(spec.fwd_s, t)]
        rest = spec.dp_s[0] + max(spec.opt_s)
        hi = rng.uniform(min(shares), max(shares))
        excess = max(f - hi * x for f, x in zip(spec.fwd_s, t))
        for phi in (ForwardShare(min(shares), max(shares)), ForwardShare(min(shares), hi, max(excess, 0.0))):
            for w_z, w_sum, hops, offset in sched.path_weights(spec.num_microbatches, spec.pp, phi):
                lb = (w_z * max(t) + w_sum * sum(t) + rest + offset
                      + (sched.path_p2p(spec.hop_s, spec.wrap_hop_s) if hops else 0.0))
                assert lb <= sim * (1 + 1e-12), (spec, phi, w_z, w_sum, offset, lb, sim)
                tight += lb >= sim * (1 - 1e-9)
    if schedule != "interleaved":
        assert tight > 0  # the bound is attained on some pipelines (last stage the slowest)


@pytest.mark.parametrize("cluster,model,gbs,fix", [
    ("default", "gpt3-2.7b", 80, {}),
    ("mixed-128", "gpt3-175b", 8, {"tp": 8, "dp": 1, "mbs": 1}),
    ("two-type-32", "llama2-7b", 64, {"recompute": "full"}),
])
def test_the_forward_share_holds_on_every_stage(cluster, model, gbs, fix):
    """lo t_s <= f_s <= hi t_s + excess (Coefficients.forward_share) on every option, stage
    position, layer count and recomputed count of sampled configs, from the cost model's own
    stage times (costmodel.stage_compute_s through Coefficients.time), and the excess is
    needed somewhere (the embedding's forward-heavy constant) on GPT-3."""
    from milp_plan.formulations.space import parse_fix
    from milp_plan.instance import InstanceSpec
    from milp_plan.solvers.driver import prepare
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
    prep = prepare(inst, {**parse_fix(None), **fix}, "megatron")
    rng, L, needed = random.Random(cluster), inst.model.num_layers, 0.0
    for i in rng.sample(range(len(prep.configs)), min(12, len(prep.configs))):
        coef = prep.coef(i)
        phi = coef.forward_share()
        for o in range(len(coef.options)):
            for s in sorted({0, coef.cfg.pp // 2, coef.cfg.pp - 1}):
                t, b = coef.time(o, s)
                for n in (1, 2, L // 2, L):
                    for r in ((0, 1, n) if coef.options[o].recompute == "full" else (0,)):
                        total, fwd = t(n, r), t(n, r) - b(n, r)
                        assert phi.lo * total <= fwd * (1 + 1e-9) + 1e-15
                        assert fwd <= (phi.hi * total + phi.excess) * (1 + 1e-9) + 1e-15
                        needed = max(needed, fwd - phi.hi * total)
    assert 0.0 <= phi.hi <= 1.0 and phi.excess >= 0.0
    if model.startswith("gpt3"):
        assert needed > 0.0   # some stage's forward share is above hi: the excess is not slack


def _hand(tmp_path, **kw):
    """One fast node of 2 GPUs (the slow type 100x slower, so never worth a stage): a block
    costs f = 1 ms forward, b = 2 ms backward; 5 layers, global batch 4."""
    spec = write_instance(tmp_path, layers=5, fast_ms=(1.0, 2.0), slow_ms=(100.0, 200.0), **kw)
    return build_instance(spec)


FIX = {"tp": 1, "dp": 1, "mbs": 1, "pp": 2, "recompute": "none", "schedule": "1f1b"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_planner_proves_the_simulated_optimum(tmp_path, backend):
    """pp 2, m 4, 1F1B; a split (n0, n1) has t_s = 3 n_s ms, f_s = n_s. The closed form
    (m - 1) max t + sum t (exact only when the last stage is the slowest) gives
        (3,2): 3*9 + 15 = 42,  (2,3): 3*9 + 15 = 42,  (4,1): 51,  (1,4): 51,
    a tie. Simulated, (3,2) finishes at 39: rank 0 runs F0 [0,3] F1 [3,6] B0 [9,15] F2 [15,18]
    B1 [18,24] F3 [24,27] B2 [27,33] B3 [33,39]; rank 1 F0 [3,5] B0 [5,9] F1 [9,11] B1 [11,15]
    F2 [18,20] B2 [20,24] F3 [27,29] B3 [29,33] (the slow first stage's warm-up forward
    hides under rank 1's work: S + (m-1) t_0 - f_0 = 15 + 27 - 3). (2,3) simulates at 42 (the
    last stage the slowest: exact), so the closed form's optimum may be 7.7% slow; the
    simulated optimum is (3,2) at 39 ms (plus the optimizer step, ~1e-6 s)."""
    inst = _hand(tmp_path)
    res = solve(inst, Limits(), backend=backend, fix=FIX)
    assert res.status == "optimal"
    plan = res.plan
    assert [st.num_layers for st in plan.stages] == [3, 2]
    assert plan.predicted.step_basis == predict.SIMULATED
    assert plan.predicted.step_time_s == pytest.approx(0.039, rel=1e-3)
    c = costmodel.plan_costs(inst, plan)
    closed = sum(costmodel.pipeline_time_s(c.fwd_s, c.bwd_s, 4, "1f1b"))
    assert closed == pytest.approx(0.042, rel=1e-6)


def test_above_the_operation_limit_the_closed_form_is_proven(tmp_path, monkeypatch):
    """The same instance with the simulation limit at 0: every plan is predicted by the closed
    form, whose optimum is the tie at 42 ms."""
    monkeypatch.setattr(predict, "STEP_SIM_MAX_OPERATIONS", 0)
    inst = _hand(tmp_path)
    res = solve(inst, Limits(), fix=FIX)
    assert res.status == "optimal" and res.plan.predicted.step_basis == predict.CLOSED_FORM
    assert res.plan.predicted.step_time_s == pytest.approx(0.042, rel=1e-3)


def test_a_time_limit_holds_the_simulated_step(tmp_path):
    """min-cost under 40 ms: (3,2) at 39 ms is the only plan on the fast node that meets it
    (the closed form, 42 ms for every 2-stage split, would say none does)."""
    inst = _hand(tmp_path)
    res = solve(inst, Limits("min-cost", time_limit_s=0.040), fix=FIX)
    assert res.status == "optimal"
    assert [st.num_layers for st in res.plan.stages] == [3, 2]
    assert res.plan.predicted.step_time_s <= 0.040


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_tail_path_bound_never_exceeds_the_simulation(schedule):
    """bounds._tail_path_bound, the full bound's reading of Schedule.tail_path, on random specs
    whose every stage has forward share exactly lo (f_s = lo t_s), equal hops and equal
    optimizer steps, given the plan's own last stage (its time and reduction): w S + c never
    exceeds the simulated step, and equals it where the path is critical (so a weight or a
    term too large, e.g. lo dropped or each hop counted twice, fails here)."""
    from milp_plan.solvers.bounds import _tail_path_bound
    rng = random.Random(f"tail-bound-{schedule}")
    tight = 0
    for spec in _slow_last_reduction_specs(rng, schedule):
        lo, h, opt = rng.uniform(0.2, 0.5), rng.choice([0.0, 0.05, 0.5]), rng.uniform(0.0, 0.3)
        t = [f / lo for f in spec.fwd_s]
        spec = dataclasses.replace(spec, bwd_s=tuple(x - f for x, f in zip(t, spec.fwd_s)),
                                   hop_s=(h,) * (spec.pp - 1), wrap_hop_s=h if spec.vpp > 1 else 0.0,
                                   opt_s=(opt,) * spec.pp)
        path = schedule_of(schedule, spec.vpp).tail_path(spec.pp, spec.num_microbatches)
        w, c = _tail_path_bound(path, lo, [(t[-1], spec.dp_s[-1])], 2.0 * h * (spec.pp - 1), opt)
        sim = simulate_pipeline(spec).step_time_s
        assert w * sum(t) + c <= sim * (1 + 1e-9)
        tight += w * sum(t) + c >= sim * (1 - 1e-9)
    assert tight > 0


MODELLED = ("1f1b", "gpipe", "interleaved")   # the schedules the exact search covers (Schedule.modelled)


@pytest.mark.parametrize("schedule", MODELLED)
def test_the_drain_path_is_a_path(schedule):
    """Schedule.drain_path (rank 0's order up to its last forward, that forward down to the last
    rank, the rest of its order and its reduction; read by bounds._two_stage_bound) is never
    longer than the simulation, on random specs and on specs with a slow first stage and a slow
    last reduction, where under 1F1B it is the critical path of some (GPipe's and interleaved's
    drains are only seldom or never critical: a bound, not a claim of tightness)."""
    rng = random.Random(f"drain-{schedule}")
    specs = [_random_spec(rng, schedule) for _ in range(150)]
    slow = [dataclasses.replace(s, fwd_s=(3 * s.fwd_s[0],) + s.fwd_s[1:], bwd_s=(3 * s.bwd_s[0],) + s.bwd_s[1:])
            for s in _slow_last_reduction_specs(rng, schedule)]
    tight = 0
    for spec in specs + slow:
        path = schedule_of(schedule, spec.vpp).drain_path(spec.pp, spec.num_microbatches)
        if path is None:
            assert spec.pp == 1
            continue
        sim = simulate_pipeline(spec).step_time_s
        assert path.length_s(spec) <= sim * (1 + 1e-12)
        tight += path.length_s(spec) >= sim * (1 - 1e-12)
    assert tight > 0 or schedule != "1f1b"


def test_the_drain_path_of_a_two_stage_1f1b_by_hand():
    """1F1B, pp 2, m 4: rank 0 runs F0, F1 B0, F2 B1, F3 B2, B3; its last forward F3 comes after
    4 forwards and 2 backwards; rank 1 runs F3 then B3: T >= 4 f_0 + 2 b_0 + h + f_1 + b_1 +
    dp_1 + opt. ZB-H1 (split backward) has no such path."""
    path = schedule_of("1f1b", 1).drain_path(2, 4)
    assert (path.fwd, path.bwd, path.hop, path.dp, path.opt) == ((4.0, 1.0), (2.0, 1.0), (1.0,), (0.0, 1.0), (1.0, 0.0))
    assert schedule_of("zb-h1", 1).drain_path(2, 4) is None


@pytest.mark.parametrize("schedule", MODELLED)
def test_the_two_stage_paths_bound_the_simulation(schedule):
    """bounds._two_stage_paths (a two-stage plan's stage paths, tail path and drain path, the
    optimizer at its largest): the longest of them never exceeds the simulated step of a random
    two-stage spec, and equals it on many (the two-stage bound is then the plan's step)."""
    from milp_plan.solvers.bounds import _two_stage_paths
    rng = random.Random(f"two-stage-{schedule}")
    tight = 0
    for _ in range(200):
        spec = _random_spec(rng, schedule, pp=2)
        rows = _two_stage_paths(schedule_of(schedule, spec.vpp), spec.num_microbatches)
        x = [*spec.fwd_s, *spec.bwd_s, spec.hop_s[0], spec.wrap_hop_s, *spec.dp_s, max(spec.opt_s)]
        longest = max(sum(w * v for w, v in zip(row, x)) for row in rows)
        sim = simulate_pipeline(spec).step_time_s
        assert longest <= sim * (1 + 1e-12)
        tight += longest >= sim * (1 - 1e-9)
    assert tight >= 50
