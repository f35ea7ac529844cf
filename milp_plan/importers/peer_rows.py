"""What the peer-plan readers (fasop_plan, metis_plan) share: the layout they return and
the helpers that turn a peer's row into it (see peer_plan for the whole import)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from milp_plan.cluster import Cluster, NodeType
from milp_plan.errors import InputError
from milp_plan.plan import Device


@dataclass(frozen=True)
class PeerStage:
    devices: tuple[Device, ...]   # tp x dp cluster devices, tp fastest
    tp: int
    dp: int
    micro_batch_size: int         # samples per dp replica per micro-batch
    blocks: int                   # transformer blocks (layer slots minus embedding / head)


@dataclass(frozen=True)
class PeerLayout:
    tool: str                     # "fasop" | "metis"
    rank: int                     # 1-based rank in the peer's file
    stages: tuple[PeerStage, ...]
    num_microbatches: int
    peer_step_time_s: float | None    # the peer's own estimate of the step, seconds
    summary: str                  # the row in a few words, for the user
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---- helpers the format modules share ---------------------------------------------------
def pick_row(rows: Sequence, rank: int, source: str, what: str):
    """The row ranked `rank` (1-based); an InputError names the range."""
    if not rows:
        raise InputError(f"no {what} rows found; give the file the peer wrote", source=source)
    if not 1 <= rank <= len(rows):
        raise InputError(f"--rank {rank} is out of range: the file has {len(rows)} row(s); use 1 to {len(rows)}",
                         source=source, field="rank")
    return rows[rank - 1]


def node_types_for_gpu(cluster: Cluster, peer_gpu: str) -> list[NodeType]:
    """Cluster node types whose GPU is `peer_gpu`: the same name (case-insensitive), or a
    catalog name that extends it with a suffix (`A100` -> A100-80GB, never `A10` -> A100)."""
    g = peer_gpu.lower()
    return [nt for nt in cluster.node_types if nt.gpu.name.lower() == g or nt.gpu.name.lower().startswith(g + "-")]


def split_slots(slot_counts: Sequence[int], block_slots: Sequence[bool], source: str, where: str) -> list[int]:
    """Blocks per stage from the layer slots per stage; `block_slots[i]` says whether slot i is
    a transformer block (False: embedding or head)."""
    if any(n < 1 for n in slot_counts):
        raise InputError(f"{where}: a stage holds {min(slot_counts)} layer slots; every stage needs at least one",
                         source=source)
    if sum(slot_counts) != len(block_slots):
        raise InputError(f"{where}: the partition covers {sum(slot_counts)} layer slots but the model has "
                         f"{len(block_slots)} (embedding + {sum(block_slots)} blocks + head); pass the --model "
                         "the peer planned for", source=source)
    out, start = [], 0
    for s, n in enumerate(slot_counts):
        blocks = sum(block_slots[start:start + n])
        if blocks == 0:
            raise InputError(f"{where}: stage {s} holds only the embedding or the head ({n} slot(s), no "
                             "transformer block); milp-plan puts those on the first and last stage with blocks of "
                             "their own, so it cannot represent this stage: pick another --rank", source=source)
        out.append(blocks)
        start += n
    return out


def micro_batches(global_batch: int, dp: int, per_replica: int | None, num_micro: int | None, source: str,
                  where: str) -> tuple[int, int]:
    """(micro-batch size per replica, micro-batch count) from the one the peer gives;
    the global batch must split exactly."""
    if per_replica is not None:
        if global_batch % (dp * per_replica):
            raise InputError(f"{where}: global batch {global_batch} does not split into dp {dp} x micro-batch "
                             f"{per_replica}; pass the --global-batch the peer searched with", source=source)
        return per_replica, global_batch // (dp * per_replica)
    assert num_micro is not None
    if global_batch % (dp * num_micro):
        raise InputError(f"{where}: global batch {global_batch} does not split into dp {dp} x {num_micro} "
                         "micro-batches; pass the --global-batch the peer searched with", source=source)
    return global_batch // (dp * num_micro), num_micro
