"""What the profile importers share: layer slots -> native rows, and content hashes.

Peer tools write one value per *layer slot* in model order: slot 0 is the embedding,
the last slot the head (post-process), and slots 1..L the L transformer blocks. The
native profile keeps one row per layer *kind*, so the slots of one kind are averaged:

    value(kind) = mean(value[s] for s in slots of kind)

Block slot i (1-based) has the kind `model.block_kind(i - 1)` (block, encoder_block or
decoder_block).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from milp_plan.errors import InputError
from milp_plan.fileio import sha256_file, sha256_text
from milp_plan.model import Model

COLUMNS = ["model", "gpu", "tp", "micro_batch_size", "seq_length", "kind", "fwd_ms", "bwd_ms"]


def slot_kinds(model: Model) -> list[str]:
    """Kind of each slot: embedding, the model's blocks in order, head (num_layers + 2 slots)."""
    return ["embedding", *(model.block_kind(i) for i in range(model.num_layers)), "head"]


def check_slot_count(n_slots: int, model: Model, source: str, what: str, fix: str) -> None:
    """n_slots must be embedding + model.num_layers blocks + head."""
    if n_slots != model.num_layers + 2:
        raise InputError(f"{what} has {n_slots} layer slots (embedding + {n_slots - 2} blocks + head) but "
                         f"{model.name} has {model.num_layers} blocks ({model.num_layers + 2} slots); {fix}",
                         source=source)


def check_numbers(values: Any, source: str, what: str) -> list[float]:
    """A list of finite numbers >= 0."""
    if not isinstance(values, (list, tuple)) or not values:
        raise InputError(f"{what} must be a non-empty list of numbers", source=source)
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v > 1e12:
            raise InputError(f"{what}[{i}] must be a finite number from 0 to 1e12, got {v!r:.40}", source=source)
        if 0 < v < 1e-9:
            raise InputError(f"{what}[{i}] = {v!r} is below 1e-9; write 0 or a real value", source=source)
        out.append(float(v))
    if not any(out):
        raise InputError(f"{what} is all zeros; a profile must hold measured values", source=source)
    return out


def mean_by_kind(values: Sequence[float], model: Model) -> dict[str, float]:
    """Average the per-slot values over the slots of each kind (model order of kinds)."""
    groups: dict[str, list[float]] = {}
    for kind, v in zip(slot_kinds(model), values):
        groups.setdefault(kind, []).append(v)
    return {kind: sum(vs) / len(vs) for kind, vs in groups.items()}


def combined_sha256(paths: Iterable[Path]) -> str:
    """One hash over several files: sha256 of the lines `<name> <sha256 of the file>`, sorted by name."""
    lines = sorted(f"{p.name} {sha256_file(p)}\n" for p in paths)
    return sha256_text("".join(lines))


def table(rows: list[tuple], extra: Sequence[str] = ()) -> pd.DataFrame:
    """Native profile table from rows in COLUMNS (+ extra) order; measured times include tp collectives."""
    out = pd.DataFrame(rows, columns=COLUMNS + list(extra))
    out["tp_comm_included"] = True
    return out
