"""Length distributions and buckets (milp_plan/workload.py) and `solve --lengths`: a strategy
per length bucket with hot switching (milp_plan/hotswitch.py) on the cost model."""
from __future__ import annotations

import json

import pytest

from milp_plan import hotswitch, workload
from milp_plan.errors import InputError
from milp_plan.formulations.switching import brute_force, step_time
from milp_plan.instance import InstanceSpec
from milp_plan.solve import SolveRequest
from milp_plan.plan import read_plan
from clitools import run_cli


def test_a_lengths_csv_reads_and_buckets_by_its_edges(tmp_path):
    f = tmp_path / "lengths.csv"
    f.write_text("length,count\n100,3\n600,2\n600,1\n3000,1\n")
    hist = workload.read_lengths(f)
    assert hist.counts == ((100, 3), (600, 3), (3000, 1)) and hist.sequences == 7 and hist.tokens == 5100
    # three lengths: the default bins are the lengths themselves, no padding inside them
    assert [(b.edge, b.sequences, b.padding) for b in workload.buckets(hist)] == [(100, 3, 0), (600, 3, 0),
                                                                                 (3000, 1, 0)]
    # edges 512, 1024, 2048, 4096: (0,512] holds 3, (512,1024] 3, (2048,4096] 1
    got = workload.buckets(hist, (512, 1024, 2048, 4096))
    assert [(b.edge, b.sequences, b.tokens) for b in got] == [(512, 3, 300), (1024, 3, 1800), (4096, 1, 3000)]
    assert got[0].padding == pytest.approx(1 - 300 / (3 * 512))
    assert [b.edge for b in workload.buckets(hist, (3000, 600))] == [600, 3000]


@pytest.mark.parametrize("text, field", [
    ("len,count\n1,1\n", "header"), ("length,count\n1,x\n", "line 2"), ("length,count\n0,1\n", "length"),
    ("length,count\n5,0\n", "count"),
])
def test_bad_lengths_files_are_one_line_errors(tmp_path, text, field):
    f = tmp_path / "l.csv"
    f.write_text(text)
    with pytest.raises(InputError, match=field) as err:
        workload.read_lengths(f)
    assert str(f) in str(err.value) and "\n" not in str(err.value)


def test_the_synthetic_distribution_is_reproducible_and_capped():
    a = workload.parse_lengths("lognormal:2048:16384:500:3")
    assert a == workload.lognormal(2048, 16384, 500, 3) and a.sequences == 500 and a.longest <= 16384
    assert 1500 < a.tokens / a.sequences < 2600  # mean 2048 before clipping
    with pytest.raises(InputError, match="largest bucket edge"):
        workload.buckets(a, (1024,))
    with pytest.raises(InputError, match="lognormal:2048"):
        workload.parse_lengths("lognormal:big")


@pytest.fixture(scope="module")
def four_a100(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "a100x4.yaml"
    path.write_text("name: a100x4\nnode_types:\n  - {name: n, gpu: A100-80GB, gpus_per_node: 4, count: 1, "
                    "intra_node_gb_per_s: 300, inter_node_gb_per_s: 50, usd_per_hour: 20}\n")
    return str(path)


def test_hot_switching_on_the_cost_model(four_a100):
    """GPT-3 1.3B on 4 A100s, 24 long-tailed sequences: the switching model's answer is
    enumeration's, never worse than the best static plan, and each bucket's time is the
    cost model's for that strategy at that row length."""
    spec = InstanceSpec(cluster=four_a100, model="gpt3-1.3b")
    bks = workload.buckets(workload.lognormal(1024, 8192, 24, 1))
    req = SolveRequest("cpsat", None, 86400.0, work_limit=20.0)
    result = hotswitch.plan_buckets(spec, bks, hotswitch.candidates(spec, bks, req))
    ref = brute_force(result.problem)
    assert result.best.step_time_s == pytest.approx(ref.step_time_s, rel=1e-4)
    assert result.static is not None and result.best.step_time_s <= result.static[1] * (1 + 1e-9)
    assert step_time(result.problem, (result.static[0],) * len(bks), result.static[0]) == result.static[1]
    b, k = len(bks) - 1, result.best.assignment[-1]
    ev = hotswitch.evaluate_on(spec, result.strategies[k], bks[b], {})
    p = ev.plan.predicted
    assert result.problem.time[b][k] == pytest.approx(p.step_time_s - p.bubble_s - p.dp_allreduce_s - p.optimizer_s)


def test_cli_solve_lengths_writes_a_plan_with_phases(four_a100, tmp_path, capsys):
    out = tmp_path / "sw.json"
    code, text, _ = run_cli(capsys, "solve", "--cluster", four_a100, "--model", "gpt3-1.3b", "--lengths",
                            "lognormal:1024:8192:24", "--work-limit", "20", "--out", str(out))
    assert code == 0 and "Best static plan" in text and "candidate strategies" in text
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == "2" and sum(ph["sequences"] for ph in doc["phases"]["phases"]) == 24
    plan = read_plan(out)   # the schema holds it, and it reads back to the same bytes
    assert plan.to_json() == out.read_text() and plan.predicted.step_basis == "phases"
    code, _, err = run_cli(capsys, "solve", "--lengths", "lognormal:1024:8192:24", "--seq-len", "2048",
                           "--out", str(out))
    assert code == 2 and "--seq-len conflicts with --lengths" in err
    code, _, err = run_cli(capsys, "solve", "--buckets", "512,1024", "--out", str(out))
    assert code == 2 and "give --lengths too" in err


@pytest.fixture(scope="module")
def phased(four_a100, tmp_path_factory):
    """GPT-3 1.3B on 4 A100s, 48 long-tailed sequences, two pipeline stages pinned (so each
    segment of several buckets has a fill the simulator can check), edges chosen."""
    d = tmp_path_factory.mktemp("phased")
    hosts = d / "hosts.yaml"
    hosts.write_text(open(four_a100).read().replace("usd_per_hour: 20}", "usd_per_hour: 20, hosts: [gpu-a]}"))
    return d, str(hosts)


def test_a_plan_with_phases_verifies_launches_and_is_reproducible(four_a100, phased, capsys):
    d, hosts = phased
    args = ("solve", "--cluster", four_a100, "--model", "gpt3-1.3b", "--lengths", "lognormal:1024:8192:48",
            "--fix", "pp=2", "--work-limit", "10")
    code, text, err = run_cli(capsys, *args, "--out", str(d / "a.json"))
    assert code == 0, err
    code, _, err = run_cli(capsys, *args, "--out", str(d / "b.json"))
    assert code == 0 and (d / "a.json").read_bytes() == (d / "b.json").read_bytes()
    plan = read_plan(d / "a.json")
    ph = plan.phases
    assert ph.edges == "chosen" and sum(x.sequences for x in ph.phases) == 48
    assert all(x.plan.pp == 2 for x in ph.phases)
    # the step's parts: work, one fill per segment, the switches around the cycle, the home's reduction
    segs = ph.segments()
    fills = sum(max(x.fill_s for x in ph.phases[a:z + 1]) for a, z in segs)
    assert plan.predicted.step_time_s == pytest.approx(sum(x.time_s for x in ph.phases) + fills
                                                       + sum(t for *_, t in ph.switches()) + ph.home_time_s)
    code, out, err = run_cli(capsys, "verify", str(d / "a.json"), "--samples", "5", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["ok"], rep
    step = rep["comparisons"][0]
    assert step["what"] == "step time" and abs(step["rel_diff"]) <= 0.02
    assert len(rep["phases"]["segments"]) == len(segs) and rep["phases"]["sampled"]["batches"] == 5
    code, out2, _ = run_cli(capsys, "verify", str(d / "a.json"), "--samples", "5", "--json")
    assert json.loads(out2)["phases"]["sampled"] == rep["phases"]["sampled"]   # the same seed, the same batches
    code, _, err = run_cli(capsys, "launch", str(d / "a.json"), "--out", str(d / "L"), "--cluster", hosts)
    assert code == 0 and "stock Megatron-LM cannot" in err
    man = json.loads((d / "L" / "launch.json").read_text())
    assert man["megatron"]["compatible"] is False and len(man["phases"]) == len(ph.phases)
    for row, x in zip(man["phases"], ph.phases):
        flags = (d / "L" / row["dir"] / "megatron_args.sh").read_text()
        assert f"--seq-length {x.edge}" in flags and f"--global-batch-size {x.plan.global_batch_size}" in flags


def test_verify_catches_a_hand_edited_phase(four_a100, phased, capsys):
    d, _ = phased
    src = d / "a.json"
    if not src.exists():
        run_cli(capsys, "solve", "--cluster", four_a100, "--model", "gpt3-1.3b", "--lengths",
                "lognormal:1024:8192:48", "--fix", "pp=2", "--work-limit", "10", "--out", str(src))
    doc = json.loads(src.read_text())
    doc["phases"]["phases"][0]["sequences"] += 1
    bad = d / "edited.json"
    bad.write_text(json.dumps(doc))
    code, out, _ = run_cli(capsys, "verify", str(bad), "--samples", "0")
    n = doc["phases"]["phases"][0]["sequences"]
    assert code == 1 and f"holds {n} sequences; the distribution puts {n - 1} in it" in out and "FAIL" in out


def test_lengths_under_a_budget_rent_only_what_it_allows(tmp_path, capsys):
    """4 A100s billed per GPU at 5 $/h each; a 10 $/h budget rents 2 of them: every phase's
    layout stays on at most 2 GPUs (the union of the layouts' GPUs is what the step rents)."""
    c = tmp_path / "c.yaml"
    c.write_text("name: a100x4g\nnode_types:\n  - {name: n, gpu: A100-80GB, gpus_per_node: 4, count: 1, billing: gpu, "
                 "intra_node_gb_per_s: 300, inter_node_gb_per_s: 50, usd_per_hour: 20}\n")
    out = tmp_path / "p.json"
    code, text, err = run_cli(capsys, "solve", "--cluster", str(c), "--model", "gpt3-1.3b", "--lengths",
                              "lognormal:1024:4096:16", "--budget", "10$/h", "--work-limit", "10", "--out", str(out))
    assert code == 0, err
    plan = read_plan(out)
    used = {(dv.node, dv.local_gpu) for x in plan.phases.phases for st in x.plan.stages for dv in st.devices}
    assert len(used) <= 2 and plan.predicted.usd_per_hour == pytest.approx(5.0 * len(used))
    limit = plan.predicted.step_time_s * 0.5      # min-cost under a limit no layout meets: one line, exit 2
    code, _, err = run_cli(capsys, "solve", "--cluster", str(c), "--model", "gpt3-1.3b", "--lengths",
                           "lognormal:1024:4096:16", "--objective", "min-cost", "--time-limit", f"{limit}s/step",
                           "--work-limit", "10", "--out", str(tmp_path / "q.json"))
    assert code == 2 and "meets the limits" in err and not (tmp_path / "q.json").exists()
    code, text, err = run_cli(capsys, "solve", "--cluster", str(c), "--model", "gpt3-1.3b", "--lengths",
                              "lognormal:1024:4096:16", "--objective", "min-cost", "--time-limit",
                              f"{4 * limit}s/step", "--work-limit", "10", "--out", str(tmp_path / "r.json"))
    cheap = read_plan(tmp_path / "r.json")   # the plan says what was asked, and its bound is in $/step
    assert code == 0, err
    assert cheap.inputs["objective"]["kind"] == "min-cost" and "$/step)" in text
    assert cheap.solver.objective == pytest.approx(cheap.predicted.usd_per_step)


def test_a_job_file_carries_the_lengths_and_buckets(four_a100, tmp_path, capsys):
    """lengths (relative to the job file) and buckets in job.yaml act as --lengths and --buckets;
    a job that also sets seq_length is one line, exit 2."""
    (tmp_path / "lens.csv").write_text("length,count\n300,10\n900,6\n3000,3\n")
    job = tmp_path / "job.yaml"
    job.write_text("lengths: lens.csv\nbuckets: [1024, 4096]\nprecision: bf16\n")
    out = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "solve", "--cluster", four_a100, "--model", "gpt3-1.3b", "--job", str(job),
                           "--work-limit", "5", "--out", str(out))
    assert code == 0, err
    ph = read_plan(out).phases
    assert ph.edges == "given" and [(x.edge, x.sequences) for x in ph.phases] == [(1024, 16), (4096, 3)]
    job.write_text("lengths: lens.csv\nseq_length: 2048\n")
    code, _, err = run_cli(capsys, "solve", "--cluster", four_a100, "--model", "gpt3-1.3b", "--job", str(job),
                           "--out", str(tmp_path / "q.json"))
    assert code == 2 and "field 'seq_length' conflicts with 'lengths'" in err and str(job) in err


def test_the_global_batch_rescales_the_distribution():
    """lengths 300 x10, 900 x6, 3000 x3 (19 sequences, 3000 + 5400 + 9000 = 17400 tokens):
    at 38 sequences every count doubles; at 10: exact shares 5.26, 3.16, 1.58 -> 5, 3, 1 and the
    largest remainder (0.58, the 3000s) takes the last: 5, 3, 2; at 17400 tokens: 19 again."""
    h = workload.Histogram(((300, 10), (900, 6), (3000, 3)), "h")
    assert workload.scaled(h, 38).counts == ((300, 20), (900, 12), (3000, 6))
    assert workload.scaled(h, 10).counts == ((300, 5), (900, 3), (3000, 2))
    assert workload.scaled(h, tokens=17400) is h and workload.scaled(h, tokens=34800).sequences == 38
    assert workload.default_edges(h) == (300, 900, 3000)   # few lengths: binned at the lengths themselves


def test_the_shipped_example_is_the_documented_synthetic_draw():
    """`--lengths example`: 256 sequences drawn by lognormal(2048, 16384, 256, seed 1), shipped
    with the package (milp_plan/catalog/lengths-example.csv)."""
    shipped = workload.parse_lengths("example")
    assert shipped.counts == workload.lognormal(2048, 16384, 256, 1).counts and shipped.sequences == 256
