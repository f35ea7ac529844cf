"""Any order of GPU types along the pipeline (issue 15): a type may appear in several runs,
each run of stages that share nodes starting on a node of its own."""
from __future__ import annotations

from pathlib import Path

import pytest

from milp_plan import planners
from milp_plan.deadline import Deadline
from milp_plan.errors import InputError
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from instances import BACKENDS, write_instance


def ends_need_the_big_gpu(tmp: Path, memory_gib=(0.05, 0.03)):
    """Two A100 nodes and one A10 node of 2 GPUs each; a 6-layer model (hidden 256) with an
    8,000-token vocabulary, so the embedding (first stage) and the tied head (last stage)
    weigh 2.0M parameters against 0.8M a layer. The A100s get 0.05 GiB, the A10 0.03 GiB:
    at tp 1 the A10 holds two layers but neither end, and no A100 stage (2 GPUs) holds an
    end with three layers, nor one of 4 GPUs all six. So with one run per type no plan fits;
    A100, A10, A100 does."""
    spec = write_instance(tmp, layers=6, gpn=2, counts=(2, 1), memory_gib=(*memory_gib, None),
                          fast_ms=(1.0, 2.0), slow_ms=(1.5, 3.0))
    model = (tmp / "model.yaml").read_text()
    (tmp / "model.yaml").write_text(model.replace("vocab_size: 128", "vocab_size: 8000")
                                    .replace("hidden_size: 64", "hidden_size: 256")
                                    .replace("ffn_hidden_size: 256", "ffn_hidden_size: 1024"))
    return build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))


FIX = {"tp": 1}


def test_a_type_in_two_runs_is_found_and_proven(tmp_path):
    """Hand derivation: A100 (2 layers), A10 (2), A100 (2), dp 2, micro-batch 1, m = 2. Stage
    times f/b per micro-batch (ms): A100 2/4, A10 3/6, A100 2/4; links cost ~0. 1F1B
    (warm-up min(pp - s - 1, m) forwards): s0 F0 0-2, F1 2-4; s1 F0 2-5, F1 5-8; s2 F0 5-7,
    B0 7-11, F1 11-13, B1 13-17; s1 B0 11-17, B1 17-23; s0 B0 17-21, B1 23-27. Makespan 27
    ms, plus the optimizer step (~0.05 ms: 2.8M parameters at the catalog's memory speed)."""
    inst = ends_need_the_big_gpu(tmp_path)
    ref = planners.get("brute-force").plan(inst, Limits(), Deadline(600), fix=FIX)
    assert ref.status == "optimal"
    plan = ref.plan
    assert [s.gpu for s in plan.stages] == ["A100-80GB", "A10", "A100-80GB"]
    assert [(s.num_layers, s.dp, s.micro_batch_size) for s in plan.stages] == [(2, 2, 1)] * 3
    assert 0.027 < plan.predicted.step_time_s < 0.0271
    for backend in BACKENDS:
        got = planners.get(backend).plan(inst, Limits(), Deadline(600), fix=FIX)
        assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-4), backend
        assert [s.gpu for s in got.plan.stages] == ["A100-80GB", "A10", "A100-80GB"]
        assert len({d for s in got.plan.stages for d in s.devices}) == 6  # three nodes, none shared


def test_one_run_per_type_holds_no_plan_here(tmp_path):
    """The former space (each type one run) has no plan on this instance: every plan the brute
    force enumerates that fits in memory puts the A100 stages apart."""
    inst = ends_need_the_big_gpu(tmp_path)
    fitting = [p for cfg in bruteforce.solved_configs(inst, FIX) for p in bruteforce.candidate_plans(inst, cfg, FIX)
               if Limits().admit(p)]
    assert fitting
    for p in fitting:
        order = [s.gpu for s in p.stages]
        runs = [g for i, g in enumerate(order) if i == 0 or order[i - 1] != g]
        assert len(runs) > len(set(runs))
    for order in (("A100-80GB", "A100-80GB", "A10"), ("A10", "A100-80GB", "A100-80GB"), ("A100-80GB",)):
        got = planners.get("cpsat").plan(inst, Limits(), Deadline(600), fix={**FIX, "order": order})
        assert got.status == "infeasible", order


def test_a_second_run_of_shared_node_stages_needs_a_node_of_its_own(tmp_path):
    """Stages of 1 GPU on nodes of 2 share nodes: A10, A100, A10 would need a second A10 node
    for the second run, and the cluster has one: brute force enumerates no such plan, and the
    pin is refused."""
    spec = write_instance(tmp_path, layers=4, gpn=2, counts=(1, 1))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    fix = {"tp": 1, "dp": 1, "pp": 3}
    for cfg in bruteforce.solved_configs(inst, fix):
        for p in bruteforce.candidate_plans(inst, cfg, fix):
            order = [s.gpu for s in p.stages]
            runs = [g for i, g in enumerate(order) if i == 0 or order[i - 1] != g]
            assert len(runs) == len(set(runs)), order
    with pytest.raises(InputError, match="puts A10 stages in 2 runs"):
        planners.get("cpsat").plan(inst, Limits(), Deadline(60), fix={**fix, "order": ("A10", "A100-80GB", "A10")})


def test_a_shared_node_type_in_two_runs_is_found_and_proven(tmp_path):
    """1-GPU stages (tp 1, dp 1) on nodes of 2 GPUs share nodes. The A100 ends need the memory
    (embedding and tied head), so the best order puts A100 stages at both ends with the A10
    node's two stages between: A100 x2 (node 0), A10 x2 (node 2), A100 x2 (node 1), a second
    A100 run on a node of its own. Brute force (which enumerates every run split that fits the
    nodes) and every backend agree; one run per type (order pinned) is no better."""
    inst = ends_need_the_big_gpu(tmp_path, memory_gib=(0.08, 0.05))
    fix = {"tp": 1, "dp": 1}
    ref = planners.get("brute-force").plan(inst, Limits(), Deadline(600), fix=fix)
    assert ref.status == "optimal"
    order = [s.gpu for s in ref.plan.stages]
    assert order == ["A100-80GB"] * 2 + ["A10"] * 2 + ["A100-80GB"] * 2
    assert [sorted({d.node for d in s.devices}) for s in ref.plan.stages] == [[0], [0], [2], [2], [1], [1]]
    for backend in BACKENDS:
        got = planners.get(backend).plan(inst, Limits(), Deadline(600), fix=fix)
        assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-4), backend
    one_run = planners.get("cpsat").plan(inst, Limits(), Deadline(600),
                                         fix={**fix, "order": ("A100-80GB",) * 4 + ("A10",) * 2})
    assert one_run.plan is None or one_run.objective > ref.objective * (1 + 1e-6)


def test_a_second_run_pays_for_its_node(tmp_path):
    """Node billing, 1-GPU stages on 2-GPU nodes, pp 3, min-cost: A100, A100, A100 takes two A100
    nodes (16 $/h); A100, A10, A100 would take two A100 nodes as well, one per run, and the A10
    node (18 $/h), though its A100 stages alone would fit one node. Every backend prices the
    second run's node and agrees with brute force."""
    inst = ends_need_the_big_gpu(tmp_path, memory_gib=(0.08, 0.05))
    fix = {"tp": 1, "dp": 1, "pp": 3}
    limits = Limits("min-cost", time_limit_s=1.0)
    ref = planners.get("brute-force").plan(inst, limits, Deadline(600), fix=fix)
    assert ref.status == "optimal" and ref.plan.predicted.usd_per_hour == pytest.approx(16.0)
    for backend in BACKENDS:
        got = planners.get(backend).plan(inst, limits, Deadline(600), fix=fix)
        assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-4), backend
    split = planners.get("cpsat").plan(inst, limits, Deadline(600),
                                       fix={**fix, "order": ("A100-80GB", "A10", "A100-80GB")})
    assert split.status == "optimal" and split.plan.predicted.usd_per_hour == pytest.approx(18.0)


def test_the_interleaved_wrap_between_two_runs_crosses_nodes(tmp_path):
    """Interleaved (vpp 2), 1-GPU stages on 4-GPU nodes, so one node could hold the whole
    pipeline, with slow links. The order A100, A10, A100 puts the two A100 stages in two runs
    on two A100 nodes. The wrap from the last stage back to the first therefore crosses nodes,
    though both ends are A100 stages, and every backend prices it so, as brute force does."""
    from instances import COMPARABLE_BW
    spec = write_instance(tmp_path, layers=6, gpn=4, counts=(2, 1), bw=COMPARABLE_BW[0])
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 6}))
    fix = {"schedule": "interleaved", "vpp": 2, "tp": 1, "dp": 1, "recompute": "none",
           "order": ("A100-80GB", "A10", "A100-80GB")}
    ref = planners.get("brute-force").plan(inst, Limits(), Deadline(600), fix=fix)
    assert ref.status == "optimal"
    assert [sorted({d.node for d in s.devices}) for s in ref.plan.stages] == [[0], [2], [1]]
    for backend in BACKENDS:
        got = planners.get(backend).plan(inst, Limits(), Deadline(600), fix=fix)
        assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-6), backend
