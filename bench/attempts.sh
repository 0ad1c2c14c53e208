#!/usr/bin/env bash
# Per-attempt cost of waymark against a bare fork/exec loop.
#
#   bash bench/attempts.sh [ATTEMPTS] [ROUNDS]     (defaults 1000 and 7)
#
# 1. One step `run = ["false"]` whose policy retries it ATTEMPTS times with no backoff: every
#    attempt is a spawn in a new process group, a wait, two output reader threads, the log and
#    error files, two store commits (its start with the outcome of the attempt before it, and its
#    pid; synchronous=NORMAL), classification.
# 2. A flow of ATTEMPTS/4 steps `run = ["true"]`: every step also pays the fsync of the commit
#    that records its success (synchronous=FULL).
# Each is run ROUNDS times against a bash loop of the same program; prints microseconds per
# attempt, best and median. State goes to a temporary directory (set TMPDIR to pick the disk).
# WAYMARK_BASELINE=PATH also times another waymark binary (an older build, say) in the same rounds.
# WAYMARK_STORE=postgres://... times the same against a PostgreSQL store (start a local one with
# `eval "$(bash .ci/postgres.sh start)"; WAYMARK_STORE=$WAYMARK_TEST_PG bash bench/attempts.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000}
rounds=${2:-7}
cargo build --release --quiet
bin=$PWD/target/release/waymark
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf 'name = "fail"\n[[step]]\nname = "fail"\nrun = ["false"]\nretry = { attempts = %d }\n' "$n" > "$work/fail.toml"
steps=$((n / 4))
{ echo 'name = "steps"'; for i in $(seq "$steps"); do printf '[[step]]\nname = "s%d"\nrun = ["true"]\n' "$i"; done; } > "$work/steps.toml"

# per COUNT COMMAND...: microseconds per unit of COMMAND, best and median of the rounds
per() {
  local count=$1; shift
  for r in $(seq "$rounds"); do
    local s e
    s=$(date +%s%N); "$@" "$r" >/dev/null 2>&1 || true; e=$(date +%s%N)
    echo $(((e - s) / count / 1000))
  done | sort -n | awk '{ a[NR] = $1 } END { printf "best %d us, median %d us\n", a[1], a[int((NR + 1) / 2)] }'
}
loop() { for _ in $(seq "$2"); do "$1"; done; }
waymark_run() { WAYMARK_STATE_DIR="$work/state-$1-$2" "$bin" run --quiet "$work/$1.toml"; }
baseline_run() { WAYMARK_STATE_DIR="$work/base-$1-$2" "$WAYMARK_BASELINE" run --quiet "$work/$1.toml"; }

echo "bash loop of /bin/false:        $(per "$n" loop /bin/false "$n")"
echo "waymark, failing attempts:      $(per "$n" waymark_run fail)"
[ -z "${WAYMARK_BASELINE:-}" ] || echo "baseline, failing attempts:     $(per "$n" baseline_run fail)"
echo "bash loop of /bin/true:         $(per "$steps" loop /bin/true "$steps")"
echo "waymark, succeeding steps:      $(per "$steps" waymark_run steps)"
[ -z "${WAYMARK_BASELINE:-}" ] || echo "baseline, succeeding steps:     $(per "$steps" baseline_run steps)"
