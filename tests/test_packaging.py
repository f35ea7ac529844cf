"""The installed package carries its data: a wheel built from this tree holds the shipped
clusters, profiles, catalogs and the plan schema, and, unzipped outside the repository, finds
them without the source checkout. The shipped analytic profiles are exactly what the
generator writes today, so they cannot drift from the code."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from milp_plan import analytic
from milp_plan.cluster import gpu_catalog
from milp_plan.model import model_catalog
from milp_plan.profile import write_native

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"__pycache__", "build", "dist", ".git", ".venv", ".ci-venv", "venv", ".pytest_cache", ".hypothesis"}


def _copy_source(dst: Path) -> Path:
    """What a build needs, copied out of the tree so that the build writes nothing here."""
    src = dst / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    for name in ("milp_plan", "clusters", "profiles"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    return src


def _setuptools_builds_wheels() -> bool:
    """setuptools >= 70.1 has bdist_wheel built in: no build isolation (and no network) needed."""
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wheel")
    src = _copy_source(d)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(d / "dist"), str(src)]
    if _setuptools_builds_wheels():
        cmd.insert(4, "--no-build-isolation")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    wheels = list((d / "dist").glob("milp_plan-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _tracked_packages() -> list[str]:
    """Every package directory (with __init__.py) of milp_plan that is part of the project:
    the files git tracks when this is a clone, else everything on disk."""
    files: list[str] = []
    if (REPO / ".git").exists() and shutil.which("git"):
        p = subprocess.run(["git", "-C", str(REPO), "ls-files", "milp_plan"], capture_output=True, text=True)
        if p.returncode == 0:
            files = p.stdout.split()
    if not files:
        files = [str(f.relative_to(REPO)) for f in (REPO / "milp_plan").rglob("__init__.py")
                 if not SKIP_DIRS & set(f.parts)]
    return sorted(str(Path(f).parent) for f in files if Path(f).name == "__init__.py")


def test_wheel_holds_the_shipped_data_and_every_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("milp_plan/shipped/clusters/default.yaml",
                   "milp_plan/shipped/profiles/analytic-gpt3-6.7b.csv",
                   "milp_plan/catalog/gpus.yaml",
                   "milp_plan/catalog/models.yaml",
                   "milp_plan/plan.schema.json"):
        assert needed in names, needed
    for cluster in (REPO / "clusters").glob("*.yaml"):
        assert f"milp_plan/shipped/clusters/{cluster.name}" in names
    for prof in (REPO / "profiles").glob("*.csv"):
        assert f"milp_plan/shipped/profiles/{prof.name}" in names
    for name in ("measurements.csv", "fit.json", "README.md"):   # tests/test_calibration.py reads them
        assert f"milp_plan/shipped/profiles/calibration/{name}" in names
    missing = [pkg for pkg in _tracked_packages() if f"{pkg}/__init__.py" not in names]
    assert not missing, f"packages left out of the wheel (add them to pyproject.toml): {missing}"
    assert not any(n.startswith(("tests/", "clusters/", "profiles/")) for n in names)


PROBE = r"""
import json, sys
import milp_plan
from milp_plan import resources
from milp_plan.instance import build_instance
from milp_plan.plan import schema
import milp_plan.solve  # the solver stack imports from the installed package too
inst = build_instance()
site = sys.argv[1]
elsewhere = sorted(m.__file__ for name, m in sys.modules.items()
                   if name.split(".")[0] == "milp_plan" and getattr(m, "__file__", None)
                   and not m.__file__.startswith(site))
print(json.dumps({
    "loaded_from_elsewhere": elsewhere,
    "package": milp_plan.__file__,
    "clusters": str(resources.shipped_dir("clusters")),
    "profiles": str(resources.shipped_dir("profiles")),
    "cluster_source": inst.cluster.source,
    "cluster_name": inst.cluster.name,
    "profile_file": inst.profile.provenance[0]["file"],
    "schema_title": schema()["title"],
    "notices": list(inst.notices),
}))
"""


def test_unzipped_wheel_finds_its_data_outside_the_repository(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(site)], cwd=work, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    cli = subprocess.Popen([sys.executable, "-m", "milp_plan.cli", "inspect", "--json"], cwd=work, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0, err
    facts = json.loads(out)
    pkg = site / "milp_plan"
    assert Path(facts["package"]).parent == pkg                       # not the checkout
    assert facts["loaded_from_elsewhere"] == []                        # nor any submodule from it
    assert Path(facts["clusters"]) == pkg / "shipped" / "clusters"
    assert Path(facts["profiles"]) == pkg / "shipped" / "profiles"
    assert Path(facts["cluster_source"]) == pkg / "shipped" / "clusters" / "default.yaml"
    assert facts["cluster_name"] == "default-a100-a10"
    assert facts["profile_file"] == "shipped:analytic-gpt3-2.7b.csv"   # the default job's shipped profile, not derived
    assert facts["notices"] == []
    assert facts["schema_title"] == "milp-plan plan"
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    report = json.loads(out)
    assert Path(report["cluster"]["source"]) == pkg / "shipped" / "clusters" / "default.yaml"
    assert report["profile"]["sources"][0]["file"] == "shipped:analytic-gpt3-2.7b.csv"


@pytest.mark.parametrize("name", sorted(model_catalog()))
def test_shipped_analytic_profiles_do_not_drift(tmp_path, name):
    model = model_catalog()[name]
    out = tmp_path / f"analytic-{name}.csv"
    write_native(out, analytic.generate_table(model, gpu_catalog().values()), analytic.provenance(model))
    shipped = REPO / "profiles" / f"analytic-{name}.csv"
    assert out.read_bytes() == shipped.read_bytes(), (
        f"{shipped} differs from what the generator writes now; regenerate with `python -m milp_plan.analytic`")
