"""Start-up tax of the CLI: what a call costs outside the search.

    python tests/benchmarks/bench_startup.py [--repeats 5] [--work-limit 30]

Prints, as the median of `repeats` fresh processes, CPU (user + system, from the child's
rusage) and wall time of

- `milp-plan --help` (target < 0.3 s), and
- `milp-plan solve` on the shipped default: the whole command, the search (solve.run: the
  planner, from its configs to its plan, timed inside the process) and the difference, the
  time outside the search (target < 0.5 s): interpreter start, imports, option parsing,
  building the instance, the checks and the simulation of the plan, rendering, writing, and
  the default's decision on token slices (slice_plan.default_line, a proven bound over every
  sliced config, timed on its own line too).

and which heavy third-party packages each call imported. The package's bytecode is compiled
first and the children may write theirs, as after `pip install` (an environment with
PYTHONDONTWRITEBYTECODE set would otherwise compile every changed module on every call: 0.09 s). Not a test (pytest does not collect
tests/benchmarks); the numbers move with the load of a shared machine, CPU less than wall.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("numpy", "pandas", "ortools", "pulp", "highspy", "jsonschema", "scipy", "matplotlib", "pydantic", "yaml",
         "torch")

# the child: the console entry point, with solve.run timed (wall and CPU) and the heavy
# packages it imported recorded at exit
CHILD = r"""
import atexit, json, os, sys, time
acc = {"search_wall_s": 0.0, "search_cpu_s": 0.0, "slices_wall_s": 0.0, "slices_cpu_s": 0.0}
heavy = set(sys.argv.pop(1).split(","))
sys.argv[0] = "milp-plan"
def _time(module, name, label):   # module.name's wall and CPU time add up under acc[label + "_wall_s"/"_cpu_s"]
    fn = getattr(module, name)
    def timed(*a, **k):
        w, c = time.perf_counter(), time.process_time()
        try:
            return fn(*a, **k)
        finally:
            acc[label + "_wall_s"] += time.perf_counter() - w
            acc[label + "_cpu_s"] += time.process_time() - c
    setattr(module, name, timed)
from milp_plan.cli import main, one_blas_thread
one_blas_thread()   # as main() does first: the timing's imports below bring numpy in before it
if os.environ.get("BENCH_TIME_SEARCH"):
    import milp_plan.solve, milp_plan.slice_plan
    _time(milp_plan.solve, "run", "search")
    _time(milp_plan.slice_plan, "default_line", "slices")   # the default's decision on token slices
def _record():
    acc["modules"] = sorted({m.split(".")[0] for m in sys.modules} & heavy)
    with open(os.environ["BENCH_RECORD"], "w") as f:
        json.dump(acc, f)
atexit.register(_record)
main()
"""


def run_once(args: list[str], time_search: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "record.json")
        env = {**os.environ, "BENCH_RECORD": record}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if time_search:
            env["BENCH_TIME_SEARCH"] = "1"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", CHILD, ",".join(HEAVY), *args], cwd=tmp, env=env,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            sys.exit(f"milp-plan {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
        with open(record) as f:
            got = json.load(f)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, **got}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work-limit", default="30", help="the solve's --work-limit (the default's)")
    args = ap.parse_args()
    import milp_plan
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(milp_plan.__file__)], check=True)
    print(f"median of {args.repeats} processes; cpu = user + system of the child; bytecode compiled")
    help_runs = [run_once(["--help"], False) for _ in range(args.repeats)]
    print(f"milp-plan --help          wall {median_of(help_runs, 'wall_s'):6.3f} s  cpu "
          f"{median_of(help_runs, 'cpu_s'):6.3f} s   (target < 0.3 s)   imports: "
          f"{', '.join(help_runs[-1]['modules']) or 'none of ' + ', '.join(HEAVY)}")
    solve = ["solve", "--out", "plan.json", "--work-limit", args.work_limit]
    runs = [run_once(solve, True) for _ in range(args.repeats)]
    for r in runs:
        r["outside_wall_s"] = r["wall_s"] - r["search_wall_s"]
        r["outside_cpu_s"] = r["cpu_s"] - r["search_cpu_s"]
    print(f"milp-plan solve (default) wall {median_of(runs, 'wall_s'):6.3f} s  cpu {median_of(runs, 'cpu_s'):6.3f} s")
    print(f"  the search (solve.run)  wall {median_of(runs, 'search_wall_s'):6.3f} s  cpu "
          f"{median_of(runs, 'search_cpu_s'):6.3f} s")
    print(f"  outside the search      wall {median_of(runs, 'outside_wall_s'):6.3f} s  cpu "
          f"{median_of(runs, 'outside_cpu_s'):6.3f} s   (target < 0.5 s)   imports: {', '.join(runs[-1]['modules'])}")
    for r in runs:
        r["rest_wall_s"] = r["outside_wall_s"] - r["slices_wall_s"]
        r["rest_cpu_s"] = r["outside_cpu_s"] - r["slices_cpu_s"]
    print(f"    of it, the decision on token slices (slice_plan.default_line, a bound search over the sliced "
          f"configs)\n                          wall {median_of(runs, 'slices_wall_s'):6.3f} s  cpu "
          f"{median_of(runs, 'slices_cpu_s'):6.3f} s")
    print(f"    the rest (start-up, imports, instance, checks, simulation, output)\n"
          f"                          wall {median_of(runs, 'rest_wall_s'):6.3f} s  cpu {median_of(runs, 'rest_cpu_s'):6.3f} s")


if __name__ == "__main__":
    main()
