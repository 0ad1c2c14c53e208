#!/usr/bin/env bash
# What one failing attempt costs the runner itself, beside another build: instructions (callgrind)
# and CPU time (perf stat --no-inherit: the runner's threads only, not its children).
#
#   bash bench/attempt-cost.sh [BASELINE] [ROUNDS]      (ROUNDS default 9)
#
# Runs `waymark run --quiet` of one step `run = ["false"]` retried at once 200 and 400 times, each
# in a new state directory, and takes (400 - 200) / 200, so that start-up and the run's fixed
# cost cancel out. Instructions are counted once per build (callgrind is deterministic up to a
# few hundred per attempt); CPU time is the median of ROUNDS interleaved rounds, with its spread.
# Needs valgrind and perf; a row whose tool is missing is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-}
rounds=${2:-9}
cargo build --release --quiet
bins=("$PWD/target/release/waymark")
[ -n "$base" ] && bins+=("$(realpath "$base")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for n in 200 400; do
  printf 'name = "f%d"\n[[step]]\nname = "f"\nrun = ["false"]\nretry = { attempts = %d }\n' "$n" "$n" > "$work/f$n.toml"
done
label() { [ "$1" = "${bins[0]}" ] && echo "this build" || echo "baseline $1"; }

if command -v valgrind > /dev/null; then
  for bin in "${bins[@]}"; do
    declare -A ir=()
    for n in 200 400; do
      rm -rf "$work/state"
      WAYMARK_STATE_DIR=$work/state valgrind --tool=callgrind --callgrind-out-file="$work/cg" \
        "$bin" run --quiet "$work/f$n.toml" > /dev/null 2>&1 || true
      ir[$n]=$(sed -n 's/^totals: //p' "$work/cg")
    done
    echo "instructions per failing attempt, $(label "$bin"): $(((ir[400] - ir[200]) / 200))"
  done
fi

if command -v perf > /dev/null; then
  declare -A cpu=()
  for _ in $(seq "$rounds"); do
    for bin in "${bins[@]}"; do
      for n in 200 400; do
        rm -rf "$work/state"
        WAYMARK_STATE_DIR=$work/state perf stat --no-inherit -x, -e task-clock -o "$work/perf" \
          "$bin" run --quiet "$work/f$n.toml" > /dev/null 2>&1 || true
        t[$n]=$(grep task-clock "$work/perf" | cut -d, -f1)
      done
      cpu[$bin]+="$(python3 -c "print(round((${t[400]} - ${t[200]}) / 200 * 1000, 1))") "
    done
  done
  for bin in "${bins[@]}"; do
    python3 - "$(label "$bin")" ${cpu[$bin]} <<'PY'
import statistics, sys
v = sorted(float(x) for x in sys.argv[2:])
print(f"runner CPU per failing attempt, {sys.argv[1]}: {statistics.median(v)} us [{v[0]}-{v[-1]}] over {len(v)} rounds")
PY
  done
fi
