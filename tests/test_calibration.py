"""The calibration on published measurements (milp_plan/calibration.py): the rows and their
sources, the measured step times by hand, milp-plan's prediction of a row, and a fit that
is reproducible (the same constants twice, and the shipped fit.json reproduced)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("scipy")

from milp_plan import analytic, calibration as cal  # noqa: E402

ROWS = cal.load_rows()
BY_ID = {r.id: r for r in ROWS}


def test_every_row_has_a_source_and_adds_up():
    assert len(ROWS) == 19
    for r in ROWS:
        assert r.source and r.where, r.id
        assert r.tp * r.pp * r.dp == r.num_gpus and r.num_layers % r.pp == 0, r.id
    assert all(r.in_fit for r in ROWS)   # the overlapped Megatron-Core rows too (the job says so)


def test_measured_step_time_by_hand():
    # sc21-1.7b: B 512, s 2048, l 24, h 2304, V 51200, 32 GPUs at 137 TFLOP/s (Narayanan et al. eq. 3):
    #   96 B s l h^2 = 96 x 512 x 2048 x 24 x 2304^2 = 12,824,703,626,379,264
    #   1 + s/(6h) + V/(16 l h) = 1 + 4/27 + 25/432 = 521/432
    #   F = 1.5466830e16;  step = F / (137e12 x 32) = 3.52802 s
    r = BY_ID["sc21-1.7b"]
    assert r.flops_per_step() == pytest.approx(12_824_703_626_379_264 * 521 / 432, rel=1e-12)
    assert r.measured_step_s == pytest.approx(3.528018, rel=1e-6)
    # mcore-1.7b: B 192, s 4096, l 24, h 2048, V 131072, 48 GPUs at 408.8 TFLOP/s (no recompute):
    #   72 B s l h^2 (1 + s/(6h) + V/(12 l h)) = 5,699,868,278,390,784 x (1 + 1/3 + 2/9) = 8.8664618e15
    #   step = 8.8664618e15 / (408.8e12 x 48) = 0.451854 s
    r = BY_ID["mcore-1.7b"]
    assert r.flops_per_step() == pytest.approx(5_699_868_278_390_784 * 14 / 9, rel=1e-12)
    assert r.measured_step_s == pytest.approx(0.451854, rel=1e-5)


def test_a_row_is_predicted_by_the_cost_model():
    # the row's plan is Megatron's: pp equal stages in rank order, tp x dp GPUs each, and the
    # instance carries the row's job (no flash attention in 2021) and its constants
    r = BY_ID["sc21-145b"]
    k = cal.Knobs(2, 10, "full")
    plan = cal.plan_for(r, k)
    assert (plan.pp, plan.stages[0].tp, plan.stages[0].dp, plan.num_microbatches) == (8, 8, 24, 2304 // 48)
    assert [len(s.devices) for s in plan.stages] == [192] * 8 and plan.stages[1].devices[0].node == 24
    inst = cal.instance_for(r, cal.DEFAULTS)
    assert inst.job.flash_attention is False and inst.profile.generator.c == analytic.ESTIMATE
    slow = cal.Fitted(analytic.Constants(gemm_efficiency=0.35), 1.0)
    a, fits = cal.predict_row(r, cal.DEFAULTS, k)
    b, _ = cal.predict_row(r, slow, k)
    assert fits and b > 1.5 * a   # halving the GEMM efficiency slows the step down, through the profile


def test_the_fit_is_deterministic():
    rows = [BY_ID[i] for i in ("sc21-1.7b", "sc21-18b", "sc21-39b")]
    a, ka = cal.fit_constants(rows, max_nfev=15)
    b, kb = cal.fit_constants(rows, max_nfev=15)
    assert a == b and ka == kb


def test_the_shipped_fit_is_what_its_constants_predict():
    # fit.json (python -m milp_plan.calibration --loo --write profiles/calibration/fit.json) records the
    # constants and each row's prediction with them: evaluating them again gives the same numbers
    doc = json.loads(cal.FIT_FILE.read_text())
    fit = cal.load_fit()
    for rec in doc["rows"]:
        r = BY_ID[rec["id"]]
        k = cal.Knobs(rec["micro_batch"], rec["vpp"], rec["recompute"])
        assert cal.choose_knobs(r, fit) == k, r.id
        assert cal.predict_row(r, fit, k)[0] == pytest.approx(rec["after_step_s"], rel=1e-5), r.id
    assert doc["summary"]["fit_loo_mean_abs_error"] <= 0.05


def test_the_analytic_profiles_use_the_fitted_constants():
    # one source: analytic.DEFAULT (every shipped and derived analytic profile) is fit.json's
    fit = cal.load_fit()
    assert analytic.DEFAULT == fit.constants and analytic.DEFAULT != analytic.ESTIMATE


def test_the_overlapped_rows_run_with_their_settings():
    # the Megatron-Core rows overlap dp and tp communication (--overlap-grad-reduce,
    # --overlap-param-gather, --tp-comm-overlap); the SC'21 rows do not
    inst = cal.instance_for(BY_ID["mcore-70b"], cal.DEFAULTS)
    job = inst.job
    assert job.overlap_grad_reduce and job.overlap_param_gather and job.tp_comm_overlap and job.flash_attention
    assert not cal.instance_for(BY_ID["sc21-39b"], cal.DEFAULTS).job.overlap_grad_reduce
    nt = inst.cluster.node_types[0]
    assert (nt.intra_node_link, nt.inter_node_link) == ("nvlink", "infiniband")


def test_a_full_refit_reproduces_the_shipped_constants():
    # about 20 s: the whole fit, from the defaults, as `python -m milp_plan.calibration` runs it
    doc = json.loads(cal.FIT_FILE.read_text())
    fit, _ = cal.fit_constants(ROWS)
    got = cal.fit_document(fit, [])["constants"]
    assert got == pytest.approx(doc["constants"], rel=1e-4)
