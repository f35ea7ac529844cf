"""Linear coefficients of the per-stage models, read off the cost model.

For a fixed Config every stage quantity is affine in the stage's layer count n and its
number of recomputed layers r (full recompute, r >= 1): q(n, r) = a n + rho r + c. The
coefficients are obtained by evaluating the cost model's own stage functions at a few
(n, r) points and differencing, and linearity is asserted at a third point, so the
models can never drift from `costmodel`. Positions matter: stage 0 holds the embedding,
the last stage the head, and the in-flight micro-batch count depends on the position.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from milp_plan import costmodel as cm
from milp_plan.cluster import NodeType
from milp_plan.formulations.space import Config
from milp_plan.instance import Instance

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
class Placement:
    """How stages of `group` GPUs pack into one node type (canonical, in node order)."""

    stages_per_node: int   # > 0 when a stage fits in a node
    nodes_per_stage: int   # > 0 when a stage spans whole nodes
    max_stages: int

    def nodes_used(self, stages: int) -> int:
        if self.stages_per_node:
            return -(-stages // self.stages_per_node)
        return stages * self.nodes_per_stage


def placement(nt: NodeType, group: int) -> Placement | None:
    g = nt.gpus_per_node
    if group <= g and g % group == 0:
        return Placement(g // group, 0, nt.count * (g // group))
    if group > g and group % g == 0:
        return Placement(0, group // g, nt.count // (group // g))
    return None


class Coefficients:
    """Every coefficient of the per-stage models for one Config."""

    def __init__(self, inst: Instance, cfg: Config, shared: dict | None = None):
        """`shared` may be passed to every Config of one instance: it memoises the
        coefficients that depend on only part of a Config (stage times on node type,
        ends, tp, micro-batch and recompute; reduction and optimizer on tp, dp and the
        distributed optimizer)."""
        self.inst, self.cfg = inst, cfg
        self._shared = {} if shared is None else shared
        self._local: dict = {}
        self.kind = inst.model.block_kind(0)
        if any(inst.model.block_kind(i) != self.kind for i in range(inst.model.num_layers)):
            from milp_plan.errors import InputError
            raise InputError(f"model '{inst.model.name}' mixes block kinds (encoder-decoder); the exact formulations "
                             "need one block kind: use --solver brute-force", field="model")
        self.types = [nt for nt in inst.cluster.node_types]
        self.place = [placement(nt, cfg.group) for nt in self.types]
        self.m = cfg.num_microbatches(inst.job.global_batch_size)
        self.full = cfg.recompute == "full"

    # ---- per node type and position -------------------------------------------------
    def _ends(self, s: int) -> tuple[bool, bool]:
        return s == 0, s == self.cfg.pp - 1

    def time(self, k: int, s: int) -> tuple[Affine, Affine]:
        """(t = f + b, b) of stage position s on node type k, seconds per micro-batch."""
        return self._time(k, *self._ends(s))

    def _time(self, k: int, first: bool, last: bool) -> tuple[Affine, Affine]:
        nt, cfg = self.types[k], self.cfg

        def f_b(n: int, r: int) -> tuple[float, float]:
            return cm.stage_compute_s(self.inst, nt, cfg.tp, cfg.mbs, [self.kind] * n, first, last,
                                      cfg.recompute, r)
        return self._memo(self._shared, ("time", k, first, last, cfg.tp, cfg.mbs, cfg.recompute),
                          lambda: (_affine(lambda n, r: sum(f_b(n, r)), self.full),
                                   _affine(lambda n, r: f_b(n, r)[1], self.full)))

    def _memo(self, cache: dict, key: tuple, make):
        value = cache.get(key)
        if value is None:
            value = cache[key] = make()
        return value

    def _params(self, n: int, first: bool, last: bool) -> float:
        return cm.stage_params(self.inst, [self.kind] * n, first, last, single_stage=self.cfg.pp == 1) / self.cfg.tp

    def memory(self, k: int, s: int) -> Affine:
        """Bytes per GPU of stage position s on node type k."""
        return self._memo(self._local, ("mem", k, s), lambda: self._memory(k, s))

    def _memory(self, k: int, s: int) -> Affine:
        cfg = self.cfg

        def mem(n: int, r: int) -> float:
            return sum(cm.stage_memory_bytes(
                self.inst, schedule=cfg.schedule, pp=cfg.pp, stage=s, m=self.m, vpp=cfg.vpp, kinds=[self.kind] * n,
                tp=cfg.tp, dp=cfg.dp, mbs=cfg.mbs, sequence_parallel=cfg.sequence_parallel,
                distributed_optimizer=cfg.distributed_optimizer, recompute=cfg.recompute, recompute_layers=r)[:4])
        return _affine(mem, self.full)

    def capacity(self, k: int) -> float:
        return cm.usable_memory_bytes(self.inst, self.types[k])

    def _state_key(self, what: str, k: int, s: int) -> tuple:
        cfg = self.cfg
        return (what, k, *self._ends(s), cfg.pp == 1, cfg.tp, cfg.dp, cfg.distributed_optimizer)

    def dp_time(self, k: int, s: int) -> Affine:
        return self._memo(self._shared, self._state_key("dp", k, s), lambda: self._dp_time(k, s))

    def _dp_time(self, k: int, s: int) -> Affine:
        cfg, (first, last), nt, pl = self.cfg, self._ends(s), self.types[k], self.place[k]
        nodes = 1 if pl.stages_per_node else pl.nodes_per_stage
        per_node = cfg.group if pl.stages_per_node else nt.gpus_per_node

        def dp(n: int, r: int) -> float:
            return cm.dp_allreduce_s(cm.GRAD_BYTES * self._params(n, first, last), cfg.dp, cfg.tp,
                                     max(1, per_node // cfg.tp), nodes, nt.intra_node_gb_per_s,
                                     nt.inter_node_gb_per_s, cfg.distributed_optimizer)
        return _affine(dp, False)

    def opt_time(self, k: int, s: int) -> Affine:
        return self._memo(self._shared, self._state_key("opt", k, s), lambda: self._opt_time(k, s))

    def _opt_time(self, k: int, s: int) -> Affine:
        cfg, (first, last), nt = self.cfg, self._ends(s), self.types[k]
        div = cfg.dp if cfg.distributed_optimizer else 1
        return _affine(lambda n, r: cm.optimizer_s(self._params(n, first, last) / div, nt), False)

    # ---- hops -------------------------------------------------------------------------
    @cached_property
    def hop_bytes(self) -> float:
        return cm.p2p_bytes(self.inst, self.cfg.mbs, self.cfg.tp, self.cfg.sequence_parallel)

    def senders(self, k: int) -> int:
        return min(self.cfg.group, self.types[k].gpus_per_node)

    def hop_intra(self, k: int) -> float:
        nt = self.types[k]
        return cm.p2p_s(self.inst, self.hop_bytes, nt, nt, True, self.senders(k))

    def hop_inter(self, k: int, k2: int) -> float:
        return cm.p2p_s(self.inst, self.hop_bytes, self.types[k], self.types[k2], False, self.senders(k))

    # ---- money --------------------------------------------------------------------------
    def usd_per_hour(self, k: int, stages: int) -> float:
        nt, pl = self.types[k], self.place[k]
        if stages == 0:
            return 0.0
        if nt.billing == "gpu":
            return nt.usd_per_gpu_hour * stages * self.cfg.group
        return nt.usd_per_hour * pl.nodes_used(stages)

    def usable_types(self) -> list[int]:
        return [k for k, pl in enumerate(self.place) if pl is not None and pl.max_stages > 0]

    # ---- the closed form's constants ------------------------------------------------------
    def z_weight(self) -> float:
        """Coefficient of z = max_s t_s in T (see costmodel.pipeline_time_s)."""
        cfg = self.cfg
        if cfg.schedule == "interleaved" and cfg.vpp > 1:
            return self.m - 1.0 / cfg.vpp
        return self.m - 1.0

    def sum_weight(self) -> float:
        cfg = self.cfg
        return 1.0 / cfg.vpp if (cfg.schedule == "interleaved" and cfg.vpp > 1) else 1.0
