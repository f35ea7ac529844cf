"""The job's settings: job file, flags over the file, errors, and what each setting changes
(gradient dtype in the dp reduction and the model state; distributed optimizer allowed;
recorded in plan.json and used by verify)."""
from __future__ import annotations

import json

import pytest

from milp_plan import costmodel as cm
from milp_plan.errors import InputError
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Job, JobSettings, load_job_file
from clitools import run_cli
from tiny_instance import tiny_instance, two_stage_plan, write_inputs

JOB_YAML = """\
global_batch_tokens: 4000     # 8 sequences of 500 tokens
seq_length: 500
precision: bf16
flash_attention: false
grad_reduce_dtype: bf16
distributed_optimizer: false
memory_headroom: 0.2
"""


def test_job_file_resolves(tmp_path):
    (tmp_path / "job.yaml").write_text(JOB_YAML)
    job = load_job_file(str(tmp_path / "job.yaml")).resolve(default_seq_length=2048)
    assert job == Job(global_batch_size=8, seq_length=500, flash_attention=False, grad_reduce_dtype="bf16",
                      distributed_optimizer=False, memory_headroom=0.2)
    assert job.global_batch_tokens == 4000 and job.grad_bytes == 2.0


def test_flags_override_the_file(tmp_path):
    (tmp_path / "job.yaml").write_text(JOB_YAML)
    inst = tiny_instance(tmp_path, global_batch=16, job_file=str(tmp_path / "job.yaml"), flash_attention=True,
                         memory_headroom=0.1)
    j = inst.job
    # the flag's batch in sequences replaces the file's batch in tokens; unset flags keep the file
    assert (j.global_batch_size, j.flash_attention, j.memory_headroom) == (16, True, 0.1)
    assert (j.grad_reduce_dtype, j.distributed_optimizer) == ("bf16", False)
    # and a batch in tokens from the flags replaces one in sequences from the file
    s = JobSettings(global_batch_tokens=1000).over(JobSettings(global_batch=3))
    assert s.resolve(500).global_batch_size == 2


def test_defaults_without_a_file(tmp_path):
    j = tiny_instance(tmp_path).job
    assert (j.precision, j.flash_attention, j.grad_reduce_dtype, j.distributed_optimizer) == \
        ("bf16", True, "fp32", True)


BAD_JOBS = {
    "unknown field": ("batch: 8\n", "unknown field 'batch'"),
    "fp8": ("precision: fp8\n", "fp8 is not modelled"),
    "fp32 precision": ("precision: fp32\n", "must be bf16 or fp16"),
    "tokens not whole sequences": ("global_batch_tokens: 4100\nseq_length: 500\n", "multiple of the sequence"),
    "both batches": ("global_batch: 8\nglobal_batch_tokens: 4000\n", "not both"),
    "bf16 reduce with fp16": ("precision: fp16\ngrad_reduce_dtype: bf16\n", "fp32 or fp16"),
    "flash not a bool": ("flash_attention: maybe\n", "true or false"),
    "headroom": ("memory_headroom: 1.5\n", "fraction in [0, 1)"),
}


@pytest.mark.parametrize("case", list(BAD_JOBS))
def test_bad_job_file_is_one_line_exit_2(tmp_path, capsys, case):
    text, words = BAD_JOBS[case]
    cluster, model, prof = write_inputs(tmp_path)
    (tmp_path / "job.yaml").write_text(text)
    code, out, err = run_cli(capsys, "inspect", "--cluster", str(cluster), "--model", str(model), "--profiles",
                             str(prof), "--job", str(tmp_path / "job.yaml"))
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and words in err, err
    assert "job.yaml" in err, err   # names the file


def test_a_flag_error_does_not_blame_the_file(tmp_path, capsys):
    # the file says fp16; the flag's bf16 gradient reduction contradicts it: the flag is named, not the file
    cluster, model, prof = write_inputs(tmp_path)
    (tmp_path / "job.yaml").write_text("precision: fp16\n")
    code, out, err = run_cli(capsys, "inspect", "--cluster", str(cluster), "--model", str(model), "--profiles",
                             str(prof), "--job", str(tmp_path / "job.yaml"), "--grad-reduce-dtype", "bf16")
    assert code == 2 and "job.yaml" not in err and "grad_reduce_dtype" in err, err


@pytest.mark.parametrize("args, words", [
    (["--precision", "fp8"], "fp8 is not modelled"),
    (["--grad-reduce-dtype", "int8"], "fp32 or bf16 or fp16"),
    (["--global-batch", "8", "--global-batch-tokens", "4000"], "not both"),
    (["--global-batch-tokens", "0"], "must be > 0"),
])
def test_bad_job_flags_are_one_line_exit_2(tmp_path, capsys, args, words):
    cluster, model, prof = write_inputs(tmp_path)
    code, out, err = run_cli(capsys, "inspect", "--cluster", str(cluster), "--model", str(model), "--profiles",
                             str(prof), *args)
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err


def test_inspect_shows_the_settings(tmp_path, capsys):
    cluster, model, prof = write_inputs(tmp_path)
    (tmp_path / "job.yaml").write_text(JOB_YAML)
    code, out, err = run_cli(capsys, "inspect", "--cluster", str(cluster), "--model", str(model), "--profiles",
                             str(prof), "--job", str(tmp_path / "job.yaml"), "--precision", "fp16",
                             "--grad-reduce-dtype", "fp16")
    assert code == 0, err
    assert ("Job: global batch 8 sequences x 500 tokens = 4,000 tokens, fp16, adam, flash attention off, "
            "gradients reduced in fp16, distributed optimizer not allowed, memory headroom 20%") in out


# ---- what the settings change --------------------------------------------------------------
def test_bf16_gradient_reduction_halves_the_dp_bytes(tmp_path):
    # tiny instance, two_stage_plan: stage 0 = embedding (1,000,000) + 2 blocks (12,002,000 each)
    # = 25,004,000 parameters, tp 2 -> P = 12,502,000 per GPU; dp 2 inside node 0 (100 GB/s):
    #   fp32: ring 2 (2-1)/2 x 4 P / 100e9 = 50,008,000 / 1e11 = 0.50008 ms
    #   bf16: 2 P bytes: 0.25004 ms (half)
    # with the distributed optimizer: fp32 (4 + 2) / 8 of it = 0.37506 ms; bf16 (2 + 2) / 4 = 0.25004 ms
    plan = two_stage_plan()
    fp32 = cm.plan_costs(tiny_instance(tmp_path / "a"), plan).dp_s[0]
    bf16 = cm.plan_costs(tiny_instance(tmp_path / "b", grad_reduce_dtype="bf16"), plan).dp_s[0]
    assert fp32 == pytest.approx(0.50008e-3, rel=1e-12)
    assert bf16 == pytest.approx(0.25004e-3, rel=1e-12)
    dist = two_stage_plan(distributed_optimizer=True)
    assert cm.plan_costs(tiny_instance(tmp_path / "c"), dist).dp_s[0] == pytest.approx(0.37506e-3, rel=1e-12)
    assert cm.plan_costs(tiny_instance(tmp_path / "d", grad_reduce_dtype="bf16"), dist).dp_s[0] == \
        pytest.approx(0.25004e-3, rel=1e-12)


def test_bf16_gradients_in_memory():
    # Megatron-LM docs/distrib_optimizer, bytes per parameter: bf16 params + fp32 grads 2 + 4 + 12 = 18
    # (distributed 6 + 12/d); 2-byte params and grads 2 + 2 + 16 = 20 (distributed 4 + 16/d)
    assert cm.model_state_bytes(1e6, 4, False, 4.0) == (2e6, 4e6, 12e6)
    assert cm.model_state_bytes(1e6, 4, False, 2.0) == (2e6, 2e6, 16e6)
    assert cm.model_state_bytes(1e6, 4, True, 2.0) == (2e6, 2e6, 4e6)


def test_stage_memory_follows_the_job(tmp_path):
    plan = two_stage_plan()
    a = cm.plan_costs(tiny_instance(tmp_path / "a"), plan).stages[0]
    b = cm.plan_costs(tiny_instance(tmp_path / "b", grad_reduce_dtype="bf16"), plan).stages[0]
    # P = 12,502,000 per GPU: gradients 4 P -> 2 P, optimizer 12 P -> 16 P (GiB)
    assert a.gradients_gib == pytest.approx(4 * 12_502_000 / 2**30)
    assert b.gradients_gib == pytest.approx(2 * 12_502_000 / 2**30)
    assert b.optimizer_gib == pytest.approx(16 * 12_502_000 / 2**30)


def _solve(tmp_path, capsys, *extra):
    cluster, model, prof = write_inputs(tmp_path)
    out = tmp_path / "plan.json"
    code, stdout, err = run_cli(capsys, "solve", "--cluster", str(cluster), "--model", str(model), "--profiles",
                                str(prof), "--global-batch", "8", "--out", str(out), "--max-solve-time", "20s",
                                *extra)
    return code, out, err


def test_distributed_optimizer_not_allowed_leaves_the_space(tmp_path, capsys):
    code, out, err = _solve(tmp_path / "on", capsys, "--fix", "dp=2")
    assert code == 0, err
    assert json.loads(out.read_text())["distributed_optimizer"] is True   # used where dp > 1
    code, out, err = _solve(tmp_path / "off", capsys, "--fix", "dp=2", "--no-distributed-optimizer")
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["distributed_optimizer"] is False
    assert doc["inputs"]["job"]["distributed_optimizer"] is False
    code, out, err = _solve(tmp_path / "both", capsys, "--fix", "distopt=on", "--no-distributed-optimizer")
    assert code == 2 and "contradicts" in err and len(err.splitlines()) == 1, err


def test_plan_records_the_job_and_verify_uses_it(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(JOB_YAML)
    code, out, err = _solve(tmp_path, capsys, "--job", str(tmp_path / "job.yaml"))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["inputs"]["job"] == {"global_batch_size": 8, "seq_length": 500, "precision": "bf16",
                                    "optimizer": "adam", "flash_attention": False, "memory_headroom": 0.2,
                                    "grad_reduce_dtype": "bf16", "distributed_optimizer": False}
    (tmp_path / "job.yaml").unlink()   # verify rebuilds the instance from the plan, not the file
    code, stdout, err = run_cli(capsys, "verify", str(out))
    assert code == 0, stdout + err


def test_older_plan_without_the_new_fields_still_verifies(tmp_path, capsys):
    code, out, err = _solve(tmp_path, capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    for k in ("grad_reduce_dtype", "distributed_optimizer"):
        del doc["inputs"]["job"][k]
    for k in ("job_file", "global_batch_tokens", "precision", "grad_reduce_dtype", "distributed_optimizer"):
        del doc["inputs"]["spec"][k]
    out.write_text(json.dumps(doc))
    code, stdout, err = run_cli(capsys, "verify", str(out))
    assert code == 0, stdout + err


def test_launch_flags_follow_the_job():
    from milp_plan.launch.megatron import attention_flags, precision_flags
    assert precision_flags("bf16") == ["--bf16"]
    assert precision_flags("bf16", "bf16") == ["--bf16", "--grad-reduce-in-bf16"]
    assert precision_flags("fp16", "fp16") == ["--fp16"]
    assert precision_flags("fp16", "fp32") == ["--fp16", "--accumulate-allreduce-grads-in-fp32"]
    assert attention_flags(True) == [] and attention_flags(False) == ["--attention-backend", "unfused"]


def test_job_rejects_fp8_in_the_library():
    with pytest.raises(InputError, match="fp8 is not modelled"):
        Job(global_batch_size=8, seq_length=512, precision="fp8")
    with pytest.raises(InputError, match="fp32 or bf16"):
        Job(global_batch_size=8, seq_length=512, grad_reduce_dtype="fp16")
    _ = build_instance, InstanceSpec


def test_compare_accepts_an_older_plan_of_the_same_job(tmp_path, capsys):
    # a plan written before grad_reduce_dtype / distributed_optimizer existed records neither: it
    # was made for their defaults, which is this compare's job
    code, out, err = _solve(tmp_path, capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    for k in ("grad_reduce_dtype", "distributed_optimizer"):
        del doc["inputs"]["job"][k]
    out.write_text(json.dumps(doc))
    code, stdout, err = run_cli(capsys, "compare", "--plan", str(out), "--planners", "warm-start",
                                "--out", str(tmp_path / "cmp.json"))
    assert code == 0, stdout + err
    # and a job flag that differs from the plan's is named
    cluster, model, prof = write_inputs(tmp_path)
    code, stdout, err = run_cli(capsys, "compare", "--plan", str(out), "--planners", "warm-start", "--cluster",
                                str(cluster), "--model", str(model), "--profiles", str(prof), "--global-batch", "8",
                                "--grad-reduce-dtype", "bf16", "--out", str(tmp_path / "cmp2.json"))
    assert code == 2 and "grad_reduce_dtype" in err, err


def test_pareto_searches_without_the_distributed_optimizer_when_the_job_says_so(tmp_path, capsys):
    cluster, model, prof = write_inputs(tmp_path)
    out = tmp_path / "front.json"
    common = ["solve", "--objective", "pareto", "--cluster", str(cluster), "--model", str(model), "--profiles",
              str(prof), "--global-batch", "8", "--max-solve-time", "20s", "--out", str(out)]
    code, stdout, err = run_cli(capsys, *common)
    assert code == 0, err
    with_it = json.loads(out.read_text())
    assert any(p["distributed_optimizer"] for p in with_it["plans"])   # dp 2 points use it when allowed
    code, stdout, err = run_cli(capsys, *common, "--no-distributed-optimizer")
    assert code == 0, err
    without = json.loads(out.read_text())
    assert without["plans"] and not any(p["distributed_optimizer"] for p in without["plans"])
