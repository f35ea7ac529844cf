"""Token slices in the cost model (costmodel.slice_context_s), the sliced GPipe form
(schedules.GPipe.sliced_pipeline_time) and the simulator running sliced items."""
from __future__ import annotations

import functools

import pytest

from milp_plan import costmodel as cm, latency
from milp_plan.analytic import ATTENTION_BWD_FACTOR
from milp_plan.instance import InstanceSpec, build_instance


@functools.lru_cache(maxsize=2)
def gpt3_175b(flash: bool = True):
    return build_instance(InstanceSpec(model="gpt3-175b", flash_attention=flash))


@pytest.mark.parametrize("flash", [True, False])
def test_unsliced_sequence_costs_what_it_costs(flash):
    """One slice of L tokens is the unsliced sequence exactly, under either kernel, on every
    layer kind and stage (the sliced form at one slice is GPipe's: test_one_slice_is_gpipe)."""
    inst = gpt3_175b(flash)
    nt, L = inst.cluster.node_types[0], inst.job.seq_length
    for kind in ("block", "embedding", "head"):
        assert cm.layer_times(inst, nt, 8, 1, kind, L, 0) == cm.layer_times(inst, nt, 8, 1, kind)
    assert cm.slice_context_s(inst, nt, 8, 1, "block", L, 0) == (0.0, 0.0)
    kinds = cm.stage_kinds(inst, 0, 3)
    assert cm.stage_compute_s(inst, nt, 8, 1, kinds, True, True, "full", 1, tokens=L, context=0) == \
        cm.stage_compute_s(inst, nt, 8, 1, kinds, True, True, "full", 1)


@pytest.mark.parametrize("flash,kappa,bwd", [(True, 2.0, ATTENTION_BWD_FACTOR), (False, 1.0, 2.0)])
@pytest.mark.parametrize("l,c", [(128, 1920), (512, 512), (1024, 1024), (256, 0)])
def test_context_term_is_kappa_l_times_c(flash, kappa, bwd, l, c):
    """ctx_f = kappa core_f(L) l c / L^2 (kappa 2 on the causal flash kernel, 1 on the full
    block), backward the kernel's ratio (the fused core's fitted factor; 2 for the GEMMs); the
    row time at l tokens is the base."""
    inst = gpt3_175b(flash)
    nt, L = inst.cluster.node_types[0], inst.job.seq_length
    assert cm.context_weight(inst) == kappa and cm.context_bwd_factor(inst) == bwd
    core = cm.layer_times(inst, nt, 8, 1, "block").attn_core_fwd_s
    base, got = cm.layer_times(inst, nt, 8, 1, "block", l), cm.layer_times(inst, nt, 8, 1, "block", l, c)
    assert got.fwd_s - base.fwd_s == pytest.approx(kappa * core * l * c / L**2, rel=1e-12, abs=1e-18)
    assert got.bwd_s - base.bwd_s == pytest.approx(bwd * kappa * core * l * c / L**2, rel=1e-12, abs=1e-18)
    assert got.attn_core_fwd_s - base.attn_core_fwd_s == pytest.approx(kappa * core * l * c / L**2, rel=1e-12,
                                                                        abs=1e-18)


@pytest.mark.parametrize("lengths", [[512, 512, 1024], [1024, 1024], [128] * 16, [2048]])
def test_slices_of_a_sequence_price_the_kernels_attention(lengths):
    """The context cells of a sequence's slices, sum_k l_k c_k = (L^2 - sum l^2) / 2, priced at
    kappa core_f(L) / L^2: on the causal flash kernel (kappa 2) they are the cells below the
    diagonal blocks, and with the blocks' own l^2 (the analytic fused core is launch + k l^2) the
    slices' cores sum to the unsliced core(L), plus one launch per extra slice and less than one
    more (the launch inside core_f(L) scales with the context's rate): slicing saves no attention
    work. On the unfused full block (kappa 1) the context is half that: the masked cells above
    the diagonal blocks are not computed."""
    from milp_plan.analytic import KERNEL_LAUNCH_S
    for flash, kappa in ((True, 2.0), (False, 1.0)):
        inst = gpt3_175b(flash)
        nt, L = inst.cluster.node_types[0], inst.job.seq_length
        whole = cm.layer_times(inst, nt, 8, 1, "block")
        total, ctx, c = 0.0, 0.0, 0
        for l in lengths:
            total += cm.layer_times(inst, nt, 8, 1, "block", l, c).attn_core_fwd_s
            ctx += cm.slice_context_s(inst, nt, 8, 1, "block", l, c)[0]
            c += l
        cells = (L * L - sum(x * x for x in lengths)) / 2
        assert ctx == pytest.approx(kappa * whole.attn_core_fwd_s * cells / L**2, rel=1e-12, abs=1e-18)
        if flash:
            n = len(lengths)
            assert (n - 1) * KERNEL_LAUNCH_S * (1 - 1e-9) <= total - whole.attn_core_fwd_s <= \
                (n - (n == 1) + 1e-9) * KERNEL_LAUNCH_S


def test_flash_slices_cost_at_least_the_sequence():
    """With flash attention (the default) the slices of a sequence never cost less than the
    sequence, layer by layer, forward and backward (the attention is the same work; the GEMMs of
    a shorter row run no faster and each slice pays its launches): a sliced plan gains from a
    shorter bubble only."""
    inst = gpt3_175b(True)
    nt = inst.cluster.node_types[0]
    for lengths in ([1024, 1024], [512] * 4, [768, 640, 640], [128] * 16):
        for kind in ("block", "embedding", "head"):
            whole = cm.layer_times(inst, nt, 8, 1, kind)
            parts, c = [], 0
            for l in lengths:
                parts.append(cm.layer_times(inst, nt, 8, 1, kind, l, c))
                c += l
            assert sum(p.fwd_s for p in parts) >= whole.fwd_s * (1 - 1e-12)
            assert sum(p.bwd_s for p in parts) >= whole.bwd_s * (1 - 1e-12)


def test_embedding_and_head_have_no_context_term():
    inst = gpt3_175b()
    nt = inst.cluster.node_types[0]
    for kind in ("embedding", "head"):
        assert cm.layer_times(inst, nt, 8, 1, kind, 256, 1024) == cm.layer_times(inst, nt, 8, 1, kind, 256)


@pytest.mark.parametrize("kappa", [2.0, 1.0])
def test_latency_fit_slice_form(kappa):
    """TeraPipe's t = T0[b, l] + beta3 b l c from the fit t = b0 + c T + d T s: s = the keys
    weighed by the kernel (a context key kappa of an own key): beta3 = kappa d."""
    f = latency.LatencyFit(0.0, 0.1, 0.001, 2e-6, 9)
    b, l, c = 2, 256, 768
    assert f.predict_slice(b, l, c, kappa) == pytest.approx(0.1 + 0.001 * b * l + 2e-6 * b * l * (l + kappa * c),
                                                            rel=1e-12)
    assert f.predict_slice(b, l, c, kappa) - f.predict_slice(b, l, 0, kappa) == \
        pytest.approx(kappa * 2e-6 * b * l * c, rel=1e-9)


# ---- the sliced GPipe form against the simulator ----------------------------------------
import random  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from milp_plan import predict  # noqa: E402
from milp_plan.schedules import schedule_of  # noqa: E402
from milp_plan.sim.pipeline import PipelineSpec, simulate_pipeline  # noqa: E402

GPIPE = schedule_of("gpipe")


def _sliced_spec(pp, m, fwd, bwd, hops, dp=(), opt=()):
    return PipelineSpec(schedule="gpipe", num_microbatches=m, fwd_s=tuple(sum(r) for r in fwd),
                        bwd_s=tuple(sum(r) for r in bwd), hop_s=tuple(sum(r) for r in hops),
                        slice_fwd_s=tuple(map(tuple, fwd)), slice_bwd_s=tuple(map(tuple, bwd)),
                        slice_hop_s=tuple(map(tuple, hops)), dp_s=tuple(dp), opt_s=tuple(opt))


def _form(m, fwd, bwd, hops, dp, opt):
    """The closed form of predict.sliced_closed_form on raw rows."""
    from milp_plan import costmodel as cmod
    c = cmod.PlanCosts(tuple(sum(r) for r in fwd), tuple(sum(r) for r in bwd), tuple(sum(r) for r in hops), 0.0,
                       tuple(dp), tuple(opt), ())
    sc = cmod.SliceCosts(tuple(map(tuple, fwd)), tuple(map(tuple, bwd)), tuple(map(tuple, hops)))
    return predict.sliced_closed_form(c, sc, m)


def _random_rows(rng, rows, n, lo=0.0, hi=3.0):
    return [[rng.uniform(lo, hi) for _ in range(n)] for _ in range(rows)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 5), st.integers(0, 10**6), st.booleans())
def test_sliced_form_never_below_the_simulation(pp, m, n, seed, comm):
    """Random heterogeneous stages (times per stage and slice drawn independently), random
    hops, reductions and optimizer steps: the form is never below the simulated makespan, and
    its pipeline part never below the simulated end of the last backward."""
    rng = random.Random(seed)
    fwd, bwd = _random_rows(rng, pp, n, 0.1), _random_rows(rng, pp, n, 0.1)
    hops = _random_rows(rng, pp - 1, n, 0.0, 2.0 if comm else 0.0)
    dp = [rng.uniform(0, 5) if comm else 0.0 for _ in range(pp)]
    opt = [rng.uniform(0, 1) for _ in range(pp)]
    sim = simulate_pipeline(_sliced_spec(pp, m, fwd, bwd, hops, dp, opt))
    compute, bubble, xfer, dpt, o = _form(m, fwd, bwd, hops, dp, opt)
    assert sim.pipeline_time_s <= compute + bubble + xfer + 1e-9
    assert sim.step_time_s <= compute + bubble + xfer + dpt + o + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 6), st.integers(0, 10**6))
def test_sliced_form_exact_at_equal_stages(pp, m, n, seed):
    """TeraPipe's case: every stage takes t_k on slice k (no transfers): the simulated
    pipeline is exactly m sum_k (f_k + b_k) + (K - 1)(max f + max b)."""
    rng = random.Random(seed)
    f = [rng.uniform(0.1, 3) for _ in range(n)]
    b = [rng.uniform(0.1, 3) for _ in range(n)]
    sim = simulate_pipeline(_sliced_spec(pp, m, [f] * pp, [b] * pp, [[0.0] * n] * (pp - 1)))
    compute, bubble, xfer, _, _ = _form(m, [f] * pp, [b] * pp, [[0.0] * n] * (pp - 1), [0.0] * pp, [0.0] * pp)
    want = m * (sum(f) + sum(b)) + (pp - 1) * (max(f) + max(b))
    assert compute + bubble + xfer == pytest.approx(want, rel=1e-12)
    assert sim.pipeline_time_s == pytest.approx(want, rel=1e-12)


def test_hand_instance_in_the_simulator():
    """The slicing hand test (tests/test_slicing.py) as a pipeline: t(l, c) = 4 + l^2 + 2 l c as
    the forward, no backward work (1e-12), K = 4 equal stages: [2,1,1] -> 61, [4] -> 80."""
    def t(i, j):
        return 4 + (j - i) ** 2 + 2 * (j - i) * i
    for lengths, want in (((2, 1, 1), 61), ((4,), 80), ((3, 1), 63)):
        cuts, f = 0, []
        for n in lengths:
            f.append(float(t(cuts, cuts + n)))
            cuts += n
        zero = [0.0] * len(f)
        sim = simulate_pipeline(_sliced_spec(4, 1, [f] * 4, [zero] * 4, [zero] * 3))
        assert sim.pipeline_time_s == pytest.approx(want)


def test_one_slice_is_gpipe():
    """n = 1: the sliced form is GPipe's closed form plus its transfers, exactly."""
    rng = random.Random(3)
    for _ in range(50):
        pp, m = rng.randint(1, 6), rng.randint(1, 8)
        fwd, bwd = _random_rows(rng, pp, 1, 0.1), _random_rows(rng, pp, 1, 0.1)
        hops = _random_rows(rng, pp - 1, 1, 0.0, 2.0)
        compute, bubble, xfer = GPIPE.sliced_pipeline_time(fwd, bwd, m, hops)
        c2, b2 = GPIPE.pipeline_time([r[0] for r in fwd], [r[0] for r in bwd], m, [h[0] for h in hops])
        p2p = GPIPE.p2p_time([h[0] for h in hops], 0.0)
        assert compute + bubble + xfer == pytest.approx(c2 + b2 + p2p, rel=1e-12)
        assert xfer == pytest.approx(p2p, rel=1e-12, abs=1e-15)


def test_slices_do_not_relieve_memory():
    """Under the sliced GPipe order every slice of every sequence is live before the first
    backward: the simulated peak activations equal unsliced GPipe's (m sequences)."""
    n, pp, m = 4, 3, 2
    one = [[1.0] * n] * pp
    spec = PipelineSpec(schedule="gpipe", num_microbatches=m, fwd_s=(4.0,) * pp, bwd_s=(4.0,) * pp,
                        slice_fwd_s=tuple(map(tuple, one)), slice_bwd_s=tuple(map(tuple, one)),
                        slice_hop_s=((0.0,) * n,) * (pp - 1), slice_share=(0.4, 0.3, 0.2, 0.1),
                        act_bytes=((100.0,),) * pp)
    unsliced = PipelineSpec(schedule="gpipe", num_microbatches=m, fwd_s=(4.0,) * pp, bwd_s=(4.0,) * pp,
                            act_bytes=((100.0,),) * pp)
    assert simulate_pipeline(spec).peak_activation_bytes == pytest.approx(
        simulate_pipeline(unsliced).peak_activation_bytes)
    assert simulate_pipeline(spec).peak_activation_bytes[0] == pytest.approx(200.0)


def test_trace_names_slices():
    n, pp = 2, 2
    one = ((1.0,) * n,) * pp
    sim = simulate_pipeline(PipelineSpec(schedule="gpipe", num_microbatches=2, fwd_s=(2.0,) * pp, bwd_s=(2.0,) * pp,
                                         slice_fwd_s=one, slice_bwd_s=one, slice_hop_s=((0.0,) * n,)))
    names = [r.name for r in sorted(sim.records(), key=lambda r: r.start_s) if r.stage == 0 and r.kind in ("F", "B")]
    assert names[:4] == ["F0/0", "F0/1", "F1/0", "F1/1"]
    assert names[4:] == ["B0/1", "B0/0", "B1/1", "B1/0"]


def test_sliced_form_by_hand_on_uneven_stages():
    """K = 2, one sequence, slices k = 0, 1; forwards stage 0 (1, 5), stage 1 (4, 2); no
    backward work, no transfers. t_k = max_s f = (4, 5): W = 9; M_s = (5, 4): sum - max = 4,
    form 13 (the envelope a_max W + w_max (sum a - a_max) with a = (1, 1) gives 14). Simulated:
    stage 0 runs 0-1, 1-6; stage 1 runs 1-5, 6-8: 8 <= 13."""
    fwd, bwd, hops = [[1.0, 5.0], [4.0, 2.0]], [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]]
    compute, bubble, xfer = GPIPE.sliced_pipeline_time(fwd, bwd, 1, hops)
    assert (compute, bubble, xfer) == (9.0, 4.0, 0.0)
    assert simulate_pipeline(_sliced_spec(2, 1, fwd, bwd, hops)).pipeline_time_s == pytest.approx(8.0)


# ---- the planner decision: solve --slices -------------------------------------------------
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from clitools import run_cli  # noqa: E402

from milp_plan import check  # noqa: E402
from milp_plan.instance import instance_from_inputs  # noqa: E402
from milp_plan.plan import plan_from_dict, read_plan  # noqa: E402

A100_128 = str(Path(__file__).parent / "benchmarks" / "a100-128.yaml")
FEW = ["--cluster", A100_128, "--model", "gpt3-175b", "--global-batch", "8", "--work-limit", "60",
       "--fix", "tp=8,dp=1,mbs=1"]


def test_slices_n_end_to_end(tmp_path, capsys):
    """--slices 4 on GPT-3 175B, 8 sequences: the best plan found with every sequence cut into 4
    slices (the joint search over every GPipe config); plan.json records them, with the bound
    over every such plan (a proof only where it meets the plan), free mode; the checker passes, the recorded
    prediction equals the evaluation from the plan alone and the simulator's step; verify passes;
    launch writes per_stage.json with the slices and says stock Megatron cannot run it."""
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "solve", *FEW, "--slices", "4", "--out", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert len(doc["slices"]) == 4 and sum(doc["slices"]) == 2048
    assert doc["schedule"] == "gpipe" and doc["mode"] == "free"
    rec = doc["solver"]
    assert rec["best_bound"] <= rec["objective"] and rec["status"] == ("optimal" if rec["gap"] <= 1e-4 else "feasible")
    assert any("token slices" in r for r in doc["needs_per_stage_runtime"])
    assert f"status {rec['status']}" in stdout and "not activation memory" in stdout
    plan = read_plan(out)
    inst = instance_from_inputs(plan.inputs, str(out))
    assert check.check_plan(inst, plan) == []
    from milp_plan.sim.from_plan import simulate_plan
    assert simulate_plan(inst, plan).step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-9)
    # the sliced closed form is never below it
    assert predict.evaluate(inst, plan, basis=predict.CLOSED_FORM).step_time_s >= plan.predicted.step_time_s - 1e-12
    # slicing the same GPipe plan does not change its memory
    whole = predict.evaluate(inst, plan.with_(slices=()))
    assert [s.peak_memory_gib for s in plan.predicted.stages] == [s.peak_memory_gib for s in whole.stages]
    assert plan.predicted.step_time_s < whole.step_time_s
    bad = check.check_plan(inst, plan.with_(slices=plan.slices[:-1]))
    assert [v.rule for v in bad] == ["slices"] and "2048" in bad[0].message
    assert [v.rule for v in check.check_plan(inst, plan.with_(schedule="1f1b"))] == ["slices"]
    code, stdout, err = run_cli(capsys, "verify", str(out))
    assert code == 0, stdout + err
    code, stdout, err = run_cli(capsys, "launch", str(out), "--out", str(tmp_path / "launch"))
    assert code == 0, err
    per_stage = json.loads((tmp_path / "launch" / "per_stage.json").read_text())
    assert per_stage["token_slices"] == doc["slices"]
    assert "stock Megatron-LM cannot run" in stdout + err


def test_slices_auto_is_deterministic_and_says_why(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for p in (a, b):
        code, stdout, err = run_cli(capsys, "solve", *FEW, "--slices", "auto", "--out", str(p))
        assert code == 0, err
        assert "token slices:" in stdout
    assert a.read_bytes() == b.read_bytes()


def test_slices_auto_writes_a_sliced_plan_only_when_it_pays(tmp_path, capsys):
    """Many micro-batches (global batch 128 of GPT-3 1.3B on 2 GPUs): auto writes a sliced plan
    only when its step beats the unsliced plan's, else the stages --slices off writes; it says
    why either way (with flash attention slices save no attention work, costmodel.context_weight:
    a sliced plan gains from its shorter bubble alone). The default says what it decides, with
    its bound's figure; an explicit off says nothing."""
    args = ["--model", "gpt3-1.3b", "--global-batch", "128", "--fix", "pp=2,tp=1", "--work-limit", "30"]
    off, auto = tmp_path / "off.json", tmp_path / "auto.json"
    code, stdout, _ = run_cli(capsys, "solve", *args, "--out", str(off))
    assert code == 0
    assert "token slices: off" in stdout and "takes at least" in stdout   # the default's decision, a figure
    code, stdout, err = run_cli(capsys, "solve", *args, "--slices", "auto", "--out", str(auto))
    assert code == 0, err
    assert "token slices:" in stdout
    a, o = json.loads(auto.read_text()), json.loads(off.read_text())
    if a.get("slices"):
        assert a["predicted"]["step_time_s"] < o["predicted"]["step_time_s"]
    else:
        assert a["stages"] == o["stages"] and "token slices: off" in stdout
    code, stdout, _ = run_cli(capsys, "solve", *args, "--slices", "off", "--out", str(off))
    assert "token slices" not in stdout


@pytest.mark.parametrize("args,flag", [(["--slices", "nope"], "slices"), (["--slices", "1"], "slices"),
                                       (["--slices", "99"], "slices"),
                                       (["--slices", "4", "--fix", "schedule=1f1b"], "slices"),
                                       (["--slices", "auto", "--objective", "pareto"], "slices")])
def test_bad_slices_is_one_line_exit_2(tmp_path, capsys, args, flag):
    code, stdout, err = run_cli(capsys, "solve", *FEW, *args, "--out", str(tmp_path / "x.json"))
    assert code == 2
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_old_plans_read_and_slices_round_trip():
    from milp_plan.plan import Device, Plan, Stage
    plan = Plan(stages=(Stage("A100-80GB", (Device(0, 0),), 0, 2, 1, 1, 1),), global_batch_size=8,
                num_microbatches=8, schedule="gpipe")
    doc = plan.to_dict()
    assert "slices" not in doc                     # an unsliced plan writes what it wrote before
    old = plan_from_dict(doc)
    assert old.slices == () and old.to_json() == plan.to_json()
    new = plan.with_(slices=(512, 1536))
    again = plan_from_dict(json.loads(new.to_json()))
    assert again.slices == (512, 1536) and again.to_json() == new.to_json()
    from milp_plan.errors import InputError
    with pytest.raises(InputError, match="slices"):
        plan_from_dict({**doc, "slices": [0, 2048]})
