"""Hot switching across length buckets (milp_plan/formulations/switching.py): hand-derived
optima, the wrap-around switch counted once per cycle, fills, the home layout, contiguity,
and every backend against enumeration on random instances."""
from __future__ import annotations

import random

import pytest

from milp_plan.errors import InputError
from milp_plan.formulations.switching import SwitchingProblem, brute_force, solve, step_time
from milp_plan.result import PROOF_TOL

BACKENDS = ("cpsat", "highs", "cbc")
A, B = 0, 1


def two_strategies(time, fill=None, sigma=0.0, **kw):
    n = len(time)
    return SwitchingProblem(tuple(tuple(r) for r in time), tuple(tuple(r) for r in (fill or [[0, 0]] * n)),
                            ((0, sigma), (sigma, 0)), **kw)


def hotspa_hand(sigma):
    """Buckets in step order: 10 sequences of length 1, then one of length 8. Strategy A (dp 2,
    tp 1) holds rows of at most 4 tokens: short 10, long impossible; B (dp 1, tp 2): short 16,
    long 8. pp 1: no fill.
      short->A, long->B: 10 + 8 + sigma (A to B) + sigma (B to A, the next step)  = 18 + 2 sigma
      all on B:          16 + 8                                                  = 24
    sigma 2: 22 < 24, switching pays; sigma 4: 26 > 24, it does not (the break-even is 3)."""
    return two_strategies([[10, 16], [None, 8]], sigma=sigma)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sigma, assignment, T", [(2, (A, B), 22), (4, (B, B), 24)])
def test_hotspa_hand_instance(backend, sigma, assignment, T):
    got = solve(hotspa_hand(sigma), backend)
    assert got.status == "optimal" and got.assignment == assignment and got.step_time_s == pytest.approx(T)
    assert brute_force(hotspa_hand(sigma)).step_time_s == T


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_wrap_around_switch_is_counted_once_per_cycle(backend):
    """Three buckets: the first runs only on A (3), the last only on B (4), the middle on
    either (A 5, B 6); sigma 10. Whatever the middle does, the cycle A..B..(next step) A
    switches exactly twice: A,A,B: 3 + 5 + 4 + 10 (A to B) + 10 (B to A, wrap) = 32;
    A,B,B: 3 + 6 + 4 + 20 = 33. No wrap would give 22, a wrap counted twice 42."""
    p = two_strategies([[3, None], [5, 6], [None, 4]], sigma=10)
    got = solve(p, backend)
    assert got.assignment == (A, A, B) and got.step_time_s == pytest.approx(32) and got.switches == 2
    assert step_time(p, (A, B, B)) == 33


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_strategy_pays_its_fill_once_at_its_longest_bucket(backend):
    """Both buckets on B (A cannot run the second): fills 3 and 5 -> one fill of 5:
    T = 1 + 1 + 5 = 7 (not 1 + 1 + 3 + 5 = 10). With A allowed for the first bucket at 1 and
    fill 4, and no switch cost: A,B gives 1 + 1 + 4 + 5 = 11 > 7."""
    p = two_strategies([[1, 1], [None, 1]], fill=[[4, 3], [0, 5]])
    got = solve(p, backend)
    assert got.assignment == (B, B) and got.step_time_s == pytest.approx(7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_layout_leaves_room_for_the_home_optimizer_state(backend):
    """The hand instance at sigma 2 prefers A,B (22). If A cannot hold B's optimizer state and
    B cannot hold A's, two layouts cannot both run: all on B (24)."""
    p = two_strategies([[10, 16], [None, 8]], sigma=2, room=(((True, False), (False, True)),) * 2)
    got = solve(p, backend)
    assert got.assignment == (B, B) and got.home == B and got.step_time_s == pytest.approx(24)
    roomy = two_strategies([[10, 16], [None, 8]], sigma=2, room=(((True, True), (False, True)),) * 2)
    got = solve(roomy, backend)  # A holds B's state: home B, A,B at 22
    assert got.assignment == (A, B) and got.home == B and got.step_time_s == pytest.approx(22)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_home_layout_pays_the_once_a_step_work(backend):
    """The hand instance at sigma 2 with the reduction and optimizer step once a step: 1 s in
    A's layout, 5 s in B's. A,B may take either home: 22 + 1 = 23; all on B: 24 + 5 = 29."""
    p = two_strategies([[10, 16], [None, 8]], sigma=2, home_time=(1.0, 5.0))
    got = solve(p, backend)
    assert got.assignment == (A, B) and got.home == A and got.step_time_s == pytest.approx(23)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_strategy_runs_one_run_of_buckets(backend):
    """Four buckets alternating in what is fastest (A 1/B 3, A 3/B 1, ...), sigma 0.5.
    A,B,A,B would cost 4 + 4 x 0.5 = 6, but a strategy runs its buckets as one run (its one
    fill is then exact): A,B,B,B-like at 1 + 1 + 1 + 3 (or 1 + 1 + 3 + 1) + 2 x 0.5 = 7; all
    on one strategy costs 8."""
    p = two_strategies([[1, 3], [3, 1], [1, 3], [3, 1]], sigma=0.5)
    got = solve(p, backend)
    assert got.step_time_s == pytest.approx(7) and got.switches == 2
    assert step_time(p, (A, B, A, B), A) == 6 and brute_force(p).step_time_s == 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_through_the_wrap_pays_a_fill_on_each_side_of_the_optimizer_step(backend):
    """Three buckets: A runs the first and the last (1 s each), B the middle (1 s), no switch
    cost; fills: A 2 at the first, 3 at the last, B 1. Around the cycle A's buckets are one
    run (last, then the next step's first), but the optimizer step between them drains the
    pipeline: T = 1 + 1 + 1 + 2 (A's head) + 1 (B) + 3 (A's tail) = 9, not 7 (one fill of 3)."""
    p = two_strategies([[1, None], [None, 1], [1, None]], fill=[[2, 0], [0, 1], [3, 0]])
    got = solve(p, backend)
    assert got.status == "optimal" and got.assignment == (A, B, A) and got.step_time_s == pytest.approx(9)
    assert brute_force(p).step_time_s == 9


def merged_edges(merged_time):
    """Two bins of sequences on one strategy whose micro-batch holds 4 rows, 8 s a micro-batch
    at the short edge, 10 s at the long one: 5 short sequences and 3 long ones.
      bins apart:  2 micro-batches (8 rows, 3 padded) x 8 + 1 micro-batch x 10  = 26
      one bucket:  8 sequences padded to the long edge, 2 micro-batches x 10    = 20
    Items 0 and 1 are the bins, item 2 both; no fill, one strategy, no switch."""
    return SwitchingProblem(((16.0,), (10.0,), (merged_time,)), ((0.0,),) * 3, ((0.0,),),
                            ranges=((0, 0), (1, 1), (0, 1)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("merged_time, items, T", [(20.0, (2,), 20), (30.0, (0, 1), 26)])
def test_the_model_chooses_the_bucket_edges(backend, merged_time, items, T):
    """merged_edges: one bucket of both bins (20) beats two (26); at 30 for the merged bucket
    the two bins stay apart (26)."""
    p = merged_edges(merged_time)
    got = solve(p, backend)
    assert got.status == "optimal" and got.items == items and got.assignment == (0, 0)
    assert got.step_time_s == pytest.approx(T)
    assert brute_force(p).items == items


def random_problem(rng: random.Random) -> SwitchingProblem:
    """2-4 buckets, 2-3 strategies; times and fills of a few seconds, some pairs impossible
    (rows too long), asymmetric switch costs, sometimes a home constraint or contiguity."""
    B, K = rng.randint(2, 4), rng.randint(2, 3)
    time = tuple(tuple(None if rng.random() < 0.2 else round(rng.uniform(0.5, 5), 3) for _ in range(K))
                 for _ in range(B))
    fill = tuple(tuple(round(rng.uniform(0, 1), 3) for _ in range(K)) for _ in range(B))
    switch = tuple(tuple(0.0 if i == j else round(rng.uniform(0, 2), 3) for j in range(K)) for i in range(K))
    room = tuple(tuple(tuple(i == j or rng.random() < 0.7 for j in range(K)) for i in range(K)) for _ in range(B)) \
        if rng.random() < 0.4 else None
    home = tuple(round(rng.uniform(0, 1), 3) for _ in range(K)) if rng.random() < 0.5 else None
    if rng.random() < 0.5:   # the edges chosen too: every range of consecutive bins is an item
        ranges = tuple((a, z) for a in range(B) for z in range(a, B))
        item = tuple(tuple(None if rng.random() < 0.2 else round(rng.uniform(0.5, 5) * (z - a + 1) ** 0.8, 3)
                           for _ in range(K)) for a, z in ranges)
        fills = tuple(tuple(round(rng.uniform(0, 1), 3) for _ in range(K)) for _ in ranges)
        rooms = None if room is None else tuple(room[z] for _, z in ranges)
        return SwitchingProblem(item, fills, switch, rooms, home_time=home, ranges=ranges)
    return SwitchingProblem(time, fill, switch, room, home_time=home)


@pytest.mark.parametrize("seed", range(60))
def test_the_model_finds_the_enumerated_optimum(seed):
    p = random_problem(random.Random(seed))
    ref = brute_force(p)
    backends = BACKENDS if seed < 8 else ("cpsat",)
    for backend in backends:
        got = solve(p, backend)
        assert got.status == ref.status, backend
        if ref.status == "optimal":
            # the model's optimum is within its rounding of enumeration's, and it is a bound
            assert got.step_time_s == pytest.approx(ref.step_time_s, rel=PROOF_TOL)
            assert got.bound_s <= ref.step_time_s + 1e-12
            assert step_time(p, got.assignment, got.home, got.items) == got.step_time_s


def test_bad_problem_shapes_name_the_field():
    with pytest.raises(InputError, match="fill must be buckets x strategies"):
        SwitchingProblem(((1.0,),), ((0.0,), (0.0,)), ((0.0,),))
    with pytest.raises(InputError, match="switch"):
        SwitchingProblem(((1.0,),), ((0.0,),), ((1.0,),))


def test_the_rent_is_the_union_of_the_layouts_gpus():
    """Two bins; A runs on GPUs {0, 1} (10 s a bin), B on {0, 1, 2, 3} (6 s a bin), 1 $/h a GPU,
    no switch cost. The sets are {0,1} (2 $/h: only A) and {0..3} (4 $/h: A, B or both).
      min-time:               all on B, 12 s (A,B mixed: 16 s; all on A: 20 s)
      min-cost under 25 s:    all on A, 20 s x 2 $/h = 40 $.s/h, against B's 12 x 4 = 48
      min-cost under 15 s:    A breaks the limit: all on B, 48
      min-time within 3 $/h:  only {0,1} is affordable: all on A, 20 s
    ($/step is $.s/h / 3600.)"""
    from milp_plan import hotswitch
    from milp_plan.job import Limits
    p = SwitchingProblem(((10.0, 6.0), (10.0, 6.0)), ((0.0, 0.0),) * 2, ((0.0, 0.0), (0.0, 0.0)))
    sets = [frozenset({0, 1}), frozenset({0, 1, 2, 3})]
    for limits, assignment, usd_h in [(Limits("min-time"), (B, B), 4.0),
                                      (Limits("min-cost", 25.0), (A, A), 2.0),
                                      (Limits("min-cost", 15.0), (B, B), 4.0),
                                      (Limits("min-time", None, 3.0), (A, A), 2.0)]:
        (ans, S, _), proven = hotswitch.best_over_sets(p, sets, lambda S: float(len(S)), limits)
        assert proven and ans.assignment == assignment and float(len(S)) == usd_h, limits
    (ans, _, _), _ = hotswitch.best_over_sets(p, sets, lambda S: float(len(S)), Limits("min-cost", 15.0))
    assert ans.step_time_s == 12.0
    assert hotswitch.best_over_sets(p, sets, lambda S: float(len(S)), Limits("min-cost", 5.0))[0] is None
