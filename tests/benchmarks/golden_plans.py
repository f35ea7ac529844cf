"""Byte-identity of plans across a refactor: solve a fixed list of shipped instances and
write each plan.json (or pareto.json) into a folder; compare two folders.

    python tests/benchmarks/golden_plans.py write DIR      # before the change
    python tests/benchmarks/golden_plans.py write DIR2     # after it
    python tests/benchmarks/golden_plans.py compare DIR DIR2
    python tests/benchmarks/golden_plans.py write DIR3 --workers 2   # extra flags for every case

Every case pins its model and batch, so a change of the shipped defaults does not show up
as a difference; every case is proven within its work limit on 2 cores, so the plans do not
depend on wall time. Prints each case's wall time (a rough speed check; bench_solve.py is
the real one)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

JOB = ["--model", "gpt3-6.7b", "--global-batch", "256"]
CASES: dict[str, list[str]] = {
    "default-min-time": [*JOB],
    "default-min-cost": [*JOB, "--objective", "min-cost", "--time-limit", "9s/step"],
    "default-budget": [*JOB, "--budget", "60$/h"],
    "default-step-budget": [*JOB, "--budget", "0.19$/step"],
    "default-highs": [*JOB, "--solver", "highs"],
    "default-cbc-pp2": [*JOB, "--solver", "cbc", "--fix", "pp=2"],
    "default-brute-pp2": [*JOB, "--solver", "brute-force", "--fix", "pp=2,tp=8"],
    "default-free-pp2": [*JOB, "--mode", "free", "--fix", "pp=2"],
    "default-free-pp3": [*JOB, "--mode", "free", "--fix", "pp=3"],       # per-stage tp differs
    "two-type-32-free-pp2": ["--cluster", "two-type-32", *JOB, "--mode", "free", "--fix", "pp=2"],
    "default-gpipe": [*JOB, "--fix", "schedule=gpipe"],
    "default-1f1b-fixed": [*JOB, "--fix", "schedule=1f1b,tp=4,pp=4,mbs=1"],
    "two-type-32": ["--cluster", "two-type-32", *JOB],
    "mixed-128": ["--cluster", "mixed-128", *JOB],
    "default-pareto-pp2": [*JOB, "--objective", "pareto", "--fix", "pp=2"],
}


def write(folder: Path, extra: list[str] = ()) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, args in CASES.items():
        out = folder / f"{name}.json"
        t0 = time.perf_counter()
        # a work limit (deterministic), but for HiGHS and CBC, which cannot measure work
        limit = ["--max-solve-time", "600s"] if {"highs", "cbc"} & set(args) else ["--work-limit", "300"]
        r = subprocess.run(["milp-plan", "solve", *args, *limit, *extra, "--out", str(out)], capture_output=True, text=True)
        status = next((line for line in r.stdout.splitlines() if line.startswith("Solver")), r.stderr.strip())
        print(f"{name:22s} exit {r.returncode}  {time.perf_counter() - t0:6.1f} s  {status[:110]}")


def compare(a: Path, b: Path) -> int:
    bad = 0
    for name in CASES:
        pa, pb = a / f"{name}.json", b / f"{name}.json"
        same = pa.exists() == pb.exists() and (not pa.exists() or pa.read_bytes() == pb.read_bytes())
        bad += not same
        print(f"{name:22s} {'identical' if same else 'DIFFERENT'}")
    print(f"{len(CASES) - bad} of {len(CASES)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
