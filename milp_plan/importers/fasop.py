"""FASOP (HPDC'24) `known_cost` profiles: `<model>_<GPU>_<tp>.npy`.

Each file is a 1-D float64 array with one value per layer slot in model order
(embedding, the blocks, post-process): the **forward** time of that slot in
**seconds** at micro-batch 1, measured at tensor-parallel degree tp on GPU <GPU>.

Conversion to native rows (one per layer kind; slots of one kind are averaged, see
`slots`):

    fwd_ms = 1000 x value            (seconds -> ms)
    bwd_ms = 2 x fwd_ms              (FASOP multiplies the forward by 3 for fwd + bwd)

micro_batch_size = 1 (other sizes are filled by the profile's documented rule),
seq_length = the job's sequence length (the files do not record one), gpu = <GPU> as
written in the file name (the instance maps it to a cluster GPU), tp_comm_included =
true (measured with tp). FASOP's per-GPU fudge factors are not applied.

Choosing the files of a model: names are compared normalised (lowercase, only letters
and digits: `gpt2XL` == `gpt2-xl`); an exact match wins, else a file model that is a
unique prefix of the model name (`bert` -> bert-large, `T5` -> t5-770m); if the
directory holds a single model it is used whatever its name; otherwise an error lists
the models found. Arrays are read with `np.load(allow_pickle=False)`.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from milp_plan.errors import InputError
from milp_plan.importers import slots
from milp_plan.model import Model
from milp_plan.profile import Profile

_NAME = re.compile(r"^(?P<model>.+)_(?P<gpu>[^_]+)_(?P<tp>\d+)\.npy$")


def normalise(name: str) -> str:
    """Lowercase, letters and digits only: 'gpt2XL' and 'gpt2-xl' both give 'gpt2xl'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def fasop_files(directory: Path) -> list[tuple[Path, str, str, int]]:
    """(path, model, gpu, tp) of every *.npy file, sorted by name."""
    out = []
    for path in sorted(directory.glob("*.npy")):
        m = _NAME.match(path.name)
        if not m or int(m["tp"]) <= 0:
            raise InputError("a FASOP profile is named <model>_<GPU>_<tp>.npy with tp > 0; rename or remove it",
                             source=str(path))
        out.append((path, m["model"], m["gpu"], int(m["tp"])))
    if not out:
        raise InputError("no FASOP profile (<model>_<GPU>_<tp>.npy) in this directory", source=str(directory))
    return out


def pick_model(found: list[str], model: Model, source: str) -> str:
    """The file model name that stands for `model`: exact (normalised), unique prefix, or the only one."""
    target = normalise(model.name)
    exact = [f for f in found if normalise(f) == target]
    prefix = [f for f in found if normalise(f) and target.startswith(normalise(f))]
    for match in (exact, prefix):
        if len(match) == 1:
            return match[0]
    if len(found) == 1:
        return found[0]
    raise InputError(f"FASOP files cover models {', '.join(found)}; none is unambiguously '{model.name}'; pass "
                     "--model with one of them or keep only that model's files", source=source)


def read_array(path: Path, model: Model) -> list[float]:
    """Per-slot forward seconds: a 1-D array of finite numbers >= 0, one per slot."""
    from milp_plan.fileio import resolve_input
    resolve_input(path, "FASOP profile")  # a regular file of sane size: never a FIFO or device
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"not a readable .npy array ({str(exc).splitlines()[0]}); write it with numpy.save",
                         source=str(path)) from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer)
                                                                or np.issubdtype(arr.dtype, np.floating)):
        raise InputError("a FASOP profile must be a 1-D numeric array (forward seconds per layer slot)",
                         source=str(path))
    values = slots.check_numbers([float(v) for v in arr], str(path), "array")
    slots.check_slot_count(len(values), model, str(path), "array",
                           f"use {model.name}'s files, or pass --model for the model these profile "
                           f"({len(values) - 2} blocks)")
    return values


def load_fasop_profiles(directory: Path, model: Model, seq_length: int | None = None) -> Profile:
    """Native rows from a FASOP known_cost directory; seq_length defaults to the model's."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError("FASOP profile directory not found; check the path", source=str(directory))
    seq = seq_length or model.seq_length
    files = fasop_files(directory)
    chosen = pick_model(sorted({m for _, m, _, _ in files}), model, str(directory))
    mine = [(p, g, tp) for p, m, g, tp in files if m == chosen]
    rows = []
    for path, gpu, tp in mine:
        for kind, fwd_s in slots.mean_by_kind(read_array(path, model), model).items():
            fwd_ms = 1000.0 * fwd_s
            rows.append((model.name, gpu, tp, 1, seq, kind, fwd_ms, 2.0 * fwd_ms))
    provenance = {
        "format": "fasop", "file": str(directory), "origin": f"measured (FASOP known_cost, model '{chosen}')",
        "sha256": slots.combined_sha256(p for p, _, _ in mine),
        "conversions": "fwd_ms = 1000 x forward seconds, bwd_ms = 2 x fwd_ms (FASOP: fwd+bwd = 3 x fwd); "
                       f"mean over the slots of a kind; micro_batch_size = 1; seq_length = {seq} (not in FASOP files)",
        "tp_comm_included": True, "files": [p.name for p, _, _ in mine],
    }
    return Profile(slots.table(rows), [provenance])
