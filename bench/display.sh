#!/usr/bin/env bash
# What the live display costs a run: the same flow of STEPS trivial steps (`echo`, so that child
# output is shown too) run with `--progress live` and with `--progress plain`, each on a
# pseudo-terminal (`script -qfc`, which copies the terminal's output to /dev/null), so that stderr
# is a terminal as for a person at one.
#
#   bash bench/display.sh [STEPS] [ROUNDS]     (defaults 1000 and 7)
#
# Rounds interleave the two (live first in odd rounds, plain first in even ones); each round gives
# the ratio live/plain of its wall times. Prints the median time of each, and the median and the
# min-max of the per-round ratios (1.00 = no cost). State goes to a temporary directory (set
# TMPDIR to pick the disk).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
rounds=${2:-7}
command -v script >/dev/null || { echo "display.sh needs script(1) (util-linux)" >&2; exit 2; }
cargo build --release --quiet
bin=$PWD/target/release/waymark
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

{
  echo 'name = "display"'
  for i in $(seq "$steps"); do printf '[[step]]\nname = "s%d"\nrun = ["echo", "step %d"]\n' "$i" "$i"; done
} > "$work/flow.toml"

# once MODE ROUND: milliseconds of one run with `--progress MODE` on a pseudo-terminal
once() {
  local s e
  s=$(date +%s%N)
  WAYMARK_STATE_DIR="$work/state-$1-$2" script -qfec "$bin run --progress $1 $work/flow.toml" /dev/null >/dev/null
  e=$(date +%s%N)
  echo $(((e - s) / 1000000))
}

live=() plain=() ratios=()
for r in $(seq "$rounds"); do
  if ((r % 2)); then l=$(once live "$r"); p=$(once plain "$r"); else p=$(once plain "$r"); l=$(once live "$r"); fi
  live+=("$l") plain+=("$p")
  ratios+=("$(awk -v l="$l" -v p="$p" 'BEGIN { printf "%.3f", l / p }')")
  echo "round $r: live ${l} ms, plain ${p} ms, ratio ${ratios[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
range() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[1] "-" a[NR] }'; }
echo "$steps steps, $rounds rounds: live median $(median "${live[@]}") ms, plain median $(median "${plain[@]}") ms"
echo "ratio live/plain: median $(median "${ratios[@]}"), min-max $(range "${ratios[@]}")"
