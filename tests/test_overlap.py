"""Communication overlapped with compute (job overlap_grad_reduce, overlap_param_gather,
tp_comm_overlap): the one rule (costmodel.overlap_pieces) by hand, against the simulator's
per-bucket overlap, in the per-config model (optimal = brute force), and in the job, plan.json
and launch flags."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from milp_plan import costmodel as cm
from milp_plan import check
from milp_plan.errors import InputError
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Job, Limits, parse_overlap
from milp_plan.result import objective_of
from milp_plan.sim.pipeline import PipelineSpec, simulate_pipeline
from milp_plan.solvers import bruteforce
from milp_plan.solvers.driver import solve
from clitools import run_cli
from tiny_instance import tiny_instance, two_stage_plan

GRAD = "grad-reduce"
BOTH = "grad-reduce,param-gather"


def test_overlap_pieces_by_hand():
    # 10 s of transfers, end piece 2 s, window 6 s: 2 + (10 - 6) = 6 s exposed
    assert cm.overlap_pieces(10.0, 2.0, 6.0) == (2.0, 6.0)
    # 3 s under a 6 s window: only the end piece shows
    assert max(cm.overlap_pieces(3.0, 1.0, 6.0)) == 1.0


def test_tiny_stage_reduction_by_hand(tmp_path):
    # two_stage_plan, stage 0: embedding + 2 blocks, tp 2, dp 2 in node 0 (100 GB/s), mbs 1.
    #   f_0 = 2 x (1 + 0.02) + 0.05 + 0.01 = 2.10 ms, b_0 = 2 x (2 + 0.02) + 0.1 = 4.14 ms (tp
    #   all-reduce 1e6 bytes: 2 x 1/2 x 1e6 / 100e9 = 0.01 ms; 2 a block each way, 1 the embedding)
    #   R = 0.50008 ms (test_job: fp32 ring of 12,502,000 params per GPU)
    #   end bucket: (block 12,002,000 + embedding 1,000,000) / 2 = 6,501,000 params per GPU:
    #   2 x 1/2 x 4 x 6,501,000 / 100e9 = 0.26004 ms
    #   overlap: max(0.26004, 0.50008 - 4.14 + 0.26004) = 0.26004 ms
    plan = two_stage_plan()
    c = cm.plan_costs(tiny_instance(tmp_path / "a", overlap=GRAD), plan)
    assert (c.fwd_s[0], c.bwd_s[0]) == pytest.approx((2.10e-3, 4.14e-3), rel=1e-12)
    assert c.dp_s[0] == pytest.approx(0.26004e-3, rel=1e-12)
    # distributed optimizer (fp32): total (4 + 2) / 8 x 0.50008 = 0.37506 ms, of it the
    # all-gather 2 / 6 = 0.12502 and the reduce-scatter 0.25004; end bucket 0.26004 x 6/8 =
    # 0.19503: reduce-scatter 0.13002, all-gather 0.06501
    #   grad-reduce only: 0.13002 + 0.12502 = 0.25504 ms; with param-gather 0.13002 + 0.06501
    dist = two_stage_plan(distributed_optimizer=True)
    assert cm.plan_costs(tiny_instance(tmp_path / "b", overlap=GRAD), dist).dp_s[0] == \
        pytest.approx(0.25504e-3, rel=1e-12)
    assert cm.plan_costs(tiny_instance(tmp_path / "c", overlap=BOTH), dist).dp_s[0] == \
        pytest.approx(0.19503e-3, rel=1e-12)
    # no overlap: the whole reduction, as before
    assert cm.plan_costs(tiny_instance(tmp_path / "d"), dist).dp_s[0] == pytest.approx(0.37506e-3, rel=1e-12)


def test_tp_comm_overlap_by_hand(tmp_path):
    # a block at tp 2: 2 all-reduces of 0.01 ms each way; GEMM window forward 1 - 0.25 (core)
    # = 0.75 ms, backward 2 x 0.75 = 1.5 ms: exposed 0.02 / 2 + max(0, 0.02 - 0.75) = 0.01 ms each
    # way; the embedding's all-reduce (no GEMM beside it) stays 0.01 ms
    inst = tiny_instance(tmp_path, overlap="tp-comm")
    nt = inst.cluster.node_types[0]
    blk = cm.layer_times(inst, nt, 2, 1, "block")
    assert (blk.fwd_s, blk.bwd_s) == pytest.approx((1.01e-3, 2.01e-3), rel=1e-12)
    assert cm.layer_times(inst, nt, 2, 1, "embedding").fwd_s == pytest.approx(0.06e-3, rel=1e-12)
    # the rule never costs more than no overlap (a collective longer than its GEMMs)
    assert cm.tp_overlapped_s(5.0, 5.0, 1.0, 2.0, 0.0, 2) == (5.0, 5.0)


@settings(max_examples=40, deadline=None)
@given(reduce_s=st.floats(0.1, 12.0), buckets=st.integers(1, 6), pp=st.integers(1, 3), m=st.integers(1, 5))
def test_rule_against_the_simulated_buckets(reduce_s, buckets, pp, m):
    # the simulator's own overlap (dp_overlap: the last backward split into equal buckets, each
    # reduced as it ends) never ends later than the rule's exposed reduction placed after the last
    # backward, and ends with it when the reduction fits in the backward (only the end piece shows)
    b = 3.0
    base = dict(schedule="1f1b", num_microbatches=m, fwd_s=(1.0,) * pp, bwd_s=(b,) * pp, hop_s=(0.1,) * (pp - 1),
                opt_s=(0.2,) * pp)
    sim = simulate_pipeline(PipelineSpec(**base, dp_s=(reduce_s,) * pp, dp_overlap=True,
                                         buckets=((buckets,),) * pp)).step_time_s
    exposed = max(cm.overlap_pieces(reduce_s, reduce_s / buckets, b))
    rule = simulate_pipeline(PipelineSpec(**base, dp_s=(exposed,) * pp)).step_time_s
    assert sim <= rule + 1e-9
    if reduce_s <= b:
        assert sim == pytest.approx(rule, rel=1e-12)


@pytest.mark.parametrize("overlap,intra", [(GRAD, 100), (BOTH, 100), (BOTH, 1)])
def test_optimal_with_overlap_is_brute_force(tmp_path, overlap, intra):
    # the per-config model reads the pieces (D >= each, E >= each on a path): CP-SAT's optimum
    # is brute force's, and both are the cost model's step of their plan. At 100 GB/s the end
    # bucket is the exposed reduction; at 1 GB/s inside the node the reduction outlasts the
    # backward (the other piece)
    from tiny_instance import write_inputs
    cluster, model, prof = write_inputs(tmp_path)
    cluster.write_text(cluster.read_text().replace("intra_node_gb_per_s: 100", f"intra_node_gb_per_s: {intra}"))
    inst = build_instance(InstanceSpec(cluster=str(cluster), model=str(model), profiles=str(prof),
                                       global_batch_size=8, overlap=overlap))
    limits = Limits()
    fix = {"pp": 2}
    brute = bruteforce.solve(inst, limits, fix=fix)
    res = solve(inst, limits, backend="cpsat", fix=fix, time_limit_s=60)
    for r in (brute, res):
        assert r.status == "optimal"
        assert check.check_plan(inst, r.plan) == []
        assert objective_of(r.plan, limits) == pytest.approx(r.objective, rel=1e-12)
    assert res.objective == pytest.approx(brute.objective, rel=1e-9)
    c = cm.plan_costs(inst, res.plan)
    if intra == 1 and res.plan.stages[0].dp > 1:
        assert c.dp_s[0] > c.bwd_s[0]   # the second piece decides


def test_job_settings_and_records(tmp_path, capsys):
    assert parse_overlap(None) == {}
    assert parse_overlap("none") == dict.fromkeys(("overlap_grad_reduce", "overlap_param_gather",
                                                   "tp_comm_overlap"), False)
    assert parse_overlap("tp-comm,grad-reduce")["overlap_grad_reduce"] is True
    with pytest.raises(InputError, match="not an overlap"):
        parse_overlap("grad")
    with pytest.raises(InputError, match="overlap_grad_reduce"):
        Job(8, 500, overlap_param_gather=True)
    # plan.json records an overlap only when it is on: a job without one writes what it wrote
    # before the settings existed, and an older record reads with them off
    assert "overlap_grad_reduce" not in Job(8, 500).to_dict()
    assert Job(8, 500, overlap_grad_reduce=True).to_dict()["overlap_grad_reduce"] is True
    assert Job.from_dict(Job(8, 500).to_dict()).overlap_grad_reduce is False
    job = tmp_path / "job.yaml"
    job.write_text("overlap_grad_reduce: true\noverlap_param_gather: true\n")
    inst = tiny_instance(tmp_path / "i", job_file=str(job))
    assert inst.job.overlap_param_gather and not inst.job.tp_comm_overlap
    assert "overlap" not in inst.inputs_record()["spec"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("tp_comm_overlap: yes please\n")
    code, out, err = run_cli(capsys, "inspect", "--job", str(bad))
    assert code == 2 and "tp_comm_overlap" in err and len(err.strip().splitlines()) == 1


def test_launch_flags_follow_the_overlap():
    from milp_plan.launch.megatron import overlap_flags
    from milp_plan.model import model_catalog
    model = {k: v for k, v in model_catalog()["gpt3-2.7b"].to_dict().items()}
    plan = two_stage_plan(distributed_optimizer=True, sequence_parallel=True)
    on = dict(overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True)
    # one block of gpt3-2.7b (h 2560): 12 h^2 + 13 h = 78,676,480 parameters, / tp 2
    assert overlap_flags(plan, model, on) == ["--overlap-grad-reduce", "--ddp-bucket-size", "39338240",
                                              "--overlap-param-gather", "--tp-comm-overlap"]
    assert overlap_flags(plan, model, {}) == []
    assert overlap_flags(two_stage_plan(), model, on) == ["--overlap-grad-reduce", "--ddp-bucket-size", "39338240"]


def test_plan_records_the_overlap_and_verify_uses_it(tmp_path, capsys):
    # solve with --overlap: plan.json says so, and verify (which rebuilds the instance from the
    # record) predicts the same step
    from tiny_instance import write_inputs
    cluster, model, prof = write_inputs(tmp_path)
    out = tmp_path / "plan.json"
    code, stdout, err = run_cli(capsys, "solve", "--cluster", str(cluster), "--model", str(model), "--profiles",
                                str(prof), "--global-batch", "8", "--overlap", GRAD, "--fix", "pp=2",
                                "--out", str(out))
    assert code == 0, stdout + err
    doc = json.loads(out.read_text())
    assert doc["inputs"]["job"]["overlap_grad_reduce"] is True and doc["inputs"]["spec"]["overlap"] == GRAD
    code, stdout, err = run_cli(capsys, "verify", str(out))
    assert code == 0, stdout + err


@pytest.mark.parametrize("intra", [100, 1])
def test_closed_form_basis_with_overlap(tmp_path, intra):
    # 4,096 sequences put the tiny instance on the closed-form basis (predict.step_basis): the
    # model's D >= each piece must agree with the cost model there too (the solve's drift check
    # and objective_of); at 100 GB/s the overlap shortens the optimum, at 1 GB/s inside the node
    # the reduction outlasts the backward (the second piece decides)
    from milp_plan.predict import CLOSED_FORM, step_basis
    from tiny_instance import write_inputs
    cluster, model, prof = write_inputs(tmp_path)
    cluster.write_text(cluster.read_text().replace("intra_node_gb_per_s: 100", f"intra_node_gb_per_s: {intra}"))
    spec = dict(cluster=str(cluster), model=str(model), profiles=str(prof), global_batch_size=4096)
    base = build_instance(InstanceSpec(**spec))
    over = build_instance(InstanceSpec(**spec, overlap=BOTH))
    assert step_basis(over) == CLOSED_FORM
    fix = {"pp": 2, "dp": 2}
    a = solve(base, Limits(), fix=fix, time_limit_s=120)
    b = solve(over, Limits(), fix=fix, time_limit_s=120)
    for inst, r in ((base, a), (over, b)):
        assert r.status == "optimal" and check.check_plan(inst, r.plan) == []
        assert objective_of(r.plan, Limits()) == pytest.approx(r.objective, rel=1e-12)
    if intra == 100:
        assert b.objective <= a.objective
        assert b.plan.predicted.dp_allreduce_s < a.plan.predicted.dp_allreduce_s
    else:   # the second piece decides; one bucket (26 ms at 1 GB/s) outlasts a micro-batch's
        # backward (4 ms), so the rule's bound lies above the plain reduction (a known limit:
        # costmodel.overlap_pieces)
        c = cm.plan_costs(over, b.plan)
        assert max(c.dp_s) > max(c.bwd_s)
