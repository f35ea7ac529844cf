"""Readers of other planners' inputs (Metis, FASOP) and the cluster-spec dispatch that uses them."""
from __future__ import annotations

from pathlib import Path

from milp_plan import cluster


def is_metis_cluster(spec: str | Path | None) -> bool:
    text = "" if spec is None else str(spec)
    return text.startswith("metis:") or text.endswith(".json")


def load_cluster(spec: str | Path | None) -> cluster.Cluster:
    """A shipped cluster name, a YAML path, or `metis:CLUSTER.json,HOSTFILE` (a Metis cluster)."""
    if is_metis_cluster(spec):
        from milp_plan.importers.metis import load_metis_cluster  # numpy and pandas only when asked
        return load_metis_cluster(str(spec).removeprefix("metis:"))
    return cluster.load_cluster(spec)
