# The common start of a device-call script, sourced with the call's name set:
#   CALL=h14z29; source benchmarks/device_calls/preamble.sh
# Results go under $R (= $OUT/$CALL, written in place so a call cut by its limit still returns
# them); `stage NAME` prints a timestamped stage line; the checkout is made importable
# (device_env.sh) and the card named.
set -u
R=${OUT:-/tmp}/$CALL
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
git log -1 --format=%h 2>/dev/null
