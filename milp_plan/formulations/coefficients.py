"""Linear coefficients of the per-stage models, read off the cost model.

For a fixed config and stage option (space.StageOption: node type, tp, dp, micro-batch,
recompute) every stage quantity is affine in the stage's layer count n and its number of
recomputed layers r (full recompute, r >= 1): q(n, r) = a n + rho r + c. The
coefficients are obtained by evaluating the cost model's own stage functions at a few
(n, r) points and differencing, and linearity is asserted at a third point, so the
models can never drift from `costmodel`. Positions matter: stage 0 holds the embedding,
the last stage the head, and the in-flight micro-batch count depends on the position.

Options that share a node type and a stage size (GPUs per stage) form a pool: each run of
a pool's stages is placed on nodes of its own (placement.place_stages), so placement,
transfers and prices depend on the pool only; a pool may form several runs (pipeline.md,
add_contiguity).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

from milp_plan import costmodel as cm
from milp_plan.cluster import MixedNodeType
from milp_plan.formulations.space import (LIST_KEYS, OPEN, Config, Placement, StageOption, host_types, placement,
                                          stage_options, within_sizes)
from milp_plan.instance import Instance
from milp_plan.predict import SIMULATED, seed_paths, step_basis
from milp_plan.schedules import ForwardShare, PathTerms, Schedule

_TOL = 1e-6


@dataclass(frozen=True)
class Affine:
    a: float      # per layer
    rho: float    # per recomputed layer
    c: float      # constant

    def __call__(self, n: float, r: float = 0.0) -> float:
        return self.a * n + self.rho * r + self.c


def _affine(fn, full: bool) -> Affine:
    """Fit q(n, r) = a n + rho r + c from q(1,r0), q(2,r0), q(2,r0+1); check q(3, r0+1)."""
    r0 = 1 if full else 0
    q1, q2 = fn(1, r0), fn(2, r0)
    a = q2 - q1
    rho = (fn(2, r0 + 1) - q2) if full else 0.0
    c = q1 - a - rho * r0
    check = fn(3, r0 + 1 if full else 0)
    want = a * 3 + rho * (r0 + 1 if full else 0) + c
    assert abs(check - want) <= _TOL * max(1.0, abs(want)), "cost model is not affine in the layer count"
    return Affine(a, rho, c)


@dataclass(frozen=True)
class Pool:
    """A node type and a stage size: each run of its stages on nodes of its own."""

    k: int
    group: int
    place: Placement


class TimeKey(NamedTuple):
    """Stage time fits (t, b) per micro-batch: node type, ends held, tp, micro-batch, recompute."""
    k: int
    first: bool
    last: bool
    tp: int
    mbs: int
    recompute: str


class MemoryKey(NamedTuple):
    """Memory fit: the stage option and everything of the config stage_memory_bytes reads."""
    option: StageOption
    first: bool
    last: bool
    single_stage: bool
    inflight: float
    end_inflight: tuple[float, float]
    sequence_parallel: bool
    distributed_optimizer: bool


class MemoryPartsKey(NamedTuple):
    """A memory fit's parts (MemoryParts): the stage option, the ends it holds, pp == 1 and the
    switches; not the micro-batches in flight, which only weigh the parts."""
    option: StageOption
    first: bool
    last: bool
    single_stage: bool
    sequence_parallel: bool
    distributed_optimizer: bool


class MemoryParts(NamedTuple):
    """Bytes per GPU of a stage option at given ends (Coefficients._memory_parts), by what the
    in-flight counts weigh: base(n, r) (model states, and a full-recompute layer's working
    activations) + inflight x per_inflight(n, r) + embedding x the embedding's in-flight count
    + head x the head's."""
    base: Affine
    per_inflight: Affine
    embedding: float
    head: float

    def at(self, inflight: float, emb: float, head: float) -> Affine:
        b, p = self.base, self.per_inflight
        return Affine(b.a + inflight * p.a, b.rho + inflight * p.rho,
                      b.c + inflight * p.c + emb * self.embedding + head * self.head)


class StateKey(NamedTuple):
    """Reduction ("dp") or optimizer ("opt") fit: what the parameter count and its sharding read."""
    what: str
    k: int
    first: bool
    last: bool
    single_stage: bool
    tp: int
    dp: int
    distributed_optimizer: bool
    mbs: int = 0           # the reduction with overlap reads the stage's f and b: its option's
    recompute: str = ""    # micro-batch and recompute (0, "" without overlap)


class HopKey(NamedTuple):
    n_bytes: float
    k: int
    k2: int
    same_node: bool
    senders: int


class PlacementKey(NamedTuple):
    """The bounds' placement terms (solvers/bounds.py): the slots, pp, layers and chunk unit."""
    slots: tuple
    pp: int
    layers: int
    unit: int


class OptionsKey(NamedTuple):
    """A config's stage options (space.stage_options): what of the config and --fix they read."""
    uniform: object
    samples: int
    sizes: tuple
    fix: tuple


class OptionTermsKey(NamedTuple):
    """The bounds' terms of a config's stage options (solvers/bounds.py, `_option_terms`): the
    options with a stage to offer and those with room for a layer, whether pp == 1 (the ends a
    stage holds), the distributed optimizer (reduction, optimizer step) and the node types
    that must host a stage."""
    options: tuple
    usable: tuple
    single_stage: bool
    distributed_optimizer: bool
    required_types: frozenset


class MemoryConfig(NamedTuple):
    """Everything of a config a stage option's memory fits read besides the option and the
    position (Coefficients.memory_config)."""
    schedule: str
    pp: int
    vpp: int
    m: int
    sequence_parallel: bool
    distributed_optimizer: bool


class FitsKey(NamedTuple):
    """What a stage option's memory at a set of stage positions truly reads (Coefficients.fits_key):
    the option and what each position gives its memory fit (Coefficients._position: the ends,
    pp == 1, the micro-batches in flight, the switches), as a set: the bounds take the best or
    the least over the positions. Configs of other pp, m, schedule or vpp whose positions hold
    as many micro-batches share what is computed from them (the bounds' `shared_recompute_pieces`,
    whose times read the option and pp == 1, a field of each position)."""
    option: StageOption
    positions: frozenset


class TiedSyncKey(NamedTuple):
    """The bounds' least tied-embedding all-reduce (solvers/bounds.py, `_tied_sync_lower_bound`):
    each end option's (node type, stage size, tp, its pool holds two stages, one node holds
    every stage)."""
    ends: tuple


class PositionMemoryKey(NamedTuple):
    """What a stage position gives a memory fit (Coefficients._position): the config fields that
    fix its MemoryKey but the option, so a config finds it without recomputing its
    in-flight counts."""
    stage: int
    config: MemoryConfig


class ForwardShareKey(NamedTuple):
    """Coefficients.forward_share: the options (their time fits) and min(pp, 3), which fixes
    the ends of the positions it reads (first, a middle one, last)."""
    options: tuple
    depth: int


class PathKey(NamedTuple):
    """The paths of a step graph (Coefficients.paths): it is fixed by these four."""
    schedule: str
    vpp: int
    pp: int
    m: int


class SharedCoefficients:
    """Coefficients shared by every config of one instance, under typed keys.

    A key names every config-level input its value depends on; the instance-level inputs
    (model, sequence length, profiles, cluster, memory headroom) are the cache's own: it
    belongs to one Instance and refuses another (`check`), so a key can never be reused
    across workloads."""

    def __init__(self, inst: Instance):
        self.inst = inst
        self._values: dict[tuple, object] = {}
        self.mixed_kinds = any(inst.model.block_kind(i) != inst.model.block_kind(0)
                               for i in range(inst.model.num_layers))
        self.types = tuple(host_types(inst, {"mixed": True}))   # node types, then mixed bundles (space.host_types)

    def check(self, inst: Instance) -> None:
        if inst is not self.inst:
            raise ValueError("a SharedCoefficients cache serves the one instance it was made for")

    def get(self, key: tuple, make):
        """make(), memoised under `key`: a value is never None."""
        value = self._values.get(key)
        if value is None:
            value = self._values[key] = make()
        return value

    def get_many(self, keys: dict, make_many) -> dict:
        """{name: the value under keys[name]}, the missing ones made at once, memoised:
        make_many(names) returns {name: value} for those names (never None)."""
        got = {name: self._values.get(key) for name, key in keys.items()}
        missing = [name for name, value in got.items() if value is None]
        if missing:
            for name, value in make_many(missing).items():
                got[name] = self._values[keys[name]] = value
        return got


class Coefficients:
    """Every coefficient of the per-stage models for one config."""

    def __init__(self, inst: Instance, cfg: Config, shared: SharedCoefficients | None = None,
                 fix: dict | None = None):
        """`shared` may be passed to every config of one instance: it memoises the
        coefficients that depend on only part of a config (stage times on node type,
        ends, tp, micro-batch and recompute; reduction and optimizer on tp, dp and the
        distributed optimizer). `fix` restricts the config's per-stage options."""
        self.inst, self.cfg = inst, cfg
        if shared is None:
            shared = SharedCoefficients(inst)
        shared.check(inst)
        self.shared = shared
        self._local: dict = {}
        self.bound_work = 0.0   # work units (deadline.py) of the last full bound beyond its flat charge
        self._phi: ForwardShare | None = None
        self.kind = inst.model.block_kind(0)
        if shared.mixed_kinds:
            from milp_plan.errors import InputError
            raise InputError(f"model '{inst.model.name}' mixes block kinds (encoder-decoder); the exact formulations "
                             "need one block kind: use --solver brute-force", field="model")
        self.types = shared.types
        self.m = cfg.num_microbatches(inst.job.global_batch_size)
        self.memory_config = MemoryConfig(cfg.schedule, cfg.pp, cfg.vpp, self.m, cfg.sequence_parallel,
                                          cfg.distributed_optimizer)
        self.pins = {k: fix[k] for k in LIST_KEYS if fix and k in fix}   # per-stage layers / GPU type order
        # the options depend on the uniform choice, the samples per micro-batch, the stage sizes
        # and --fix alone (space.stage_options): configs of other pp, schedules and switches share
        # them, and their pools where no option is dropped as dominated (a uniform config has no twins)
        fixed = tuple(sorted((k, repr(v)) for k, v in (fix or {}).items()))
        key = OptionsKey(cfg.uniform, cfg.samples, cfg.sizes, fixed)
        if cfg.uniform is not None:
            options, self.pools, self.pool_of = shared.get(key, lambda: self._pooled(stage_options(inst, cfg, fix)))
            self.options: list[StageOption] = list(options)
            self.options_key: tuple = key   # what fixes `options` (a memo's key for what reads them alone)
        else:
            # those of every size, made once per samples per micro-batch, filtered by the config's sizes
            every = ("every size", cfg.samples, fixed)
            options = list(shared.get(key, lambda: tuple(within_sizes(shared.get(every, lambda: tuple(
                stage_options(inst, replace(cfg, sizes=(OPEN,) * len(cfg.sizes)), fix))), cfg.sizes))))
            # what is left of them reads their memory at the positions `_undominated` checks: configs
            # whose positions there hold as many micro-batches share it, and the pools
            worst = frozenset(self._position(s) for s in self._worst()) if cfg.complete else None
            self.options_key = ("free options", key, worst)
            kept, pools, pool_of = shared.get(self.options_key, lambda: tuple(
                map(tuple, self._pooled(self._undominated(options) if cfg.complete else options))))
            self.options, self.pools, self.pool_of = list(kept), list(pools), list(pool_of)
        # Megatron: one r for every stage (a model variable); free: each full-recompute stage its own
        self.shared_r = cfg.shared_recompute
        # free mode: every node type given a stage size hosts at least one stage
        self.required_types = cfg.required_types

    def _pooled(self, options: list[StageOption]) -> tuple[list[StageOption], list[Pool], list[int]]:
        """(options, their pools, each option's pool): a pool per (node type, stage size)."""
        index: dict[tuple[int, int], int] = {}
        for o in options:
            index.setdefault((o.k, o.group), len(index))
        return (options, [Pool(k, g, placement(self.types[k], g)) for k, g in index],
                [index[o.k, o.group] for o in options])

    def _undominated(self, options: list[StageOption]) -> list[StageOption]:
        """Drop a recompute option when its no-recompute twin (same node type, tp, dp) is an
        option too and holds all L layers within memory at every position (free mode: a
        Megatron config has no twins). The twin has the same transfers,
        prices, reduction and optimizer step and never a longer forward or backward; a shorter
        backward can lengthen the reduction tail by no more than it shortens the stage-time sum
        (costmodel.dp_tail_s), so some optimum never uses the dropped option."""
        L, worst = self.inst.model.num_layers, self._worst()
        twins = {(o.k, o.tp, o.dp) for o in options if o.recompute != "none"}
        roomy = set()
        for o in options:
            if o.recompute == "none" and (o.k, o.tp, o.dp) in twins:
                cap = cm.usable_memory_bytes(self.inst, self.types[o.k])
                if all(self._memory(o, s)(L) <= cap for s in worst):
                    roomy.add((o.k, o.tp, o.dp))
        return [o for o in options if o.recompute == "none" or (o.k, o.tp, o.dp) not in roomy]

    def _worst(self) -> list[int]:
        """The positions of most memory for `_undominated`: most in flight, embedding, head."""
        pp = self.cfg.pp
        return sorted({0, min(1, pp - 1), pp - 1})

    def full(self, o: int) -> bool:
        return self.options[o].recompute == "full"

    # ---- per option and position ----------------------------------------------------
    def _ends(self, s: int) -> tuple[bool, bool]:
        return s == 0, s == self.cfg.pp - 1

    def time(self, o: int, s: int) -> tuple[Affine, Affine]:
        """(t = f + b, b) of stage position s run as option o, seconds per micro-batch (the
        shared fit, found once per config, option and ends)."""
        key = ("time", o, s == 0, s == self.cfg.pp - 1)
        got = self._local.get(key)
        if got is None:
            got = self._local[key] = self._time(self.options[o], *self._ends(s))
        return got

    def least_layer_time(self) -> float:
        """The least f + b per layer and micro-batch (s) of any option at any stage position of
        any pp (pp == 1, or not, as this config's): the slope of `time`."""
        return min(self._time(opt, *ends)[0].a for opt in self.options for ends in self._all_ends())

    def least_layer_work(self) -> float:
        """The least $/h x s per layer and micro-batch of any option at any position: the
        option's `stage_usd_per_hour` times its least per-layer time."""
        return min(self.stage_usd_per_hour(opt.k, opt.group) * self._time(opt, *ends)[0].a
                   for opt in self.options for ends in self._all_ends())

    def stage_usd_per_hour(self, k: int, group: int) -> float:
        """At least the $/h a stage of `group` GPUs (tp x dp) on host type k rents: its GPUs at
        the type's $/GPU-hour (node billing's whole nodes, and a bundle's member nodes, only add)."""
        return self.types[k].usd_per_gpu_hour * group

    def _all_ends(self) -> tuple[tuple[bool, bool], ...]:
        return ((True, True),) if self.cfg.pp == 1 else ((True, False), (False, False), (False, True))

    def _time(self, opt: StageOption, first: bool, last: bool) -> tuple[Affine, Affine]:
        nt, full = self.types[opt.k], opt.recompute == "full"

        def f_b(n: int, r: int) -> tuple[float, float]:
            return cm.stage_compute_s(self.inst, nt, opt.tp, opt.mbs, [self.kind] * n, first, last,
                                      opt.recompute, r)
        return self.shared.get(TimeKey(opt.k, first, last, opt.tp, opt.mbs, opt.recompute),
                                    lambda: (_affine(lambda n, r: sum(f_b(n, r)), full),
                                        _affine(lambda n, r: f_b(n, r)[1], full)))

    def _memo(self, cache: dict, key: tuple, make):
        value = cache.get(key)
        if value is None:
            value = cache[key] = make()
        return value

    def _params(self, opt: StageOption, n: int, first: bool, last: bool) -> float:
        return cm.stage_params(self.inst, [self.kind] * n, first, last, single_stage=self.cfg.pp == 1) / opt.tp

    def memory(self, o: int, s: int) -> Affine:
        """Bytes per GPU of stage position s run as option o (the shared fit, found once per
        config, option and position)."""
        key = ("memory", o, s)
        got = self._local.get(key)
        if got is None:
            got = self._local[key] = self._memory(self.options[o], s)
        return got

    def _memory(self, opt: StageOption, s: int) -> Affine:
        # costmodel.stage_memory_bytes depends on the position only through the ends it holds,
        # pp == 1 and the micro-batches in flight, so configs of other pp, m or schedule share
        # the fit wherever these agree (MemoryKey)
        return self.shared.get(self.memory_key(opt, s), lambda: self._memory_fit(opt, s))

    def memory_key(self, opt: StageOption, s: int) -> MemoryKey:
        """What option `opt`'s memory fit at stage position s reads (MemoryKey)."""
        return MemoryKey(opt, *self._position(s))

    def _position(self, s: int) -> tuple:
        """What a memory fit reads of stage position s besides the option (MemoryKey's fields
        from `first` on): the ends, pp == 1, the micro-batches in flight and the ends' own, and
        the switches; found once per MemoryConfig and position (PositionMemoryKey)."""
        got = self._local.get(("position", s))   # this config's own first: no key to build and hash
        if got is None:
            got = self._local["position", s] = self.shared.get(PositionMemoryKey(s, self.memory_config),
                                                               lambda: self._position_of(s))
        return got

    def _position_of(self, s: int) -> tuple:
        cfg = self.cfg
        inflight = cm.inflight_microbatches(cfg.schedule, cfg.pp, s, self.m, cfg.vpp)
        return (*self._ends(s), cfg.pp == 1, inflight, cm.end_inflight(cfg.schedule, cfg.pp, self.m, cfg.vpp, inflight),
                cfg.sequence_parallel, cfg.distributed_optimizer)

    def _memory_fit(self, opt: StageOption, s: int) -> Affine:
        """costmodel.stage_memory_bytes (weights, gradients, optimizer, activations) of n layers,
        r recomputed, at position s: the option's MemoryParts at the position's in-flight counts
        (configs of any pp, m or schedule share the parts wherever the ends agree)."""
        first, last, single, inflight, (emb, head), sp, distopt = self._position(s)
        parts = self.shared.get(MemoryPartsKey(opt, first, last, single, sp, distopt),
                                lambda: self._memory_parts(opt, first, last, single))
        return parts.at(inflight, emb, head)

    def _memory_parts(self, opt: StageOption, first: bool, last: bool, single: bool) -> "MemoryParts":
        """The fits of stage_memory_bytes's terms: the model states (costmodel.stage_state_bytes)
        with what stays at no micro-batch in flight (costmodel.stage_activation_bytes at in-flight
        0: a full-recompute layer's working activations), and the activations per micro-batch in
        flight of the layers, the embedding and the head (stage_activation_bytes is linear in
        its three in-flight counts; tests/test_bound_memo.py checks the sum against
        stage_memory_bytes)."""
        cfg, full, gpu = self.cfg, opt.recompute == "full", self.types[opt.k].gpu.name

        def states(n: int) -> float:
            return sum(cm.stage_state_bytes(self.inst, [self.kind] * n, first, last, single, opt.tp, opt.dp,
                                            cfg.distributed_optimizer))

        # what the activations read (not dp): the options of other dp share their values
        acts = self.shared.get(("activation bytes", gpu, first, last, opt.tp, opt.mbs, cfg.sequence_parallel,
                                opt.recompute), dict)

        def act(n: int, r: int, inflight: float, emb: float = 0.0, head: float = 0.0) -> float:
            got = acts.get((n, r, inflight, emb, head))
            if got is None:
                got = acts[n, r, inflight, emb, head] = cm.stage_activation_bytes(
                    self.inst, [self.kind] * n, first, last, opt.tp, opt.mbs, cfg.sequence_parallel, opt.recompute,
                    r, inflight, emb, head, gpu=gpu)
            return got
        r0 = 1 if full else 0
        idle = act(1, r0, 0.0)
        return MemoryParts(_affine(lambda n, r: states(n) + act(n, r, 0.0), full),
                           _affine(lambda n, r: act(n, r, 1.0) - act(n, r, 0.0), full),
                           act(1, r0, 0.0, 1.0) - idle if first else 0.0,
                           act(1, r0, 0.0, 0.0, 1.0) - idle if last else 0.0)

    def capacity(self, o: int) -> float:
        return cm.usable_memory_bytes(self.inst, self.types[self.options[o].k])

    def layer_room(self, o: int, s: int, r: int | None = None) -> int:
        """Most layers (at most L) stage position s can hold as option o within memory:
        a n + rho r + c <= capacity. With r given, that many recomputed layers; with None,
        the best r under full recompute, 1 <= r <= n: r = n where recomputing saves memory
        (rho < 0), else r = 1 (and r = 0 without full recompute)."""
        L = self.inst.model.num_layers
        mem = self.memory(o, s)
        room, per = self.capacity(o) - mem.c, mem.a
        if r is not None:
            room -= mem.rho * r
        elif self.full(o):
            if mem.rho < 0:
                per += mem.rho
            else:
                room -= mem.rho
        if room < per or room < 0:
            return 0
        return L if per <= 0 else min(L, int(room // per))

    def rooms(self, positions: tuple[int, ...]) -> list[int]:
        """Every option o's most layers at any of `positions`, max over them of layer_room(o, s),
        at once: layer_room's arithmetic on arrays of the options' MemoryParts (the same floats:
        MemoryParts.at's sums in its order, IEEE operations; tests/test_bound_memo.py checks it
        against layer_room)."""
        import numpy as np   # the solve path has it (CP-SAT's); --help does not import it
        got = self._local.get(("rooms", positions))
        if got is not None:
            return got
        L, best = self.inst.model.num_layers, None
        for s in positions:
            a, rho, c, cap, full = self.memory_rows(s)
            room, per = cap - c, a
            per = np.where(full & (rho < 0), per + rho, per)
            room = np.where(full & (rho >= 0), room - rho, room)
            fits = np.minimum(L, np.floor_divide(room, np.where(per > 0, per, 1.0)))
            at = np.where((room < per) | (room < 0), 0, np.where(per <= 0, L, fits))
            best = at if best is None else np.maximum(best, at)
        got = self._local["rooms", positions] = [int(v) for v in best]
        return got

    def memory_rows(self, s: int):
        """Every option's memory fit at stage position s as arrays (a, rho, c), with the options'
        capacities and whether each recomputes fully: MemoryParts.at's sums in its order, IEEE
        operations, so the same floats as memory(o, s)."""
        got = self._local.get(("memory rows", s))
        if got is None:
            first, last, single, inflight, (emb, head), _, _ = self._position(s)
            P, cap, full = self._parts_arrays(first, last, single)
            got = self._local["memory rows", s] = (
                P[:, 0] + inflight * P[:, 3], P[:, 1] + inflight * P[:, 4],
                P[:, 2] + inflight * P[:, 5] + emb * P[:, 6] + head * P[:, 7], cap, full)
        return got

    def _parts_arrays(self, first: bool, last: bool, single: bool):
        """(the options' MemoryParts at these ends as rows (base a, rho, c, per in-flight a, rho,
        c, embedding, head), their capacities, whether each recomputes fully), shared by the
        configs with these options."""
        import numpy as np
        cfg = self.cfg

        def make():
            parts = [self.shared.get(MemoryPartsKey(opt, first, last, single, cfg.sequence_parallel,
                                                    cfg.distributed_optimizer),
                                     lambda opt=opt: self._memory_parts(opt, first, last, single))
                     for opt in self.options]
            rows = [(p.base.a, p.base.rho, p.base.c, p.per_inflight.a, p.per_inflight.rho, p.per_inflight.c,
                     p.embedding, p.head) for p in parts]
            return (np.array(rows, dtype=float).reshape(len(rows), 8),
                    np.array([self.capacity(o) for o in range(len(self.options))], dtype=float),
                    np.array([self.full(o) for o in range(len(self.options))], dtype=bool))
        key = ("parts arrays", tuple(self.options), first, last, single, cfg.sequence_parallel,
               cfg.distributed_optimizer)
        return self.shared.get(key, make)

    def fits_key(self, o: int, positions: tuple[int, ...]) -> FitsKey:
        """What option o's memory at `positions` truly reads (`FitsKey`)."""
        key = ("positions", positions)
        got = self._local.get(key)
        if got is None:
            got = self._local[key] = frozenset(self._position(s) for s in positions)
        return FitsKey(self.options[o], got)

    def _state_key(self, what: str, opt: StageOption, s: int) -> StateKey:
        job = self.inst.job
        overlap = what == "dp" and (job.overlap_grad_reduce or job.overlap_param_gather)
        return StateKey(what, opt.k, *self._ends(s), self.cfg.pp == 1, opt.tp, opt.dp, self.cfg.distributed_optimizer,
                        opt.mbs if overlap else 0, opt.recompute if overlap else "")

    def dp_time(self, o: int, s: int) -> tuple[Affine, ...]:
        """The exposed reduction of stage position s run as option o: the max of these pieces
        (costmodel.stage_dp_pieces_s: one without overlap; with it, pieces in the stage's f and
        b). Piece 0 never decreases with the layer count (the bounds read it at the fewest)."""
        opt = self.options[o]
        return self.shared.get(self._state_key("dp", opt, s), lambda: self._dp_time(o, s))

    def _dp_time(self, o: int, s: int) -> tuple[Affine, ...]:
        opt, (first, last) = self.options[o], self._ends(s)
        nt, pl = self.types[opt.k], self.pools[self.pool_of[o]].place
        nodes = 1 if pl.stages_per_node else pl.nodes_per_stage
        per_node = opt.group if pl.stages_per_node else nt.gpus_per_node
        if isinstance(nt, MixedNodeType):  # the bundle's whole nodes (costmodel.plan_costs reads the devices)
            nodes, per_node = nt.real_nodes, nt.busiest_node
        end = cm.dp_end_params(self.inst, opt.tp, first)
        overlap = self._state_key("dp", opt, s).mbs > 0

        @functools.cache   # every piece's fit reads the same points
        def pieces(n: int, r: int) -> tuple[float, ...]:
            f, b = cm.stage_compute_s(self.inst, nt, opt.tp, opt.mbs, [self.kind] * n, first, last,
                                      opt.recompute, r) if overlap else (0.0, 0.0)
            return cm.stage_dp_pieces_s(self.inst, self._params(opt, n, first, last), opt.dp, opt.tp,
                                        max(1, per_node // opt.tp), nodes, nt.intra_node_gb_per_s,
                                        nt.inter_node_gb_per_s, self.cfg.distributed_optimizer, end, f, b,
                                        (nt.intra_node_link, nt.inter_node_link))
        full = opt.recompute == "full"
        return tuple(_affine(lambda n, r, i=i: pieces(n, r)[i], full) for i in range(len(pieces(1, int(full)))))

    def opt_time(self, o: int, s: int) -> Affine:
        opt = self.options[o]
        return self.shared.get(self._state_key("opt", opt, s), lambda: self._opt_time(opt, s))

    def _opt_time(self, opt: StageOption, s: int) -> Affine:
        (first, last), nt = self._ends(s), self.types[opt.k]
        div = opt.dp if self.cfg.distributed_optimizer else 1
        return _affine(lambda n, r: cm.optimizer_s(self.inst, self._params(opt, n, first, last) / div, nt), False)

    # ---- hops (per pool: with sequence parallelism a stage sends B / group samples' worth) ----
    def pool_options(self) -> tuple[tuple[int, ...], ...]:
        """The options of each pool (by index), in option order."""
        return self._memo(self._local, "pool options", lambda: tuple(
            tuple(o for o, q in enumerate(self.pool_of) if q == p) for p in range(len(self.pools))))

    def hop_bytes(self, p: int) -> float:
        """Bytes one GPU of pool p sends per micro-batch and hop; equal for every option of
        the pool (space.FREE_SP_REFUSAL), which is asserted."""
        return self._memo(self._local, "hop bytes", self._hop_bytes)[p]

    def _hop_bytes(self) -> tuple[float, ...]:
        """Every pool's transfer size, in one pass over the options (one p2p_bytes per mbs, tp)."""
        sizes: list[set[float]] = [set() for _ in self.pools]
        each: dict[tuple[int, int], float] = {}
        for o, pool in zip(self.options, self.pool_of):
            got = each.get((o.mbs, o.tp))
            if got is None:
                got = each[o.mbs, o.tp] = cm.p2p_bytes(self.inst, o.mbs, o.tp, self.cfg.sequence_parallel)
            sizes[pool].add(got)
        assert all(len(size) == 1 for size in sizes), "transfer size differs inside a pool"
        return tuple(size.pop() for size in sizes)

    def senders(self, p: int) -> int:
        pool = self.pools[p]
        return cm.senders_per_node(self.types[pool.k], pool.group)

    def hop_intra(self, p: int) -> float:
        return self._hop(p, self.pools[p].k, True)

    def hop_inter(self, p: int, k2: int) -> float:
        """One transfer from a stage of pool p to a stage on another node of node type k2."""
        return self._hop(p, k2, False)

    def _hop(self, p: int, k2: int, same_node: bool) -> float:
        return self._link(p, self.hop_bytes(p), k2, same_node)

    def _link(self, p: int, n_bytes: float, k2: int, same_node: bool) -> float:
        """n_bytes from each GPU of a stage of pool p to its peer on node type k2 (costmodel.p2p_s,
        as costmodel.link_s for a plan)."""
        k, senders = self.pools[p].k, self.senders(p)
        return self.shared.get(HopKey(n_bytes, k, k2, same_node, senders),
                               lambda: cm.p2p_s(self.inst, n_bytes, self.types[k], self.types[k2], same_node, senders))

    def embedding_sync(self, o: int, k2: int, same_node: bool) -> float:
        """One direction of the tied embedding's all-reduce from an end stage run as option o to
        the other end on node type k2 (costmodel.tied_embedding_sync_s): its shard
        (costmodel.embedding_grad_bytes at o's tp) over the link; 0 when the model has no tied
        embedding or pp == 1."""
        if self.cfg.pp < 2 or not self.inst.model.tied_embeddings:
            return 0.0
        return self._link(self.pool_of[o], cm.embedding_grad_bytes(self.inst, self.options[o].tp), k2, same_node)

    # ---- money --------------------------------------------------------------------------
    def usd_per_hour(self, p: int, stages: int) -> float:
        pool = self.pools[p]
        nt = self.types[pool.k]
        if stages == 0:
            return 0.0
        return nt.rent_usd_per_hour(stages * pool.group, pool.place.nodes_used(stages))

    def usd_per_hour_nodes(self, p: int, nodes: int) -> float:
        """$/h of a pool whose stages share nodes and that uses `nodes` nodes under node billing
        (its runs may use more nodes than its stage count alone needs)."""
        pool = self.pools[p]
        return self.types[pool.k].rent_usd_per_hour(0, nodes)

    def max_stages(self, p: int, pp: int | None = None) -> int:
        """Most stages pool p holds in this config (or in one like it of `pp` stages)."""
        return min(self.cfg.pp if pp is None else pp, self.pools[p].place.max_stages)

    def min_stages(self, p: int) -> int:
        return 1 if self.pools[p].k in self.required_types else 0

    # ---- the step's form -------------------------------------------------------------------
    def basis(self) -> str:
        """How the step of this instance's plans is predicted: predict.SIMULATED or
        predict.CLOSED_FORM (predict.step_basis)."""
        return step_basis(self.inst)

    def forward_share(self) -> ForwardShare:
        """(lo, hi, excess) with lo t_s <= f_s <= hi t_s + excess on every stage of every plan
        (schedules.ForwardShare). t = a n + rho r + c, f = a_f n + rho_f r + c_f per option and
        stage kind: lo, the least share of any part of f over the same part with the
        recompute added (recompute, at most one per layer, adds backward only); hi, the
        largest per-layer share a_f / a, rho_f / rho; and since a_f n + rho_f r <= hi (a n +
        rho r) = hi (t - c), f <= hi t + (c_f - hi c): excess, the largest c_f - hi c (or 0).
        The ends' constant parts (the embedding's forward-heavy lookup) would otherwise raise
        hi for every stage."""
        if self._phi is None:
            # it reads the options' times at the positions below, whose ends min(pp, 3) fixes
            self._phi = self.shared.get(ForwardShareKey(tuple(self.options), min(self.cfg.pp, 3)), self._forward_share)
        return self._phi

    def _forward_share(self) -> ForwardShare:
        lo, hi, parts = 1.0, 0.0, []
        for o in range(len(self.options)):
            for s in sorted({0, min(1, self.cfg.pp - 1), self.cfg.pp - 1}):
                t, b = self.time(o, s)
                parts.append((t, b))
                rho = max(t.rho, 0.0)
                for part, whole, fwd in ((t.a, t.a + rho, t.a - b.a), (t.c, t.c, t.c - b.c)):
                    if part > 0:
                        lo = min(lo, fwd / whole)
                for part, fwd in ((t.a, t.a - b.a), (t.rho, t.rho - b.rho)):
                    if part > 0:
                        hi = max(hi, fwd / part)
        hi = min(hi, 1.0)
        excess = max([(t.c - b.c) - hi * t.c for t, b in parts] + [0.0])
        return ForwardShare(max(lo, 0.0), hi, excess)

    def step_weights(self, sched: Schedule | None = None) -> list[tuple[float, float, bool, float]]:
        """Quadruples (w_z, w_sum, with the transfers, offset) of the step's lower bounds w_z z
        + w_sum S + offset + ... (solvers/bounds.py): the closed form's own weights, or the
        simulated step's (Schedule.path_weights)."""
        sched = sched or self.cfg.sched
        if self.basis() == SIMULATED:
            return sched.path_weights(self.m, self.cfg.pp, self.forward_share())
        return [(sched.z_weight(self.m), sched.sum_weight(), True, 0.0)]

    def position_weights(self) -> list[float] | None:
        """Per stage s, the weight c_s of t_s in step_weights()[1]'s path through s
        (Schedule.position_weights; the simulated basis only, whose quadruples take c_0 for
        every stage), or None."""
        if self.basis() != SIMULATED:
            return None
        return self.cfg.sched.position_weights(self.m, self.cfg.pp, self.forward_share())

    def step_p2p(self, hop_s: list[float], wrap_hop_s: float) -> float:
        """The transfers the step's lower bound counts (closed form or paths) for these hops."""
        sched = self.cfg.sched
        if self.basis() == SIMULATED:
            return sched.path_p2p(hop_s, wrap_hop_s)
        return sched.p2p_time(hop_s, wrap_hop_s)

    def paths(self) -> list[PathTerms]:
        """The known paths of this config's step graph (schedule, vpp, pp, m), shared by every
        config with the same four; seeded by `predict.seed_paths`, grown by the driver."""
        cfg = self.cfg
        return self.shared.get(PathKey(cfg.schedule, cfg.vpp, cfg.pp, self.m),
                               lambda: seed_paths(cfg.sched, cfg.pp, self.m))
