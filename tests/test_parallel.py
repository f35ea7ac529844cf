"""--workers N (solvers/parallel.py): the configs solved ahead in worker processes, and free
mode's bounds computed ahead in them, give the same plan.json, bound, status and work as one
process, with or without a work limit that cuts the search short; and the workers' answers are
used (not all dropped)."""
from __future__ import annotations

import json

import pytest

from clitools import run_cli
from milp_plan import solve as solving
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Objective
from milp_plan.solvers import parallel


@pytest.fixture
def counted(monkeypatch):
    """Each solve's (taken, dropped) answers of its workers."""
    seen = []
    close = parallel.Ahead.close

    def record(self):
        seen.append((self.taken, self.dropped))
        close(self)
    monkeypatch.setattr(parallel.Ahead, "close", record)
    return seen


@pytest.fixture
def bounded(monkeypatch):
    """Each free solve's (root bounds, full bounds, parents opened with their children) its
    BoundWorkers' processes gave the search."""
    seen = []
    workers = parallel.BoundWorkers
    root_bounds, take, close = workers.root_bounds, workers.take, workers.close

    def roots(self, dl):
        got = root_bounds(self, dl)
        seen.append([len(got), 0, 0])
        return got

    def taken(self, cfg, floor, dl):
        got = take(self, cfg, floor, dl)
        seen[-1][2] += got is not None and got.kids is not None
        return got

    def record(self):
        seen[-1][1] = self.taken
        close(self)
    monkeypatch.setattr(parallel.BoundWorkers, "root_bounds", roots)
    monkeypatch.setattr(parallel.BoundWorkers, "take", taken)
    monkeypatch.setattr(parallel.BoundWorkers, "close", record)
    return seen


@pytest.fixture
def guessed(monkeypatch):
    """The root processes' first guesses (parallel._guess: 4 jobs each) done before the search
    starts, as on a machine where the Megatron-mode start outlasts them; each free solve's
    count of parents guessed."""
    seen = []
    monkeypatch.setattr(parallel.BoundWorkers, "root_bounds", patient(parallel.BoundWorkers.root_bounds, seen))
    return seen


def patient(root_bounds, seen: list):
    """BoundWorkers.root_bounds after the first 4 guesses of each root process (`guessed`)."""
    def wait(self, dl):
        for job in self.guesses[:4]:
            job.wait()
        got = root_bounds(self, dl)
        seen.append(len(self.guessed))
        return got
    return wait


def _outcome(inst, fix: str, workers: int, work: float, mode_limits=None):
    r = solving.run(inst, solving.SolveRequest("cpsat", fix, 600.0, 1, workers, work), mode_limits)
    return (r.status, r.objective, r.best_bound, r.gap, r.work, r.configs_solved, r.configs_pruned,
            json.dumps(r.plan.to_dict(), sort_keys=True) if r.plan else None)


def test_same_answer_with_pruning(counted):
    """The default (simulated step: the workers' models read the paths the search learned),
    pp 2: a proven optimum with configs pruned by bounds, the same with 1 and 3 processes."""
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))
    one = _outcome(inst, "pp=2", 1, 30.0)
    assert one[0] == "optimal" and one[6] > 0   # proven, and pruning took part
    assert _outcome(inst, "pp=2", 3, 30.0) == one
    assert sum(t for t, _ in counted) > 0        # the workers' answers were taken


def test_same_answer_when_the_work_limit_cuts_the_search(counted):
    """Free mode cut short by a work limit: the same plan, bound and work with 2 processes
    (the work of an answer taken from a worker is charged as the search's own)."""
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256), Objective(mode="free"))
    limits = inst.objective.limits()
    one = _outcome(inst, "pp=3", 1, 0.7, limits)
    assert one[0] != "optimal"                   # the limit cut it short
    assert _outcome(inst, "pp=3", 2, 0.7, limits) == one
    assert sum(t for t, _ in counted) > 0


@pytest.fixture(scope="module")
def free_default():
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256), Objective(mode="free"))
    return inst, _outcome(inst, None, 1, 4.0, inst.objective.limits())


def test_free_bounds_ahead_give_the_same_answer(free_default, bounded):
    """Free mode on the default, cut short after its Megatron-mode start, its parents' root
    bounds and some of their full bounds (4.0 work units): the same plan, bound and work with 2
    processes, whose workers computed every root bound and full bounds the search took, and
    opened parents into their children for it (parallel.Opened)."""
    inst, one = free_default
    assert one[0] == "feasible" and one[5] > 0   # cut short, after configs were solved
    assert _outcome(inst, None, 2, 4.0, inst.objective.limits()) == one
    (roots, taken, opened), = bounded
    assert roots == 637 and taken > 20 and opened > 10   # every root parent (3,186 configs with their children)


@pytest.fixture(scope="module")
def moving_job():
    inst = build_instance(InstanceSpec(model="gpt3-2.7b", global_batch_size=80), Objective(mode="free"))
    return inst, _moving_outcome(inst, 1)


def _moving_outcome(inst, workers):
    r = solving.run(inst, solving.SolveRequest("cpsat", "pp=3", 600.0, 1, workers, 30.0), inst.objective.limits())
    return (r.status, r.objective, r.best_bound, r.work, r.heuristic_objective, r.configs_solved, r.configs_pruned,
            r.configs_ruled_out, r.configs_opened, r.configs_total, json.dumps(r.plan.to_dict(), sort_keys=True))


def test_free_search_whose_incumbent_moves_gives_the_same_answer(moving_job, bounded):
    """The shipped default's job (GPT-3 2.7B, batch 80) in free mode at pp 3: the free search
    beats its Megatron-mode start three times, so the workers bound and open parents under
    incumbents the search has left by the time it pops them (parallel.Opened: their bounds and
    children are read as the search's own where they cannot differ). The same answer, and the
    same count of every kind of config, with 2 processes."""
    inst, one = moving_job
    assert one[0] == "optimal" and one[1] < one[4] * (1 - 0.03)   # proven 1.3525 s/step; the start's 1.4153
    assert _moving_outcome(inst, 2) == one
    (_, taken, opened), = bounded
    assert taken > 10 and opened > 5


def test_guessed_bounds_give_the_same_answer(moving_job, free_default, guessed):
    """Parents bounded by the root processes, with their children, under the Megatron-mode
    start's incumbent (parallel._guess): the search reads them under its own, which then moves
    (the job above), or is cut short by a work limit (the default), with the same answer and
    counts as one process."""
    inst, one = moving_job
    assert _moving_outcome(inst, 2) == one
    inst, one = free_default
    assert _outcome(inst, None, 2, 4.0, inst.objective.limits()) == one
    assert guessed[0] == 20 and guessed[1] >= 4 * parallel.GUESSES   # every parent of pp 3; the default's first 32


def _raised(*args):
    return None   # what a bound worker answers when its bound raised


@pytest.mark.parametrize("broken, roots, taken", [
    ("_root_bounds", 0, True),    # then no guesses either (they follow the root bounds); the full bounds asked ahead
    ("_guess", 637, True),        # the full bounds asked ahead
    ("_bounds", 637, False),      # every full bound: asked ahead or guessed
])
def test_a_bound_worker_that_fails_leaves_the_bound_to_the_search(free_default, bounded, monkeypatch, broken, roots,
                                                                  taken):
    """A worker whose bound raised answers None (parallel._root_bounds, _guess, _bounds): the
    search computes those bounds itself, with the same answer."""
    monkeypatch.setattr(parallel, broken, _raised)   # the forked workers inherit it
    inst, one = free_default
    assert _outcome(inst, None, 2, 4.0, inst.objective.limits()) == one
    (got_roots, got_taken, _), = bounded
    assert (got_roots, got_taken > 0) == (roots, taken)


def test_cli_plan_json_bytes_do_not_depend_on_workers(tmp_path, capsys):
    outs = []
    for n in (1, 2):
        out = tmp_path / f"plan-{n}.json"
        code, _, err = run_cli(capsys, "solve", "--model", "gpt3-6.7b", "--global-batch", "256", "--fix",
                               "pp=2,tp=8", "--workers", str(n), "--out", str(out))
        assert code == 0, err
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_a_full_bound_goes_to_whoever_claims_it_first(monkeypatch):
    """parallel._claim: the worker that begins a full bound and the search that takes it back
    (BoundWorkers.take: not begun when its parent is popped) each claim it; only the first
    computes it, and a lock not had (a worker killed holding it) claims nothing."""
    import multiprocessing
    claims = multiprocessing.RawArray("b", 4)
    lock = multiprocessing.Lock()
    monkeypatch.setattr(parallel, "_CLAIMS", (claims, lock))
    assert parallel._claim(0, parallel.STARTED) and not parallel._claim(0, parallel.TAKEN_BACK)
    assert parallel._claim(1, parallel.TAKEN_BACK) and not parallel._claim(1, parallel.STARTED)
    assert list(claims) == [parallel.STARTED, parallel.TAKEN_BACK, 0, 0]
    assert parallel._full_bound(None, 0.0, 1.0, 1.0, 1) is None   # taken back: the worker does not start it
    lock.acquire()
    monkeypatch.setattr(lock, "acquire", lambda timeout: False)   # (no wait of a second here)
    assert not parallel._claim(2, parallel.STARTED) and claims[2] == 0


class _Done:
    """A finished worker job (multiprocessing's AsyncResult, as Ahead.take reads it)."""

    def __init__(self, answer):
        self.answer = answer

    def ready(self) -> bool:
        return True

    def get(self):
        return self.answer


@pytest.mark.parametrize("statuses, charges, taken", [
    (["optimal"], [0.5], True),
    (["infeasible"], [0.5], True),
    (["closed"], [0.5], True),           # stopped at a plan close to the bound both started from
    (["feasible"], [0.5], False),        # a run stopped by a limit (a wall clock's, say): not the serial answer
    (["timeout"], [0.5], False),
    (["optimal", "expired"], [0.5], False),
    (["optimal"], [0.5, 0.6], False),    # 1.1 units replayed on 0.5 used: past the search's limit of 1.5
])
def test_take_only_answers_no_limit_touched(statuses, charges, taken):
    from milp_plan.deadline import Deadline
    dl = Deadline(60.0, work=1.5)
    dl.charge(0.5)
    ahead = parallel.Ahead(None, None, "cpsat", 1, 2)
    inputs = (1.0, None, None)
    ahead.pending["cfg"] = ((inputs, 0.8), _Done(("plan", 2.0, parallel.Trace(statuses, ["path"], charges))))
    got = ahead.take("cfg", inputs, dl, 0.8)
    assert (got == ("plan", 2.0, ["path"])) is taken
    assert dl.work_used() == (0.5 + sum(charges) if taken else 0.5)   # charged only when taken
    ahead.pending["cfg"] = ((inputs, 0.8), _Done(("plan", 2.0, parallel.Trace(["optimal"], [], [0.1]))))
    assert ahead.take("cfg", (0.9, None, None), dl, 0.8) is None       # the incumbent moved since
    ahead.pending["cfg"] = ((inputs, 0.8), _Done(("plan", 2.0, parallel.Trace(["optimal"], [], [0.1]))))
    assert ahead.take("cfg", inputs, dl, 0.85) is None                 # another bound to start from


def test_a_wall_clock_limit_that_ends_the_bounding_keeps_the_workers_bounds():
    """A limit that ends before free mode's bounding (during its Megatron-mode start): under a
    wall clock alone every parent the workers bounded goes in at its bound (the answer then
    proves them); under a work limit none does (one process, which bounds none, gives the same
    answer), all at bound 0."""
    from milp_plan.deadline import Deadline
    from milp_plan.job import Limits
    from milp_plan.solvers import driver
    from milp_plan.solvers.bounds import WeakFamilyBounds
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))
    prepared = driver.prepare(inst, None, "free")
    computed = {i: 1.0 + i for i in range(len(prepared.configs) - 1)}   # the last one not reached
    weak = WeakFamilyBounds(Limits())
    bounded, later, _ = driver._cheap_bounds(prepared, Limits(), Deadline(0.0), weak, computed)
    assert sorted(lb for lb, *_ in bounded) == sorted(computed.values())
    assert [cfg for _, cfg, *_ in later] == [prepared.configs[-1]]
    bounded, later, _ = driver._cheap_bounds(prepared, Limits(), Deadline(60.0, work=0.0), weak, computed)
    assert not bounded and len(later) == len(prepared.configs)


class _Shared:
    """A stand-in for the incumbent the search shares with its workers (a RawValue's .value)."""

    def __init__(self, value: float) -> None:
        self.value = value


def _solve_until_stopped(coef, limits, backend, cutoff, hint, dl, seed, lb, trace):
    """A worker's solve that runs until its deadline expires (as CP-SAT does when stopped)."""
    import time
    while not dl.expired():
        time.sleep(0.01)
    trace.statuses.append("timeout")
    return None, None


@pytest.mark.parametrize("cutoff, shared, stopped", [
    (3.0, 3.0, False),                  # the search's incumbent is the job's cutoff: solved on
    (3.0, 2.5, True),                   # it fell: the search will not take this answer
    (None, float("inf"), False),        # no incumbent then, none now
    (None, 2.5, True),                  # no incumbent then, one now
])
def test_a_solve_ahead_stops_once_the_incumbent_moves(monkeypatch, cutoff, shared, stopped):
    """_solve_ahead under a cutoff the search no longer has (its incumbent, shared with the
    workers, moved) is stopped and answers None; under the search's cutoff it runs to its own
    end (here a 0.3 s deadline) and answers. The worker's stop flag is cleared after either. (A
    stopped solve gets 20 s, which only a watcher that never fires would reach.)"""
    from milp_plan import deadline
    monkeypatch.setattr(parallel, "Coefficients", lambda *a: None)
    prepared = type("P", (), {"inst": None, "shared": None, "fix": None})()
    monkeypatch.setattr(parallel, "_FORKED", (prepared, _solve_until_stopped, _Shared(shared)))
    seconds = 20.0 if stopped else 0.3
    got = parallel._solve_ahead("cfg", None, "cpsat", cutoff, None, seconds, None, 1, None, 0.0)
    assert deadline.interrupted() is None
    if stopped:
        assert got is None
    else:
        plan, bound, trace = got
        assert trace.statuses == ["timeout", "expired"]
