"""Every term of the cost model against a hand calculation on the tiny instance
(tests/tiny_instance.py: round bandwidths, a hand-written profile, a 4-block model)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from milp_plan import costmodel as cm, predict
from milp_plan.plan import Stage
from milp_plan.schedules import steady_period_s
from tiny_instance import devs, tiny_instance, two_stage_plan

MS = 1e-3
S = 500          # sequence length
H = 1000         # hidden size
SBH = S * H      # s b h at micro-batch 1 = 5e5
BLOCK_P, EMB_P, HEAD_P = 12_002_000, 1_000_000, 1_001_000   # see tiny_instance.py


@pytest.fixture(scope="module")
def inst(tmp_path_factory):
    return tiny_instance(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def big(inst):
    return inst.cluster.node_type("big")


@pytest.fixture(scope="module")
def small(inst):
    return inst.cluster.node_type("small")


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-15)


# ---- collectives --------------------------------------------------------------------------
def test_ring_allreduce():
    # 2 (g-1)/g x B / bw: 1e9 bytes over 4 GPUs at 100 GB/s = 1.5 x 1e9 / 1e11 = 15 ms
    assert cm.ring_allreduce_s(1e9, 4, 100) == approx(0.015)
    # g = 2: 2 x 1/2 x 1e6 / 1e11 = 1e-5 s
    assert cm.ring_allreduce_s(1e6, 2, 100) == approx(1e-5)
    assert cm.ring_allreduce_s(1e9, 1, 100) == 0.0
    assert cm.ring_allreduce_s(0, 8, 100) == 0.0


def test_tp_comm(inst, big):
    # one all-reduce of s b h x 2 bytes; tp 2, b 1: 1e6 bytes -> 2 x 1/2 x 1e6 / 100e9 = 1e-5 s
    # a block has 2 forward and 2 backward all-reduces; the embedding 1 forward; the head none
    assert cm.tp_comm_s(inst, big, 2, 1, "block") == (approx(2e-5), approx(2e-5))
    assert cm.tp_comm_s(inst, big, 2, 1, "embedding") == (approx(1e-5), 0.0)
    assert cm.tp_comm_s(inst, big, 2, 1, "head") == (0.0, 0.0)
    # tp 4, b 2: 2e6 bytes -> 2 x 3/4 x 2e6 / 1e11 = 3e-5 per all-reduce; T5 decoder block: 3 each way
    assert cm.tp_comm_s(inst, big, 4, 2, "block") == (approx(6e-5), approx(6e-5))
    assert cm.tp_comm_s(inst, big, 4, 2, "decoder_block") == (approx(9e-5), approx(9e-5))
    assert cm.tp_comm_s(inst, big, 1, 4, "block") == (0.0, 0.0)


# ---- compute ------------------------------------------------------------------------------
def test_layer_times_add_tp_comm(inst, big, small):
    # profile: block tp 2 mbs 1 on G: fwd 1 ms, bwd 2 ms, core 0.25 ms; + 2e-5 s each way
    lt = cm.layer_times(inst, big, 2, 1, "block")
    assert (lt.fwd_s, lt.bwd_s, lt.attn_core_fwd_s) == (approx(1.02 * MS), approx(2.02 * MS), approx(0.25 * MS))
    # S GPUs: twice the times; tp 1 -> no collective
    lt = cm.layer_times(inst, small, 1, 2, "block")
    assert (lt.fwd_s, lt.bwd_s) == (approx(8 * MS), approx(16 * MS))


def test_a_layer_without_flops_is_filled_at_another_length_by_its_tokens(tmp_path):
    """The embedding has no FLOPs; filling it at another sequence length divided 0 by 0
    (ZeroDivisionError, reachable with --extrapolate). Profiled at seq 500 (0.1 / 0.2 ms at
    micro-batch 1, tp 1 on G), at seq 1000 it takes twice that (a lookup per token); the block
    scales by its FLOPs per sequence, which grow faster than the tokens (attention)."""
    inst = tiny_instance(tmp_path, seq_length=1000)
    g = inst.cluster.node_types[0]
    emb = cm.layer_times(inst, g, 1, 1, "embedding")
    assert (emb.fwd_s, emb.bwd_s) == (approx(2 * 0.1e-3), approx(2 * 0.2e-3))
    ratio = cm._flops_ratio(inst, "block")(500, 1000)
    assert ratio > 2 and cm.layer_times(inst, g, 1, 1, "block").fwd_s == approx(2.0e-3 * ratio)


def test_attention_core_estimated_by_flop_share(tmp_path, big):
    # a profile without attn_core_fwd_ms: core = fwd x (4 s h) / (2 (2h^2 + 2h kv + 2hf) + 4 s h)
    #   = 2 ms x 2e6 / (2 x (2e6 + 2e6 + 8e6) + 2e6) = 2 ms / 13
    inst = tiny_instance(tmp_path, with_core=False)
    assert cm.layer_times(inst, big, 1, 1, "block").attn_core_fwd_s == approx(2 * MS / 13)


def test_stage_compute_and_recompute(inst, big):
    kinds = ["block", "block"]
    # tp 1, mbs 1, 2 blocks + embedding: fwd 2 x 2 + 0.1 = 4.1 ms, bwd 2 x 4 + 0.2 = 8.2 ms
    assert cm.stage_compute_s(inst, big, 1, 1, kinds, True, False) == (approx(4.1 * MS), approx(8.2 * MS))
    # full recompute of r layers adds r block forwards to the backward: r=1 -> 10.2, r=2 -> 12.2
    assert cm.stage_compute_s(inst, big, 1, 1, kinds, True, False, "full", 1)[1] == approx(10.2 * MS)
    assert cm.stage_compute_s(inst, big, 1, 1, kinds, True, False, "full", 2)[1] == approx(12.2 * MS)
    # selective adds every block's attention core: 2 x 0.5 ms -> 9.2 ms
    assert cm.stage_compute_s(inst, big, 1, 1, kinds, True, False, "selective")[1] == approx(9.2 * MS)
    # with the head instead of the embedding, mbs 2: fwd 2 x 4 + 2 = 10, bwd 2 x 8 + 4 = 20
    assert cm.stage_compute_s(inst, big, 1, 2, kinds, False, True) == (approx(10 * MS), approx(20 * MS))
    # tp 2: block 1 + 0.02 fwd, 2 + 0.02 bwd; embedding 0.05 + 0.01 fwd, 0.1 bwd
    #   fwd 2 x 1.02 + 0.06 = 2.10 ms; bwd 2 x 2.02 + 0.1 = 4.14 ms;
    #   full r=1 recomputes a forward including its collectives: + 1.02 -> 5.16 ms
    assert cm.stage_compute_s(inst, big, 2, 1, kinds, True, False) == (approx(2.10 * MS), approx(4.14 * MS))
    assert cm.stage_compute_s(inst, big, 2, 1, kinds, True, False, "full", 1)[1] == approx(5.16 * MS)
    assert cm.recompute_overhead_s(inst, big, 2, 1, kinds, "selective", 0) == approx(2 * 0.25 * MS)
    assert cm.recompute_overhead_s(inst, big, 2, 1, kinds, "none", 0) == 0.0


# ---- point to point -----------------------------------------------------------------------
def test_p2p(inst, big, small):
    # s b h x 2 bytes per GPU per hop: b 1 -> 1e6; with sequence parallelism / t
    assert cm.p2p_bytes(inst, 1, 2, False) == approx(1e6)
    assert cm.p2p_bytes(inst, 1, 2, True) == approx(5e5)
    assert cm.p2p_bytes(inst, 3, 1, True) == approx(3e6)
    # same node: intra 100 GB/s -> 1e6 / 1e11 = 10 us
    assert cm.p2p_s(inst, 1e6, big, big, True, 4) == approx(1e-5)
    # across big nodes, 4 senders share the 10 GB/s link: 1e6 / 2.5e9 = 0.4 ms
    assert cm.p2p_s(inst, 1e6, big, big, False, 4) == approx(4e-4)
    assert cm.p2p_s(inst, 1e6, big, big, False, 1) == approx(1e-4)
    # big -> small: the slower link, 5 GB/s, shared by 2 senders -> 1e6 / 2.5e9
    assert cm.p2p_s(inst, 1e6, big, small, False, 2) == approx(4e-4)


# ---- data parallel ------------------------------------------------------------------------
def test_dp_allreduce_inside_a_node():
    # B = 4e8 gradient bytes, dp 4 in one node at 100 GB/s: 2 x 3/4 x 4e8 / 1e11 = 6 ms
    assert cm.dp_allreduce_s(4e8, 4, 1, 4, 1, 100, 10, False) == approx(6e-3)
    # distributed optimizer: reduce-scatter fp32 grads + all-gather bf16 params = (4 + 2)/8 -> 4.5 ms
    assert cm.dp_allreduce_s(4e8, 4, 1, 4, 1, 100, 10, True) == approx(4.5e-3)
    assert cm.dp_allreduce_s(4e8, 1, 8, 1, 1, 100, 10, False) == 0.0


def test_dp_allreduce_hierarchical_across_nodes():
    # dp 4 over 2 nodes, k = 2 replicas per node, tp 2 (the node's 4 GPUs all reduce at once):
    #   intra ring over k: 2 x 1/2 x 4e8 / 1e11 = 4 ms
    #   inter ring over n = 2 nodes, t = 2 tp groups share the 10 GB/s link: 2 x 1/2 x 4e8 x 2 / 1e10 = 80 ms
    assert cm.dp_allreduce_s(4e8, 4, 2, 2, 2, 100, 10, False) == approx(0.084)
    # distributed optimizer: x 6/8 -> 63 ms
    assert cm.dp_allreduce_s(4e8, 4, 2, 2, 2, 100, 10, True) == approx(0.063)
    # one replica per node (k = 1), 4 nodes, tp 1: no intra step; 2 x 3/4 x 4e8 / 1e10 = 60 ms
    assert cm.dp_allreduce_s(4e8, 4, 1, 1, 4, 100, 10, False) == approx(0.060)


# ---- memory -------------------------------------------------------------------------------
def test_model_state_bytes():
    # bf16 weights 2, fp32 main grads 4, Adam fp32 master + m + v 12 bytes per parameter
    assert cm.model_state_bytes(1e6, 4, False) == (approx(2e6), approx(4e6), approx(12e6))
    # Megatron-LM docs (distrib_optimizer): 18 -> 6 + 12/d bytes per parameter; d = 4 -> 9
    w, g, o = cm.model_state_bytes(1e6, 4, True)
    assert (w, g, o) == (approx(2e6), approx(4e6), approx(3e6))
    assert w + g + o == approx(1e6 * (6 + 12 / 4))


def test_stage_params(inst):
    # 2 blocks + embedding; 2 blocks + head (untied model)
    assert cm.stage_params(inst, ["block"] * 2, True, False) == 2 * BLOCK_P + EMB_P
    assert cm.stage_params(inst, ["block"] * 2, False, True) == 2 * BLOCK_P + HEAD_P
    # a tied model keeps a copy of the V x h projection on the last stage, unless one stage holds both
    tied = replace(inst, model=replace(inst.model, tied_embeddings=True))
    assert cm.stage_params(tied, ["block"] * 2, False, True) == 2 * BLOCK_P + HEAD_P
    assert cm.stage_params(tied, ["block"] * 4, True, True, single_stage=True) == \
        4 * BLOCK_P + EMB_P + HEAD_P - 1000 * 1000


@pytest.mark.parametrize("pp, stage, m, expected", [
    (4, 0, 8, 4), (4, 1, 8, 3), (4, 3, 8, 1),   # 1F1B: min(pp - s, m)
    (4, 0, 2, 2), (8, 2, 3, 3),
])
def test_inflight_1f1b(pp, stage, m, expected):
    assert cm.inflight_microbatches("1f1b", pp, stage, m) == expected


def test_inflight_zb_h1_first_stage():
    # ZB-H1 keeps 1F1B's peak on the first stage: min(pp, m) (Qi et al. 2024: "same peak memory as 1F1B")
    assert cm.inflight_microbatches("zb-h1", 4, 0, 8) == 4
    assert cm.inflight_microbatches("zb-h1", 4, 0, 3) == 3


def test_inflight_gpipe():
    assert cm.inflight_microbatches("gpipe", 4, 0, 8) == 8
    assert cm.inflight_microbatches("gpipe", 4, 3, 13) == 13


@pytest.mark.parametrize("pp, v", [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_inflight_interleaved_korthikanti(pp, v):
    # Korthikanti et al. 2022 section 4.2.3: the first stage holds pp (1 + (pp-1)/(pp v))
    # micro-batches' worth of its layers (enough micro-batches: m = 64)
    assert cm.inflight_microbatches("interleaved", pp, 0, 64, v) == approx(pp * (1 + (pp - 1) / (pp * v)))


def test_inflight_interleaved_by_chunks():
    # pp 4, v 2: stage 3 holds 2 x 0 + 1 x 4 + 1 = 5 chunks = 2.5 stages; capped at m v chunks
    assert cm.inflight_microbatches("interleaved", 4, 3, 64, 2) == approx(2.5)
    assert cm.inflight_microbatches("interleaved", 4, 0, 2, 2) == approx(2.0)   # 4 chunks / 2
    assert cm.inflight_microbatches("interleaved", 4, 0, 64, 1) == 4              # vpp 1 = 1F1B


def test_stage_activation_bytes(inst):
    # tiny model (no dropout), flash attention on, per block at b 1:
    #   attention: LN-out 2sbh, Q+K 4sbh/t, V 2sbh/t, proj input 2sbh/t; MLP: input 2sbh, fc1 out +
    #   GeLU out 2 x 2 x 4sbh/t = 16sbh/t; 2 norm inputs 4sbh  ->  sbh (8 + 24/t)
    #   tp 2: 20 sbh = 1e7 bytes; with sequence parallelism sbh (8 + 24)/t = 16 sbh = 8e6
    # embedding: no dropout -> 0; head: 2sbh + 2sbh/t + 4 s b V / t = 1e6 + 5e5 + 1e6 = 2.5e6 (tp 2)
    blocks = ["block", "block"]
    f = cm.stage_activation_bytes
    assert f(inst, blocks, True, False, 2, 1, False, "none", 0, 2.0) == approx(2 * 2 * 1e7)
    assert f(inst, blocks, True, False, 2, 1, True, "none", 0, 2.0) == approx(2 * 2 * 8e6)
    assert f(inst, blocks, False, True, 2, 1, False, "none", 0, 1.0) == approx(2 * 1e7 + 2.5e6)
    # full recompute of 1 of 2 blocks: kept 2sbh (1e6) + 1e7 per micro-batch, x 2 in flight,
    # plus one block's full activations while it is recomputed (1e7)
    assert f(inst, blocks, True, False, 2, 1, False, "full", 1, 2.0) == approx(2 * (1e6 + 1e7) + 1e7)
    # all recomputed, sequence parallel: 2 x 2sbh/t per micro-batch x 3 in flight + 8e6 working
    assert f(inst, blocks, True, False, 2, 1, True, "full", 2, 3.0) == approx(3 * 2 * 5e5 + 8e6)
    # micro-batch 2 doubles everything
    assert f(inst, blocks, True, False, 2, 2, False, "none", 0, 1.0) == approx(2 * 2e7)


def test_optimizer_s(inst, big, small):
    # 30 bytes per parameter, memory-bound at 80% of bandwidth (the tiny profile measures no
    # optimizer):  1e8 x 30 / (1000e9 x 0.8) = 3.75 ms on G;  / (500e9 x 0.8) = 7.5 ms on S
    assert cm.optimizer_s(inst, 1e8, big) == approx(3.75e-3)
    assert cm.optimizer_s(inst, 1e8, small) == approx(7.5e-3)


# ---- pipeline closed forms ----------------------------------------------------------------
def test_pipeline_1f1b_equal_stages():
    # (m + p - 1)(f + b): P = 4, M = 8, f = 1, b = 2 -> 11 x 3 = 33 (compute 24 + bubble 9)
    comp, bub = cm.pipeline_time_s([1] * 4, [2] * 4, 8, "1f1b")
    assert (comp, bub) == (approx(24), approx(9))
    assert sum(cm.pipeline_time_s([1] * 4, [2] * 4, 8, "gpipe")) == approx(33)


def test_pipeline_1f1b_unequal_stages():
    # t = (3, 5, 4): (m - 1) max t + sum t = 3 x 5 + 12 = 27 at m = 4
    comp, bub = cm.pipeline_time_s([1, 2, 1], [2, 3, 3], 4, "1f1b")
    assert comp + bub == approx(27) and comp == approx(20)


@pytest.mark.parametrize("p, m, v, t, expected", [
    (4, 8, 2, 3, 28.5),        # 8 x 3 + 3 x 3 / 2 (the ecosystem notes' simulated 28.5)
    (8, 32, 4, 3, 101.25),     # 32 x 3 + 7 x 3 / 4
])
def test_pipeline_interleaved(p, m, v, t, expected):
    # Narayanan et al. 2021: m t + (p - 1) t / v
    comp, bub = cm.pipeline_time_s([1] * p, [t - 1] * p, m, "interleaved", v)
    assert comp == approx(m * t) and bub == approx((p - 1) * t / v) and comp + bub == approx(expected)


def test_pipeline_zb_h1():
    # ZB-H1 (Qi et al. 2024) at F = B = W = 1 (our b = B + W = 2), P = 4, M = 8:
    #   m (F + B + W) + (P - 1)(F + B - W) = 24 + 3 = 27, against 1F1B's 33
    assert sum(cm.pipeline_time_s([1] * 4, [2] * 4, 8, "zb-h1")) == approx(27)
    assert sum(cm.pipeline_time_s([1] * 4, [2] * 4, 8, "1f1b")) == approx(33)


def test_pipeline_gpipe_is_two_flow_shops():
    # all forwards, then all backwards: (sum f + (m-1) max f) + (sum b + (m-1) max b)
    # f = (2, 1), b = (2, 3), m = 9: (3 + 16) + (5 + 24) = 48; a shared max over t = f + b
    # would say 8 x 4 + 8 = 40 (the simulator measures 48)
    comp, bub = cm.pipeline_time_s([2, 1], [2, 3], 9, "gpipe")
    assert comp + bub == approx(48) and comp == approx(9 * 5)
    # a link slower than every stage is the flow shops' bottleneck: h = 3 > f, b
    assert sum(cm.pipeline_time_s([1, 1], [2, 2], 4, "gpipe", hop_s=[3])) == approx(3 * 3 + 3 * 3 + 6)


def test_steady_period_windows():
    # no hops: max t
    assert steady_period_s([3, 5, 4], [0, 0]) == 5
    # t = (4, 4), h = 1: stage 0 holds 2 micro-batches over a round trip f0 + h + t1 + h + b0 = 10 -> 5 each
    assert steady_period_s([4, 4], [1]) == approx(5)
    # t = (3, 5, 4), h = (2, 0): windows [0,1] (3 + 5 + 4) / 2 = 6, [0,2] 16 / 3, [1,2] 4.5, singles 5
    assert steady_period_s([3, 5, 4], [2, 0]) == approx(6)
    # 1F1B: T = (m - 1) z + sum t; with t = (4, 4), h = 1, m = 4: 3 x 5 + 8 = 23 (+ 2 h of p2p)
    assert sum(cm.pipeline_time_s([1, 1], [3, 3], 4, "1f1b", hop_s=[1])) == approx(23)


def test_p2p_time_by_schedule():
    # hops (1, 2), wrap 3: 1F1B / GPipe cross each hop twice (fill, drain): 6; ZB-H1 4x: 12;
    # interleaved v = 2: 2 (v sum h + (v - 1) wrap) = 2 (6 + 3) = 18
    assert cm.p2p_time_s([1, 2], 3, "1f1b") == cm.p2p_time_s([1, 2], 3, "gpipe") == 6
    assert cm.p2p_time_s([1, 2], 3, "zb-h1") == 12
    assert cm.p2p_time_s([1, 2], 3, "interleaved", 2) == 18


def test_dp_tail_hidden_by_the_drain():
    # b = 2, h = 1: stage s finishes its last backward 3 s earlier than stage s - 1
    assert cm.dp_tail_s([5, 5, 5], [2, 2, 2], [1, 1], "1f1b") == 5         # stage 0's, unhidden
    assert cm.dp_tail_s([1, 6, 9], [2, 2, 2], [1, 1], "1f1b") == 3         # max(1, 6 - 3, 9 - 6)
    # interleaved v = 2: only b / v of each stage's backward follows: slack 2 per stage -> max(1, 4, 5)
    assert cm.dp_tail_s([1, 6, 9], [2, 2, 2], [1, 1], "interleaved", 2) == 5
    assert cm.dp_tail_s([0, 0], [2, 2], [1], "1f1b") == 0                  # never negative


def test_end_inflight():
    # interleaved: embedding in chunk 0 of stage 0 held min(2 pp - 1, m) times, the head once
    assert cm.end_inflight("interleaved", 4, 8, 2, 4.75) == (7, 1)
    assert cm.end_inflight("interleaved", 4, 4, 2, 3.5) == (4, 1)
    assert cm.end_inflight("1f1b", 4, 8, 1, 4.0) == (4.0, 4.0)       # with the stage's blocks


def test_inflight_zb_h1_every_stage():
    # deferred weight gradients keep min(pp, m) micro-batches on every stage, not pp - s
    assert [cm.inflight_microbatches("zb-h1", 4, s, 8) for s in range(4)] == [4, 4, 4, 4]
    assert cm.inflight_microbatches("zb-h1", 4, 3, 2) == 2


# ---- cost ---------------------------------------------------------------------------------
def test_usd_per_hour(inst):
    nodes = inst.cluster.nodes
    # node 0 (big, billed per node): any GPU used pays the whole node, 8 $/h
    assert cm.usd_per_hour(nodes, {0: 1}) == approx(8.0)
    assert cm.usd_per_hour(nodes, {0: 4, 1: 2}) == approx(16.0)
    # node 2 (small, billed per GPU): 3 $/h / 2 GPUs = 1.5 $ per GPU-hour
    assert cm.usd_per_hour(nodes, {2: 1}) == approx(1.5)
    assert cm.usd_per_hour(nodes, {0: 4, 2: 1, 3: 2, 1: 0}) == approx(8 + 1.5 + 3)
    assert cm.usd_per_hour(nodes, {}) == 0.0


def test_usd_per_step():
    # 9.5 $/h x 36 s / 3600 s = 0.095 $
    assert cm.usd_per_step(9.5, 36.0) == approx(0.095)


# ---- the whole plan -----------------------------------------------------------------------
def test_evaluate_two_stage_plan_by_hand(inst):
    # stage 0 = node 0 (blocks 0-2 + embedding), stage 1 = node 1 (block 3 + head), tp 2, dp 2,
    # micro-batch 1, m = 8 / (1 x 2) = 4, 1F1B, no distributed optimizer, no sequence parallelism.
    # (Stage 0 is both the slowest and the one with most gradients, so the step-time terms do
    # not depend on how the drain overlaps the other stage's gradient reduction.)
    s0 = Stage("G", devs(0, range(4)), 0, 3, 2, 2, 1)
    s1 = Stage("G", devs(1, range(4)), 3, 1, 2, 2, 1)
    plan = two_stage_plan().with_(stages=(s0, s1))
    # compute (per layer as in test_stage_compute_and_recompute, tp 2):
    #   f0 = 3 x 1.02 + 0.06 = 3.12, b0 = 3 x 2.02 + 0.1 = 6.16 ms  -> t0 = 9.28 ms
    #   f1 = 1.02 + head 0.5 = 1.52, b1 = 2.02 + 1 = 3.02 ms       -> t1 = 4.54 ms
    f0, b0, f1, b1 = 3.12, 6.16, 1.52, 3.02
    compute = 4 * 9.28 * MS                     # m max t  (1F1B: (m - 1) max t + sum t in all)
    bubble = 4.54 * MS                          # sum t - max t
    # p2p: node 0 -> node 1, 4 senders share 10 GB/s; 1e6 bytes -> 0.4 ms; forward + backward
    p2p = 2 * 0.4 * MS
    # dp: params per GPU (tp 2): stage 0 (3 x 12,002,000 + 1,000,000)/2 = 18,503,000,
    #   stage 1 (12,002,000 + 1,001,000)/2 = 6,501,500; fp32 grads 4 bytes, ring over 2 in a node:
    #   2 x 1/2 x 4 x 18,503,000 / 1e11 = 0.74012 ms (stage 1: 0.26006 ms)
    dp = 4 * 18_503_000 / 1e11
    # optimizer: 18,503,000 x 30 / (1000e9 x 0.8) = 0.6938625 ms
    opt = 18_503_000 * 30 / 8e11
    step = compute + bubble + p2p + dp + opt
    assert step == approx(43.8939825 * MS)
    closed = predict.evaluate(inst, plan, predict.CLOSED_FORM)
    assert (closed.step_time_s, closed.bubble_s, closed.step_basis) == (approx(step), approx(bubble), "closed-form")

    # Simulated (the step the planner proves): the critical path is F0 on both stages, B0 back
    # to stage 0, the rest of stage 0's order (F2 B1 F3 B2 B3: m - w0 = 2 forwards, m - 1 = 3
    # backwards, w0 = min(pp - 0, m) = 2), then its reduction and the optimizer:
    #   f0 + f1 + b1 + 4 b0 + 2 f0 + 2 h + dp + opt = S + (m - 1) t0 - (w0 - 1) f0 + ...
    # so stage 0's first warm-up forward (3.12 ms) hides under stage 1's work: the closed
    # form's bubble sum t - max t = 4.54 ms is 4.54 - 3.12 = 1.42 ms here.
    bubble = (4.54 - 3.12) * MS
    step = compute + bubble + p2p + dp + opt
    assert step == approx((f0 + f1 + b1 + 4 * b0 + 2 * f0 + 0.8) * MS + dp + opt)
    pred = predict.evaluate(inst, plan)
    assert pred.step_basis == "simulated"
    assert pred.compute_s == approx(compute)
    assert pred.bubble_s == approx(bubble)
    assert pred.p2p_s == approx(p2p)
    assert pred.dp_allreduce_s == approx(dp)
    assert pred.optimizer_s == approx(opt)
    assert pred.step_time_s == approx(step)
    # both big nodes used, billed per node: 16 $/h
    assert pred.usd_per_hour == approx(16.0)
    assert pred.usd_per_step == approx(16.0 * step / 3600)
    assert pred.tokens_per_s == approx(8 * 500 / step)
    p0, p1 = pred.stages
    assert (p0.fwd_ms, p0.bwd_ms, p1.fwd_ms, p1.bwd_ms) == (approx(f0), approx(b0), approx(f1), approx(b1))
    gib = 2**30
    assert p0.weights_gib == approx(2 * 18_503_000 / gib)
    assert p0.gradients_gib == approx(4 * 18_503_000 / gib)
    assert p0.optimizer_gib == approx(12 * 18_503_000 / gib)
    # activations: stage 0 holds min(2 - 0, 4) = 2 micro-batches of 3 blocks x 1e7 (the embedding
    # keeps nothing without dropout); stage 1 one micro-batch of 1e7 + head 2.5e6
    assert (p0.inflight_microbatches, p1.inflight_microbatches) == (2, 1)
    assert p0.activations_gib == approx(6e7 / gib)
    assert p1.activations_gib == approx(1.25e7 / gib)
    assert p1.peak_memory_gib == approx((18 * 6_501_500 + 1.25e7) / gib)
    assert p0.capacity_gib == approx(80 * 0.9)


def test_plan_costs_hops_and_distributed_optimizer(inst):
    plan = two_stage_plan(distributed_optimizer=True, sequence_parallel=True)
    c = cm.plan_costs(inst, plan)
    # sequence parallel: 5e5 bytes per GPU over the shared link: 5e5 / 2.5e9 = 0.2 ms
    assert c.hop_s == (approx(2e-4),)
    # distributed optimizer: dp volume x 6/8 -> 0.50010 x 0.75 ms; optimizer updates 1/dp of the shard
    assert c.dp_s[1] == approx(0.75 * 4 * 12_502_500 / 1e11)
    assert c.opt_s[1] == approx(12_502_500 / 2 * 30 / 8e11)
    assert c.stages[1].optimizer_gib == approx(12 * 12_502_500 / 2 / 2**30)


def test_plan_costs_same_node_hop_and_hierarchical_dp(inst):
    # stage 0 = node 0 GPUs 0-1, stage 1 = node 0 GPUs 2-3 (tp 2, dp 1): the hop stays inside the node
    plan = two_stage_plan()
    s0 = Stage("G", devs(0, (0, 1)), 0, 2, 2, 1, 1)
    s1 = Stage("G", devs(0, (2, 3)), 2, 2, 2, 1, 1)
    c = cm.plan_costs(inst, plan.with_(stages=(s0, s1), num_microbatches=8))
    assert c.hop_s == (approx(1e6 / 1e11),)
    assert c.dp_s == (0.0, 0.0)
    # one stage of tp 2 x dp 4 over nodes 0 and 1 (2 replicas per node):
    #   params per GPU (4 x 12,002,000 + 1,000,000 + 1,001,000) / 2 = 25,004,500, B = 4 x that
    #   intra: 2 x 1/2 x B / 1e11; inter: 2 x 1/2 x B x 2 / 1e10
    one = Stage("G", devs(0, range(4)) + devs(1, range(4)), 0, 4, 2, 4, 1)
    c = cm.plan_costs(inst, plan.with_(stages=(one,), num_microbatches=2))
    B = 4 * 25_004_500
    assert c.dp_s == (approx(B / 1e11 + 2 * B / 1e10),)
    assert c.hop_s == ()


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return tiny_instance(tmp_path_factory.mktemp("tied"), tied=True)


def test_tied_embedding_all_reduce(inst, tied):
    """Megatron all-reduces the tied word-embedding gradient between the end stages after the
    data-parallel reduction: each GPU's shard V h / tp in fp32, B = 4 x 1000 x 1000 / 2 = 2e6
    bytes at tp 2, a two-rank ring: B / bandwidth."""
    plan = two_stage_plan()
    # nodes 0 and 1 (big): 10 GB/s a node shared by its 4 GPUs -> 2e6 / 2.5e9 = 0.8 ms
    assert cm.tied_embedding_sync_s(tied, plan) == approx(8e-4)
    assert cm.tied_embedding_sync_s(inst, plan) == 0.0                 # untied: no all-reduce
    c, u = cm.plan_costs(tied, plan), cm.plan_costs(inst, plan)
    assert c.dp_s == u.dp_s and c.embedding_s == approx(8e-4)
    assert c.tail_s == (approx(u.dp_s[0] + 8e-4), approx(u.dp_s[1] + 8e-4))   # both ends wait for it
    # the slower direction sets it: big node 0 (4 senders, min(10, 5) GB/s: 1.25 GB/s each)
    # -> small node 2 (2 GPUs, tp 2 dp 1; 5 / 2 = 2.5 GB/s): 1.6 ms against 0.8 ms back
    s1 = Stage("S", devs(2, (0, 1)), 2, 2, 2, 1, 1)
    assert cm.tied_embedding_sync_s(tied, plan.with_(stages=(plan.stages[0], s1))) == approx(1.6e-3)
    # inside one node: tp 1, B = 4e6 over 100 GB/s = 0.04 ms; one stage holds both: none
    s0, s1 = Stage("G", devs(0, (0,)), 0, 2, 1, 1, 1), Stage("G", devs(0, (1,)), 2, 2, 1, 1, 1)
    assert cm.tied_embedding_sync_s(tied, plan.with_(stages=(s0, s1), num_microbatches=8)) == approx(4e-5)
    one = Stage("G", devs(0, range(4)), 0, 4, 2, 2, 1)
    assert cm.tied_embedding_sync_s(tied, plan.with_(stages=(one,))) == 0.0


def test_tied_embedding_all_reduce_lengthens_the_simulated_step_by_itself(inst, tied):
    """Stage 0 ends its last backward after stage 1 and both reduce alike, so the all-reduce,
    which waits for both ends, adds all of its 0.8 ms to the simulated step; the closed form's
    tail (costmodel.dp_tail_s on PlanCosts.tail_s) adds the same."""
    plan = two_stage_plan()
    for basis in ("simulated", "closed-form"):
        t = predict.evaluate(tied, plan, basis).step_time_s
        u = predict.evaluate(inst, plan, basis).step_time_s
        assert t - u == pytest.approx(8e-4, abs=1e-12)


def test_cost_functions_take_the_tokens_of_a_work_item(tmp_path):
    """Every cost function prices rows of `tokens` tokens (the job's sequence length when not
    given): transfers and tp collectives scale with the tokens (tokens x mbs x h x 2 bytes),
    activations are the model's formula at that length."""
    inst = tiny_instance(tmp_path)
    nt = inst.cluster.node_types[0]
    seq = inst.job.seq_length                                   # 500 in the tiny instance
    assert cm.p2p_bytes(inst, 2, 1, False) == cm.p2p_bytes(inst, 2, 1, False, seq) == 500 * 2 * 1000 * 2
    assert cm.p2p_bytes(inst, 2, 1, False, 1500) == 3 * cm.p2p_bytes(inst, 2, 1, False)
    f, b = cm.tp_comm_s(inst, nt, 2, 1, "block")
    f3, b3 = cm.tp_comm_s(inst, nt, 2, 1, "block", 3 * seq)
    assert (f3, b3) == pytest.approx((3 * f, 3 * b))
    for tokens in (250, 1000):
        got = cm.stage_activation_bytes(inst, ["block"], False, False, 1, 1, False, "none", 0, 1.0,
                                               tokens=tokens)
        assert got == inst.model.layer_activation_bytes("block", micro_batch=1, tp=1, seq_length=tokens,
                                                        flash_attention=inst.job.flash_attention)
