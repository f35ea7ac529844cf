"""Where the shipped data lives, both in a checkout and after a plain `pip install`.

In a wheel the top-level `clusters/` and `profiles/` folders are installed as
`milp_plan/shipped/clusters` and `milp_plan/shipped/profiles` (see pyproject.toml);
in a source checkout they sit beside the package.
"""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def shipped_dir(kind: str) -> Path:
    """Folder of shipped `clusters` or `profiles`."""
    installed = _PKG / "shipped" / kind
    if installed.is_dir():
        return installed
    return _PKG.parent / kind


def catalog_file(name: str) -> Path:
    return _PKG / "catalog" / name
