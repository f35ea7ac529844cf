"""Mixed-type stages (issue 15): a stage's data-parallel replicas on whole nodes of two GPU types,
paced by the slowest replica (--mixed-stages, fix mixed=on): cost model, checker, placement,
a hand-derived optimum, and the exact planners against brute force on random instances."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings, assume, strategies as st

from milp_plan import check, costmodel as cm, predict
from milp_plan.cluster import MixedNodeType
from milp_plan.formulations import space
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.errors import InputError
from milp_plan.plan import Device, Plan, Stage
from milp_plan.solvers.driver import solve
from milp_plan.solvers import bruteforce

from test_bounds import check_instance
from instances import BACKENDS, EXAMPLES, HUGE_BW, assert_agrees, limits_for, write_instance

MIXED = {"mixed": True}


def _inst(tmp_path, gbs=4, **kw):
    spec = write_instance(tmp_path, **{"layers": 4, "fast_ms": (1.0, 2.0), "slow_ms": (1.5, 3.0), "gpn": 1,
                                       "counts": (1, 1), **kw})
    return build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs}))


def _mixed_plan(inst, layers=4, mbs=1, gpu="A100-80GB+A10", devices=(Device(0, 0), Device(1, 0))):
    st = Stage(gpu, tuple(devices), 0, layers, 1, len(devices), mbs)
    return Plan((st,), inst.job.global_batch_size, inst.job.global_batch_size // (mbs * len(devices)))


def test_mixed_stage_is_paced_by_its_slowest_replica(tmp_path):
    """One stage over the fast node (A100, block 1 + 2 ms a sample) and the slow node (A10, 1.5 +
    3 ms): each micro-batch takes the A10's time, 4 layers x (1.5 + 3) ms = 18 ms at micro-batch 1;
    memory per GPU is checked against the smaller GPU (A10, 24 GiB); the price is both nodes'."""
    inst = _inst(tmp_path)
    plan = _mixed_plan(inst)
    assert check.check_plan(inst, plan) == []
    nt = cm.stage_node_type(inst, plan.stages[0])
    assert isinstance(nt, MixedNodeType) and nt.gpu.name == "A100-80GB+A10"
    costs = cm.plan_costs(inst, plan)
    assert costs.fwd_s[0] == pytest.approx(4 * 1.5e-3) and costs.bwd_s[0] == pytest.approx(4 * 3.0e-3)
    assert costs.stages[0].capacity_gib == pytest.approx(24 * (1 - inst.job.memory_headroom))
    assert cm.plan_usd_per_hour(inst, plan) == pytest.approx(8.0 + 2.0)
    # the stage's links are the slower node's: both types have HUGE_BW here, so the reduction is ~0
    assert costs.dp_s[0] < 1e-6
    # the optimizer step is the slower GPU's: the A10's 600 GB/s against the A100's 2039
    fast, slow = inst.cluster.node_types
    params = cm.stage_params(inst, cm.stage_kinds(inst, 0, 4), True, True, single_stage=True)
    assert costs.opt_s[0] == pytest.approx(cm.optimizer_s(inst, params, slow))
    assert costs.opt_s[0] > cm.optimizer_s(inst, params, fast)


def test_mixed_stage_keeps_the_most_measured_activations(tmp_path, monkeypatch):
    """Where the profile measured activations per GPU, a mixed-type stage keeps the larger."""
    inst = _inst(tmp_path)
    measured = {"A100-80GB": 3e6, "A10": 5e6}
    monkeypatch.setattr(cm, "measured_activation_bytes", lambda inst, gpu, *a, **k: measured[gpu])
    one = {g: cm.layer_activation_bytes(inst, "block", 1, 1, False, "none", gpu=g) for g in measured}
    assert one["A10"] > one["A100-80GB"]
    assert cm.layer_activation_bytes(inst, "block", 1, 1, False, "none", gpu="A100-80GB+A10") == one["A10"]


def test_checker_reads_mixed_stage_names(tmp_path):
    inst = _inst(tmp_path)
    wrong = _mixed_plan(inst, gpu="A100-80GB")
    assert [v.rule for v in check.check_plan(inst, wrong)] == ["device_exists"]
    swapped = _mixed_plan(inst, gpu="A10+A100-80GB")
    assert [v.rule for v in check.check_plan(inst, swapped)] == ["device_exists"]
    reordered = _mixed_plan(inst, gpu="A10+A100-80GB", devices=(Device(1, 0), Device(0, 0)))
    assert check.check_plan(inst, reordered) == []


def test_mixed_stage_memory_binds_on_the_smaller_gpu(tmp_path):
    """The A10 side gets 2 MiB: a stage that fits the A100 but not the A10 fails memory_capacity."""
    inst = _inst(tmp_path, memory_gib=(None, 0.002, None))
    plan = _mixed_plan(inst)
    assert [v.rule for v in check.check_plan(inst, plan)] == ["memory_capacity"]


def test_hand_optimum_uses_a_mixed_stage(tmp_path):
    """2 blocks, global batch 4, one A100 node and one A10 node of one GPU each, links ~free.
    Per sample and block: A100 f 1 + b 2 ms, A10 1.5 + 3 ms. Without mixed stages:
      A100 alone: 4 samples x 2 blocks x 3 = 24 ms;  A10 alone: 36 ms;
      pipeline (1 block a stage; interleaving needs 4 blocks), m = 4 micro-batches of 1:
      A100 | A10, t = (3, 4.5) ms: 1F1B 21 ms (= 3 + 4.5 + 3 x 4.5; S0's last backward ends at
      21); A10 | A100, t = (4.5, 3): 1F1B simulated 19.5 ms (S0 runs F0 F1 B0 F2 B1 F3 B2 B3,
      waiting only for B0 at 4.5: 4.5 + 3 + 1.5 + 3 + 1.5 + 3 + 3 = 19.5); m = 2: 24 ms.
    With them: one stage, dp 2 over both nodes, 2 samples a replica, the A10 pacing:
      2 x 2 x 4.5 = 18 ms (micro-batch 1 or 2 alike), plus a reduction and an optimizer step
      of microseconds. It is the only mixed plan (it takes both nodes), so 18 ms is optimal."""
    inst = _inst(tmp_path, layers=2)
    without = solve(inst, Limits(), backend="cpsat")
    assert without.status == "optimal" and without.objective == pytest.approx(0.0195, rel=2e-3)
    for mode in ("megatron", "free"):
        res = solve(inst, Limits(), backend="cpsat", fix=MIXED, mode=mode)
        assert res.status == "optimal" and res.objective == pytest.approx(0.018, rel=2e-3), mode
        (stage,) = res.plan.stages
        assert stage.gpu == "A100-80GB+A10" and stage.dp == 2 and check.check_plan(inst, res.plan) == []
        sim = predict.evaluate(inst, res.plan)
        assert sim.step_time_s == pytest.approx(res.objective, rel=1e-9)
    ref = bruteforce.solve(inst, Limits(), fix=MIXED)
    assert ref.objective == pytest.approx(0.018, rel=2e-3)


def test_mixed_bundles_share_their_types_nodes(tmp_path):
    """Two fast and one slow node: a bundle (1 fast + 1 slow) leaves one fast node; a plan may
    not also put two stages on fast nodes (placement refuses, brute force skips it, and the
    model's add_shared_nodes forbids it)."""
    inst = _inst(tmp_path, counts=(2, 1))
    hosts = space.host_types(inst, MIXED)
    k = next(i for i, nt in enumerate(hosts) if isinstance(nt, MixedNodeType) and nt.members[0][1] == 1
             and nt.members[1][1] == 1)
    bundle = space.StageOption(k, 1, 2, 1, "none")
    fast = space.StageOption(0, 1, 1, 1, "none")
    from milp_plan.formulations.placement import fits
    assert fits(inst, [fast, bundle]) and not fits(inst, [fast, fast, bundle])


@st.composite
def mixed_instances(draw):
    """Two node types of 1-2 GPUs, 1-2 nodes each, 2-5 layers, speeds and prices that may make a
    mixed stage pay, links from free to comparable with a stage, memory that may bind."""
    layers = draw(st.integers(2, 5))
    slow = draw(st.sampled_from([1.0, 1.25, 1.5, 2.5]))
    memory = (None, draw(st.sampled_from([None, 0.003, 0.004])), None)
    bw = draw(st.sampled_from([(HUGE_BW, HUGE_BW), (0.05, 0.005)]))
    return dict(layers=layers, fast_ms=(1.0, 2.0), slow_ms=(slow, 2 * slow), gpn=draw(st.sampled_from([1, 2])),
                counts=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                prices=(draw(st.sampled_from([4.0, 8.0])), draw(st.sampled_from([1.0, 2.0, 6.0]))),
                memory_gib=memory, bw=bw), draw(st.sampled_from([2, 4])), \
        draw(st.sampled_from(["min-time", "min-cost", "budget-step-on-limit"])), draw(st.sampled_from(["megatron", "free"]))


@settings(max_examples=5 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(mixed_instances())
def test_mixed_stages_agree_with_brute_force(tmp_path_factory, case):
    """Every exact backend finds brute force's optimum over the space with mixed-type stages."""
    kw, gbs, objective, mode = case
    spec = write_instance(tmp_path_factory.mktemp("mixed"), **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs}))
    configs = bruteforce.solved_configs(inst, MIXED, mode)
    assume(sum(bruteforce.count_candidates(inst, c, MIXED) for c in configs) <= 8_000)
    fastest = bruteforce.solve(inst, Limits(), fix=MIXED, mode=mode)
    assume(fastest.plan is not None)
    limits = limits_for(objective, fastest.plan)
    ref = bruteforce.solve(inst, limits, fix=MIXED, mode=mode)
    for backend in BACKENDS:
        assert_agrees(inst, solve(inst, limits, backend=backend, fix=MIXED, mode=mode, time_limit_s=60), ref, limits)


def test_model_coefficients_of_a_mixed_pool_equal_the_cost_model(tmp_path):
    """Nodes of unequal size (tiny instance: 'big' 4 GPUs of G, 'small' 2 of S at twice G's
    times, tied embeddings): a bundle of one big and one small node is 6 GPUs; at tp 2, dp 3 it
    is the only option, and two bundles fit (two nodes of each type). For the placed two-stage
    plan the model's coefficients (stage time, memory, reduction, optimizer step, hop, embedding
    all-reduce) equal the cost model's: the big node's 4 GPUs share its link, and the reduction
    runs over 2 nodes with 2 replicas on the busiest."""
    from tiny_instance import tiny_instance
    from milp_plan.formulations.coefficients import Coefficients
    from milp_plan.formulations.placement import build_plan
    from milp_plan.units import GIB
    inst = tiny_instance(tmp_path, global_batch=6, tied=True)
    cfg = space.Config.megatron(2, 3, 1, 2, "none", sequence_parallel=True, distributed_optimizer=True)
    coef = Coefficients(inst, cfg, fix=MIXED)
    assert len(coef.options) == 1 and len(coef.pools) == 1
    nt = coef.types[coef.options[0].k]
    assert [(m.name, n) for m, n in nt.members] == [("big", 1), ("small", 1)] and nt.count == 2
    plan = build_plan(inst, cfg, [coef.options[0]] * 2, [2, 2], [0, 0], None)
    assert [sorted({d.node for d in st.devices}) for st in plan.stages] == [[1, 3], [0, 2]]
    costs = cm.plan_costs(inst, plan)
    k = coef.pools[0].k
    assert costs.hop_s[0] == pytest.approx(coef.hop_inter(0, k), rel=1e-12)
    assert costs.embedding_s == pytest.approx(coef.embedding_sync(0, k, False), rel=1e-12) and costs.embedding_s > 0
    for s in (0, 1):
        t, b = coef.time(0, s)
        assert costs.fwd_s[s] + costs.bwd_s[s] == pytest.approx(t(2), rel=1e-12)
        assert costs.dp_s[s] == pytest.approx(max(a(2) for a in coef.dp_time(0, s)), rel=1e-12)
        assert costs.opt_s[s] == pytest.approx(coef.opt_time(0, s)(2), rel=1e-12)
        sp = costs.stages[s]
        mem = (sp.weights_gib + sp.gradients_gib + sp.optimizer_gib + sp.activations_gib) * GIB
        assert mem == pytest.approx(coef.memory(0, s)(2), rel=1e-12)
        assert sp.capacity_gib * GIB == pytest.approx(coef.capacity(0), rel=1e-12)
    # the S side paces: twice G's block time per micro-batch (tp 2, micro-batch 1: 2 x (2+4)/2 ms a block)
    assert costs.fwd_s[1] + costs.bwd_s[1] > 2 * 2 * (2.0 + 4.0) / 2 * 1e-3


@settings(max_examples=5 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(mixed_instances())
@example(({"layers": 6, "fast_ms": (1.0, 2.0), "slow_ms": (1.25, 2.5), "gpn": 1, "counts": (2, 1),
           "prices": (8.0, 2.0), "memory_gib": (None, None, None), "bw": (HUGE_BW, HUGE_BW)}, 4, "min-time", "free"))
@example(({"layers": 5, "fast_ms": (1.0, 2.0), "slow_ms": (1.25, 2.5), "gpn": 2, "counts": (2, 1),
           "prices": (8.0, 2.0), "memory_gib": (None, None, None), "bw": (HUGE_BW, HUGE_BW)}, 4, "min-time",
          "megatron"))
def test_config_bounds_with_mixed_bundles_never_exceed_the_config_optimum(tmp_path_factory, case):
    """Every config's cheap and full bound, free parents included, against brute force over the
    space with bundles: a bundle shares its member types' GPUs in the full bound (bounds._slots)."""
    kw, gbs, objective, mode = case
    check_instance(kw, gbs, objective, True, tmp_path_factory.mktemp("bounds"), mode, 4_000, MIXED)


def test_a_slot_with_a_bundle_counts_each_gpu_at_its_best_pool():
    """Type A: 2 GPUs, its own 1-GPU stages at a = 1 ms a layer; type B: 1 GPU, no stage of its
    own; a bundle of one A and one B GPU at a = 0.75. At z = 3 ms an A stage holds 3 layers,
    the bundle 4 (densities 3 and 2 a GPU). The best real split, one A stage and the bundle,
    holds 7 layers; the bound's cap is 2 x 3 + 1 x 2 = 8 >= 7 (B's GPU counted at the bundle's
    density: leaving it out gives 6 and an invalid bound)."""
    from milp_plan.solvers.bounds import SlotType, _most_layers
    own, bundle = (1, 2, ((1.0, 99),)), (2, 1, ((0.75, 99),))
    slot = SlotType(3, (own, bundle), False, 0.0, ((2, (0, 1)), (1, (1,))))
    assert _most_layers(3.0, slot, 2, 1) == 8


def test_bounds_merge_a_bundle_with_the_types_it_joins(tmp_path):
    """Two 1-GPU fast nodes and one slow one, tp 1 x dp 2 (Megatron): the fast type's 2-GPU
    stages and the (fast 1 + slow 1) bundle share the fast GPUs; the slow GPU serves the bundle
    alone. One slot: 3 GPUs, fast GPUs read by both pools, the slow GPU by the bundle."""
    from milp_plan.formulations.coefficients import Coefficients
    from milp_plan.solvers.bounds import _slots
    inst = _inst(tmp_path, counts=(2, 1))
    coef = Coefficients(inst, space.Config.megatron(1, 2, 1, 1, "none"), fix=MIXED)
    by_type = {pool.k: [(pool.group, 1, ((1.0, 4),))] for pool in coef.pools}
    assert sorted(k for k in by_type) == [0, 2]   # the fast type and bundle (1, 1); the slow node holds no 2-GPU stage
    (slot,) = _slots(coef, by_type, Limits(), {k: 1.0 for k in range(len(coef.types))})
    assert slot.gpus == 3 and slot.shares == ((2, (0, 1)), (1, (1,)))


def test_launch_notes_a_mixed_type_stage(tmp_path):
    """launch says who runs a mixed-type stage (stock Megatron-LM) and what every node needs."""
    from milp_plan.launch import _notes
    from milp_plan.launch.ranks import assign_ranks
    inst = _inst(tmp_path)
    plan = _mixed_plan(inst)
    notes = _notes(plan, assign_ranks(plan, inst.cluster))
    assert any("stage 0 (A100-80GB+A10)" in n and "stock Megatron-LM runs this" in n for n in notes)


def test_a_node_cap_keeps_the_smaller_bundles(tmp_path):
    """--fix mixed=N offers the bundles of at most N nodes (mixed=on: 4); an option's k indexes
    the same host list whatever the cap."""
    inst = _inst(tmp_path, counts=(2, 2))
    assert space.parse_fix("mixed=2") == {"mixed": 2} and space.parse_fix("mixed=on") == {"mixed": True}
    for bad in ("mixed=5", "mixed=maybe"):
        with pytest.raises(InputError, match="mixed"):
            space.parse_fix(bad)
    offered = {cap: {nt.real_nodes for _, nt in space.hosts(inst, {"mixed": cap}) if isinstance(nt, MixedNodeType)}
               for cap in (2, 3, True)}
    assert offered == {2: {2}, 3: {2, 3}, True: {2, 3, 4}}
    hosts = space.host_types(inst, MIXED)
    cfg = space.Config(4, 1, sizes=(space.OPEN,) * len(hosts))   # 4 samples: dp 2 or 4 (one GPU a node)
    sizes = {cap: {hosts[o.k].real_nodes for o in space.stage_options(inst, cfg, {"mixed": cap})
                   if isinstance(hosts[o.k], MixedNodeType)} for cap in (2, True)}
    assert sizes == {2: {2}, True: {2, 4}}
    res = solve(inst, Limits(), backend="cpsat", fix={"mixed": 2}, mode="free")
    assert res.status == "optimal" and check.check_plan(inst, res.plan) == []
