"""The layer ceiling (solvers/bounds.py: state_room, layer_ceiling, may_hold_layers): a proof
that a config's stages cannot hold the model's layers by their model states alone, which the
family bounds (Megatron mode) and the GPU-budget bounds (free parents) read.

- state_room against a scan of the cost model's state bytes over every layer count, and two
  hand cases: GPT-3 175B at tp 8, dp 1 holds 18 layers on an A100-80GB, 5 on an A10; GPT-3 13B
  at tp 1, dp 1 holds 12 + 13 + 12 = 37 < 40 layers in three stages;
- a config exactly at its ceiling (its GPUs hold L layers) keeps its plans;
- nothing with a plan is ruled out: on random small instances whose memory binds on the model
  states (both modes), every admitted plan's stages hold at most their state rooms, every
  config with an admitted plan passes may_hold_layers, and a Megatron family whose family
  bound is None has no member with a plan (brute force);
- GPT-3 175B on the default 32 GPUs: every config is ruled out, and the search says so in
  under 2 work units (8.1 in Megatron mode and 9.6 in free mode before).

And the figure of the infeasibility diagnosis (solve.least_plan_memory, "the smallest per-GPU
memory any plan needs"): at most the fullest GPU of every plan brute force builds.
"""
from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from milp_plan import costmodel as cm
from milp_plan.deadline import Deadline
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.bounds import family_lower_bound, layer_ceiling, may_hold_layers, state_room
from milp_plan.solvers.driver import prepare, solve
from milp_plan.solve import least_plan_memory
from instances import EXAMPLES, write_instance


def scanned_room(coef, opt, first, last, single) -> int:
    """The most layers n <= L whose state bytes (costmodel.stage_state_bytes) fit the option's
    usable memory, by trying every n."""
    inst, L = coef.inst, coef.inst.model.num_layers
    cap = cm.usable_memory_bytes(inst, coef.types[opt.k])
    fits = [n for n in range(1, L + 1) if sum(cm.stage_state_bytes(inst, [coef.kind] * n, first, last, single, opt.tp,
                                                                      opt.dp, coef.cfg.distributed_optimizer)) <= cap]
    return max(fits, default=0)


POSITIONS = [(True, False, False), (False, False, False), (False, True, False), (True, True, True)]


def test_gpt3_175b_does_not_fit_the_default_cluster_by_hand():
    """A block of GPT-3 175B has 12 h^2 + 13 h = 1,812,099,072 parameters (h = 12,288); at tp 8 a
    GPU holds 226,512,384 of them at 2 (bf16 weights) + 4 (fp32 gradients) + 12 (fp32 master
    weights and two moments; dp 1 shards nothing) = 18 bytes each: 4.077 GB, 3.797 GiB a layer.
    The usable 72 GiB of an A100-80GB (10% headroom) hold 18 layers, the 21.6 GiB of an A10 5.
    At most 32 / 8 = 4 stages: 18 x 4 = 72 < 96 layers by the positions, and 16 GPUs x 18 / 8 +
    16 x 5 / 8 = 36 + 10 = 46 by the GPUs: no plan (the embedding and head are more states)."""
    inst = build_instance(InstanceSpec(model="gpt3-175b", global_batch_size=256))
    prepared = prepare(inst, None, "megatron")
    coef = next(c for c in prepared.coefs if (c.cfg.uniform.tp, c.cfg.uniform.dp, c.cfg.pp) == (8, 1, 4))
    per_layer = sum(cm.stage_state_bytes(inst, ["block"], False, False, False, 8, 1, False))
    assert math.isclose(per_layer, 1_812_099_072 / 8 * 18, rel_tol=1e-12)
    a100, a10 = (next(o for o in coef.options if coef.types[o.k].gpu.name == name) for name in ("A100-80GB", "A10"))
    for pos in POSITIONS:
        assert state_room(coef, a100, *pos) == 18 == math.floor(72 * 2**30 / per_layer)
        assert state_room(coef, a10, *pos) == 5 == math.floor(21.6 * 2**30 / per_layer)
    assert layer_ceiling(coef) == (36, 18, 46)
    assert not may_hold_layers(coef)
    assert not any(may_hold_layers(c) for c in prepared.coefs)   # every tp, dp, pp: 6,400 configs


def test_gpt3_13b_by_hand_three_stages_of_one_gpu_hold_37_layers():
    """GPT-3 13B (40 layers, h = 5,120) at tp 1, dp 1: a block's 12 h^2 + 13 h = 314,639,360
    parameters at 18 bytes are 5.274 GiB, so a middle stage on an A100-80GB (72 GiB usable)
    holds floor(72 / 5.274) = 13 layers. The first stage also holds the embedding (50,257 x
    5,120 + 2,048 x 5,120 = 267,801,600 parameters, 4.489 GiB): floor((72 - 4.489) / 5.274) = 12;
    the last the head's own vocabulary projection (257,326,080, 4.314 GiB): 12 as well. Three
    stages hold 12 + 13 + 12 = 37 < 40 layers: no plan at pp 3; four hold 50."""
    inst = build_instance(InstanceSpec(model="gpt3-13b", global_batch_size=64))
    coefs = {c.cfg.pp: c for c in prepare(inst, None, "megatron").coefs
             if (c.cfg.uniform.tp, c.cfg.uniform.dp, c.cfg.uniform.recompute, c.cfg.schedule) == (1, 1, "none", "1f1b")}
    a100 = next(o for o in coefs[3].options if coefs[3].types[o.k].gpu.name == "A100-80GB")
    assert [state_room(coefs[3], a100, *pos) for pos in POSITIONS[:3]] == [12, 13, 12]
    # the A10s (21.6 GiB) hold 3, 4, 3; the GPUs: 16 x 13 + 16 x 4 = 272 layers
    assert layer_ceiling(coefs[3]) == (24, 13, 272)
    assert not may_hold_layers(coefs[3]) and may_hold_layers(coefs[4])


def test_a_config_at_its_ceiling_keeps_its_plans(tmp_path):
    """Two one-GPU nodes, a fast one of 3.8 MiB (3 layers of states) and a slow one of 1.4 MiB
    (1 layer), a 4-layer model: at tp 1, dp 1, pp 2 the GPUs hold 1 x 3 + 1 x 1 = 4 layers,
    exactly L, and brute force finds the plans of 3 + 1 layers; the ceiling must let them be."""
    spec = write_instance(tmp_path, layers=4, gpn=1, counts=(1, 1), memory_gib=(0.0038, 0.0014, None))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 2}))
    coef = next(c for c in prepare(inst, None, "megatron").coefs
                if (c.cfg.uniform.tp, c.cfg.uniform.dp, c.cfg.uniform.mbs, c.cfg.pp, c.cfg.uniform.recompute,
                    c.cfg.schedule) == (1, 1, 1, 2, "none", "1f1b"))
    assert layer_ceiling(coef) == (6, 0, 4)
    plans = [p for p in bruteforce.config_plans(inst, coef.cfg) if Limits().admit(p)]
    assert sorted(sorted(st.num_layers for st in p.stages) for p in plans) == [[1, 3], [1, 3]]
    assert may_hold_layers(coef)


def test_gpt3_175b_on_the_default_cluster_is_infeasible_at_once():
    """Before the ceiling the search ruled out each of the configs by its full bound: 8.10 work
    units (Megatron mode), 9.60 (free mode)."""
    inst = build_instance(InstanceSpec(model="gpt3-175b", global_batch_size=256))
    for mode in ("megatron", "free"):
        dl = Deadline(3600.0, work=30)
        result = solve(inst, Limits(), mode=mode, dl=dl)
        assert result.status == "infeasible" and result.plan is None
        assert dl.work_used() < 2.0, (mode, dl.work_used())


def test_state_room_is_the_scan_on_the_shipped_instances():
    """On the default and mixed-128 with three models (the model states of a layer from 0.5 to
    39 GiB a GPU at tp 1), every option of a sample of configs, at every kind of position: the
    bisection finds what the scan of every layer count finds (rooms 0, in between, and L)."""
    seen = set()
    for cluster, model in (("default", "gpt3-13b"), ("mixed-128", "llama2-70b"), ("default", "gpt3-175b")):
        inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=64))
        for mode in ("megatron", "free"):
            for coef in prepare(inst, None, mode).coefs[::211]:
                for opt in coef.options[::3]:
                    for pos in POSITIONS:
                        got = state_room(coef, opt, *pos)
                        assert got == scanned_room(coef, opt, *pos), (coef.cfg.label(), opt, pos)
                        seen.add(0 if got == 0 else "L" if got == inst.model.num_layers else "between")
    assert seen == {0, "between", "L"}


@st.composite
def state_bound_instances(draw):
    """Tiny GPTs whose model states are most of their memory (a block: about 0.9 MB of states
    at tp 1 against 70 KB of activations a micro-batch), GPUs of 1.4 to 5 MiB, so that a stage
    holds 0 to 5 layers, up to 3 node types, both modes."""
    memory = tuple(draw(st.sampled_from([None, 0.0014, 0.0022, 0.003, 0.0038, 0.0048])) for _ in range(3))
    return dict(layers=draw(st.integers(2, 6)), gpn=draw(st.sampled_from([1, 2])),
                counts=(draw(st.integers(1, 2)), draw(st.integers(1, 2))), third=draw(st.booleans()),
                memory_gib=memory), draw(st.sampled_from([2, 4])), draw(st.sampled_from(["megatron", "free"]))


def complete_configs(prepared, coef):
    if coef.cfg.complete:
        yield coef
        return
    for kid in prepared.children(coef):
        yield from complete_configs(prepared, kid)


@settings(max_examples=12 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(state_bound_instances())
def test_nothing_with_a_plan_is_ruled_out(tmp_path_factory, case):
    kw, gbs, mode = case
    spec = write_instance(tmp_path_factory.mktemp("inst"), **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs}))
    assume(sum(bruteforce.count_candidates(inst, c) for c in bruteforce.solved_configs(inst, None, mode)) <= 6_000)
    prepared = prepare(inst, None, mode)
    admitted: dict = {}
    for head in prepared.coefs:
        for coef in complete_configs(prepared, head):
            plans = [p for p in bruteforce.config_plans(inst, coef.cfg) if Limits().admit(p)]
            admitted[coef.cfg] = bool(plans)
            if plans:
                assert may_hold_layers(coef), coef.cfg.label()
            for plan in plans:
                for s, stage in enumerate(plan.stages):
                    opt = next(o for o in coef.options if coef.types[o.k].name == inst.cluster.nodes[
                        stage.devices[0].node].type.name and (o.tp, o.dp, o.mbs) == (stage.tp, stage.dp,
                                                                                  stage.micro_batch_size))
                    pos = (s == 0, s == coef.cfg.pp - 1, coef.cfg.pp == 1)
                    assert stage.num_layers <= state_room(coef, opt, *pos), (coef.cfg.label(), s, stage.num_layers)
    if mode == "megatron":
        for members in prepared.families():
            variants = [prepared.configs[i] for i in members]
            if family_lower_bound(prepared.coef(members[0]), Limits(), variants) is None:
                assert not any(admitted.get(v) for v in variants), variants[0].label()


@settings(max_examples=6 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(state_bound_instances())
def test_the_diagnosis_memory_is_at_most_every_plans_fullest_gpu(tmp_path_factory, case):
    """Every plan of every Megatron-mode config (any micro-batch, recompute, schedule), in
    memory or not: its fullest GPU needs at least what the diagnosis says any plan needs.
    Before, the figure read the fullest position and one recomputed layer: GPT-3 175B at a
    sequence of 2^20 tokens on the default "needed" 4,853.5 GiB a GPU; the bound is 246.0."""
    kw, gbs, _ = case
    spec = write_instance(tmp_path_factory.mktemp("inst"), **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs}))
    assume(sum(bruteforce.count_candidates(inst, c) for c in bruteforce.solved_configs(inst, None)) <= 6_000)
    need, _, complete = least_plan_memory(inst)
    assert complete
    fullest = min(max(st.peak_memory_gib for st in plan.predicted.stages)
                  for cfg in bruteforce.solved_configs(inst, None) for plan in bruteforce.config_plans(inst, cfg))
    assert need / 2**30 <= fullest * (1 + 1e-9), (need / 2**30, fullest)


def test_the_diagnosis_memory_of_a_long_sequence_is_a_plans_by_hand():
    """GPT-3 175B at 2^20 tokens a sequence on the default: no plan fits. The plan of tp 8, dp 1,
    pp 4, 24 layers a stage, every layer recomputed, needs 437.5, 358.1, 286.1 and 246.0 GiB a
    GPU (stage 0 holds four micro-batches in flight under 1F1B, the last one). The diagnosis
    reads that config's least position with all 24 layers recomputed: exactly the last stage's
    246.0 GiB, the least any plan needs. Before, it read the fullest position with one layer
    recomputed, 4,853.5 GiB: more than this plan needs anywhere."""
    from milp_plan.formulations.placement import build_plan
    inst = build_instance(InstanceSpec(model="gpt3-175b", global_batch_size=8, seq_length=2**20))
    need, cfg, complete = least_plan_memory(inst)
    assert complete and cfg.label() == "tp=8 dp=1 pp=4 mbs=1 recompute=full 1f1b sp"
    coef = Coefficients(inst, cfg)
    a100, a10 = (next(o for o in coef.options if coef.types[o.k].gpu.name == name) for name in ("A100-80GB", "A10"))
    plan = build_plan(inst, cfg, [a10, a10, a100, a100], [24] * 4, [24] * 4, None)
    memory = [st.peak_memory_gib for st in plan.predicted.stages]
    assert [round(m, 1) for m in memory] == [437.5, 358.1, 286.1, 246.0]
    assert math.isclose(need / 2**30, memory[-1], rel_tol=1e-9)
