"""The slicing subproblem (milp_plan/slicing.py): TeraPipe's capped min-sum DP, exact.

Hand test, from first principles. L = 4 token units, t(l, c) = 4 + l^2 + 2 l c for a slice of
l units after c units of context, step time J = sum_k t_k + (K - 1) max_k t_k (one sequence).
All 8 compositions of 4 (times t_k; sum; max):
    [4]        20                 sum 20  max 20
    [3,1]      13, 4+1+6=11       sum 24  max 13
    [1,3]      5, 4+9+6=19        sum 24  max 19
    [2,2]      8, 4+4+8=16        sum 24  max 16
    [2,1,1]    8, 4+1+4=9, 11     sum 28  max 11
    [1,2,1]    5, 4+4+4=12, 11    sum 28  max 12
    [1,1,2]    5, 7, 4+4+8=16     sum 28  max 16
    [1,1,1,1]  5, 7, 9, 11        sum 32  max 11
K = 4 (J = sum + 3 max): 80, 63, 81, 72, 61, 64, 76, 65  -> [2,1,1], J = 61
K = 2 (J = sum + max):   40, 37, 43, 40, 39, 40, 44, 43  -> [3,1],   J = 37
K = 1 (J = sum):         20, 24, 24, 24, 28, 28, 28, 32  -> [4],     J = 20
(the issue's numbers are right).
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from milp_plan.errors import InputError
from milp_plan.slicing import best_slices, brute_force, compositions, step_objective, times_of


def hand_t(i: int, j: int) -> float:
    l, c = j - i, i
    return 4 + l * l + 2 * l * c


@pytest.mark.parametrize("stages,lengths,objective", [(4, (2, 1, 1), 61), (2, (3, 1), 37), (1, (4,), 20)])
def test_hand_instance(stages, lengths, objective):
    got = best_slices(4, hand_t, stages)
    assert got.lengths == lengths
    assert got.objective == objective
    assert got.times == times_of(lengths, hand_t)
    assert brute_force(4, hand_t, stages).objective == objective


def test_hand_instance_enumerated_table():
    """The comment's table, recomputed: every composition's J at K = 4."""
    js = {x: step_objective(times_of(x, hand_t), 4) for x in compositions(4)}
    assert len(js) == 8
    assert js == {(4,): 80, (3, 1): 63, (1, 3): 81, (2, 2): 72, (2, 1, 1): 61, (1, 2, 1): 64, (1, 1, 2): 76,
                  (1, 1, 1, 1): 65}


def test_fixed_and_capped_counts():
    # K = 4: with exactly 2 slices the best is [3,1] (63); with at most 2 the same; exactly 4 -> 65
    assert best_slices(4, hand_t, 4, count=2).lengths == (3, 1)
    assert best_slices(4, hand_t, 4, max_count=2).objective == 63
    assert best_slices(4, hand_t, 4, count=4).objective == 65
    with pytest.raises(InputError):
        best_slices(4, hand_t, 4, count=5)


def test_sequences_weight_the_sum():
    # m = 8 sequences, K = 4: J = 8 sum + 3 max; [4] = 160 + 60 = 220, [3,1] = 192 + 39 = 231
    assert best_slices(4, hand_t, 4, sequences=8).lengths == (4,)
    assert best_slices(4, hand_t, 4, sequences=8).objective == 220


def _random_table(rng: random.Random, units: int):
    """A random slice time: fixed cost + token part + context part, with noise per arc (the DP
    must not rely on any structure of t)."""
    a, b, c = rng.uniform(0, 5), rng.uniform(0.1, 3), rng.uniform(0, 2)
    noise = {(i, j): rng.uniform(0, 3) for i in range(units) for j in range(i + 1, units + 1)}
    return lambda i, j: a + b * (j - i) ** 2 + c * (j - i) * i + noise[i, j]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.integers(1, 6), st.integers(1, 4), st.integers(0, 10**6),
       st.sampled_from([None, 1, 2, 3]), st.booleans())
def test_dp_matches_enumeration(units, stages, sequences, seed, n, exact):
    t = _random_table(random.Random(seed), units)
    kw = {}
    if n is not None and n <= units:
        kw = {"count": n} if exact else {"max_count": n}
    got, want = best_slices(units, t, stages, sequences, **kw), brute_force(units, t, stages, sequences, **kw)
    assert got.objective == pytest.approx(want.objective, rel=1e-12, abs=1e-12)
    assert sum(got.lengths) == units
    assert got.objective == pytest.approx(step_objective(times_of(got.lengths, t), stages, sequences))
    if "count" in kw:
        assert got.count == kw["count"]
    if "max_count" in kw:
        assert got.count <= kw["max_count"]


def test_integer_times_many_ties():
    """Small integer times make many ties: the DP's J must still be the enumeration's."""
    rng = random.Random(7)
    for _ in range(200):
        units = rng.randint(1, 7)
        table = {(i, j): rng.randint(0, 4) for i in range(units) for j in range(i + 1, units + 1)}
        t = lambda i, j: table[i, j]  # noqa: E731
        k, m = rng.randint(1, 5), rng.randint(1, 3)
        assert best_slices(units, t, k, m).objective == brute_force(units, t, k, m).objective


def test_bad_input_names_the_field():
    with pytest.raises(InputError, match="units"):
        best_slices(0, hand_t, 2)
    with pytest.raises(InputError, match="finite"):
        best_slices(2, lambda i, j: -1.0, 2)
