#!/usr/bin/env bash
# Per-attempt cost of waymark against a bare fork/exec loop.
#
#   bash bench/attempts.sh [ATTEMPTS]     (default 2000)
#
# Runs one step `run = ["false"]` whose policy retries it ATTEMPTS times with no backoff, so
# every attempt is a spawn, a wait, three store commits (start, pid, outcome), the log and error
# files, and classification. Prints milliseconds per attempt for waymark and for a bash loop of
# the same program. State goes to a temporary directory on the same disk as /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
cargo build --release --quiet
bin=$PWD/target/release/waymark
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/bench.toml" <<TOML
name = "bench"
[[step]]
name = "fail"
run = ["false"]
retry = { attempts = $n }
TOML

now() { date +%s.%N; }
per() { echo "scale=3; ($2 - $1) * 1000 / $n" | bc; }

t0=$(now)
for _ in $(seq "$n"); do /bin/false || true; done
t1=$(now)
WAYMARK_STATE_DIR="$work/state" "$bin" run --quiet "$work/bench.toml" 2>/dev/null || true
t2=$(now)
used=$(WAYMARK_STATE_DIR="$work/state" "$bin" status bench --json | grep -o '"attempts_used": [0-9]*')
echo "attempts:                 $n ($used)"
echo "bash loop of /bin/false:  $(per "$t0" "$t1") ms per spawn"
echo "waymark:                  $(per "$t1" "$t2") ms per attempt"
