"""Backend adapters: the same PipelineModel built into CP-SAT (OR-Tools) or a PuLP MILP
(HiGHS through highspy, CBC through PuLP's bundled binary), and run with a time limit,
a seed and optional hints. Each run returns a BackendRun with the status mapped to
optimal | feasible | infeasible | timeout. CP-SAT also takes a deterministic work limit (its
`max_deterministic_time`) and reports the work spent; HiGHS and CBC have no such measure.

Interrupts: CP-SAT and HiGHS run in a worker thread (deadline.run_native) so that SIGINT /
SIGTERM reach Python at once and stop them (CpSolver.stop_search, Highs.cancelSolve); CP-SAT's
own SIGINT catching is off. CBC runs as a child process and stops at its time limit (Ctrl-C
in a terminal reaches it directly).

PuLP 3.3 API: variables come from LpProblem.add_variable and CBC from COIN_CMD with the
bundled binary's path (no PuLP 4.0 deprecation warnings).

Search: CP-SAT runs PORTFOLIO_SEARCH (its strategies cycled at restarts), also with one
worker: the default single-worker search could stall on a model its deterministic time did
not measure (see CpsatBackend.solve). Workers: CP-SAT runs `workers` parallel search workers;
the exact search asks for one (deterministic) and runs configs side by side instead
(solvers/parallel.py, --workers). (With interleave_search on, OR-Tools 9.15 aborts with
`heuristics.fixed_search != nullptr` on models with hints; determinism with several workers
is not promised.)
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from milp_plan import deadline

BACKENDS = ("cpsat", "highs", "cbc")
DETERMINISTIC_BACKENDS = ("cpsat",)   # those that take a work limit (CP-SAT's deterministic time)


@dataclass
class BackendRun:
    status: str                      # optimal | closed (stop_at) | stopped (stop_if) | feasible | infeasible | timeout
    objective: float | None          # raw model units
    bound: float | None              # raw model units
    value: Callable[[Any], float] | None
    wall_time_s: float
    work: float = 0.0                # work units spent (deadline.py): CP-SAT's deterministic time


@functools.cache
def import_cp_model():
    """OR-Tools' cp_model module, imported without pandas where pandas is not loaded yet.

    cp_model imports pandas (0.2 s of CPU, a third of a small solve's start-up) for its
    *_series helpers, which we never call; at import it only names pd.Index and pd.Series in
    type annotations. While it loads, sys.modules holds a stand-in `pandas` with those two
    names; afterwards the stand-in is removed, so that any later `import pandas` gets pandas."""
    import sys
    if "pandas" in sys.modules:
        from ortools.sat.python import cp_model
        return cp_model
    stand_in = types.ModuleType("pandas", "stand-in while ortools.sat.python.cp_model loads (backends.py)")
    stand_in.Index = type("Index", (), {})
    stand_in.Series = type("Series", (), {})
    sys.modules["pandas"] = stand_in
    try:
        from ortools.sat.python import cp_model
    finally:
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]
    return cp_model


@functools.cache
def _plain_cp_model_class(cp_model):
    """CpModel without the camelCase aliases OR-Tools attaches to every new model (a dir()
    walk, ~1.3 ms a model: a fifth of a small per-Config solve). We use PEP 8 names only."""
    class PlainCpModel(cp_model.CpModel):
        def _add_pre_pep8_methods(self) -> None:
            pass
    return PlainCpModel


def _plain_cp_model(cp_model):
    return _plain_cp_model_class(cp_model)()


class CpsatBackend:
    name = "cpsat"
    magnitude = 2**50   # int64 arithmetic with room: 1 ns ticks wherever a step bound allows
    value_rel_tol = 0.0  # values are exact integers

    def __init__(self) -> None:
        cp_model = import_cp_model()
        self.cp = cp_model
        self.model = _plain_cp_model(cp_model)
        self.parameters: dict[str, Any] = {}   # a model's own CP-SAT parameters (e.g. the switching model's)

    def new_bool(self, name: str):
        return self.model.new_bool_var(name)

    def new_int(self, lo: int, hi: int, name: str):
        return self.model.new_int_var(int(lo), int(hi), name)

    def add(self, ct) -> None:
        self.model.add(ct)

    def sum(self, terms: list):
        return self.cp.LinearExpr.sum(list(terms))

    def minimize(self, expr) -> None:
        self.model.minimize(expr)

    def hint(self, var, value: int) -> None:
        self.model.add_hint(var, int(value))

    def clear_hints(self) -> None:
        """Forget every hint (a model solved again starts from another one)."""
        self.model.clear_hints()

    def solve(self, time_limit_s: float, seed: int, workers: int = 1,
              on_progress: Callable[[float, float], None] | None = None, work: float | None = None,
              stop_at: float | None = None, stop_if: Callable[[Callable], bool] | None = None) -> BackendRun:
        """`stop_at` (raw model units): stop at the first solution whose objective is at or below
        it, status "closed" (the caller knows a bound that close; one worker's search, and so
        where it stops, is deterministic). `stop_if(value)`: stop at the first solution for
        which it holds (value(var) reads the solution), status "stopped"."""
        solver = self.cp.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = max(0.01, time_limit_s)
        if work is not None:
            p.max_deterministic_time = max(1e-3, work)
        p.random_seed = seed
        p.num_workers = workers
        # the portfolio of search strategies, cycled at restarts (one worker: still deterministic). The
        # default single-worker search can crawl on a per-config model whose step spans ~1e11 ticks,
        # raising its bound a sliver per conflict at ~0.002 deterministic units a second, so that a
        # work limit stopped nothing for hours (tests/test_work_limit.py); the portfolio proves it at once
        p.search_branching = self.cp.PORTFOLIO_SEARCH
        # no inclusion detection in presolve (ProcessAtMostOneAndLinear): in OR-Tools 9.15 it
        # certifies wrong optima (google/or-tools#5293, open). On a free-mode config of mixed-128
        # (GPT-3 13B, batch 512, pp 8, interleaved v2, stage sizes 8,32,16,32) it proved
        # 6,711,403,170 ticks optimal in 1.8 work units; the optimum is 6,649,013,764, found
        # with this switch (or with presolve off); the driver's drift check caught it (exit 3).
        # The default solves cost the same work, mixed-128 8% more (6.59 -> 7.12 units)
        p.presolve_inclusion_work_limit = 0
        # the LP with every constraint's linear relaxation (level 2, not the default 1): the refutations
        # of mixed-128's free proof (GPT-3 13B, batch 512) take 21.74 work units instead of 23.60 and
        # 46.8 s CPU instead of 50.7; the Pareto benchmark 26.10 units instead of 27.91; the default's
        # and scale-1024's solves the same within 1% (tests/benchmarks/bench_solve.py, --work)
        p.linearization_level = 2
        for name, value in self.parameters.items():
            setattr(p, name, value)
        p.catch_sigint_signal = False  # SIGINT goes to Python (deadline.handle_signals), which stops us
        cb, closed = None, []
        if on_progress is not None or stop_at is not None or stop_if is not None:
            class _CB(self.cp.CpSolverSolutionCallback):
                def on_solution_callback(inner) -> None:  # noqa: N805
                    if on_progress is not None:
                        on_progress(inner.objective_value, inner.best_objective_bound)
                    if stop_at is not None and inner.objective_value <= stop_at:
                        closed.append(True)
                        inner.stop_search()
                    elif stop_if is not None and stop_if(inner.value):
                        closed.append(False)
                        inner.stop_search()
            cb = _CB()
        t0 = time.perf_counter()
        status = deadline.run_native(lambda: solver.solve(self.model, cb) if cb else solver.solve(self.model),
                                     solver.stop_search)
        wall, work = time.perf_counter() - t0, solver.deterministic_time
        cp = self.cp
        if status == cp.OPTIMAL:
            return BackendRun("optimal", solver.objective_value, solver.objective_value, solver.value, wall, work)
        if status == cp.FEASIBLE and closed == [False]:
            return BackendRun("stopped", solver.objective_value, solver.best_objective_bound, solver.value, wall,
                              work)
        if status == cp.FEASIBLE and closed:
            return BackendRun("closed", solver.objective_value, solver.best_objective_bound, solver.value, wall, work)
        if status == cp.FEASIBLE:
            return BackendRun("feasible", solver.objective_value, solver.best_objective_bound, solver.value, wall,
                              work)
        if status == cp.INFEASIBLE:
            return BackendRun("infeasible", None, None, None, wall, work)
        return BackendRun("timeout", None, None, None, wall, work)


class PulpBackend:
    """PuLP model solved by HiGHS (highspy) or CBC."""

    # HiGHS and CBC work in doubles with absolute tolerances: with the default instance's
    # step bound at 6e9 ticks (0.1 us) HiGHS returned a wrong optimum, at 6e8 (1 us) it did not
    magnitude = 2**30

    def __init__(self, solver: str) -> None:
        import pulp
        self.pulp = pulp
        self.name = solver
        # CBC hands its solution back through a text file that prints 8 significant digits, so
        # a value above 1e8 (a step in ticks, a $/step product) comes back off by up to 5e-9
        # of itself; HiGHS returns doubles, which round to their integers exactly
        self.value_rel_tol = 1e-7 if solver == "cbc" else 0.0
        self.prob = pulp.LpProblem("milp_plan", pulp.LpMinimize)
        self._names: set[str] = set()

    def _name(self, name: str) -> str:
        clean = re.sub(r"[^A-Za-z0-9]", "_", name)
        while clean in self._names:
            clean += "_"
        self._names.add(clean)
        return clean

    def new_bool(self, name: str):
        return self.prob.add_variable(self._name(name), 0, 1, cat="Integer")

    def new_int(self, lo: int, hi: int, name: str):
        return self.prob.add_variable(self._name(name), int(lo), int(hi), cat="Integer")

    def add(self, ct) -> None:
        self.prob += ct

    def sum(self, terms: list):
        return self.pulp.lpSum(terms)

    def minimize(self, expr) -> None:
        self.prob.setObjective(expr)

    def hint(self, var, value: int) -> None:
        var.setInitialValue(int(value))

    def solve(self, time_limit_s: float, seed: int, workers: int = 1,
              on_progress: Callable[[float, float], None] | None = None, work: None = None,
              stop_at: float | None = None) -> BackendRun:
        """`work`: always None (solvers/driver.py refuses a work limit for HiGHS and CBC).
        `stop_at` is not read: HiGHS and CBC solve to their optimum."""
        pulp = self.pulp
        limit = max(0.05, time_limit_s)
        if self.name == "highs":
            solver = pulp.HiGHS(msg=False, timeLimit=limit, gapRel=0.0, threads=workers, random_seed=seed,
                                **HIGHS_OPTIONS)
        else:
            solver = pulp.COIN_CMD(path=_cbc_path(), msg=False, timeLimit=limit, gapRel=0.0, threads=workers,
                                   options=[f"randomSeed {seed}", f"randomCbcSeed {seed}", *CBC_OPTIONS])
        t0 = time.perf_counter()
        if self.name == "highs":
            with _native_stdout_to_stderr():
                deadline.run_native(lambda: self.prob.solve(solver), self._cancel_highs)
        else:
            self.prob.solve(solver)
        wall = time.perf_counter() - t0
        st = self.prob.sol_status
        value = self._value
        obj = value(self.prob.objective) if self.prob.objective is not None else None
        if st == pulp.LpSolutionOptimal:
            return BackendRun("optimal", obj, obj, value, wall)
        if st == pulp.LpSolutionIntegerFeasible:
            bound = None
            if self.name == "highs":
                try:
                    bound = float(self.prob.solverModel.getInfo().mip_dual_bound)
                except Exception:  # pragma: no cover - depends on highspy internals
                    bound = None
            return BackendRun("feasible", obj, bound, value, wall)
        if st == pulp.LpSolutionInfeasible or self.prob.status == pulp.LpStatusInfeasible:
            return BackendRun("infeasible", None, None, None, wall)
        return BackendRun("timeout", None, None, None, wall)


    def _value(self, v) -> float:
        """A variable's or an expression's value in the solution, every variable rounded to its
        integer (all are integer): HiGHS and CBC return values within an integrality tolerance
        (CBC through a text file), and a coefficient of 1e6 turns 1e-8 into a unit; the
        model's own objective must be exact, or the drift check calls it a bug."""
        if isinstance(v, (int, float)):
            return 0.0
        if isinstance(v, self.pulp.LpAffineExpression):
            return float(sum(c * round(x.value() or 0.0) for x, c in v.items()) + v.constant)
        return float(round(v.value() or 0.0))

    def _cancel_highs(self) -> None:
        model = getattr(self.prob, "solverModel", None)
        if model is not None:
            model.cancelSolve()


@contextlib.contextmanager
def _native_stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at 2 while the block runs: highspy 1.12 prints a debug line
    ("HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();") to stdout with
    its output off, which would corrupt the CLI's stdout (--json, --out -)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


# HiGHS without presolve. On a $/step objective (W = T u: ticks x price units, ~1e12) highspy 1.12's
# presolve lost the optimum of a per-config model: a Megatron-mode config of a random 2-type,
# 8-layer instance (tests/test_solve.py's brute-force cross-check, min-cost under a time limit,
# pp 3) came back "optimal" at 1,800,414,000,000 where the plan it returned is priced at
# 1,800,406,080,004 (the drift check: an internal error, exit 3). Tighter feasibility tolerances
# (1e-9) did not help, nor did HiGHS's objective scaling (user_objective_scale -10 to -30: not the
# objective's magnitude; tests/test_backends.py); without presolve it is right. Measured (shipped clusters, 60 s): min-time
# default 0.7 -> 0.9 s, the shipped job 2.9 -> 3.2 s, two-type-32 0.6 -> 0.9 s; min-cost the shipped
# job at 1.4 s/step 0.9 -> 1.0 s, GPT-3 6.7B at 9 s/step 11.3 -> 16.7 s; the same plans
HIGHS_OPTIONS = {"presolve": "off"}

# CBC without cutting planes. In a $/step objective (W = T u: ticks x price units, ~1e12) the
# bundled CBC 2.10.3's cuts are unsafe: on a free config of a 3-type, 12-layer instance (min-cost
# under a time limit; tests/test_solve.py's issue-scale example) a Gomory cut and strong
# branching fathomed the root and CBC called 3.0594e12 optimal where 2.8412e12 is feasible (HiGHS
# and CP-SAT find it): the search wrote a plan 3.2% dearer than brute force's as `optimal`; and
# two-type-32 (GPT-3 6.7B, batch 256) min-cost in Megatron mode stopped with an internal error
# (exit 3) after 42 s, CBC's `optimal` solution priced above its own plan (the drift check).
# Without cuts both are right; the min-time solves cost the same (default 1.00 -> 0.91 s,
# shipped 3.3 -> 3.7 s), the min-cost ones more (the shipped default's job: proven in 54 s, a
# 0.8% gap at 60 s without cuts)
CBC_OPTIONS = ["cuts off"]


@functools.cache
def _cbc_path() -> str:
    """A CBC binary: one on PATH (pulp[cbc]), else the one bundled with PuLP 3.x."""
    found = shutil.which("cbc")
    if found:
        return found
    from pulp.apis import coin_api
    path = coin_api.COIN_CMD.executableExtension(coin_api.pulp_cbc_path)
    if os.name != "nt" and not os.access(path, os.X_OK):  # what PULP_CBC_CMD did on import
        try:
            os.chmod(path, 0o755)
        except OSError:
            pass
    return path


def make_backend(name: str):
    if name == "cpsat":
        return CpsatBackend()
    if name in ("highs", "cbc"):
        return PulpBackend(name)
    raise ValueError(name)
