"""Planners compared over a suite of instances: the suite, its runs and their results file.

A suite is a list of cases. A case is what a worker needs to rebuild its instance on its
own (a cluster name, path or inline definition, a catalog model, the batch, the objective),
never pickled solver state, so the same case runs in a local process or on a Ray worker.
Each (case, planner) row is `compare.compare`'s: the plan scored by the cost model, the
checker, the limits and the simulator, its gap to the best bound any proving planner found
on that case. Sources of a suite:

  shipped        milp_plan/catalog/suite.yaml: the shipped clusters x catalog models x
                 objectives (`SHIPPED`);
  FILE.yaml      a user's suite, same format (`load_suite`);
  --random N     N generated cases (`random_suite`): 1-3 catalog GPU types with their
                 usual node shapes, links and rental prices, small GPT/BERT models, min-time
                 with and without a $/h budget; case i depends on (seed, i) alone.

Suite YAML: `cases:` a list of mappings with cluster, model (a catalog name or a model
YAML), global_batch, objective ('min-time', 'min-time@60$/h', 'min-cost@1.2s/step') and
optionally seq_length, mode, profiles, job (a job YAML: precision, flash attention, gradient
dtype, ...; the case's global_batch and seq_length win) and name; a list in any of cluster, model, global_batch, objective, mode expands to every
combination. `planners:`, `max_solve_time:` and `work_limit:` give defaults that flags override.

Runs stream into a results file (JSON lines: a header with the run's fingerprint, then one
line per finished case), so an interrupted run resumes where it stopped (`run_suite`).
Executors: `local` (worker processes, concurrent.futures) and `ray` (Ray tasks; `address`
names a running cluster, else a local one is started).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from milp_plan import deadline
from milp_plan.errors import InputError

SHIPPED = "shipped"
EXECUTORS = ("local", "ray")
OBJECTIVE_FORMS = "min-time, min-time@60$/h, min-time@0.2$/step or min-cost@1.2s/step"
RESULTS_VERSION = 1


@dataclass(frozen=True)
class Case:
    """One instance of a suite, in the terms `milp-plan solve` takes."""

    name: str
    cluster: Any                 # shipped name, YAML path, or an inline definition (a mapping)
    model: str
    global_batch: int
    objective: str = "min-time"  # min-time | min-time@BUDGET | min-cost@LIMIT
    seq_length: int | None = None
    mode: str = "megatron"
    profiles: str | None = None  # a profile file or folder; None: the shipped or analytic profiles
    job: str | None = None       # a job YAML (precision, flash attention, ...); the case's batch wins

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Suite:
    name: str
    cases: tuple[Case, ...]
    planners: tuple[str, ...] | None = None
    max_solve_time: str | None = None
    work_limit: float | None = None


def fingerprint(planners: Sequence[str], time_limit_s: float, seed: int, work_limit: float | None = None) -> str:
    """What a results file must match to be resumed: the planners, the limits and the seed (each
    record carries its case, so a larger suite resumes from a smaller one's file)."""
    key = {"planners": list(planners), "time_limit_s": time_limit_s, "seed": seed}
    if work_limit is not None:  # absent otherwise, so that files written before work limits still resume
        key["work_limit"] = work_limit
    doc = json.dumps(key, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


# ---- reading suites -------------------------------------------------------------------
def shipped_suite_path() -> Path:
    return Path(__file__).parent / "catalog" / "suite.yaml"


def load_suite(spec: str) -> Suite:
    """`shipped` or a suite YAML path."""
    import yaml
    path = shipped_suite_path() if spec == SHIPPED else Path(spec)
    source = f"suite:{SHIPPED}" if spec == SHIPPED else str(path)
    if not path.is_file():
        raise InputError(f"no suite file here; give '{SHIPPED}' or a suite YAML (cases: [...])", source=source)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML ({' '.join(str(exc).split())[:120]})", source=source) from None
    return suite_from_mapping(data, path.stem, source, path.parent)


def suite_from_mapping(data: Any, name: str, source: str, base: Path | None = None) -> Suite:
    """`base`: the suite file's folder; a cluster, model or profiles path is read relative to it."""
    if not isinstance(data, Mapping) or not isinstance(data.get("cases"), list) or not data["cases"]:
        raise InputError("a suite needs 'cases:', a non-empty list of mappings (cluster, model, global_batch, "
                         "objective)", source=source, field="cases")
    unknown = set(data) - {"name", "description", "cases", "planners", "max_solve_time", "work_limit"}
    if unknown:
        raise InputError(f"unknown field '{sorted(unknown)[0]}'; a suite has name, description, cases, planners, "
                         "max_solve_time, work_limit", source=source)
    work = data.get("work_limit")
    if work is not None and (isinstance(work, bool) or not isinstance(work, (int, float)) or not 0 < work < 1e9):
        raise InputError(f"work_limit must be a positive number of work units (about seconds), e.g. 30; got {work!r}",
                         source=source, field="work_limit")
    cases: list[Case] = []
    for i, entry in enumerate(data["cases"]):
        cases += _expand(entry, f"cases[{i}]", source, base)
    names = [c.name for c in cases]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InputError(f"two cases are named '{dup}'; give each case its own name", source=source, field="cases")
    planners = data.get("planners")
    if planners is not None and (not isinstance(planners, list) or not all(isinstance(p, str) for p in planners)):
        raise InputError("planners must be a list of planner names, e.g. [cpsat, warm-start]", source=source,
                         field="planners")
    return Suite(str(data.get("name", name)), tuple(cases), None if planners is None else tuple(planners),
                 None if data.get("max_solve_time") is None else str(data["max_solve_time"]),
                 None if work is None else float(work))


_CASE_FIELDS = {"name", "cluster", "model", "global_batch", "objective", "seq_length", "mode", "profiles", "job"}
_LISTABLE = ("cluster", "model", "global_batch", "objective", "mode")


def _beside(value: Any, base: Path | None) -> Any:
    """A relative path that names a file or folder beside the suite file, made absolute."""
    if base is None or not isinstance(value, str) or Path(value).is_absolute() or not (base / value).exists():
        return value
    return str((base / value).resolve())


def _expand(entry: Any, where: str, source: str, base: Path | None) -> list[Case]:
    if not isinstance(entry, Mapping):
        raise InputError(f"{where} must be a mapping (cluster, model, global_batch, objective)", source=source)
    unknown = set(entry) - _CASE_FIELDS
    if unknown:
        raise InputError(f"{where}: unknown field '{sorted(unknown)[0]}'; use {', '.join(sorted(_CASE_FIELDS))}",
                         source=source)
    for key in ("cluster", "model", "global_batch"):
        if key not in entry:
            raise InputError(f"{where}: missing field '{key}'", source=source)
    axes = {k: (entry[k] if isinstance(entry.get(k), list) else [entry.get(k)]) for k in _LISTABLE}
    single = all(len(v) == 1 for v in axes.values())
    out = []
    for values in itertools.product(*axes.values()):
        kw = dict(zip(axes, values))
        kw["objective"] = kw["objective"] or "min-time"
        kw["mode"] = kw["mode"] or "megatron"
        if not isinstance(kw["global_batch"], int) or isinstance(kw["global_batch"], bool) or kw["global_batch"] < 1:
            raise InputError(f"{where}: global_batch must be a whole number >= 1, got {kw['global_batch']!r}",
                             source=source)
        parse_objective(str(kw["objective"]), f"{source}: {where}")
        cluster = _beside(kw["cluster"], base)
        label = cluster.get("name", "inline") if isinstance(cluster, Mapping) else Path(str(cluster)).stem
        name = entry.get("name") if single and entry.get("name") else \
            f"{label}/{kw['model']}/b{kw['global_batch']}/{kw['objective']}" + \
            ("" if kw["mode"] == "megatron" else f"/{kw['mode']}")
        out.append(Case(str(name), cluster, str(_beside(kw["model"], base)), int(kw["global_batch"]),
                        str(kw["objective"]), entry.get("seq_length"), str(kw["mode"]),
                        _beside(entry.get("profiles"), base), _beside(entry.get("job"), base)))
    return out


def parse_objective(text: str, source: str | None = None):
    """'min-time' | 'min-time@60$/h' | 'min-time@0.2$/step' | 'min-cost@1.2s/step' -> Objective."""
    from milp_plan.job import Objective
    from milp_plan.units import parse_duration_s, parse_money
    kind, _, limit = text.partition("@")
    if kind == "min-time":
        return Objective("min-time", budget=parse_money(limit, field="objective") if limit else None)
    if kind == "min-cost" and limit:
        return Objective("min-cost", time_limit_s=parse_duration_s(limit, field="objective"))
    raise InputError(f"objective '{text}' is not one of {OBJECTIVE_FORMS}", source=source, field="objective")


# ---- generated suites -----------------------------------------------------------------
# Node shapes as clouds rent them: GPUs per node, NVLink/NVSwitch or PCIe GB/s per GPU,
# network GB/s per node, list $/h per GPU (rounded on-demand prices of 2024-2025 offers).
NODE_SHAPES = {
    "A100-80GB": (8, 300.0, 50.0, 5.1),
    "A100-40GB": (8, 300.0, 50.0, 4.1),
    "H100-SXM": (8, 450.0, 400.0, 12.3),
    "V100-32GB": (8, 150.0, 12.5, 3.1),
    "L40S": (8, 32.0, 25.0, 2.3),
    "A10": (8, 16.0, 12.5, 2.0),
    "L4": (8, 16.0, 12.5, 0.9),
}
RANDOM_MODELS = (("gpt3-1.3b", (16, 32, 64, 128)), ("gpt3-2.7b", (16, 32, 64)), ("bert-large", (32, 64, 128)))


def random_suite(n: int, seed: int, max_gpus: int = 32) -> Suite:
    """n cases; case i is drawn from Random(f'{seed}:{i}') alone, so a suite of 200 holds the
    suite of 100 as its first half. Each: 1-3 GPU types, 1-2 nodes each (4 or 8 GPUs), prices
    within +-20% of the list price, at most `max_gpus` GPUs; min-time, with a $/h budget of
    40-90% of the whole cluster's price in 40% of the cases."""
    if n < 1:
        raise InputError(f"--random needs a count >= 1, got {n}", field="random")
    if max_gpus < 4:
        raise InputError(f"--max-gpus must be >= 4 (one node of 4 GPUs), got {max_gpus}", field="max-gpus")
    cases = []
    for i in range(n):
        rng = random.Random(f"{seed}:{i}")
        types, gpus, price = [], 0, 0.0
        for gpu in rng.sample(sorted(NODE_SHAPES), rng.choice((1, 2, 2, 3))):
            gpn, intra, inter, usd = NODE_SHAPES[gpu]
            gpn = rng.choice((4, gpn)) if gpn == 8 else gpn
            count = rng.choice((1, 1, 2))
            while count and gpus + gpn * count > max_gpus:
                count -= 1
            if not count:
                continue
            node_usd = round(usd * gpn * rng.uniform(0.8, 1.2), 3)
            types.append({"name": f"{gpu.lower()}-node", "gpu": gpu, "gpus_per_node": gpn, "count": count,
                          "intra_node_gb_per_s": intra, "inter_node_gb_per_s": inter, "usd_per_hour": node_usd})
            gpus += gpn * count
            price += node_usd * count
        if not types:  # max_gpus below every drawn shape: one node of 4 of the first GPU
            gpu = sorted(NODE_SHAPES)[0]
            gpn, intra, inter, usd = NODE_SHAPES[gpu]
            types.append({"name": f"{gpu.lower()}-node", "gpu": gpu, "gpus_per_node": 4, "count": 1,
                          "intra_node_gb_per_s": intra, "inter_node_gb_per_s": inter, "usd_per_hour": usd * 4})
            price = usd * 4
        model, batches = RANDOM_MODELS[rng.randrange(len(RANDOM_MODELS))]
        batch = rng.choice(batches)
        objective = "min-time" if rng.random() < 0.6 else f"min-time@{round(price * rng.uniform(0.4, 0.9), 2)}$/h"
        cluster = {"name": f"random-{seed}-{i}", "node_types": types}
        cases.append(Case(f"random-{seed}-{i}", cluster, model, batch, objective))
    return Suite(f"random-{n}-seed-{seed}", tuple(cases))


# ---- running --------------------------------------------------------------------------
def build_case(case: Case):
    """The instance of a case (what a worker does first)."""
    from milp_plan.cluster import cluster_from_mapping
    from milp_plan.instance import InstanceSpec, build_instance
    from milp_plan.job import Objective
    obj = parse_objective(case.objective, f"case {case.name}")
    objective = Objective(obj.kind, obj.time_limit_s, obj.budget, case.mode)
    inline = isinstance(case.cluster, Mapping)
    spec = InstanceSpec(cluster=None if inline else str(case.cluster), model=case.model, profiles=case.profiles,
                        global_batch_size=case.global_batch, seq_length=case.seq_length, job_file=case.job)
    cluster = cluster_from_mapping(dict(case.cluster), f"case {case.name}: cluster") if inline else None
    return build_instance(spec, objective, cluster=cluster)


def run_case(case: Mapping[str, Any], planners: Sequence[str], time_limit_s: float, seed: int,
             work_limit: float | None = None) -> dict[str, Any]:
    """One case, every planner: a JSON-ready record (what a worker sends back). Bad input of
    a case is recorded as its error, so one broken case does not stop a suite."""
    from milp_plan.compare import compare
    c = Case(**case)
    try:
        inst = build_case(c)
        result = compare(inst, inst.objective.limits(), planners, time_limit_s=time_limit_s, seed=seed,
                         work_limit=work_limit)
    except InputError as exc:
        return {"case": c.name, "spec": c.to_dict(), "error": str(exc), "rows": []}
    doc = result.to_dict()
    return {"case": c.name, "spec": c.to_dict(), "gpus": inst.cluster.num_gpus, "model": c.model, "goal": c.objective,
            "best_bound": doc["best_bound"], "proven_infeasible": doc["proven_infeasible"],
            "violations": result.violations, "rows": doc["rows"]}


@dataclass
class SuiteRun:
    """The records of a suite's cases (in suite order) and how this run got them."""

    suite: Suite
    planners: tuple[str, ...]
    time_limit_s: float
    seed: int
    work_limit: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0      # cases read back from the results file
    ran: int = 0          # cases run now


def _read_results(path: Path, fingerprint: str, suite: Suite) -> dict[str, dict]:
    """The finished cases of a results file that are cases of this suite ({} when there is no
    file); a record of a case that has changed since is dropped (it runs again)."""
    if not path.exists():
        return {}
    done = {}
    with path.open() as fh:
        lines = fh.read().splitlines()
    if not lines:
        return {}
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        header = {}
    if header.get("fingerprint") != fingerprint:
        raise InputError("this results file comes from another planner list, time or work limit, or seed; give a new "
                         "--results file or delete it to start over", source=str(path), field="results")
    specs = {c.name: c.to_dict() for c in suite.cases}
    for line in lines[1:]:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut short by an interruption: that case runs again
        if specs.get(rec.get("case")) == rec.get("spec"):
            done[rec["case"]] = rec
    return done


def run_suite(suite: Suite, planners: Sequence[str], time_limit_s: float, *, seed: int = 1, workers: int = 1,
              executor: str = "local", address: str | None = None, results: str | Path | None = None,
              progress: Callable[[int, int, dict], None] | None = None,
              work_limit: float | None = None) -> SuiteRun:
    """Run every case not yet in `results` (JSON lines, appended as each case finishes). With a
    `work_limit` (compare.compare) the records are the same whatever the machine, its load,
    the executor or the number of workers; only the measured search times differ."""
    if executor not in EXECUTORS:
        raise InputError(f"executor must be {' or '.join(EXECUTORS)}, got {executor!r}", field="executor")
    if workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}", field="workers")
    planners = tuple(planners)
    from milp_plan.compare import check_work_limit
    check_work_limit(planners, work_limit)
    mark = fingerprint(planners, time_limit_s, seed, work_limit)
    path = Path(results) if results else None
    done = _read_results(path, mark, suite) if path else {}
    todo = [c for c in suite.cases if c.name not in done]
    run = SuiteRun(suite, planners, time_limit_s, seed, work_limit, resumed=len(done))
    out = None
    if path is not None:
        # written anew (atomically) with what was read back, so a line an interruption cut short goes
        from milp_plan.fileio import write_atomic
        head = {"suite": suite.name, "fingerprint": mark, "version": RESULTS_VERSION}
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in [head, *done.values()]))
        out = path.open("a")
    got: dict[str, dict] = dict(done)

    def finished(rec: dict) -> bool:
        """Record a case; False once the user has interrupted (a case cut short is not kept)."""
        if deadline.interrupted():
            return False
        got[rec["case"]] = rec
        run.ran += 1
        if out is not None:
            out.write(json.dumps(rec) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if progress:
            progress(len(got), len(suite.cases), rec)
        return True
    try:
        runner = _run_ray if executor == "ray" else _run_local
        runner([c.to_dict() for c in todo], (planners, time_limit_s, seed, work_limit), workers, address, finished)
    finally:
        if out is not None:
            out.close()
    run.records = [got[c.name] for c in suite.cases if c.name in got]
    return run


def _run_local(cases: list[dict], args: tuple, workers, address, finished) -> None:
    """`args`: run_case's arguments after the case (planners, time limit, seed, work limit)."""
    if address:
        raise InputError("--address names a Ray cluster; use it with --executor ray", field="address")
    if workers == 1:
        for case in cases:
            if not finished(run_case(case, *args)):
                return
        return
    pool = ProcessPoolExecutor(max_workers=workers)
    try:
        pending = {pool.submit(run_case, case, *args) for case in cases}
        while pending and not deadline.interrupted():
            ready, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in ready:  # records go back into suite order at the end
                if fut.exception() is not None and deadline.interrupted():
                    return
                if not finished(fut.result()):
                    return
    finally:
        if deadline.interrupted():  # the workers' cases are cut short: stop them, keep nothing of theirs
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(cases: list[dict], args: tuple, workers, address, finished) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'milp-plan[ray]'", field="executor") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1)(run_case)
        pending = [task.remote(case, *args) for case in cases]
        while pending and not deadline.interrupted():
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.2)
            for ref in ready:
                if not finished(ray.get(ref)):
                    break
        for ref in pending:
            ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()
