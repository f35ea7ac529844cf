"""The exact search over one GPipe config's sliced plans (slice_plan._examine): branch and bound
over the stage options and layer counts, every slicing row at once.

The last stage's option and layers are fixed first (a root each, taken in increasing bound: they
set the tied embedding's all-reduce between the end stages and the last stage's share of every
path), then stage 0, 1, ..., K-2: a node fixes stages 0..j-1 (option o_s within its pool's
stages, n_s layers within the option's room). Its bound, per slicing row, is at least the step
of every plan below it cut by that row (slice_bounds' module docstring: the machine paths M(s)
and the paths P(a, s, b, k)), plus stage 0's reduction and the end pair's least all-reduce, and
the optimizer term; the largest of

  * the config's bound of the row (ConfigBounds.full, where it has run: the roots start there);
  * M(s) of each fixed stage:  m W_s + sum_{r<s} p_{r,0} + sum_{r>s} p_{r,last} + the hops on
    the first slice above s and on the last below it, each down and back (slice_bounds._hop_costs:
    twice the forward transfer), with p_{s,k} >= n_s alpha_{o_s,k} (the option's least per-layer
    f + b over the block kinds), the embedding's on stage 0 and the head's on stage K-1 (least
    over the options), a recomputed block's forward phi under full recompute (recompute at its
    least: time only grows with it); the middle stages not fixed below s: their layers at the
    least alpha of the last slice, a phi and a least hop each; the last stage's last slice;
  * M(K-1), the last stage's: m W_{K-1} + the stages above it on the first slice (the middle
    ones not fixed as above, on the first slice);
  * M(t) of the heaviest middle stage not fixed: W_t >= z', the fractional bottleneck of the L'
    layers left over the middle stages left (sum_t z / A_{o_t} >= L', the fastest pools first
    within their stages left), raised to the least whole-layer time n A_o >= z' of an option a
    stage left may run; and with the other stages not fixed holding the layers t does not, each
    within n A <= W_t (`_heavy`: the least over W_t >= z', at the roots and in every child's
    paths);
  * the paths P(a, s, b, k) of every slice k (`_slice_bound`, `_root`) with a fixed (D_k: down
    the first slice to a, a's slices before k, the fixed stages' p_{s,k} from a; E_k: the same
    with (m - 1) W_s of a fixed s at or after a) and b the last stage (its p_{K-1,k} and slices
    after k), the middle layers left at their least sum on slice k within the pools' stages and
    rooms (`_layer_sums`); with a fixed and b = t, the heaviest middle stage not fixed (its
    slices k.. at least z' times the least share of a layer's time on them); with a = t and b
    the last stage (on both paths through t, the other middle stages' layers: at least the
    layers left less the largest room, `_others`). A path that starts and ends at the heavy
    middle stages, not at the light ends, is what the leaves of GPT-3 175B's pp 16 configs
    reach: with P(0, s, K-1, k) alone the deepest nodes of one (16 x 8 A100, batch 8) bounded
    at 1.61-1.65 s, its leaves at 1.66 s and more, and the search ran 70,000 nodes in 120 work
    units without one leaf under the incumbent; now it ends in 62;
  * at a leaf (every stage fixed) the plan's paths P(a, s, b, k) (slice_bounds.gathered_paths).

A row whose bound reaches the incumbent leaves the node's subtree (min-cost: its step priced at
the $/h of the node's fixed stages and the least of those left, `_cut`); a node with no row left
is pruned. Each option's layer counts at a node are bounded in one numpy pass, the children taken
in increasing bound (min-cost: of their $/step). A leaf with rows left is handed to the caller (`leaf(options, layers,
bound)`), which bounds the plan exactly over every slicing, slices it and returns its bound; the
config's bound is the least leaf bound (inf where every leaf was pruned). `run` stops where its
deadline expires and a later call goes on from there (the search is a generator).

Memory: a stage of option o holds at most rooms[o] layers (solvers.bounds.usable_options: within
memory at the best recompute count of any position), so no plan that fits is cut.
formulations/pipeline.md, 'Token slices' (examining a config); tests/test_slice_search.py checks
it against enumeration."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from milp_plan.deadline import Deadline
from milp_plan.solvers.driver import REL_EPS
from milp_plan.slice_bounds import (SECONDS_PER_CELL, ConfigBounds, _embedding_sync, _gather, _hop_costs,
                                    _value, gathered_paths)

# work charged (deadline.py units, about CPU seconds; fitted by least squares on the CPU of 36 config searches,
# the default's pp 3, 4 and 8 configs, GPT-3 175B's pp 16 on 16 x 8 A100 and on mixed-128):
CELL_OPS = 0.25    # per bounded cell (row x layer count) of a node, at SECONDS_PER_CELL each
SLICE_OPS = 1.8    # per row x slice of a child's paths (`_child`, `_slice_bound`) ...
LEAF_OPS = 1.2     # ... and per row x slice x stage of a leaf's paths (`_leaf_bound`)
NODE_WORK = 9e-4   # per node beside its cells: Python's and numpy's per-call cost ...
CHILD_WORK = 1.7e-4  # ... and per child bounded (GPT-3 175B's pp 16 on mixed-128: 25 a node, most cut)
HEAVY_WORK = 1e-4  # per call of `_heavy` (most have a few rows) ...
HEAVY_OPS = 0.5    # ... and per candidate x row x pool (the roots': 14,000 rows)
HEAVY_STEPS = 2    # `_heavy`: breakpoints of each pool taken at or above z'
ROOT_OPS = 0.6     # per row of a last stage's bound (`_roots`) ...
ROOT_PATH_OPS = 1.5   # ... and per row x slice x pool of its paths (`_root`)
Leaf = Callable[[tuple[int, ...], tuple[int, ...], float], float]


class SplitSearch:
    """Branch and bound over the plans of one GPipe config (module docstring)."""

    def __init__(self, cb: ConfigBounds, coef):
        from milp_plan.solvers import bounds
        self.cb, self.coef = cb, coef
        inst = cb.inst
        self.K, self.L = coef.cfg.pp, inst.model.num_layers
        self.mid = max(self.K - 1, 1)    # the stages fixed one by one after the last (K = 1: the one stage)
        self.min_cost = cb.limits.objective == "min-cost"
        self.m = coef.cfg.num_microbatches(inst.job.global_batch_size)
        self.nodes = self.leaves = 0
        self.best = math.inf          # the least leaf bound so far
        self._walk = None             # the search, where it stopped (run)
        self.dl: Deadline | None = None
        found = bounds.usable_options(coef, cb.limits, memory=True)
        self.usable: list[int] = [] if found is None else found[3]
        if not self.usable:
            return
        caps, _, rooms, usable = found
        self.caps = {q: min(c, self.K) for q, c in caps.items()}
        self.rooms = {o: min(rooms[o], self.L) for o in usable}
        t = cb._terms(coef)
        _, emb, head, _, _ = cb._arcs_of(cb._terms_key(coef), coef)
        rows, valid = cb.rows, cb.valid
        self.valid = valid
        ar, last = np.arange(len(rows)), valid.sum(axis=1) - 1
        key = {o: (coef.options[o].k, coef.options[o].tp, coef.options[o].mbs) for o in usable}
        self.a = {o: t["per_a"][key[o]] for o in usable}               # rows x U, per layer
        self.A = {o: t["per"][key[o]] for o in usable}                 # rows
        self.a0 = {o: self.a[o][:, 0] for o in usable}
        self.a1 = {o: self.a[o][ar, last] for o in usable}
        self.e, self.h, self.ph = _gather(emb, rows), _gather(head, rows), t["ph"]
        self.E, self.H, self.Phi = self.e.sum(axis=1), self.h.sum(axis=1), t["Phi"]
        self.e0, self.h1 = self.e[:, 0], self.h[ar, last]
        self.ph0, self.ph1 = self.ph[:, 0], self.ph[ar, last]
        self.amin = np.min([self.a[o] for o in usable], axis=0)        # rows x U: the least alpha
        self.amin0, self.amin1 = self.amin[:, 0], self.amin[ar, last]
        # per option, row and slice k: the share of a layer's f + b on slices k.. and ..k (_slice_bound)
        self.suf = {o: np.cumsum(self.a[o][:, ::-1], axis=1)[:, ::-1] / self.A[o][:, None] for o in usable}
        self.pre = {o: np.cumsum(self.a[o], axis=1) / self.A[o][:, None] for o in usable}
        self.mask = np.where(valid, 0.0, -np.inf)
        self.shares: dict = {}
        self.sorted_a: dict = {}     # _layer_sums: per set of pools
        self.others: dict = {}       # _others: per set of pools
        self.heavies: dict = {}      # _heavy: per set of pools
        self.ar, self.last_slice = ar, last
        self.pool_list = sorted({coef.pool_of[o] for o in usable})
        self.pool_inv = np.stack([np.max([1.0 / self.A[o] for o in usable if coef.pool_of[o] == q], axis=0)
                                  for q in self.pool_list])               # pools x rows: the fastest option's
        self.pool_a = {q: np.min([self.a[o] for o in usable if coef.pool_of[o] == q], axis=0) for q in self.pool_list}
        self.pool_room = {q: max(self.rooms[o] for o in usable if coef.pool_of[o] == q) for q in self.pool_list}
        # `_heavy`: per pool and row, its fastest option's A and the least a of its options on the first or last slice
        self.pool_A = 1.0 / self.pool_inv
        self.pool_end_a = np.stack([np.minimum(self.pool_a[q][:, 0], self.pool_a[q][ar, last]) for q in self.pool_list])
        self.ph_end = np.minimum(self.ph0, self.ph1)
        least0 = np.min([self.a0[o] for o in usable], axis=0)
        least1 = np.min([self.a1[o] for o in usable], axis=0)
        self.q0, self.q1 = least0 + self.ph0, least1 + self.ph1   # a stage not fixed: one layer
        seq = inst.job.seq_length
        self.tok = cb.tokens
        self.t0, self.t1 = cb.tokens[:, 0], cb.tokens[ar, last]
        c = _hop_costs(coef) if self.K > 1 else ((0.0,),)
        self.hop = {(p, q): c[p][q] / seq for p in range(len(c)) for q in range(len(c))}   # per token, both ways
        self.hop_least = min(self.hop.values())
        self.ends = np.minimum(self.t0, self.t1) * self.hop_least   # per row: a least hop on the first or last slice
        self.Q = self.ph + self.hop_least * self.tok
        # _slice_bound's terms of the rows alone: t's phis on slices k.. with a least hop into t, and
        # ..k; a middle stage not fixed on slice k or the last (or the first)
        self.t_last = np.cumsum(self.ph[:, ::-1], axis=1)[:, ::-1] + self.hop_least * self.tok + self.mask
        self.ph_pre = np.cumsum(self.ph, axis=1)
        self.Q_below = np.minimum(self.Q, (self.ph1 + self.hop_least * self.t1)[:, None])
        self.Q_above = np.minimum(self.Q, (self.ph0 + self.hop_least * self.t0)[:, None])
        self.sync = _embedding_sync(coef, cb.limits)
        # $/h at least: per stage option, and per pool its cheapest option's (min-cost's cut, `_cut`)
        self.stage_price = {o: coef.stage_usd_per_hour(coef.options[o].k, coef.options[o].group) for o in usable}
        self.by_price = sorted((min(self.stage_price[o] for o in usable if coef.pool_of[o] == q), q)
                               for q in self.pool_list)            # (its cheapest option's $/h, pool)
        self.dp0 = {o: [max(0.0, coef.dp_time(o, 0)[0](n)) for n in range(self.L + 1)] for o in usable}
        self.syncs: dict = {}
        self.opts = {(o, s): [coef.opt_time(o, s)(n) for n in range(self.L + 1)]
                     for o in usable for s in {0, max(self.K - 2, 0), self.K - 1}}
        self.opt_least = cb._opt(coef)

    def _pair_sync(self, o0: int, o1: int) -> float:
        """At least the tied embedding's all-reduce with the end stages run as o0 and o1
        (costmodel.tied_embedding_sync_s: the slower direction; within one node only where their
        pool's node holds every stage), and at least the config's (`_embedding_sync`)."""
        coef = self.coef
        if self.K < 2 or not coef.inst.model.tied_embeddings:
            return self.sync
        q0, q1 = coef.pool_of[o0], coef.pool_of[o1]
        k0, k1 = coef.pools[q0].k, coef.pools[q1].k
        sames = (False, True) if q0 == q1 and coef.pools[q0].place.stages_per_node >= self.K else (False,)
        got = min(max(coef.embedding_sync(o0, k1, same), coef.embedding_sync(o1, k0, same)) for same in sames)
        return max(got, self.sync)

    def _sync_below(self, o0: int, used: dict[int, int], last: int | None) -> float:
        """At least the tied embedding's all-reduce of every plan below a node whose stage 0 runs
        o0: with the last stage's option (`last`), that pair's; else the least pair with an option
        whose pool has a stage left."""
        key = (o0, last, tuple(sorted(used.items())))
        got = self.syncs.get(key)
        if got is None:
            pools = self._pools_left(used)
            ends = [last] if last is not None else [o for o in self.usable if self.coef.pool_of[o] in pools]
            got = self.syncs[key] = min((self._pair_sync(o0, o1) for o1 in ends), default=self.sync)
        return got

    def _opt(self, o: int, s: int, n: int) -> float:
        return self.opts[(o, s if s in (0, self.K - 1) else max(self.K - 2, 0))][n]

    def _cut(self, cutoff: float, price: float) -> float:
        """The step (seconds) every row kept stays under: no plan at or above it beats the
        incumbent's objective `cutoff` (min-cost: at a $/h of at least `price`) or meets
        --time-limit (ConfigBounds._time_cutoff), less REL_EPS."""
        return self.cb._time_cutoff(self.coef, cutoff, price) * (1 - REL_EPS)

    def _rest_price(self, stages: int, used: dict[int, int]) -> float:
        """At least the $/h of `stages` middle stages within the pools' stages left (the cheapest
        pools first)."""
        total = 0.0
        for price, q in self.by_price:
            k = min(self.caps[q] - used.get(q, 0), stages)
            total, stages = total + k * price, stages - k
        return total

    def _rest_speed(self, g: dict, stages: int, used: dict[int, int]) -> np.ndarray:
        """Per row (of the view `g`), the most sum_t 1 / A_{o_t} over the `stages` middle stages
        not fixed, within the pools' stages left (the fastest pools first; each pool at its
        fastest usable option): z' = L' / it (module docstring)."""
        room = np.array([self.caps[q] - used.get(q, 0) for q in self.pool_list], dtype=float)
        inv = g["inv"]
        idx = np.argsort(-inv, axis=1, kind="stable")
        inv_s, room_s = np.take_along_axis(inv, idx, axis=1), room[idx]
        take = np.minimum(room_s, np.maximum(stages - (np.cumsum(room_s, axis=1) - room_s), 0))
        return (inv_s * take).sum(axis=1)

    def _whole(self, z: np.ndarray, g: dict, used: dict[int, int]) -> np.ndarray:
        """z' raised to the least whole-layer time n A_o >= z' of an option o whose pool has a
        stage left: the heaviest middle stage not fixed holds whole layers; 1e-6 of a layer of
        slack against the rounding of z'."""
        best = np.full(z.shape, np.inf)
        for o in self.usable:
            q = self.coef.pool_of[o]
            if used.get(q, 0) < self.caps[q]:
                A = g["A", o]
                best = np.minimum(best, np.ceil(z / A - 1e-6) * A)
        return np.where(np.isfinite(best), best, z)

    def _rest_room(self, stages: int, used: dict[int, int]) -> int:
        """The most layers the `stages` middle stages not fixed hold within the pools' stages left
        (the largest rooms first); -1 when they do not fit the pools."""
        left = {q: self.caps[q] - used.get(q, 0) for q in self.caps}
        total = 0
        for o in sorted(self.usable, key=lambda o: -self.rooms[o]):
            q = self.coef.pool_of[o]
            k = min(left[q], stages)
            total += k * self.rooms[o]
            left[q] -= k
            stages -= k
        return total if stages == 0 else -1

    def heaviest(self, cutoff: float, dl: Deadline) -> float:
        """A bound on the objective of every sliced plan of the config (inf: none): per row, the
        config's bound of the row (ConfigBounds.full, where it has run) and, on the rows under the
        incumbent's objective `cutoff`, M(t) of the row's heaviest stage t (the most n A of any of
        the K stages) with the other K - 1 stages' layers under it (`_heavy`), their phis and least
        hops, the embedding's first slice and the head's last (in W_t where t holds them), the end
        pair's least all-reduce and the optimizer term; the least over the rows, at the config's
        least $/h. sliced_search raises a min-cost config to it after ConfigBounds.full."""
        if not self.usable:
            return math.inf
        self.dl = dl
        K, L = self.K, self.L
        floor = self.cb.row_bounds.get(self.coef.cfg)
        T = np.zeros(len(self.cb.rows)) if floor is None else floor + self.opt_least
        price = self._rest_price(K, {})
        rows = np.flatnonzero(T < self._cut(cutoff, price))
        if len(rows):
            g = self._view(rows)
            z = self._whole(L / self._rest_speed(g, K, {}), g, {})
            T[rows] = np.maximum(T[rows], self._heavy(rows, L, K, {}, z) + self.e0[rows] + self.h1[rows]
                                 + (K - 1) * g["ends"] + self.sync + self.opt_least)
        return float(_value(T, price, self.cb.limits).min())

    def run(self, cutoff: Callable[[], float], leaf: Leaf, dl: Deadline) -> tuple[float, bool]:
        """(the least leaf bound so far (the objective's), inf where every leaf was pruned; whether
        the search has ended). `cutoff()`: the incumbent's objective, read at every node: a row
        whose bound reaches it leaves the subtree. Where `dl` expires first, the search stops where
        it is, and a later call goes on from there (within its own deadline), nothing redone."""
        self.dl = dl
        if self._walk is None:
            self._walk = self._search(cutoff, leaf)
        try:
            next(self._walk)
        except StopIteration:
            return self.best, True
        return self.best, False

    def _search(self, cutoff, leaf: Leaf):
        """The search as a generator that yields where the deadline expires."""
        if not self.usable:
            return
        n = len(self.cb.rows)
        if self.K == 1:
            z, no = np.zeros(n), np.full(self.valid.shape, -np.inf)
            root = _Node((), (), {}, np.arange(n), z, np.full(n, -np.inf), self.opt_least, 0.0, 0.0, no, no, no,
                         z, None, 0, z, z, 0.0)
            yield from self._expand(root, cutoff, leaf)
            return
        # the last stage's option and layers first (they fix the tied embedding's all-reduce and
        # the last stage's share of every path), the least bound first; then stage 0, 1, ...
        for _, low, T, z, o, nl, used, opt, price in self._roots(cutoff):
            cut = self._cut(cutoff(), price)
            if low >= cut:
                continue
            root = self._root(np.flatnonzero(T < cut), z, o, nl, used, opt, cut)
            if root is not None:
                yield from self._expand(root, cutoff, leaf)

    def _root(self, rows: np.ndarray, z: np.ndarray, o: int, nl: int, used: dict, opt: float, cut: float
              ) -> "_Node | None":
        """The root of the last stage run as o on nl layers, on the rows whose paths P(0, s, K-1, k)
        (stage 0's slices before k left out) and P(t, s, K-1, k) of the heaviest middle stage t
        (_slice_bound's first and third) stay under `cut`; z: per row (of every row) the middle
        stages' bottleneck z'."""
        K, m, left = self.K, self.m, self.L - nl
        pl = nl * self.a[o][rows] + self.ph[rows] + self.h[rows]
        # C_k's last stage and the hop into it, and the last stage's slices after k
        Lk = np.cumsum(pl[:, ::-1], axis=1)[:, ::-1] + self.hop_least * self.tok[rows] + self.mask[rows]
        Wl = nl * self.A[o][rows] + self.Phi[rows] + self.H[rows]
        Wt = z[rows] + self.Phi[rows]
        heavy = (m - 1) * np.maximum(Wl, Wt)
        # the middle stages: a phi each, a least hop into each but stage 0
        got = (Lk + self._layer_sums(rows, left, K - 1, used) + (K - 1) * self.ph[rows]
               + (K - 2) * self.hop_least * self.tok[rows]).max(axis=1)
        # from t's slices ..k, the others on slice 0 or k
        t_first = (z[rows][:, None] * self._share("pre", rows, used) + self.ph_pre[rows]
                   + (K - 2) * self.Q_above[rows] + Lk).max(axis=1)
        keep = np.maximum(got, t_first) + heavy + self.sync + opt < cut
        self.dl.charge(Lk.size * len(self.pool_list) * ROOT_PATH_OPS * SECONDS_PER_CELL)
        if not keep.any():
            return None
        rows, Lk, Wl = rows[keep], Lk[keep], Wl[keep]
        zero, no = np.zeros(len(rows)), np.full(Lk.shape, -np.inf)
        return _Node((), (), used, rows, zero, np.full(len(rows), -np.inf), opt, 0.0, 0.0, no, no, Lk, zero, o, nl,
                     Wl, pl[keep][np.arange(len(rows)), self.last_slice[rows]], self.stage_price[o])

    def _roots(self, cutoff) -> list:
        """(sort key, least bound, bound per row, z' per row, option, layers, pools used, optimizer
        term, least $/h below) of every last stage (option, layers), sorted by the objective's
        least bound: per row the larger of its machine path M(K-1) (stages 0..K-2's first slices
        at the least, module docstring) and M(t) of the heaviest middle stage, + the config's
        least tail and the optimizer term, and at least the config's bound of the row."""
        n, K, L, m = len(self.cb.rows), self.K, self.L, self.m
        g = self._view(np.arange(n))
        # the config's bound per row (ConfigBounds.full, where it has run), the optimizer term added
        floor = self.cb.row_bounds.get(self.coef.cfg)
        floor = np.zeros(n) if floor is None else floor + self.cb._opt(self.coef)
        out = []
        for o in self.usable:
            q = self.coef.pool_of[o]
            if self.caps[q] < 1:
                continue
            used = {q: 1}
            room = self._rest_room(K - 1, used)
            if room < 0:
                continue
            speed = self._rest_speed(g, K - 1, used)
            price = self.stage_price[o] + self._rest_price(K - 1, used)
            cut = self._cut(cutoff(), price)
            for nl in range(max(1, L - room), min(self.rooms[o], L - (K - 1)) + 1):
                left = L - nl
                Wl = nl * self.A[o] + self.Phi + self.H
                Pl1 = nl * self.a1[o] + self.ph1 + self.h1
                opt = max(self.opt_least, self._opt(o, K - 1, nl))
                z = self._whole(left / speed, g, used)
                T = np.maximum(m * Wl + left * self.amin0 + (K - 1) * g["above"],
                               m * (z + self.Phi) + (K - 2) * g["q"] + Pl1 + (K - 1) * g["ends"]) + self.sync + opt
                T = np.maximum(T, floor)
                self.dl.charge(T.size * ROOT_OPS * SECONDS_PER_CELL)
                keep = np.flatnonzero(T < cut)
                if len(keep):   # M(t) with the others' layers under the heaviest stage (`_heavy`)
                    T[keep] = np.maximum(T[keep], self._heavy(keep, left, K - 1, used, z[keep]) + Pl1[keep]
                                         + (K - 1) * g["ends"][keep] + self.sync + opt)
                low = float(T.min())
                # min-cost: in the order of the objective's bound (the step's times the least $/h)
                out.append((low * price if self.min_cost else low, low, T, z, o, nl, used, opt, price))
        out.sort(key=lambda r: (r[0], r[4], r[5]))
        return out

    def _expand(self, nd: "_Node", cutoff, leaf: Leaf):
        """Bound the children of `nd` (every usable option, every layer count) and search those
        with rows left, the least bound first (a generator: it yields while the deadline, self.dl,
        has expired)."""
        while self.dl.expired():
            yield
        dl = self.dl
        self.nodes += 1
        dl.charge(NODE_WORK)
        m, rows, j = self.m, nd.rows, len(nd.opts)
        left, rest = self.L - sum(nd.layers) - nd.nlast, self.mid - j - 1
        end = nd.last is None      # K = 1: the one stage holds the head
        g = self._view(rows)
        kids = []
        for o in self.usable:
            q = self.coef.pool_of[o]
            if nd.used.get(q, 0) >= self.caps[q]:
                continue
            used = {**nd.used, q: nd.used.get(q, 0) + 1}
            lo, hi = (left, left) if rest == 0 else (1, left - rest)
            hi = min(hi, self.rooms[o])
            if rest:
                room = self._rest_room(rest, used)
                lo = max(lo, left - room) if room >= 0 else hi + 1
            if hi < lo:
                continue
            ns = np.arange(lo, hi + 1)
            n_ = ns[:, None].astype(float)                               # layer counts x rows
            p0 = n_ * g["a0", o] + g["ph0"] + (g["e0"] if j == 0 else 0.0)
            p1 = n_ * g["a1", o] + g["ph1"] + (g["h1"] if end else 0.0)
            W = n_ * g["A", o] + g["Phi"] + (g["E"] if j == 0 else 0.0) + (g["H"] if end else 0.0)
            hop = self.hop[(self.coef.pool_of[nd.opts[-1]], q)] if j else 0.0
            F = nd.F + hop * g["t0"]                                    # the first slice down to stage j
            Mx = np.maximum(nd.Mx + p1 + hop * g["t1"], m * W + F)       # M(s), s <= j, with stage j's last
            F_next = F + p0
            # the middle stages not fixed, below: their layers left at the least alpha on the last
            # slice, a phi and a least hop each; then the last stage
            T = Mx + ((left - n_) * g["amin1"] + rest * g["below"])
            if not end:    # the last stage's last slice below every M(s), and its own machine path M(K-1)
                hl = self.hop[(q, self.coef.pool_of[nd.last])] if rest == 0 else self.hop_least
                T = np.maximum(T + nd.Pl1 + hl * g["t1"],
                               m * nd.Wl + F_next + (left - n_) * g["amin0"] + rest * g["above"] + hl * g["t0"])
            z = np.zeros_like(T)
            if rest:     # M(t) of the heaviest middle stage not fixed, t > j
                speed = self._rest_speed(g, rest, used)
                z = self._whole((left - n_) / speed, g, used)
                T = np.maximum(T, m * (z + g["Phi"]) + F_next + (rest + 1) * g["ends"] + (rest - 1) * g["q"]
                               + nd.Pl1)
            # stage 0's tail: its reduction at its layers, then the tied embedding's all-reduce
            o0 = nd.opts[0] if j else o
            sync = self._sync_below(o0, used, nd.last) if self.K > 1 else 0.0
            dp0 = np.array([self.dp0[o][n] for n in ns]) if j == 0 else np.full(len(ns), nd.dp0)
            tail = dp0 + sync
            opt = np.array([max(nd.opt, self._opt(o, j, n)) for n in ns])
            T = T + (tail + opt)[:, None]
            dl.charge(T.size * CELL_OPS * SECONDS_PER_CELL)
            price = nd.price + self.stage_price[o] + self._rest_price(rest, used)   # $/h at least below
            for i, n in enumerate(ns.tolist()):
                low = float(T[i].min())
                kids.append((low * price if self.min_cost else low, low, price, o, n, used, T[i], F_next[i], Mx[i],
                             float(opt[i]), float(dp0[i]), float(tail[i]), W[i], z[i]))
        kids.sort(key=lambda k: k[0])
        for _, low, price, o, n, used, T, F, Mx, opt, dp0, tail, Wj, z in kids:
            cut = self._cut(cutoff(), price)
            if low >= cut:
                continue
            keep = T < cut
            child = self._child(nd, o, n, used, keep, F, Mx, opt, dp0, tail, Wj)
            dl = self.dl
            dl.charge(CHILD_WORK + child.D.size * (SLICE_OPS if rest else LEAF_OPS * self.K) * SECONDS_PER_CELL)
            if rest:
                keep = self._slice_bound(child, z[keep], rest, cut) < cut    # the paths P(a, s, b, k)
                if not keep.any():
                    continue
                child = child.restrict(keep)
                yield from self._expand(child, cutoff, leaf)
                continue
            got = self._leaf_bound(child, T[keep])      # every stage fixed: the paths P(a, s, b, k) too
            if got < cut:
                self.leaves += 1
                self.best = min(self.best, leaf(*child.plan(), _value(got, child.price, self.cb.limits)))
            while self.dl.expired():
                yield

    def _view(self, rows: np.ndarray) -> dict:
        """The per-row terms of `rows`, gathered once for a node's children."""
        g = {name: getattr(self, name)[rows] for name in ("ph0", "ph1", "e0", "h1", "Phi", "E", "H", "t0", "t1",
                                                          "amin0", "amin1")}
        for o in self.usable:
            g["a0", o], g["a1", o], g["A", o] = self.a0[o][rows], self.a1[o][rows], self.A[o][rows]
        g["below"] = g["ph1"] + self.hop_least * g["t1"]
        g["above"] = g["ph0"] + self.hop_least * g["t0"]
        g["ends"] = self.ends[rows]
        g["q"] = np.minimum(self.q0[rows], self.q1[rows])
        g["inv"] = self.pool_inv[:, rows].T                          # rows x pools
        return g

    def _child(self, nd: "_Node", o: int, n: int, used: dict, keep: np.ndarray, F, Mx, opt: float, dp0: float,
               tail: float, Wj) -> "_Node":
        """`nd` with stage j run as option o on n layers (Wj: its W per row of `nd`), on the rows
        kept: the paths D and E gain the stage's slices (and the hop above it, both ways)."""
        j, rows = len(nd.opts), nd.rows[keep]
        p = n * self.a[o][rows] + self.ph[rows] + (self.e[rows] if j == 0 else 0.0)
        hop = self.hop[(self.coef.pool_of[nd.opts[-1]], self.coef.pool_of[o])] if j else 0.0
        # D: the paths from a fixed stage a (down slice 0 to a, a's slices before k) through stage j on slice k
        D = np.maximum(nd.D[keep] + hop * self.tok[rows], (nd.F[keep] + hop * self.t0[rows])[:, None]
                       + np.cumsum(p, axis=1) - p) + p
        # E: the same paths with (m - 1) W_s of a fixed stage s between a and j (every path's s is at or after its a)
        Wj = Wj[keep]
        E = np.maximum(nd.E[keep] + hop * self.tok[rows] + p, (self.m - 1) * Wj[:, None] + D)
        return _Node((*nd.opts, o), (*nd.layers, n), used, rows, F[keep], Mx[keep], opt, dp0, tail, D, E,
                     nd.Lk[keep], np.maximum(nd.W[keep], Wj), nd.last, nd.nlast, nd.Wl[keep], nd.Pl1[keep],
                     nd.price + self.stage_price[o])

    def _pools_left(self, used: dict[int, int]) -> tuple[int, ...]:
        """The pools with a stage left (`used`: stages taken per pool)."""
        return tuple(q for q in self.pool_list if used.get(q, 0) < self.caps[q])

    def _share(self, name: str, rows: np.ndarray, used: dict[int, int]) -> np.ndarray:
        """Per row (of `rows`) and slice: the least of self.suf or self.pre (`name`) over the
        options whose pool has a stage left (the least over every row kept per set of options)."""
        pools = self._pools_left(used)
        opts = tuple(o for o in self.usable if self.coef.pool_of[o] in pools)
        got = self.shares.get((name, opts))
        if got is None:
            table = getattr(self, name)
            got = self.shares[name, opts] = np.min([table[o] for o in opts], axis=0)
        return got[rows]

    def _layer_sums(self, rows: np.ndarray, left: int, rest: int, used: dict[int, int]) -> np.ndarray:
        """Per row (of `rows`) and slice k: at least sum_t n_t alpha_{o_t,k} over the `rest` >= 1
        middle stages not fixed holding `left` layers: pool q's share n_q at most min(its stages
        left, rest) rooms and at least one layer per stage it must take (rest beyond the other
        pools' stages left), the rest at the least alpha_k first (a relaxation of the placements:
        a valid bound; on mixed-128's pp 16 config of GPT-3 175B at batch 8 the first root keeps
        1,597 of the 14,153 rows the config's bound leaves it, and its children one or two on
        average, against 13,635 with every layer at the least alpha)."""
        pools = self._pools_left(used)
        got = self.sorted_a.get(pools)
        if got is None:   # the pools' alphas, sorted per row and slice, and their order
            al = np.stack([self.pool_a[q] for q in pools])
            idx = np.argsort(al, axis=0, kind="stable")
            got = self.sorted_a[pools] = (np.take_along_axis(al, idx, axis=0), idx)
        al_s, idx = got[0][:, rows], got[1][:, rows]                        # pools x rows x U
        if len(pools) == 1:
            return left * al_s[0]
        capleft = {q: self.caps[q] - used.get(q, 0) for q in pools}
        total = sum(capleft.values())
        lo = np.array([max(0, rest - (total - capleft[q])) for q in pools], dtype=float)
        hi = np.array([min(capleft[q], rest) * self.pool_room[q] for q in pools], dtype=float) - lo
        cap = hi[idx]
        start = np.cumsum(cap, axis=0) - cap
        take = np.clip(left - lo.sum() - start, 0, cap) + lo[idx]
        return (take * al_s).sum(axis=0)

    def _others(self, rows: np.ndarray, left: int, used: dict[int, int]) -> tuple[int, np.ndarray, np.ndarray]:
        """(the layers the middle stages not fixed hold beside the heaviest, t: at least `left`
        less the largest room of a pool with a stage left; per row and slice k the least alpha of
        those pools on slice k or the last, and on slice k or the first): _slice_bound's paths
        through t pass them on one of those slices."""
        pools = self._pools_left(used)
        got = self.others.get(pools)
        if got is None:
            al = np.min([self.pool_a[q] for q in pools], axis=0)
            got = self.others[pools] = (np.minimum(al, al[self.ar, self.last_slice][:, None]),
                                        np.minimum(al, al[:, :1]), max(self.pool_room[q] for q in pools))
        return max(0, left - got[2]), got[0][rows], got[1][rows]

    def _heavy(self, rows: np.ndarray, left: int, rest: int, used: dict[int, int], z: np.ndarray) -> np.ndarray:
        """Per row (of `rows`): at least m W_t + sum_s p_s over the other middle stages not fixed
        (on their first or last slice), t the heaviest of the `rest` middle stages not fixed
        holding `left` layers: m Phi, a phi of each other stage, and the least over Z >= z (z': per
        row) of m Z + the least sum of the others' layers when every stage holds n A <= Z
        (`_least_others`).
        That sum is a step function of Z, constant between the breakpoints j A_q of the pools, so
        the least is at z or at a breakpoint: the first HEAVY_STEPS of each pool at or above z, and
        past them at least m times the next one + the sum without the caps (Z unbounded). The
        coupling is what a heaviest stage forces: a plan whose middle stages are all light needs
        its layers on the slow pools too. On GPT-3 175B's pp 16 config on mixed-128 at batch 8
        (m = 1, 16 stages on 4 types of 4 stages each) it lifts the roots' least bounds from 1.18 s
        to 1.24-1.45 s; with one layer a stage (`q`) the roots' M(t) counted 14 of 84 layers."""
        pools = self._pools_left(used)
        got = self.heavies.get(pools)
        if got is None:   # per row, the pools with a stage left by their a (least first): order, A, a, room
            idx = [self.pool_list.index(q) for q in pools]
            al = self.pool_end_a[idx]
            order = np.argsort(al, axis=0, kind="stable")
            room = np.array([self.pool_room[q] for q in pools], dtype=float)
            got = self.heavies[pools] = (order, np.take_along_axis(self.pool_A[idx], order, axis=0),
                                         np.take_along_axis(al, order, axis=0), room[order])
        order, A, al, room = (x[:, rows] for x in got)                   # pools x rows, by a
        capleft = np.array([self.caps[q] - used.get(q, 0) for q in pools], dtype=float)
        lo = np.maximum(0.0, (rest - 1) - (capleft.sum() - capleft))    # stages a pool must give the others
        hi = np.minimum(capleft, rest - 1)                                # ... and may give them
        lo, hi = lo[order], hi[order]
        j0 = np.maximum(np.ceil(z / A - 1e-9), 1.0)                      # pools x rows: the first breakpoints
        steps = [np.where(j0 + i <= room, (j0 + i) * A, np.inf) for i in range(HEAVY_STEPS)]
        beyond = np.where(j0 + HEAVY_STEPS <= room, (j0 + HEAVY_STEPS) * A, np.inf).min(axis=0)
        Z = np.concatenate([z[None, :], *steps, np.full((1, len(rows)), np.inf)], axis=0)   # candidates x rows
        sums = self._least_others(Z, A, al, room, lo, hi, left)
        self.dl.charge(HEAVY_WORK + Z.size * len(pools) * HEAVY_OPS * SECONDS_PER_CELL)
        least = np.minimum((self.m * Z[:-1] + sums[:-1]).min(axis=0), self.m * beyond + sums[-1])
        return self.m * self.Phi[rows] + (rest - 1) * self.ph_end[rows] + least

    @staticmethod
    def _least_others(Z: np.ndarray, A: np.ndarray, al: np.ndarray, room: np.ndarray, lo: np.ndarray,
                      hi: np.ndarray, left: int) -> np.ndarray:
        """Per candidate Z and row (Z: candidates x rows; the rest pools x rows, the pools in
        increasing a per row): at least sum_s n_s a_s over the other stages (pool q at least lo_q
        and at most hi_q of them, each one layer at least and at most cap_q = min(room_q,
        floor(Z / A_q))), which hold `left` less the heaviest stage's, at most max_q cap_q; the
        least a first (a relaxation: a valid bound); inf where they cannot hold it."""
        cap = np.minimum(room[:, None, :], np.floor(Z[None] / A[:, None, :] + 1e-9))   # pools x Z x rows
        need = left - cap.max(axis=0) - lo.sum(axis=0)
        spare = np.maximum(hi[:, None, :] * cap - lo[:, None, :], 0.0)   # beyond one layer a stage it must give
        bad = ((lo[:, None, :] > 0) & (cap < 1)).any(axis=0) | (need > spare.sum(axis=0))
        take = np.clip(need[None] - (np.cumsum(spare, axis=0) - spare), 0.0, spare)
        got = (take * al[:, None, :]).sum(axis=0) + (lo * al).sum(axis=0)
        return np.where(bad, np.inf, got)

    def _slice_bound(self, nd: "_Node", z: np.ndarray, rest: int, cut: float) -> np.ndarray:
        """Per row of `nd` (the last stage and stages 0..j fixed, `rest` >= 1 middle stages not):
        at least the paths P(a, s, b, k) of every plan below it, max over k, + stage 0's tail and
        the optimizer term (seconds), for

          * a fixed, b = K - 1: D_k (down slice 0 to a, a's slices before k, the fixed stages' p_{s,k}
            from a and their hops) + (m - 1) W_s, s after j (z' + Phi, or the last stage's), or E_k
            (the same with s fixed, at or after a), + the layers left at their least sum
            (`_layer_sums`), one phi and a least hop per middle stage not fixed + the last stage's
            p_{K-1,k}, its slices after k and a least hop into it;
          * a fixed, b = t, the heaviest middle stage not fixed (n_t A_t >= z'): D_k + (m - 1)
            (z' + Phi), or E_k, + t's slices k.. (at least z' times the least share of a layer's
            time on them, and their phis) + the other middle stages not fixed (a phi and a least
            hop each, and their layers, `_others`, on slice k or the last) + the last stage's last
            slice, the hops;
          * a = t, b = K - 1: (m - 1) max(z' + Phi, W_{K-1}) + the fixed stages' first slices and
            hops (F) + t's slices ..k + the others (on slice 0 or k, `_others`) + the last stage's
            part.
        """
        rows, left, m = nd.rows, self.L - sum(nd.layers) - nd.nlast, self.m
        zs, Wt = z[:, None], z + self.Phi[rows]
        # s fixed (E), or s after stage j (D and the heaviest such W)
        later = (m - 1) * np.maximum(nd.Wl, Wt)
        got = (np.maximum(nd.E, nd.D + later[:, None]) + self._layer_sums(rows, left, rest, nd.used)
               + rest * self.Q[rows] + nd.Lk).max(axis=1)
        others, below, above = self._others(rows, left, nd.used)
        t_last = (np.maximum(nd.E, nd.D + (m - 1) * Wt[:, None]) + zs * self._share("suf", rows, nd.used)
                  + self.t_last[rows] + (rest - 1) * self.Q_below[rows] + others * below).max(axis=1)
        got = np.maximum(got, t_last + nd.Pl1 + self.hop_least * self.t1[rows])
        t_first = (zs * self._share("pre", rows, nd.used) + self.ph_pre[rows] + (rest - 1) * self.Q_above[rows]
                   + others * above + nd.Lk).max(axis=1)
        got = np.maximum(got, nd.F + self.hop_least * self.t0[rows] + t_first + (m - 1) * np.maximum(Wt, nd.Wl))
        got = got + nd.tail + nd.opt
        at = np.flatnonzero(got < cut)
        if len(at):   # M(t) with the others' layers under the heaviest stage (`_heavy`), on the rows under the cut
            r = rows[at]
            got[at] = np.maximum(got[at], nd.F[at] + self._heavy(r, left, rest, nd.used, z[at])
                                 + (rest + 1) * self.ends[r] + nd.Pl1[at] + nd.tail + nd.opt)
        return got

    def _leaf_bound(self, nd: "_Node", T: np.ndarray) -> float:
        """The least over the node's rows of max(T, the plan's paths P(a, s, b, k) + stage 0's
        tail + the optimizer term) (seconds)."""
        rows, K = nd.rows, self.K
        opts, layers = nd.plan()
        P = []
        for s, (o, n) in enumerate(zip(opts, layers)):
            p = n * self.a[o][rows] + self.ph[rows]
            if s == 0:
                p = p + self.e[rows]
            if s == K - 1:
                p = p + self.h[rows]
            P.append(p)
        pool = [self.coef.pool_of[o] for o in opts]
        Hk = [0.5 * self.hop[(pool[h], pool[h + 1])] * self.tok[rows] for h in range(K - 1)]
        paths = gathered_paths(P, Hk, self.m, self.valid[rows]) + nd.tail + nd.opt
        return float(np.maximum(T, paths).min())


@dataclass(frozen=True)
class _Node:
    opts: tuple[int, ...]        # stages 0..j-1: option
    layers: tuple[int, ...]      # ... and layers
    used: dict                   # pool -> stages taken (the last stage's too)
    rows: np.ndarray             # the slicing rows left (indices into ConfigBounds.rows)
    F: np.ndarray                # per row: sum_{s<j} p_{s,0} + the hops between them on slice 0
    Mx: np.ndarray               # per row: max_{s<j} M(s) with the fixed stages below s
    opt: float                   # the optimizer term at least
    dp0: float                   # stage 0's reduction at least (0 before stage 0 is fixed)
    tail: float                  # ... and the tied embedding's all-reduce after it
    D: np.ndarray                # per row and slice k: max over fixed a of the path down slice 0 to a,
    #                              a's slices before k, p_{s,k} of a..j-1 and the hops between, both ways
    E: np.ndarray                # ... the same with (m - 1) W_s of a fixed s, a <= s <= j-1 (max over both)
    Lk: np.ndarray               # per row and k: the last stage's sum_{i>=k} p_{K-1,i} and a least hop
    #                              into it (-inf past the row's slices)
    W: np.ndarray                # per row: max W_s of the fixed middle stages (0 at the root)
    last: int | None             # the last stage's option (pp >= 2; its pool's stage is in `used`) ...
    nlast: int                   # ... its layers (0 at pp 1)
    Wl: np.ndarray               # per row: the last stage's W
    Pl1: np.ndarray              # per row: the last stage's p on the row's last slice (its head's too)
    price: float                 # the $/h of the stages fixed at least (Coefficients.stage_usd_per_hour)

    def plan(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(options, layers) of the stages fixed, in stage order (the last stage's last)."""
        if self.last is None:
            return self.opts, self.layers
        return (*self.opts, self.last), (*self.layers, self.nlast)

    def restrict(self, keep: np.ndarray) -> "_Node":
        return _Node(self.opts, self.layers, self.used, self.rows[keep], self.F[keep], self.Mx[keep], self.opt,
                     self.dp0, self.tail, self.D[keep], self.E[keep], self.Lk[keep], self.W[keep], self.last,
                     self.nlast, self.Wl[keep], self.Pl1[keep], self.price)
