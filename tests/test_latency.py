"""The fitted latency model (milp_plan.latency) and its use in Profile.cost's fill rules.
No torch needed: the data are synthetic, generated from known functions."""
from __future__ import annotations

import pandas as pd
import pytest

from milp_plan import latency
from milp_plan.profile import Profile


def test_fit_recovers_a_roofline():
    # t = max(2, 0.5 + 0.01 T): T = 16..128 lie on the floor (0.5 + 1.28 = 1.78 < 2), 256.. on the line
    tokens = [16, 32, 64, 128, 256, 512, 1024, 2048]
    times = [max(2.0, 0.5 + 0.01 * t) for t in tokens]
    f = latency.fit(tokens, [128] * len(tokens), times)
    assert f.floor_ms == pytest.approx(2.0, rel=1e-9)
    assert f.intercept_ms == pytest.approx(0.5, rel=1e-9)
    assert f.per_token_ms == pytest.approx(0.01, rel=1e-9)
    assert f.per_token_seq_ms == 0.0
    assert f.predict(4096, 128) == pytest.approx(0.5 + 40.96, rel=1e-9)


def test_fit_of_a_line_has_no_floor():
    tokens = [128, 256, 512, 1024]
    times = [0.3 + 0.002 * t for t in tokens]
    f = latency.fit(tokens, [128] * 4, times)
    assert (f.floor_ms, f.intercept_ms, f.per_token_ms) == pytest.approx((0.0, 0.3, 0.002), rel=1e-9, abs=1e-12)


def test_fit_recovers_the_attention_term_across_sequence_lengths():
    # t = 0.1 + 0.001 T + 2e-6 T s over s in {128, 256, 512}, b in {1, 2, 4}
    pts = [(b * s, s) for s in (128, 256, 512) for b in (1, 2, 4)]
    times = [0.1 + 0.001 * t + 2e-6 * t * s for t, s in pts]
    f = latency.fit([p[0] for p in pts], [p[1] for p in pts], times, attention=True)
    assert (f.intercept_ms, f.per_token_ms, f.per_token_seq_ms) == pytest.approx((0.1, 0.001, 2e-6), rel=1e-7)
    # without attention the T*s column is not fitted, and the fit is then only approximate
    g = latency.fit([p[0] for p in pts], [p[1] for p in pts], times, attention=False)
    assert g.per_token_seq_ms == 0.0


def test_a_floor_needs_two_token_counts():
    # two points at T = 128 (micro-batch 1 at seq 128 and micro-batch 2 at seq 64) are not evidence
    # of a flat region: a floor through them would fit them and the line the other two exactly
    f = latency.fit([128, 128, 256, 512], [128, 64, 64, 64], [1.0, 1.04, 1.5, 3.2])
    assert f.floor_ms == 0.0
    # at two token counts it is: here the data are exactly max(1, T/256)
    g = latency.fit([64, 128, 512, 1024], [64] * 4, [1.0, 1.0, 2.0, 4.0])
    assert (g.floor_ms, g.intercept_ms, g.per_token_ms) == pytest.approx((1.0, 0.0, 1 / 256), abs=1e-12)


def test_slopes_and_intercept_are_never_negative():
    # a falling series: the best non-negative fit is a constant
    f = latency.fit([100, 200, 300], [1, 1, 1], [3.0, 2.0, 1.0])
    assert f.intercept_ms >= 0 and f.per_token_ms >= 0
    assert f.predict(1000, 1) >= 0


def test_leave_one_out_error_by_hand():
    # points (T, t) = (1,1), (2,2), (3,4). Hand derivation:
    # * without (3,4): t = T exactly -> predicts 3 for 4: error 0.25
    # * without (1,1): the line through (2,2), (3,4) has intercept -2 < 0, so the best non-negative
    #   fit is t = c T with c = sum(T/t) / sum((T/t)^2) = 1.75 / 1.5625 = 1.12 (relative least
    #   squares; beats the constant 2.4, error 0.04 vs 0.2) -> predicts 1.12: error 0.12
    # * without (2,2): the line through (1,1), (3,4) has intercept -0.5 < 0; c = 1.12 again -> 2.24: error 0.12
    e = latency.loo_error([1, 2, 3], [1, 1, 1], [1.0, 2.0, 4.0])
    assert e.max_rel == pytest.approx(0.25, rel=1e-9)
    assert e.mean_rel == pytest.approx((0.12 + 0.12 + 0.25) / 3, rel=1e-9)
    assert latency.loo_error([1, 2], [1, 1], [1.0, 2.0]) is None


def _profile(points, kind="block", tp=1):
    """A profile from {(mbs, seq): fwd_ms}, bwd = 2 fwd."""
    rows = [("m", "G", tp, b, s, kind, t, 2 * t) for (b, s), t in points.items()]
    t = pd.DataFrame(rows, columns=["model", "gpu", "tp", "micro_batch_size", "seq_length", "kind", "fwd_ms", "bwd_ms"])
    return Profile(t)


def test_profile_fills_an_unmeasured_micro_batch_with_the_fit():
    # t = max(1, 0.2 + T/512) at seq 128: mbs 1, 2 on the floor (0.45, 0.7 -> 1.0), mbs 4 -> 1.2, 8 -> 2.2
    truth = lambda b: max(1.0, 0.2 + b * 128 / 512)  # noqa: E731
    prof = _profile({(b, 128): truth(b) for b in (1, 2, 4, 8)})
    # mbs 3: 0.2 + 0.75 = 0.95 -> the floor 1.0 (the old linear rule between 2 and 4 gave 1.1)
    c = prof.cost("m", "G", 1, 3, 128, "block")
    assert c.fwd_ms == pytest.approx(1.0, rel=1e-9) and c.bwd_ms == pytest.approx(2.0, rel=1e-9)
    assert prof.cost("m", "G", 1, 16, 128, "block").fwd_ms == pytest.approx(4.2, rel=1e-9)
    assert "fitted latency model" in prof.fills[("m", "G", 1, 3, 128, "block")]


def test_profile_keeps_the_linear_rule_below_three_points():
    prof = _profile({(2, 128): 1.0, (4, 128): 1.2})
    c = prof.cost("m", "G", 1, 3, 128, "block")
    assert c.fwd_ms == pytest.approx(1.1, rel=1e-12)     # halfway between 1.0 and 1.2
    assert "interpolated between micro_batch 2 and 4" in prof.fills[("m", "G", 1, 3, 128, "block")]


def test_profile_fills_an_unmeasured_sequence_length_with_the_fit():
    truth = lambda b, s: 0.1 + 0.001 * b * s + 2e-6 * b * s * s  # noqa: E731
    prof = _profile({(b, s): truth(b, s) for s in (128, 256) for b in (1, 2, 4)})
    # mbs 2, seq 512: 0.1 + 0.001 * 1024 + 2e-6 * 1024 * 512 = 2.172576
    c = prof.cost("m", "G", 1, 2, 512, "block", flops_ratio=lambda a, b: 1e9)  # the ratio must not be used
    assert c.fwd_ms == pytest.approx(2.172576, rel=1e-7)


def test_profile_keeps_the_flops_ratio_with_one_sequence_length():
    prof = _profile({(b, 128): 0.5 * b for b in (1, 2, 4)})
    c = prof.cost("m", "G", 1, 2, 256, "block", flops_ratio=lambda a, b: 3.0)
    assert c.fwd_ms == pytest.approx(1.0 * 3.0, rel=1e-9)


def test_fit_table_reports_each_field():
    prof = _profile({(b, 128): 0.5 * b for b in (1, 2, 4, 8)})
    reps = latency.fit_table(prof.table)
    assert [(r.kind, r.field) for r in reps] == [("block", "fwd_ms"), ("block", "bwd_ms")]
    assert all(r.error.max_rel < 1e-9 for r in reps)      # exactly proportional data
