"""Token slices in the cost model (costmodel.slice_context_s), the sliced GPipe form
(schedules.GPipe.sliced_pipeline_time) and the simulator running sliced items."""
from __future__ import annotations

import functools

import pytest

from milp_plan import costmodel as cm, latency
from milp_plan.instance import InstanceSpec, build_instance


@functools.lru_cache(maxsize=1)
def gpt3_175b():
    return build_instance(InstanceSpec(model="gpt3-175b"))


def test_unsliced_sequence_costs_what_it_costs():
    inst = gpt3_175b()
    nt, L = inst.cluster.node_types[0], inst.job.seq_length
    assert cm.layer_times(inst, nt, 8, 1, "block", L, 0) == cm.layer_times(inst, nt, 8, 1, "block")
    assert cm.slice_context_s(inst, nt, 8, 1, "block", L, 0) == (0.0, 0.0)


@pytest.mark.parametrize("l,c", [(128, 1920), (512, 512), (1024, 1024), (256, 0)])
def test_context_term_is_l_times_c(l, c):
    """ctx_f = core_f(L) l c / L^2, backward twice that; the row time at l tokens is the base."""
    inst = gpt3_175b()
    nt, L = inst.cluster.node_types[0], inst.job.seq_length
    core = cm.layer_times(inst, nt, 8, 1, "block").attn_core_fwd_s
    base, got = cm.layer_times(inst, nt, 8, 1, "block", l), cm.layer_times(inst, nt, 8, 1, "block", l, c)
    assert got.fwd_s - base.fwd_s == pytest.approx(core * l * c / L**2, rel=1e-12, abs=1e-18)
    assert got.bwd_s - base.bwd_s == pytest.approx(2 * core * l * c / L**2, rel=1e-12, abs=1e-18)
    assert got.attn_core_fwd_s - base.attn_core_fwd_s == pytest.approx(core * l * c / L**2, rel=1e-12, abs=1e-18)


def test_slices_of_a_sequence_price_the_causal_attention():
    """The attention cores of the slices of a sequence sum to core(L) (L^2 + sum l^2) / (2 L^2)
    plus each slice's kernel launch (the analytic flash core is launch + k l^2)."""
    from milp_plan.analytic import KERNEL_LAUNCH_S
    inst = gpt3_175b()
    nt, L = inst.cluster.node_types[0], inst.job.seq_length
    core_L = cm.layer_times(inst, nt, 8, 1, "block").attn_core_fwd_s
    lengths = [512, 512, 1024]
    total, c = 0.0, 0
    for l in lengths:
        total += cm.layer_times(inst, nt, 8, 1, "block", l, c).attn_core_fwd_s
        c += l
    want = core_L * (L * L + sum(x * x for x in lengths)) / (2 * L * L)
    assert 0 <= total - want <= len(lengths) * KERNEL_LAUNCH_S


def test_embedding_and_head_have_no_context_term():
    inst = gpt3_175b()
    nt = inst.cluster.node_types[0]
    for kind in ("embedding", "head"):
        assert cm.layer_times(inst, nt, 8, 1, kind, 256, 1024) == cm.layer_times(inst, nt, 8, 1, kind, 256)


def test_latency_fit_slice_form():
    """TeraPipe's t = T0[b, l] + beta3 b l c from the fit t = b0 + c T + d T s: s = keys."""
    f = latency.LatencyFit(0.0, 0.1, 0.001, 2e-6, 9)
    b, l, c = 2, 256, 768
    assert f.predict_slice(b, l, c) == pytest.approx(0.1 + 0.001 * b * l + 2e-6 * b * l * (l + c), rel=1e-12)
    assert f.predict_slice(b, l, c) - f.predict_slice(b, l, 0) == pytest.approx(2e-6 * b * l * c, rel=1e-9)
