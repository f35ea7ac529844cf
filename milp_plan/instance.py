"""Instance = cluster + model + profile + job + objective, validated once, immutable after.

`build_instance` is the one entry point the CLI, `verify` and the tests use; a plan
records its arguments (`InstanceSpec`) so that the same instance can be rebuilt.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from milp_plan import analytic
from milp_plan.cluster import Cluster, cluster_from_mapping
from milp_plan.importers import load_cluster
from milp_plan.errors import InputError
from milp_plan.job import DEFAULT_MODEL, Job, JobSettings, Objective, load_job_file, parse_overlap
from milp_plan.model import Model, load_model, model_catalog, model_from_mapping
from milp_plan.profile import Profile, match_gpu_names, read_native


@dataclass(frozen=True)
class InstanceSpec:
    """The arguments an instance was built from (what plan.json records as `inputs`)."""

    cluster: str | None = None
    model: str | None = None
    profiles: str | None = None
    profile_format: str = "auto"
    profile_gpu_map: tuple[tuple[str, str], ...] = ()
    global_batch_size: int | None = None
    seq_length: int | None = None
    memory_headroom: float | None = None
    flash_attention: bool | None = None
    job_file: str | None = None
    global_batch_tokens: int | None = None
    precision: str | None = None
    grad_reduce_dtype: str | None = None
    distributed_optimizer: bool | None = None
    overlap: str | None = None     # --overlap: grad-reduce,param-gather,tp-comm | none (job.parse_overlap)

    def job_settings(self) -> JobSettings:
        """The job as the flags say it, over the job file (flags win)."""
        flags = JobSettings(global_batch=self.global_batch_size, global_batch_tokens=self.global_batch_tokens,
                            seq_length=self.seq_length, precision=self.precision,
                            flash_attention=self.flash_attention, grad_reduce_dtype=self.grad_reduce_dtype,
                            distributed_optimizer=self.distributed_optimizer, memory_headroom=self.memory_headroom,
                            **parse_overlap(self.overlap))
        return flags.over(load_job_file(self.job_file) if self.job_file else JobSettings())


@dataclass(frozen=True)
class Instance:
    cluster: Cluster
    model: Model
    profile: Profile
    job: Job
    objective: Objective = field(default_factory=Objective)
    spec: InstanceSpec = field(default_factory=InstanceSpec)
    notices: tuple[str, ...] = ()
    gpu_map: tuple[tuple[str, str], ...] = ()

    def inputs_record(self) -> dict[str, Any]:
        """What plan.json records: the build arguments, the full cluster/model/job, and hashes.
        Made once per instance (its content hashes took a third of every plan's build in the
        brute-force enumeration) and shared by the plans built on it: read it, never change it
        in place (Plan.to_dict copies it)."""
        return self._inputs_record

    @functools.cached_property
    def _inputs_record(self) -> dict[str, Any]:
        return {
            "spec": {**{k: v for k, v in asdict(self.spec).items() if k != "overlap" or v is not None},
                     "profile_gpu_map": dict(self.spec.profile_gpu_map)},
            "cluster": {"name": self.cluster.name, "source": self.cluster.source, "sha256": self.cluster.content_hash(),
                        "definition": self.cluster.to_dict()},
            "model": {"name": self.model.name, "sha256": self.model.content_hash(), "definition": self.model.to_dict()},
            "profile": {"sources": [{k: p.get(k) for k in ("file", "format", "origin", "sha256") if p.get(k)}
                                    for p in self.profile.provenance],
                        "gpu_map": dict(self.gpu_map)},
            "job": self.job.to_dict(),
            "objective": self.objective.to_dict(),
        }


def _detect_format(path: Path) -> str:
    if path.is_file() and path.suffix == ".csv":
        return "native"
    if not path.is_dir():
        raise InputError("profile directory not found; give a folder of profiles", source=str(path))
    names = [p.name for p in path.iterdir()]
    if any(n.startswith("DeviceType.") and n.endswith(".json") for n in names):
        return "metis"
    if any(n.endswith(".npy") for n in names):
        return "fasop"
    if any(n.endswith(".csv") for n in names):
        return "native"
    raise InputError("cannot tell the profile format (no *.csv, DeviceType.*.json or *.npy files); "
                     "name it with --profile-format native|metis|fasop", source=str(path))


def load_profiles(path: str | Path, fmt: str, model: Model, seq_length: int | None = None) -> Profile:
    """seq_length: the job's, recorded on imported (Metis, FASOP) rows, whose files have none."""
    p = Path(path)
    fmt = _detect_format(p) if fmt == "auto" else fmt
    if fmt == "native":
        files = [p] if p.is_file() else sorted(p.glob("*.csv"))
        if not files:
            raise InputError("no *.csv profile in this directory", source=str(p))
        profile = read_native(files[0])
        for f in files[1:]:
            profile = profile.merged(read_native(f))
        mine = profile.only(model=model.name)
        if not len(mine.rows):
            if len(profile.models()) == 1:
                return profile.for_model(model.name)
            raise InputError(f"profiles cover models {', '.join(profile.models())}, not '{model.name}'",
                             source=str(p))
        return mine
    if fmt == "metis":
        from milp_plan.importers.metis import load_metis_profiles
        return load_metis_profiles(p, model, seq_length)
    if fmt == "fasop":
        from milp_plan.importers.fasop import load_fasop_profiles
        return load_fasop_profiles(p, model, seq_length)
    raise InputError(f"unknown profile format {fmt!r}; use auto, native, metis or fasop", field="profile-format")


def _profile_seq_length(spec: InstanceSpec) -> int | None:
    """The sequence length a profile states where its rows carry none of their own: a Metis
    directory's name (importers.metis.named_seq_length); None otherwise."""
    p = Path(spec.profiles) if spec.profiles else None
    if p is None or not p.is_dir():
        return None
    if (spec.profile_format if spec.profile_format != "auto" else _detect_format(p)) != "metis":
        return None
    from milp_plan.importers.metis import named_seq_length
    return named_seq_length(p)


def _shipped_profile(model: Model, seq: int, flash_attention: bool = True) -> tuple[Profile | None, list[str]]:
    path = analytic.shipped_profile_path(model.name)
    if model.source != "catalog" or not path.exists():
        return None, []
    if not flash_attention:
        return None, [f"shipped profiles for {model.name} assume flash attention; derived an analytic profile "
                      "with unfused attention on the fly"]
    if seq != model.seq_length:
        return None, [f"shipped profiles for {model.name} are at seq {model.seq_length}; "
                      f"derived an analytic profile at seq {seq} on the fly"]
    profile = read_native(path)
    profile.provenance[0]["file"] = f"shipped:{path.name}"
    return profile, []


def build_instance(spec: InstanceSpec | None = None, objective: Objective | None = None, *,
                   cluster: Cluster | None = None, model: Model | None = None, job: Job | None = None) -> Instance:
    """Build from arguments; `cluster`, `model`, `job` given directly replace what `spec` names."""
    spec = spec or InstanceSpec()
    cluster = cluster or load_cluster(spec.cluster)
    model = model or load_model(spec.model or DEFAULT_MODEL)
    notices: list[str] = []
    if job is None:
        settings = spec.job_settings()
        inferred = _profile_seq_length(spec) if settings.seq_length is None else None
        if inferred is not None and inferred != model.seq_length:
            settings = replace(settings, seq_length=inferred)
            notices.append(f"sequence length {inferred} inferred from the profile directory's name ({spec.profiles}); "
                           f"{model.name}'s default is {model.seq_length}; pass --seq-len to choose")
        job = settings.resolve(model.seq_length)
    cluster_gpus = {nt.gpu.name: nt.gpu for nt in cluster.node_types}
    gpu_map: dict[str, str] = {}
    if spec.profiles:
        profile = load_profiles(spec.profiles, spec.profile_format, model, job.seq_length)
        notices += [p["notice"] for p in profile.provenance if p.get("notice")]
        profile_gpus = profile.gpus()
        gpu_map = match_gpu_names(profile.gpus(), cluster_gpus, dict(spec.profile_gpu_map), spec.profiles)
        profile = profile.only(gpus=gpu_map).renamed_gpus(gpu_map)
        for g in cluster_gpus:
            if g not in profile.gpus():
                raise InputError(f"profiles have no data for GPU '{g}' of cluster '{cluster.name}' (they have "
                                 f"{', '.join(profile_gpus) or 'none'}; matched "
                                 f"{', '.join(f'{a}->{b}' for a, b in sorted(gpu_map.items())) or 'none'}); "
                                 f"map one with --profile-gpu-map "
                                 f"NAME={g} or profile that GPU", source=spec.profiles)
            for kind in model.kinds():
                if not profile.covers(model.name, g, kind):
                    raise InputError(f"profile lacks layer kind '{kind}' for GPU '{g}'; {model.name} needs "
                                     f"{', '.join(model.kinds())}", source=spec.profiles)
        notices += profile.measured_notes()
    else:
        profile, notes = _shipped_profile(model, job.seq_length, job.flash_attention)
        notices += notes
        missing = [g for name, g in cluster_gpus.items() if profile is None or name not in profile.gpus()]
        if missing:
            if profile is not None or not notes:
                notices.append(f"no profile covers {model.name} on {', '.join(g.name for g in missing)}: "
                               "derived an analytic profile on the fly")
            derived = analytic.generate_profile(model, missing, flash_attention=job.flash_attention,
                                                seq_lengths=[job.seq_length])
            profile = derived if profile is None else profile.merged(derived)
        # an analytic profile generates every point: its planner space is not limited to the
        # table's tp and micro-batch sizes (profile.py, `generator`)
        from milp_plan.cluster import gpu_catalog
        catalog = gpu_catalog()
        profile.generator = analytic.Generator(model, {name: (gpu if gpu in missing else catalog.get(name, gpu))
                                                       for name, gpu in cluster_gpus.items()},
                                                      job.flash_attention)
    return Instance(cluster, model, profile, job, objective or Objective(), spec, tuple(notices),
                    tuple(sorted(gpu_map.items())))


def spec_from_record(record: Mapping[str, Any]) -> InstanceSpec:
    d = dict(record)
    d["profile_gpu_map"] = tuple(sorted((d.get("profile_gpu_map") or {}).items()))
    return InstanceSpec(**d)


def instance_from_inputs(inputs: Mapping[str, Any], source: str) -> Instance:
    """Rebuild the instance a plan records: cluster and model from their embedded
    definitions, profiles from the recorded arguments, then compare hashes."""
    try:
        spec = spec_from_record(inputs["spec"])
        objective = Objective.from_dict(inputs["objective"])
        cluster = cluster_from_mapping(inputs["cluster"]["definition"], f"{source}: inputs.cluster")
        mdef = dict(inputs["model"]["definition"])
        name = mdef.pop("name")
        model = model_catalog().get(name) if spec.model in (None, name) else None
        if model is None or model.to_dict() != inputs["model"]["definition"]:
            model = replace(model_from_mapping(name, mdef, f"{source}: inputs.model"), source=f"{source}")
        job = Job.from_dict(inputs["job"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"inputs record is incomplete ({exc}); it must come from `milp-plan solve`",
                         source=source) from None
    return build_instance(spec, objective, cluster=cluster, model=model, job=job)
