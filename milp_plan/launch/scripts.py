"""Bash text for a launch directory: flags file, node scripts, host dispatcher, Slurm job.

Safety: no value reaches shell text unquoted. Hosts must pass `cluster.valid_host`,
Slurm partitions must be plain tokens, everything interpolated into commands is
`shlex.quote`d, and comments carry only validated hosts, integers and names reduced to
token characters (`comment_text`). The scripts
pass `bash -n` and ShellCheck (`shellcheck -x`) without a finding (tests/test_launch.py).
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from milp_plan.cluster import valid_host
from milp_plan.errors import InputError
from milp_plan.launch.megatron import ENV, MEGATRON_VERSION, TRAINING_SCRIPT
from milp_plan.launch.ranks import Agent, RankLayout

ARGS_FILE = "megatron_args.sh"
DISPATCHER = "run_node.sh"
SLURM_FILE = "slurm.sbatch"
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
q = shlex.quote


def check_host(host: object, where: str) -> str:
    """An IP literal or RFC 1123 name, or InputError naming where it came from."""
    if not isinstance(host, str) or not valid_host(host):
        raise InputError(f"{where}: host {host!r} is not an IP address or RFC 1123 host name (letters, digits, "
                         "hyphens, dots); fix the cluster file", source=None)
    return host


def check_token(value: object, where: str) -> str:
    """Values written into script directives (Slurm partitions): letters, digits, . _ + -."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise InputError(f"{where}: {value!r} cannot be written into a launch script; use letters, digits, "
                         "'.', '_', '+' and '-' only")
    return value


def comment_text(value: object) -> str:
    """A name for a comment line: token characters kept, anything else (newlines too) becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", str(value))[:64] or "_"


def check_path(value: str, where: str) -> str:
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InputError(f"{where}: {value!r} must be a non-empty path without control characters")
    return value


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def node_script_name(host: str) -> str:
    """node_<host>.sh (':' of an IPv6 literal becomes '_'; host names cannot contain '_')."""
    return f"node_{host.replace(':', '_')}.sh"


def _array_lines(tokens: Sequence[str]) -> list[str]:
    """One line per flag with its values, each token shell-quoted."""
    lines: list[list[str]] = []
    for t in tokens:
        if t.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(q(t))
    return ["  " + " ".join(line) for line in lines]


def _header(lines: Sequence[str]) -> list[str]:
    return ["#!/usr/bin/env bash", *[f"# {line}".rstrip() for line in lines]]


def render_args_file(groups: Sequence[tuple[str, Sequence[str]]], summary: Sequence[str]) -> str:
    """megatron_args.sh: exports the environment and defines MEGATRON_ARGS; run it to print them."""
    out = _header([f"Megatron-LM flags for this plan, written by `milp-plan launch` (Megatron-LM {MEGATRON_VERSION};",
                   "flag contract: launch/README.md). Every node script sources this file; run it to print",
                   "the flags one per line. Data, tokenizer, optimizer and training-length flags are yours:",
                   "give them as arguments of the node scripts (they are appended after these).",
                   *summary])
    out += [f"export {k}={q(v)}" for k, v in ENV.items()]
    out.append("MEGATRON_ARGS=(")
    for name, flags in groups:
        out.append(f"  # {name}")
        out += _array_lines(flags)
    out += [")", 'if [[ "${BASH_SOURCE[0]}" == "${0}" ]]; then', '  printf \'%s\\n\' "${MEGATRON_ARGS[@]}"', "fi"]
    return "\n".join(out) + "\n"


def torchrun_args(agent: Agent, num_agents: int, master_addr: str, master_port: int) -> list[str]:
    """The torchrun options of one agent: static rendezvous, explicit node rank and master."""
    return ["--nnodes", str(num_agents), "--nproc-per-node", str(len(agent.gpus)), "--node-rank",
            str(agent.node_rank), "--master-addr", master_addr, "--master-port", str(master_port),
            "--rdzv-backend", "static"]


_NODE_BODY = r'''set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=megatron_args.sh
source "${HERE}/megatron_args.sh"
EXTRA_ARGS=("$@")
TORCHRUN="${TORCHRUN:-torchrun}"
PIDS=()

start_agent() {  # CUDA_VISIBLE_DEVICES, then torchrun options
  local devices="$1"
  shift
  local cmd=("${TORCHRUN}" "$@" "${TRAIN_SCRIPT}" "${MEGATRON_ARGS[@]}" "${EXTRA_ARGS[@]}")
  if [[ "${MILP_PLAN_DRY_RUN:-0}" == 1 ]]; then
    printf 'CUDA_VISIBLE_DEVICES=%s CUDA_DEVICE_MAX_CONNECTIONS=%q' "${devices}" "${CUDA_DEVICE_MAX_CONNECTIONS}"
    printf ' %q' "${cmd[@]}"
    printf '\n'
    return 0
  fi
  CUDA_VISIBLE_DEVICES="${devices}" "${cmd[@]}" &
  PIDS+=("$!")
}

stop_agents() {
  if ((${#PIDS[@]} > 0)); then
    kill "${PIDS[@]}" 2>/dev/null || true
  fi
}
'''

_NODE_WAIT = r'''
if [[ "${MILP_PLAN_DRY_RUN:-0}" == 1 ]]; then
  exit 0
fi
trap stop_agents INT TERM
status=0
for _ in "${PIDS[@]}"; do
  if ! wait -n; then
    status=1
    stop_agents
  fi
done
exit "${status}"
'''


def _megatron_path_lines(megatron_path: str | None) -> list[str]:
    """MEGATRON_PATH from the environment, else the --megatron-path default. The default is a
    plain quoted assignment: quotes inside a double-quoted ${VAR:-word} are not quotes to bash."""
    if not megatron_path:
        return ['MEGATRON_PATH="${MEGATRON_PATH:-}"']
    return [f"DEFAULT_MEGATRON_PATH={q(megatron_path)}", 'MEGATRON_PATH="${MEGATRON_PATH:-${DEFAULT_MEGATRON_PATH}}"']


def render_node_script(host: str, agents: Sequence[Agent], layout: RankLayout, master_addr: str, master_port: int,
                       megatron_path: str | None, gpu: str) -> str:
    """One host's script: sources the flags, starts one torchrun agent per run of consecutive ranks."""
    ranks = ", ".join(f"{a.ranks.start}-{a.ranks.stop - 1}" for a in agents)
    out = _header([f"Node {host} ({comment_text(gpu)}): torchrun agent(s) {', '.join(str(a.node_rank) for a in agents)} of "
                   f"{len(layout.agents)}, global ranks {ranks} of {layout.world_size}.",
                   "Written by `milp-plan launch`. Run it on this host (or through run_node.sh) with",
                   "MEGATRON_PATH set to a Megatron-LM checkout; extra arguments go to Megatron.",
                   "MILP_PLAN_DRY_RUN=1 prints the commands instead of running them."])
    out.append(_NODE_BODY.rstrip("\n"))
    out += _megatron_path_lines(megatron_path)
    out += ['if [[ -z "${MEGATRON_PATH}" ]]; then',
            f'  echo "$0: set MEGATRON_PATH to a Megatron-LM checkout ({MEGATRON_VERSION})" >&2',
            "  exit 2",
            "fi",
            f'TRAIN_SCRIPT="${{MEGATRON_PATH}}/{TRAINING_SCRIPT}"']
    for a in agents:
        args = " ".join(q(t) for t in torchrun_args(a, len(layout.agents), master_addr, master_port))
        out.append(f"start_agent {q(a.cuda_visible_devices)} {args}")
    out.append(_NODE_WAIT.rstrip("\n"))
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class HostEntry:
    host: str
    script: str
    aliases: tuple[str, ...]  # other names `hostname -s` may print for it


def host_entries(hosts: Sequence[str]) -> list[HostEntry]:
    """Each host with its script; a dotted name also answers to its first label when unique."""
    shorts = [h.split(".")[0] for h in hosts]
    out = []
    for h, short in zip(hosts, shorts):
        alias = () if is_ip(h) or short == h or shorts.count(short) > 1 or short in hosts else (short,)
        out.append(HostEntry(h, node_script_name(h), alias))
    return out


_DISPATCH_BODY = r'''
names=()
if [[ -n "${MILP_PLAN_HOST:-}" ]]; then
  names=("${MILP_PLAN_HOST}")
else
  names+=("$(hostname -s 2>/dev/null || true)" "$(hostname 2>/dev/null || true)")
  read -r -a addrs <<< "$(hostname -I 2>/dev/null || true)"
  names+=("${addrs[@]}")
fi
for name in "${names[@]}"; do
  if script="$(script_for "${name}")"; then
    exec bash "${HERE}/${script}" "$@"
  fi
done
echo "$0: this host (${names[*]}) is not in the plan; hosts: ${PLAN_HOSTS}" >&2
exit 2
'''


def render_dispatcher(entries: Sequence[HostEntry]) -> str:
    """run_node.sh: finds this host's node script by name (never by Slurm's node numbering)."""
    out = _header(["Runs this host's node script: the host is looked up by name in the plan's rank table",
                   "(MILP_PLAN_HOST, else `hostname -s`, `hostname`, the addresses of `hostname -I`).",
                   "Written by `milp-plan launch`; arguments go to Megatron."])
    out += ["set -euo pipefail", 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
            f"PLAN_HOSTS={q(' '.join(e.host for e in entries))}", "", "script_for() {", '  case "$1" in']
    for e in entries:
        out.append(f"    {'|'.join(q(n) for n in (e.host, *e.aliases))}) echo {q(e.script)} ;;")
    out += ["    *) return 1 ;;", "  esac", "}"]
    out.append(_DISPATCH_BODY.rstrip("\n"))
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class SlurmComponent:
    node_type: str
    gpu: str
    hosts: tuple[str, ...]
    gpus_per_node: int
    partition: str | None


def render_slurm(components: Sequence[SlurmComponent], megatron_path: str | None) -> str:
    """slurm.sbatch: one component per node type (a heterogeneous job when more than one);
    whole nodes, pinned by --nodelist; srun starts run_node.sh once per node."""
    hetero = len(components) > 1
    desc = "; ".join(f"component {i}: {len(c.hosts)} x {comment_text(c.node_type)} ({comment_text(c.gpu)})"
                     for i, c in enumerate(components))
    out = _header(["Slurm batch script written by `milp-plan launch`. Submit it from the launch directory:",
                   "  MEGATRON_PATH=/path/to/Megatron-LM sbatch slurm.sbatch [extra Megatron flags]",
                   "(or set MILP_PLAN_LAUNCH_DIR). The directory must be visible at the same path on every node.",
                   ("Heterogeneous job, " if hetero else "") + desc + ".",
                   "Each node runs run_node.sh, which finds its node rank by host name, not by SLURM_NODEID."])
    for i, c in enumerate(components):
        if i:
            out.append("#SBATCH hetjob")
        else:
            out.append("#SBATCH --job-name=milp-plan")
        out += [f"#SBATCH --nodes={len(c.hosts)}", "#SBATCH --ntasks-per-node=1",
                f"#SBATCH --gpus-per-node={c.gpus_per_node}", "#SBATCH --exclusive"]
        if not any(is_ip(h) for h in c.hosts):
            out.append(f"#SBATCH --nodelist={','.join(c.hosts)}")
        if c.partition:
            out.append(f"#SBATCH --partition={c.partition}")
    out += ["set -euo pipefail", 'LAUNCH_DIR="${MILP_PLAN_LAUNCH_DIR:-${SLURM_SUBMIT_DIR:-.}}"']
    if megatron_path:
        out += [*_megatron_path_lines(megatron_path), "export MEGATRON_PATH"]
    groups = f" --het-group={','.join(str(i) for i in range(len(components)))}" if hetero else ""
    out.append(f'srun{groups} --kill-on-bad-exit=1 bash "${{LAUNCH_DIR}}/{DISPATCHER}" "$@"')
    return "\n".join(out) + "\n"
