#!/usr/bin/env bash
# Run a launch directory written by `milp-plan launch` on the current node.
#
#   launch/run_launch_dir.sh [--dry-run] [--host NAME] LAUNCH_DIR MEGATRON_PATH [-- MEGATRON_FLAGS...]
#
# LAUNCH_DIR     the directory `milp-plan launch --out` wrote
# MEGATRON_PATH  a Megatron-LM checkout (tag core_v0.16.1) holding pretrain_gpt.py
# --dry-run      print the torchrun command(s) this node would run, run nothing
# --host NAME    act as host NAME instead of looking this host up by `hostname -s`
# MEGATRON_FLAGS data, tokenizer, optimizer and training-length flags, appended after the plan's
#
# The directory's run_node.sh finds this host's node script by name (see launch/README.md);
# the node script sources megatron_args.sh (flags and CUDA_DEVICE_MAX_CONNECTIONS) and starts
# torchrun with the plan's node rank and CUDA_VISIBLE_DEVICES. Run this on every host of the plan.
set -euo pipefail

usage() {
  sed -n '4,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

dry_run=0
host=""
positional=()
while (($# > 0)); do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --host) [[ $# -ge 2 ]] || usage; host="$2"; shift 2 ;;
    --host=*) host="${1#--host=}"; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "run_launch_dir.sh: unknown option $1" >&2; usage ;;
    *) positional+=("$1"); shift ;;
  esac
done
((${#positional[@]} == 2)) || usage
launch_dir="${positional[0]}"
megatron_path="${positional[1]}"

if [[ ! -f "${launch_dir}/launch.json" ]]; then
  echo "run_launch_dir.sh: ${launch_dir} is not a launch directory (no launch.json); write one with milp-plan launch" >&2
  exit 2
fi
if [[ ! -f "${launch_dir}/run_node.sh" ]]; then
  echo "run_launch_dir.sh: ${launch_dir} holds no Megatron scripts: stock Megatron-LM cannot run this plan" >&2
  echo "(see per_stage.json for the reasons and the per-stage description)" >&2
  exit 2
fi
if [[ ! -f "${megatron_path}/pretrain_gpt.py" ]]; then
  if ((dry_run)); then
    echo "run_launch_dir.sh: warning: ${megatron_path}/pretrain_gpt.py not found" >&2
  else
    echo "run_launch_dir.sh: ${megatron_path} is not a Megatron-LM checkout (no pretrain_gpt.py)" >&2
    exit 2
  fi
fi

MEGATRON_PATH="$(cd "${megatron_path}" 2>/dev/null && pwd || printf '%s' "${megatron_path}")"
export MEGATRON_PATH
export MILP_PLAN_DRY_RUN="${dry_run}"
if [[ -n "${host}" ]]; then
  export MILP_PLAN_HOST="${host}"
fi
exec bash "${launch_dir}/run_node.sh" "$@"
