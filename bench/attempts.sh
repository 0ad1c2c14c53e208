#!/usr/bin/env bash
# Per-attempt cost of waymark against a bare fork/exec loop.
#
#   bash bench/attempts.sh [ATTEMPTS]     (default 2000)
#
# 1. One step `run = ["false"]` whose policy retries it ATTEMPTS times with no backoff: every
#    attempt is a spawn, a wait, three store commits (start, pid, outcome; synchronous=NORMAL),
#    the log and error files, and classification.
# 2. A flow of ATTEMPTS/4 steps `run = ["true"]`: every step also pays the fsync of the commit
#    that records its success (synchronous=FULL).
# Prints milliseconds per attempt against a bash loop of the same program. State goes to a
# temporary directory (on the disk that holds /tmp, or set TMPDIR).
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
echo "attempts:                         $n ($used)"
echo "bash loop of /bin/false:          $(per "$t0" "$t1") ms per spawn"
echo "waymark, failing attempts:        $(per "$t1" "$t2") ms per attempt"

steps=$((n / 4))
{ echo 'name = "steps"'; for i in $(seq "$steps"); do printf '[[step]]\nname = "s%d"\nrun = ["true"]\n' "$i"; done; } > "$work/steps.toml"
t3=$(now)
for _ in $(seq "$steps"); do /bin/true; done
t4=$(now)
WAYMARK_STATE_DIR="$work/state" "$bin" run --quiet "$work/steps.toml" 2>/dev/null
t5=$(now)
n=$steps
echo "steps:                            $steps"
echo "bash loop of /bin/true:           $(per "$t3" "$t4") ms per spawn"
echo "waymark, succeeding steps:        $(per "$t4" "$t5") ms per step (fsync included)"
