"""`milp-plan inspect` end to end, and every kind of bad input: exit 2, one line on stderr
naming the file and the field, never a traceback.

The good cases and a few bad ones run as real `milp-plan` processes, started together (a
few at a time) in a module fixture so that the interpreter start-ups overlap. Every bad
case also runs in this process through the same console entry point (`cli.main`, with
sys.argv set): the same exit code and stderr, without ~0.8 s of start-up each; an
unexpected exception there (what would be a traceback) fails the test.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tiny_instance import CLUSTER_YAML, MODEL_YAML, profile_csv

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "clusters").glob("*.yaml"))


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("milp-plan")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("milp-plan")
    return [found] if found else [sys.executable, "-c", "from milp_plan.cli import main; main()"]


BASE = """\
name: small-test
node_types:
  - name: a100-node
    gpu: A100-80GB
    gpus_per_node: 8
    count: 1
    intra_node_gb_per_s: 300
    inter_node_gb_per_s: 25
    usd_per_hour: 32.77
"""

MINE = """\
name: mine
num_layers: 4
hidden_size: 512
ffn_hidden_size: 2048
num_attention_heads: 8
vocab_size: 1000
seq_length: 128
"""


def cluster_variant(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new)


FILES = {
    "syntax.yaml": "name: [small\nnode_types: []\n",
    "gpu.yaml": cluster_variant("gpu: A100-80GB", "gpu: Z100"),
    "count0.yaml": cluster_variant("count: 1", "count: 0"),
    "countneg.yaml": cluster_variant("count: 1", "count: -2"),
    "gpn0.yaml": cluster_variant("gpus_per_node: 8", "gpus_per_node: 0"),
    "mem0.yaml": cluster_variant("usd_per_hour: 32.77", "usd_per_hour: 32.77\n    gpu_memory_gib: 0"),
    "memneg.yaml": cluster_variant("gpu: A100-80GB",
                                   "gpu: {name: X1, memory_gib: -80, peak_tflops: 100, memory_gb_per_s: 1000}"),
    "inter0.yaml": cluster_variant("inter_node_gb_per_s: 25", "inter_node_gb_per_s: 0"),
    "intra0.yaml": cluster_variant("intra_node_gb_per_s: 300", "intra_node_gb_per_s: -300"),
    "field.yaml": cluster_variant("usd_per_hour: 32.77", "usd_per_hour: 32.77\n    colour: red"),
    "topfield.yaml": "owner: me\n" + BASE,
    "noprice.yaml": cluster_variant("    usd_per_hour: 32.77\n", ""),
    "textnum.yaml": cluster_variant("inter_node_gb_per_s: 25", "inter_node_gb_per_s: fast"),
    "tiny-cluster.yaml": CLUSTER_YAML,
    "tiny-model.yaml": MODEL_YAML,
    "noh.csv": profile_csv(kinds=("embedding", "block")),
    "textfwd.csv": profile_csv().replace("tiny,G,1,2,500,block,4,8,1", "tiny,G,1,2,500,block,fast,8,1"),
    "col.csv": profile_csv().replace("attn_core_fwd_ms", "attn_core_fwd_ms_x"),
    "mine.yaml": MINE,
    "badmodel.yaml": MINE + "dropout_rate: 0.1\n",
    "heads.yaml": MINE.replace("num_attention_heads: 8", "num_attention_heads: 7"),
}

TINY = ["--cluster", "tiny-cluster.yaml", "--model", "tiny-model.yaml"]

# name: (arguments, words the single stderr line must contain)
BAD = {
    "missing file": (["inspect", "--cluster", "nope.yaml"], ["nope.yaml", "not found"]),
    "yaml syntax": (["inspect", "--cluster", "syntax.yaml"], ["syntax.yaml", "YAML syntax error at line 2"]),
    "unknown gpu": (["inspect", "--cluster", "gpu.yaml"], ["gpu.yaml", "field 'gpu'", "unknown GPU 'Z100'"]),
    "zero count": (["inspect", "--cluster", "count0.yaml"], ["count0.yaml", "field 'count'", "> 0, got 0"]),
    "negative count": (["inspect", "--cluster", "countneg.yaml"], ["countneg.yaml", "field 'count'", "got -2"]),
    "zero gpus per node": (["inspect", "--cluster", "gpn0.yaml"], ["gpn0.yaml", "field 'gpus_per_node'"]),
    "zero memory": (["inspect", "--cluster", "mem0.yaml"], ["mem0.yaml", "field 'gpu_memory_gib'", "> 0"]),
    "negative memory": (["inspect", "--cluster", "memneg.yaml"], ["memneg.yaml", "field 'memory_gib'", "-80"]),
    "zero bandwidth": (["inspect", "--cluster", "inter0.yaml"], ["inter0.yaml", "field 'inter_node_gb_per_s'"]),
    "negative bandwidth": (["inspect", "--cluster", "intra0.yaml"], ["intra0.yaml", "field 'intra_node_gb_per_s'"]),
    "unknown field": (["inspect", "--cluster", "field.yaml"], ["field.yaml", "unknown field 'colour'"]),
    "unknown top field": (["inspect", "--cluster", "topfield.yaml"], ["topfield.yaml", "unknown field 'owner'"]),
    "missing field": (["inspect", "--cluster", "noprice.yaml"], ["noprice.yaml", "'usd_per_hour'"]),
    "text for a number": (["inspect", "--cluster", "textnum.yaml"],
                          ["textnum.yaml", "field 'inter_node_gb_per_s'", "must be a number"]),
    "profile lacks head": (["inspect", *TINY, "--profiles", "noh.csv"], ["noh.csv", "kind 'head'", "GPU 'G'"]),
    "text in fwd_ms": (["inspect", *TINY, "--profiles", "textfwd.csv"], ["textfwd.csv", "column 'fwd_ms'", "ms"]),
    "unknown profile column": (["inspect", *TINY, "--profiles", "col.csv"], ["col.csv", "attn_core_fwd_ms_x"]),
    "missing profile dir": (["inspect", "--profiles", "no-such-dir"], ["no-such-dir", "not found"]),
    "global batch 0": (["inspect", "--global-batch", "0"], ["'global-batch'", "> 0, got 0"]),
    "global batch text": (["inspect", "--global-batch", "256k"], ["'--global-batch'", "'256k'", "int"]),
    "negative seq len": (["inspect", "--seq-len", "-5"], ["'seq-len'", "got -5"]),
    "budget in euros": (["solve", "--budget", "40€/h"], ["'budget'", "40€/h", "40$/h"]),
    "time in parsecs": (["solve", "--objective", "min-cost", "--time-limit", "1.2parsecs"],
                        ["'time-limit'", "parsecs", "1.2s/step"]),
    "unknown model": (["inspect", "--model", "gpt5-huge"], ["gpt5-huge", "unknown model"]),
    "model unknown field": (["inspect", "--model", "badmodel.yaml"], ["badmodel.yaml", "unknown field 'dropout_rate'"]),
    "model heads": (["inspect", "--model", "heads.yaml"], ["heads.yaml", "hidden_size 512", "num_attention_heads 7"]),
    "unknown option": (["inspect", "--colour", "red"], ["--colour"]),
    "zero workers": (["solve", "--workers", "0"], ["'workers'", "between 1 and", "got 0"]),
    "zero solve time": (["solve", "--max-solve-time", "0s"], ["'max-solve-time'", "> 0"]),
    "impossible fix": (["solve", "--fix", "tp=3"], ["'fix'", "tp=3 must divide the 32 attention heads"]),
    "zb-h1 fix": (["solve", "--fix", "schedule=zb-h1"], ["'fix'", "zero-bubble fork"]),
    "free mode without sp": (["solve", "--mode", "free", "--fix", "sp=off"], ["'fix'", "sequence parallelism on"]),
    "unknown mode": (["solve", "--mode", "aceso"], ["'mode'", "mode must be one of"]),
}

BAD_IN_A_PROCESS = ["missing file", "profile lacks head", "global batch text"]

GOOD = {
    "default": ["inspect"],
    "default json": ["inspect", "--json"],
    "custom model": ["inspect", "--model", "mine.yaml"],
    **{f"shipped {p.stem}": ["inspect", "--cluster", str(p)] for p in SHIPPED},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    for name, text in FILES.items():
        (d / name).write_text(text, encoding="utf-8")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    cli = _cli()

    def run(args):
        p = subprocess.run(cli + args, cwd=d, env=env, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    cases = {**{k: BAD[k][0] for k in BAD_IN_A_PROCESS}, **GOOD}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(run, args) for k, args in cases.items()}
        out = {k: f.result() for k, f in futures.items()}
    out["_dir"] = d
    return out


def assert_one_line_error(case: str, code: int, stdout: str, stderr: str) -> None:
    assert "Traceback" not in stderr
    assert code == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    for word in BAD[case][1]:
        assert word in lines[0], (word, lines[0])
    assert stdout == ""


@pytest.mark.parametrize("case", BAD_IN_A_PROCESS)
def test_bad_input_in_a_real_process(runs, case):
    assert_one_line_error(case, *runs[case])


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2(runs, case, monkeypatch, capsys):
    from milp_plan.cli import main
    monkeypatch.chdir(runs["_dir"])
    monkeypatch.setattr(sys, "argv", ["milp-plan", *BAD[case][0]])
    with pytest.raises(SystemExit) as exit_:
        main()
    captured = capsys.readouterr()
    assert_one_line_error(case, exit_.value.code, captured.out, captured.err)


def test_no_plan_written_on_bad_input(runs):
    assert not (runs["_dir"] / "plan.json").exists()


def _cluster_facts(path: Path) -> tuple[str, int, list[str]]:
    data = yaml.safe_load(path.read_text())
    gpus = sum(nt["count"] * nt["gpus_per_node"] for nt in data["node_types"])
    return data["name"], gpus, [nt["name"] for nt in data["node_types"]]


def test_inspect_default(runs):
    code, out, err = runs["default"]
    assert code == 0, err
    assert err == ""
    # the shipped default: 2 x 8 A100-80GB + 2 x 8 A10
    assert "Cluster default-a100-a10: 32 GPUs" in out
    header = next(line for line in out.splitlines() if line.startswith("node type"))
    for col in ("GPU", "nodes", "GPUs/node", "memory GiB", "TFLOP/s", "intra GB/s", "inter GB/s", "$/node-h"):
        assert col in header
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("a100-node", "a10-node"))}
    assert rows["a100-node"][1:4] == ["A100-80GB", "2", "8"] and rows["a10-node"][1:4] == ["A10", "2", "8"]
    assert rows["a100-node"][-1] == "40.97" and rows["a10-node"][-1] == "16.29"
    # the default job's gpt3-2.7b (l 32, h 2560, V 50257, s 2048):
    # 12 l h^2 + 13 l h + (V + s) h + 2h = 2,516,582,400 + 1,064,960 + 133,900,800 + 5,120 = 2,651,553,280
    assert "Model gpt3-2.7b (gpt): 2.652 B parameters, 32 layers" in out
    assert "Profile coverage:" in out and "analytic-gpt3-2.7b.csv" in out
    cov = [line.split() for line in out.splitlines() if line.startswith(("A100-80GB ", "A10 "))]
    # tp 1, 2, 4, 8 x micro-batch 1..16 x 3 kinds = 192 rows per GPU
    assert [c[:2] for c in cov] == [["A100-80GB", "192"], ["A10", "192"]]
    assert all(c[2:5] == ["1,2,4,8", "1-16", "2048"] for c in cov)


def test_inspect_json(runs):
    code, out, err = runs["default json"]
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cluster"]["name"] == "default-a100-a10" and doc["cluster"]["num_gpus"] == 32
    l, h, V, s = 32, 2560, 50257, 2048   # gpt3-2.7b, the default job's model
    params = 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h
    assert doc["model"]["parameters"] == params
    # Narayanan et al.: 72 l h^2 (1 + s/(6h) + V/(12 l h)) per token, x 80 x 2048 tokens per step
    per_token = 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert doc["model"]["flops_per_token"] == pytest.approx(per_token, rel=1e-12)
    assert doc["model"]["flops_per_step"] == pytest.approx(per_token * 80 * 2048, rel=1e-12)
    assert doc["job"]["global_batch_size"] == 80 and doc["job"]["seq_length"] == 2048
    assert {c["gpu"] for c in doc["profile"]["coverage"]} == {"A100-80GB", "A10"}
    assert doc["notices"] == []


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_inspect_every_shipped_cluster(runs, path):
    code, out, err = runs[f"shipped {path.stem}"]
    assert code == 0, err
    assert "Traceback" not in err
    name, gpus, types = _cluster_facts(path)
    assert f"Cluster {name}: {gpus} GPUs" in out
    table_rows = [line.split()[0] for line in out.splitlines() if line.split()]
    for t in types:
        assert t in table_rows
    assert "Profile coverage:" in out and "Model gpt3-2.7b" in out


def test_inspect_shipped_cluster_by_name(runs, monkeypatch, capsys):
    from milp_plan.cli import main
    monkeypatch.chdir(runs["_dir"])
    monkeypatch.setattr(sys, "argv", ["milp-plan", "inspect", "--cluster", "two-type-32"])
    main()
    out = capsys.readouterr().out
    name, gpus, _ = _cluster_facts(REPO / "clusters" / "two-type-32.yaml")
    assert f"Cluster {name}: {gpus} GPUs" in out


def test_custom_model_derives_profile_with_one_line_notice(runs):
    code, out, err = runs["custom model"]
    assert code == 0, err
    assert err.splitlines() == ["note: no profile covers mine on A100-80GB, A10: derived an analytic profile "
                                "on the fly"]
    assert "Model mine (gpt)" in out and "Profile coverage:" in out
