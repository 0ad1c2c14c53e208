#!/usr/bin/env bash
# What one failing attempt costs the runner itself, beside another build: instructions (callgrind,
# all the runner's threads, not its children) and the CPU time of its main thread (perf stat
# --no-inherit: the thread that decides, spawns and reads evidence; not the thread that commits to
# the store, which starts later, nor the children).
#
#   bash bench/attempt-cost.sh [BASELINE] [ROUNDS]      (ROUNDS default 9)
#
# Runs `waymark run --quiet` of one step `run = ["false"]` retried at once 200 and 400 times, each
# in a new state directory, and takes (400 - 200) / 200, so that start-up and the run's fixed
# cost cancel out. Instructions are counted once per build (callgrind is deterministic up to a
# few hundred per attempt); CPU time is the median of ROUNDS interleaved rounds, with its spread.
# Needs python3, and valgrind or perf (or both): a row whose tool is missing is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-}
rounds=${2:-9}
command -v valgrind > /dev/null || command -v perf > /dev/null || { echo "needs valgrind or perf" >&2; exit 1; }
cargo build --release --quiet
bins=("$PWD/target/release/waymark")
[ -n "$base" ] && bins+=("$(realpath "$base")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for n in 200 400; do
  printf 'name = "f%d"\n[[step]]\nname = "f"\nrun = ["false"]\nretry = { attempts = %d }\n' "$n" "$n" > "$work/f$n.toml"
done
label() { [ "$1" = "${bins[0]}" ] && echo "this build" || echo "baseline $1"; }

# Run `waymark run --quiet` of f$2 under the command in the remaining arguments, with binary $1;
# stop unless the step failed after all its attempts (exit status 1, and the failure report's
# `budget spent: N of N attempts`), as it must.
run() {
  local bin=$1 n=$2 status=0
  shift 2
  rm -rf "$work/state"
  WAYMARK_STATE_DIR=$work/state "$@" "$bin" run --quiet "$work/f$n.toml" > /dev/null 2> "$work/err" || status=$?
  if [ "$status" != 1 ] || ! grep -q "budget spent: $n of $n attempts" "$work/err"; then
    echo "$bin: the run did not end as $n failing attempts must (exit status 1, \"budget spent: $n of" \
      "$n attempts\"); its exit status was $status, and the end of its stderr:" >&2
    tail -5 "$work/err" >&2
    exit 1
  fi
}

# The figure in file $1 that `sed -n $2` prints, or stop saying what is missing.
figure() {
  local value
  value=$(sed -n "$2" "$1" 2> /dev/null | head -1)
  [ -n "$value" ] || { echo "no $3 in $1: $(head -3 "$1" 2> /dev/null)" >&2; exit 1; }
  echo "$value"
}

if command -v valgrind > /dev/null; then
  for bin in "${bins[@]}"; do
    ir=()
    for n in 200 400; do
      rm -f "$work/cg"
      run "$bin" "$n" valgrind --tool=callgrind --callgrind-out-file="$work/cg"
      ir[n]=$(figure "$work/cg" 's/^totals: //p' "callgrind total")
    done
    echo "instructions per failing attempt, $(label "$bin"): $(((ir[400] - ir[200]) / 200))"
  done
fi

if command -v perf > /dev/null; then
  declare -A cpu=()
  for _ in $(seq "$rounds"); do
    for bin in "${bins[@]}"; do
      ms=()
      for n in 200 400; do
        rm -f "$work/perf"
        run "$bin" "$n" perf stat --no-inherit -x, -e task-clock -o "$work/perf"
        ms[n]=$(figure "$work/perf" 's/^\([0-9.]*\),.*task-clock.*/\1/p' "task-clock (is perf allowed to count?)")
      done
      cpu[$bin]+="$(python3 -c "print(round((${ms[400]} - ${ms[200]}) / 200 * 1000, 1))") "
    done
  done
  for bin in "${bins[@]}"; do
    python3 - "$(label "$bin")" ${cpu[$bin]} <<'PY'
import statistics, sys
v = sorted(float(x) for x in sys.argv[2:])
m = round(statistics.median(v), 1)
print(f"main-thread CPU per failing attempt, {sys.argv[1]}: {m} us [{v[0]}-{v[-1]}] over {len(v)} rounds")
PY
  done
fi
