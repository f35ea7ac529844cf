"""Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
Table 2 and section 4) reproduced by hand on GPT-3 175B, through the cost model the planner
uses (costmodel.stage_activation_bytes with the job's flash-attention setting), and the
unfused attention's time (analytic.unfused_core_s).

GPT-3 175B (the paper's Table 3 row, and the catalog's gpt3-175b): h = 12288, a = 96,
s = 2048, f = 4h, GeLU, dropout; micro-batch b = 1, tensor parallel t = 8.
    sbh    = 2048 x 12288        = 25,165,824
    5as/h  = 5 x 96 x 2048 / 12288 = 80
Bytes per layer and micro-batch:
    no parallelism               sbh (34 + 80)            = 114   sbh = 2,868,903,936
    tp 8                         sbh (10 + 24/8 + 80/8)   = 23    sbh =   578,813,952
    tp 8 + sp                    sbh/8 (34 + 80)          = 14.25 sbh =   358,612,992
    tp 8 + selective             sbh (10 + 24/8)          = 13    sbh =   327,155,712
    tp 8 + sp + selective        34 sbh / 8               = 4.25  sbh =   106,954,752
    full recompute, tp 8         2 sbh                              =    50,331,648
    full recompute, tp 8 + sp    2 sbh / 8                          =     6,291,456
With flash attention the 5as/h term is never stored: no parallelism 34 sbh = 855,638,016,
tp 8 13 sbh (as selective), tp 8 + sp 4.25 sbh.
"""
from __future__ import annotations

import pytest

from milp_plan import analytic
from milp_plan import costmodel as cm
from milp_plan.cluster import GPU
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.model import model_catalog

SBH = 25_165_824
BY_HAND = {  # (tp, sequence parallel, recompute, flash attention) -> bytes per layer, b = 1
    (1, False, "none", False): 2_868_903_936,
    (8, False, "none", False): 578_813_952,
    (8, True, "none", False): 358_612_992,
    (8, False, "selective", False): 327_155_712,
    (8, True, "selective", False): 106_954_752,
    (8, False, "full", False): 50_331_648,
    (8, True, "full", False): 6_291_456,
    (1, False, "none", True): 855_638_016,
    (8, False, "none", True): 327_155_712,
    (8, True, "none", True): 106_954_752,
    (8, True, "selective", True): 106_954_752,
    (8, True, "full", True): 6_291_456,
}


def test_the_hand_numbers_are_the_papers_formulas():
    # the table above, from the closed forms (a check on the arithmetic in the docstring)
    assert SBH == 2048 * 12288 and 5 * 96 * 2048 / 12288 == 80
    assert BY_HAND[(1, False, "none", False)] == SBH * (34 + 80)
    assert BY_HAND[(8, False, "none", False)] == SBH * (10 + 24 / 8 + 80 / 8)
    assert BY_HAND[(8, True, "none", False)] == SBH / 8 * (34 + 80)
    assert BY_HAND[(8, False, "selective", False)] == SBH * (10 + 24 / 8)
    assert BY_HAND[(8, True, "selective", False)] == 34 * SBH / 8


def instance(flash: bool):
    return build_instance(InstanceSpec(model="gpt3-175b", cluster="default", global_batch_size=8,
                                       flash_attention=flash))


@pytest.fixture(scope="module")
def instances():
    return {True: instance(True), False: instance(False)}


@pytest.mark.parametrize("key", list(BY_HAND), ids=[f"tp{k[0]}-{'sp' if k[1] else 'nosp'}-{k[2]}-"
                                                    f"{'flash' if k[3] else 'unfused'}" for k in BY_HAND])
def test_stage_activation_bytes_by_hand(instances, key):
    tp, sp, recompute, flash = key
    inst = instances[flash]
    assert inst.job.flash_attention is flash
    # two layers of one stage, one micro-batch in flight, no embedding or head:
    # 2 x the layer's bytes; full recompute of both layers keeps their inputs plus one layer's
    # full activations while it is recomputed (the working set; with flash on/off as the job says)
    got = cm.stage_activation_bytes(inst, ["block", "block"], False, False, tp, 1, sp, recompute,
                                    2 if recompute == "full" else 0, inflight=1)
    want = 2 * BY_HAND[key]
    if recompute == "full":
        want += BY_HAND[(tp, sp, "none", flash)]
    assert got == want


def test_unfused_attention_stores_the_5as_over_h_term(instances):
    # the 5as/h term is 80 of 114 sbh at no parallelism: without flash attention a layer holds
    # 114/34 = 3.35 times the activations it holds with it (the "half of what was measured")
    a = cm.stage_activation_bytes(instances[False], ["block"], False, False, 1, 1, False, "none", 0, 1)
    b = cm.stage_activation_bytes(instances[True], ["block"], False, False, 1, 1, False, "none", 0, 1)
    assert a / b == pytest.approx(114 / 34, rel=1e-12)


def test_unfused_attention_time_by_hand():
    # GPU with round numbers: 100 TFLOP/s, 1000 GB/s. GPT-3 175B core at tp 8, b 1, s 2048:
    # 96/8 = 12 heads of d = 128. Each of QK^T and AV: 12 batches of 2048 x 2048 x 128,
    #   FLOPs 12 x 2 x 2048^2 x 128 = 12,884,901,888 at peak x GEMM_EFFICIENCY x phi,
    #   phi = 128 / (128 + GEMM_DIM_HALF); bytes 12 x 2 x (2 x 2048 x 128 + 2048^2) = 113,246,208
    #   at bandwidth x MEMORY_EFFICIENCY; the larger of the two, plus one launch.
    # Scores: 12 x 2048^2 = 50,331,648 elements; softmax 4 bytes each, dropout 5: 452,984,832 bytes
    # memory-bound in 2 kernels. Backward: both GEMMs twice, the element-wise bytes twice.
    gpu = GPU("R", 80, 100, 1000)
    m = model_catalog()["gpt3-175b"]
    gemm = max(12_884_901_888 / (100e12 * analytic.GEMM_EFFICIENCY * 128 / (128 + analytic.GEMM_DIM_HALF)),
               113_246_208 / (1000e9 * analytic.MEMORY_EFFICIENCY)) + analytic.KERNEL_LAUNCH_S
    elem = 452_984_832 / (1000e9 * analytic.MEMORY_EFFICIENCY) + 2 * analytic.KERNEL_LAUNCH_S
    fwd, bwd = analytic.unfused_core_s(m, gpu, 8, 1, 2048)
    assert fwd == pytest.approx(2 * gemm + elem, rel=1e-12)
    assert bwd == pytest.approx(4 * gemm + 2 * elem, rel=1e-12)
    # and it is what a block's time counts without flash attention, in place of the fused core
    f_on, b_on, core_on = analytic.layer_cost_s(m, gpu, "block", 8, 1, 2048, True)
    f_off, b_off, core_off = analytic.layer_cost_s(m, gpu, "block", 8, 1, 2048, False)
    flash_f, flash_b = analytic.flash_core_s(m, gpu, 8, 1, 2048)
    assert (core_on, core_off) == (pytest.approx(flash_f), pytest.approx(fwd))
    assert f_off - f_on == pytest.approx(fwd - flash_f, rel=1e-9)
    assert b_off - b_on == pytest.approx(bwd - flash_b, rel=1e-9)


def test_the_job_setting_reaches_the_profile(instances):
    # without flash attention the instance does not read the shipped (flash) profile: its block
    # times include the unfused core
    on, off = instances[True], instances[False]
    nt = on.cluster.node_types[0]
    t_on = cm.layer_times(on, nt, 8, 1, "block")
    t_off = cm.layer_times(off, nt, 8, 1, "block")
    assert t_off.fwd_s > t_on.fwd_s and t_off.attn_core_fwd_s > t_on.attn_core_fwd_s
    assert any("unfused attention" in n for n in off.notices)
