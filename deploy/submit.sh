#!/usr/bin/env bash
# Submit an fp8rl job spec to a Ray cluster with `ray job submit`: the same driver as `fp8rl run`
# and the REST API. The spec is validated here first, so a typo fails in a second, not on the cluster.
#
#   deploy/submit.sh SPEC [key=value ...]
#
# Examples:
#   # a local head (`ray start --head`) or a port-forwarded KubeRay head:
#   #   kubectl port-forward svc/fp8rl-head-svc 8265:8265
#   deploy/submit.sh deploy/jobs/quickstart.yaml output_dir=/data/runs
#   deploy/submit.sh deploy/jobs/qwen2.5-7b-gsm8k-math-8gpu.yaml steps=100 trainer.lr=2e-6
#   RAY_ADDRESS=http://ray-head.example:8265 deploy/submit.sh deploy/jobs/llama3.1-8b-gsm8k-math-8gpu.yaml
#   FP8RL_NO_WAIT=1 deploy/submit.sh deploy/jobs/qwen2.5-7b-gsm8k-math-2node.yaml   # submit and return
#   ray job logs --address http://127.0.0.1:8265 -f SUBMISSION_ID                    # follow it later
#
# Environment: RAY_ADDRESS (default http://127.0.0.1:8265, the head's dashboard / job API);
# FP8RL_NO_WAIT=1 returns after submitting instead of following the logs;
# FP8RL_SUBMISSION_ID sets the job's submission id (default: Ray's raysubmit_...).
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $(( $# < 1 ? 2 : 0 ))
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
# The spec travels with the working directory (the repository): name it relative to the repository.
given=$1
spec=$(python3 -c 'import os, sys; print(os.path.relpath(os.path.abspath(sys.argv[1]), sys.argv[2]))' "$given" "$repo")
shift
if [[ $spec == ../* || ! -f $repo/$spec ]]; then
  echo "submit.sh: $given is not a file inside $repo (the spec is uploaded with the repository as the job's working directory)" >&2
  exit 2
fi
cd "$repo"

fp8rl validate --no-local "$spec" "$@" >/dev/null  # cluster paths need not exist here

args=(--address "${RAY_ADDRESS:-http://127.0.0.1:8265}" --working-dir . --runtime-env deploy/runtime_env.yaml)
if [[ -n ${FP8RL_NO_WAIT:-} ]]; then
  args+=(--no-wait)
fi
if [[ -n ${FP8RL_SUBMISSION_ID:-} ]]; then
  args+=(--submission-id "$FP8RL_SUBMISSION_ID")
fi
exec ray job submit "${args[@]}" -- python -m fp8rl.services.driver "$spec" "$@"
