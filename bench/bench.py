#!/usr/bin/env python3
"""waymark's benchmark: what it costs against the floors and against other retry tools.

    python3 bench/bench.py [--rounds N] [--only ROW,ROW...] [--scratch DIR] [--baseline WAYMARK]
                           [--output-mib N]

Builds waymark (release) and the floor helper (bench/floor, its own package), installs the peers
(retry-cli and attempt-cli, `cargo install --root SCRATCH/peers`), then prints one table. Rows
(names for --only): scale (start-up against 1 and 10,000 earlier runs, a 10,000-step flow's first
spawn (in a new state directory, and in one a run used before), its resume half done, `check` of it
and of 5,000 unknown names in one `needs`), step (a succeeding durable step, on disk and on tmpfs,
against the spawn and flush floors, and the kept flush floor: the flush floor plus what README's
guarantees add, the step's own process group, its output through pipes read to their end, its pid
committed while it runs; fsyncs per step and per run), postgres (the same step with the
shared store on the PostgreSQL server at
`$WAYMARK_TEST_PG`, as `bash .ci/postgres.sh start` prints it, and the writes the runner makes
to its socket per step; left out without one), dispatch (a step's cost in flows of 100, 1,000 and 10,000 steps), attempt (a failing
attempt against the retry CLIs, the spawn and record floors, and the kept floor: the record floor
plus what the guarantees add, as for a step), backoff (lateness of a retry after its backoff, read from the
child's side to the microsecond, beside a floor's: a spawn loop sleeping the backoff between
spawns), timeout (from a step's timeout to its child's death), output
(throughput and peak RSS against `sh -c 'cmd | cat > file'` with the echo on and
`sh -c 'cmd > file'` with it off).

`--baseline WAYMARK` puts another waymark binary (one built from an earlier commit, say) into the
attempt, step, postgres, scale, backoff and output rows, interleaved with this one, and adds the ratio of this
waymark to it: a before/after figure measured side by side in one run.

Every comparison runs its commands round by round, interleaved (A, B, A, B, ... in each round),
and reports the median of the rounds and, for a ratio, the median and the min-max of the ratios
taken within each round. Times are wall-clock times of whole processes, taken from outside with
time.perf_counter around subprocess start and exit (Python's own fork/exec is in every timed
command alike). A "first spawn" is the time from starting `waymark run --json` until its
`attempt.started` line is read from its stdout (the event is emitted after the child was
spawned). Nothing here is part of the test suite. The scratch directory (default
target/bench) is on the disk the repository is on; the tmpfs rows use /dev/shm.
"""

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ["scale", "step", "postgres", "dispatch", "attempt", "backoff", "timeout", "output"]
BASELINE = None  # --baseline: another waymark binary, measured beside this one


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build(scratch, need_peers):
    env = dict(os.environ, CARGO_INCREMENTAL="0")
    log("building waymark (release) ...")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, env=env, check=True)
    log("building the floor helper ...")
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(ROOT / "bench/floor/Cargo.toml"),
         "--target-dir", str(scratch / "floor-target")],
        env=env, check=True)
    peers = scratch / "peers"
    for crate, binary in (("retry-cli", "retry"), ("attempt-cli", "attempt")):
        if need_peers and not (peers / "bin" / binary).exists():
            log(f"installing {crate} into {peers} ...")
            subprocess.run(["cargo", "install", "--quiet", "--root", str(peers), crate], env=env, check=True)
    return ROOT / "target/release/waymark", scratch / "floor-target/release/waymark-floor", peers / "bin"


def timed(cmd, env=None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
    """Wall seconds of one process, its exit status and its peak RSS (KiB)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    t = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return t, p.returncode, usage.ru_maxrss


def first_spawn(cmd, env, step=None):
    """Seconds from starting `waymark run --json` to its first `attempt.started` line (of `step`, if
    given); then the run is interrupted (SIGTERM) and waited for."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    t = None
    for line in p.stdout:
        # Only the candidates are parsed: a resumed run's 5,000 `step.skipped` lines parsed one by
        # one made the reader, not waymark, what this row timed.
        if b'"attempt.started"' not in line:
            continue
        event = json.loads(line)
        if event.get("event") == "attempt.started" and step in (None, event.get("step")):
            t = time.perf_counter() - t0
            break
    p.send_signal(signal.SIGTERM)
    p.stdout.read()
    p.wait()
    if t is None:
        raise RuntimeError(f"no attempt.started from {cmd}")
    return t


def fmt_t(seconds):
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def med_range(values, f=fmt_t):
    return f"{f(statistics.median(values))} [{f(min(values))}-{f(max(values))}]"


def ratio_str(values):
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, what, value, ratio="", note=""):
        self.rows.append((what, value, ratio, note))
        log(f"  {what}: {value} {ratio} {note}")

    def print(self):
        heads = ("what", "median [min-max]", "ratio: median [min-max]", "against")
        widths = [max(len(r[i]) for r in self.rows + [heads]) for i in range(4)]
        line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
        print(line(heads))
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for r in self.rows:
            print(line(r))


def write_steps(path, count, run_of=lambda i: '["true"]', name="steps"):
    with open(path, "w") as f:
        f.write(f'name = "{name}"\n')
        for i in range(count):
            f.write(f'[[step]]\nname = "s{i}"\nrun = {run_of(i)}\n')


def state_env(state):
    return dict(os.environ, WAYMARK_STATE_DIR=str(state), NO_COLOR="1")


def interleave(rounds, commands):
    """Run each of `commands` (name -> zero-argument function returning seconds) once per round,
    in turn; the order rotates from round to round. Returns name -> list of seconds."""
    out = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            out[name].append(commands[name]())
    return out


def ratios(a, b):
    return [x / y for x, y in zip(a, b)]


# ---------------------------------------------------------------------------------------------------------------
# scale: start-up against earlier runs, a 10,000-step flow's first spawn and resume, check (of it, and of
# thousands of errors on one line)


def add_earlier_runs(db, count):
    """Copy the one run in `db` (with its steps and attempts) `count` times, as finished runs of the
    same flow: what `count` earlier runs leave behind, definitions and all."""
    con = sqlite3.connect(db)
    (run_id,) = con.execute("SELECT id FROM runs ORDER BY seq LIMIT 1").fetchone()
    cols = lambda table: [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
    gen = f"WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {count})"
    run_cols = cols("runs")
    sel = [("'e' || printf('%07d', n)" if c == "id" else "n + 1000000" if c == "seq" else c) for c in run_cols]
    con.execute(f"{gen} INSERT INTO runs ({', '.join(run_cols)}) SELECT {', '.join(sel)} FROM runs, c WHERE id = ?",
                (run_id,))
    for table, skip in (("steps", None), ("attempts", "row")):
        tcols = [c for c in cols(table) if c != skip]
        sel = [("'e' || printf('%07d', n)" if c == "run_id" else c) for c in tcols]
        con.execute(f"{gen} INSERT INTO {table} ({', '.join(tcols)}) SELECT {', '.join(sel)} FROM {table}, c "
                    f"WHERE run_id = ?", (run_id,))
    con.commit()
    con.close()


def bench_scale(t, waymark, work, rounds):
    one = work / "one.toml"
    write_steps(one, 1, name="one")
    states = {}
    for earlier in (1, 10_000):
        state = work / f"state-earlier-{earlier}"
        shutil.rmtree(state, ignore_errors=True)
        subprocess.run([waymark, "run", "--quiet", one], env=state_env(state), check=True)
        if earlier > 1:
            add_earlier_runs(state / "waymark.db", earlier - 1)
        states[earlier] = state
    run_one = lambda e: lambda: timed([waymark, "run", "--quiet", one], env=state_env(states[e]))[0]
    res = interleave(rounds, {1: run_one(1), 10_000: run_one(10_000)})
    t.add("`run` of a 1-step flow, 1 earlier run", med_range(res[1]))
    t.add("`run` of a 1-step flow, 10,000 earlier runs", med_range(res[10_000]), ratio_str(ratios(res[10_000], res[1])),
          "the same with 1 earlier run")

    big = work / "big.toml"
    write_steps(big, 10_000, lambda i: '["sleep", "1000"]' if i == 0 else '["true"]', name="big")
    small = work / "small.toml"
    write_steps(small, 1, lambda i: '["sleep", "1000"]', name="small")

    def fresh_first(flow, binary=waymark, used=False):
        def go():
            with tempfile.TemporaryDirectory(dir=work) as state:
                if used:
                    # The usual case: a database a run made before (not timed), so that none is
                    # created, nor flushed six times as creating one is.
                    subprocess.run([binary, "run", "--quiet", one], env=state_env(state), check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                return first_spawn([binary, "run", "--json", flow], state_env(state))
        return go

    res = interleave(rounds, {"small": fresh_first(small), "big": fresh_first(big),
                              "used": fresh_first(big, used=True),
                              **({"baseline": fresh_first(big, BASELINE), "baseline_small": fresh_first(small, BASELINE)}
                                 if BASELINE else {})})
    t.add("first spawn of a new run, 1 step", med_range(res["small"]))
    if BASELINE:
        against_baseline(t, "first spawn of a new run, 1 step", {"waymark": res["small"], "baseline": res["baseline_small"]})
    t.add("first spawn of a new run, 10,000 steps", med_range(res["big"]), ratio_str(ratios(res["big"], res["small"])),
          "1 step")
    against_baseline(t, "first spawn of a new run, 10,000 steps", dict(res, waymark=res["big"]))
    t.add("first spawn of a new run, 10,000 steps, state directory used before", med_range(res["used"]),
          ratio_str(ratios(res["used"], res["big"])), "the same in a new state directory")

    # Half done: steps 0..4999 succeeded, step 5000 (sleep) was running when the runner was stopped.
    half = work / "half.toml"
    write_steps(half, 10_000, lambda i: '["sleep", "1000"]' if i == 5000 else '["true"]', name="half")
    half_state = work / "state-half"
    base_half_state = work / "state-half-baseline"
    for state, binary in ((half_state, waymark), (base_half_state, BASELINE)):
        if binary:
            shutil.rmtree(state, ignore_errors=True)
            log("  (running 5,000 steps to get a half-done run ...)")
            # Until s5000 starts: stopped at the first spawn, the run would have no step done.
            first_spawn([binary, "run", "--json", half], state_env(state), step="s5000")
    small_state = work / "state-small"
    shutil.rmtree(small_state, ignore_errors=True)
    first_spawn([waymark, "run", "--json", small], state_env(small_state))
    res = interleave(rounds, {
        "small": lambda: first_spawn([waymark, "run", "--json", small], state_env(small_state)),
        "half": lambda: first_spawn([waymark, "run", "--json", half], state_env(half_state)),
        **({"baseline": lambda: first_spawn([BASELINE, "run", "--json", half], state_env(base_half_state))}
           if BASELINE else {}),
    })
    t.add("first spawn resuming, 1 step", med_range(res["small"]))
    t.add("first spawn resuming 10,000 steps half done", med_range(res["half"]),
          ratio_str(ratios(res["half"], res["small"])), "1 step")
    against_baseline(t, "first spawn resuming 10,000 steps half done", dict(res, waymark=res["half"]))

    check = lambda flow, binary=waymark: lambda: timed([binary, "check", flow], env=state_env(work / "state-check"))[0]
    res = interleave(rounds, {"small": check(one), "big": check(big),
                              **({"baseline": check(big, BASELINE)} if BASELINE else {})})
    t.add("`check`, 1 step", med_range(res["small"]))
    t.add("`check`, 10,000 steps", med_range(res["big"]), ratio_str(ratios(res["big"], res["small"])), "1 step")
    against_baseline(t, "`check`, 10,000 steps", dict(res, waymark=res["big"]))

    # A step whose `needs` names 5,000 steps that do not exist: 5,000 diagnostics on one long line.
    unknown = work / "unknown-needs.toml"
    names = ", ".join(f'"u{i}"' for i in range(5_000))
    unknown.write_text(f'name = "unknown"\n\n[[step]]\nname = "a"\nrun = ["true"]\nneeds = [{names}]\n')
    res = interleave(rounds, {"waymark": check(unknown), **({"baseline": check(unknown, BASELINE)} if BASELINE else {})})
    t.add("`check`, 5,000 unknown names in one `needs`", med_range(res["waymark"]))
    against_baseline(t, "`check`, 5,000 unknown names in one `needs`", res)


# ---------------------------------------------------------------------------------------------------------------
# step: a succeeding durable step against the floors; fsyncs


def count_fsyncs(cmd, env):
    """fsync + fdatasync calls of `cmd` and its threads (strace -f -c)."""
    out = subprocess.run(["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", "/dev/stderr"] + cmd, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    n = 0
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[-1] in ("fsync", "fdatasync"):
            n += int(parts[3])
    return n


def bench_step(t, waymark, floor, work, rounds, steps=200):
    for where, base in (("disk", work), ("tmpfs", Path("/dev/shm"))):
        d = Path(tempfile.mkdtemp(prefix="waymark-bench-", dir=base))
        try:
            flow = d / "steps.toml"
            write_steps(flow, steps)
            true = shutil.which("true")

            def wm(binary):
                def go():
                    with tempfile.TemporaryDirectory(dir=d) as state:
                        return timed([binary, "run", "--quiet", flow], env=state_env(state))[0] / steps
                return go

            def flush(mode="flush"):
                def go():
                    with tempfile.TemporaryDirectory(dir=d) as db:
                        return timed([floor, mode, str(steps), true, os.path.join(db, "floor.db")])[0] / steps
                return go

            spawn = lambda: timed([floor, "spawn", str(steps), true])[0] / steps
            res = interleave(rounds, {"waymark": wm(waymark), "flush": flush(), "kept": flush("kept-flush"),
                                      "spawn": spawn, **({"baseline": wm(BASELINE)} if BASELINE else {})})
            if where == "disk":
                t.add("spawn floor (posix_spawn+wait of true)", med_range(res["spawn"]))
            t.add(f"flush floor (+1 FULL commit, {where})", med_range(res["flush"]))
            t.add(f"kept flush floor (flush + own group, pipes read, pid committed, {where})", med_range(res["kept"]))
            t.add(f"succeeding durable step ({where}, {steps}-step flow)", med_range(res["waymark"]),
                  ratio_str(ratios(res["waymark"], res["flush"])), "flush floor")
            t.add(f"succeeding durable step ({where}) against the kept flush floor", "",
                  ratio_str(ratios(res["waymark"], res["kept"])), "kept flush floor")
            against_baseline(t, f"succeeding durable step ({where})", res)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    if shutil.which("strace"):
        with tempfile.TemporaryDirectory(dir=work) as d:
            d = Path(d)
            counts = {}
            env = state_env(d / "state")
            for n in (1, 3, 50):
                write_steps(d / f"f{n}.toml", n, name=f"f{n}")
            # The state directory's first run creates the database: counted apart.
            first = count_fsyncs([str(waymark), "run", "--quiet", str(d / "f1.toml")], env)
            for n in (1, 3, 50):
                counts[n] = count_fsyncs([str(waymark), "run", "--quiet", str(d / f"f{n}.toml")], env)
            per_step = (counts[50] - counts[1]) / 49
            t.add("fsyncs of a 1-step run, the state directory's first", str(first))
            t.add("fsyncs of a 3-step run", str(counts[3]))
            t.add("fsyncs per step / fixed per run", f"{per_step:.2f} / {counts[1] - per_step:.2f}",
                  note="strace -f -c, runs of 1 and 50 steps")


def bench_postgres(t, waymark, work, rounds, steps=200):
    """A succeeding step with the state in PostgreSQL (`$WAYMARK_TEST_PG`, a server the tests may
    use: every run goes into its database). Each statement is a round trip to the server: the
    writes to its socket per step (sendto calls, strace, runs of 1 and 50 steps) count them."""
    url = os.environ.get("WAYMARK_TEST_PG")
    if not url:
        log("postgres: WAYMARK_TEST_PG is not set (eval \"$(bash .ci/postgres.sh start)\"): left out")
        return
    if not shutil.which("psql"):
        log("postgres: psql is not on the PATH (each waymark gets a database of its own): left out")
        return
    # A database of its own for each binary: a newer waymark migrates its schema, which an older
    # one (the baseline) then refuses.
    base, _, _ = url.rpartition("/")
    dbs = {binary: f"waymark_bench_{i}_{os.getpid()}" for i, binary in enumerate(b for b in (waymark, BASELINE) if b)}

    def psql(sql):
        subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True,
                       stdout=subprocess.DEVNULL)
    for db in dbs.values():
        psql(f"CREATE DATABASE {db}")
    try:
        bench_postgres_in(t, waymark, work, rounds, steps, {b: f"{base}/{db}" for b, db in dbs.items()})
    finally:
        for db in dbs.values():
            psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def bench_postgres_in(t, waymark, work, rounds, steps, urls):
    """`bench_postgres`, each binary on its database in `urls`."""
    with tempfile.TemporaryDirectory(dir=work) as d:
        d = Path(d)
        envs = {binary: dict(state_env(d / "state"), WAYMARK_STORE=u) for binary, u in urls.items()}
        flow = d / "pg.toml"
        write_steps(flow, steps, name=f"bench-pg-{os.getpid()}")

        def wm(binary):
            def go():
                sec, code, _ = timed([binary, "run", "--quiet", flow], env=envs[binary])
                # A run that failed (the server refused it, a newer schema) timed nothing worth a row.
                if code != 0:
                    sys.exit(f"postgres: `{binary} run {flow}` exited {code} (run it by hand to see why)")
                return sec / steps
            return go
        res = interleave(rounds, {"waymark": wm(waymark), **({"baseline": wm(BASELINE)} if BASELINE else {})})
        t.add(f"succeeding step, PostgreSQL store ({steps}-step flow)", med_range(res["waymark"]))
        against_baseline(t, "succeeding step, PostgreSQL store", res)
        if shutil.which("strace"):
            for binary, what in ((waymark, ""), (BASELINE, ", baseline waymark")):
                if not binary:
                    continue
                sent = {}
                for n in (1, 50):
                    write_steps(d / f"m{n}.toml", n, name=f"bench-pg-m{n}-{os.getpid()}")
                    done = subprocess.run(["strace", "-f", "-c", "-e", "trace=sendto", "-o", "/dev/stderr", binary,
                                           "run", "--quiet", d / f"m{n}.toml"], env=envs[binary], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True)
                    if done.returncode != 0:
                        sys.exit(f"postgres: `{binary} run` under strace exited {done.returncode}")
                    out = done.stderr
                    sent[n] = sum(int(line.split()[3]) for line in out.splitlines() if line.split()[-1:] == ["sendto"])
                t.add(f"writes to PostgreSQL's socket per step{what}", f"{(sent[50] - sent[1]) / 49:.1f}",
                      note="sendto calls (strace -f -c), runs of 1 and 50 steps")


def bench_dispatch(t, waymark, work, rounds):
    """Per-step cost of a flow of 100, 1,000 and (once) 10,000 succeeding steps, state on tmpfs: a
    dispatcher whose work per event grows with the number of steps shows as a growing cost."""
    d = Path(tempfile.mkdtemp(prefix="waymark-bench-", dir="/dev/shm"))
    try:
        def per_step(n):
            flow = d / f"steps{n}.toml"
            if not flow.exists():
                write_steps(flow, n)

            def go():
                with tempfile.TemporaryDirectory(dir=d) as state:
                    return timed([waymark, "run", "--quiet", flow], env=state_env(state))[0] / n
            return go

        res = interleave(rounds, {100: per_step(100), 1000: per_step(1000)})
        big = [per_step(10_000)()]
        t.add("succeeding step, 100-step flow (tmpfs)", med_range(res[100]))
        t.add("succeeding step, 1,000-step flow (tmpfs)", med_range(res[1000]), ratio_str(ratios(res[1000], res[100])),
              "100-step flow")
        t.add("succeeding step, 10,000-step flow (tmpfs, 1 run)", med_range(big),
              ratio_str([big[0] / statistics.median(res[100])]), "100-step flow (median)")
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# attempt: a failing attempt against the retry CLIs


def bench_attempt(t, waymark, floor, peers, work, rounds, n=200):
    flow = work / "fail.toml"
    flow.write_text(f'name = "fail"\n[[step]]\nname = "fail"\nrun = ["false"]\nretry = {{ attempts = {n} }}\n')
    false = shutil.which("false")

    def wm(binary):
        def go():
            with tempfile.TemporaryDirectory(dir=work) as state:
                return timed([binary, "run", "--quiet", flow], env=state_env(state))[0] / n
        return go

    # The least an attempt recorded so that it survives a SIGKILL of the runner costs: a spawn and
    # one synchronous=NORMAL commit of the same database (waymark commits an attempt's outcome with
    # its retry's start, then its pid).
    def record(mode="record"):
        def go():
            with tempfile.TemporaryDirectory(dir=work) as db:
                return timed([floor, mode, str(n), false, os.path.join(db, "floor.db")])[0] / n
        return go

    res = interleave(rounds, {
        "waymark": wm(waymark),
        **({"baseline": wm(BASELINE)} if BASELINE else {}),
        # retry-cli: no wait between attempts, no jitter.
        "retry": lambda: timed([peers / "retry", "--attempts", str(n), "--min-duration", "0ms", "--max-duration", "0ms",
                                "--jitter", "0", "--", false])[0] / n,
        # attempt-cli: fixed schedule of 0 s, retry on a failing status, quiet.
        "attempt": lambda: timed([peers / "attempt", "fixed", "-w", "0", "-a", str(n), "-F", "-qq", "--", false])[0] / n,
        "spawn": lambda: timed([floor, "spawn", str(n), false])[0] / n,
        "record": record(),
        # What README's guarantees add to the record: the attempt's own process group, its output
        # through pipes read to their end, and its pid committed while it runs.
        "kept": record("kept-record"),
    })
    fastest = [min(a, b) for a, b in zip(res["retry"], res["attempt"])]
    t.add("spawn floor (posix_spawn+wait of false)", med_range(res["spawn"]))
    t.add("record floor (+1 NORMAL commit, disk)", med_range(res["record"]))
    t.add("kept floor (record + own group, pipes read, pid committed)", med_range(res["kept"]),
          ratio_str(ratios(res["kept"], fastest)), "fastest retry CLI of the round")
    t.add("failing attempt, retry-cli", med_range(res["retry"]))
    t.add("failing attempt, attempt-cli", med_range(res["attempt"]))
    t.add(f"failing attempt, waymark ({n} attempts, disk)", med_range(res["waymark"]), ratio_str(ratios(res["waymark"], fastest)),
          "fastest retry CLI of the round")
    t.add("failing attempt, waymark against the spawn floor", "", ratio_str(ratios(res["waymark"], res["spawn"])),
          "spawn floor")
    t.add("failing attempt, waymark against the record floor", "", ratio_str(ratios(res["waymark"], res["record"])),
          "record floor: the least an attempt recorded to survive a SIGKILL costs")
    t.add("failing attempt, waymark against the kept floor", "", ratio_str(ratios(res["waymark"], res["kept"])),
          "kept floor: the least an attempt that keeps README's guarantees costs")
    against_baseline(t, "failing attempt", res)


def against_baseline(t, what, res, f=fmt_t):
    """The baseline binary's row and this waymark's ratio to it, when --baseline was given."""
    if "baseline" in res:
        t.add(f"{what}, baseline waymark", med_range(res["baseline"], f), ratio_str(ratios(res["waymark"], res["baseline"])),
              "this waymark's time / the baseline's")


# ---------------------------------------------------------------------------------------------------------------
# backoff (from the child's side) and timeout (from the `--json` events, to the millisecond)


def events(cmd, env):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def pcts(values, digits=0):
    return f"p50 {pct(values, 0.5):.{digits}f} ms, p99 {pct(values, 0.99):.{digits}f} ms, max {max(values):.{digits}f} ms (n={len(values)})"


def above(values, floor):
    """The p50 and p99 of `values` less those of `floor`, in ms."""
    return f"p50 {pct(values, 0.5) - pct(floor, 0.5):+.2f} ms, p99 {pct(values, 0.99) - pct(floor, 0.99):+.2f} ms"


def bench_backoff(t, waymark, floor, peers, work, rounds, attempts=21, backoff=0.05):
    """Each attempt's program (`waymark-floor stamp`) records when it started, to the microsecond.
    The gap between two attempts' starts with a backoff, less the backoff, less the median gap of
    the same tool without a backoff in the same round (the attempt's own cost: the child's run,
    its exit seen, the failure recorded, the next spawn), is the net lateness of the wake-up.
    retry-cli is measured the same way in the same rounds, and a bare `time.sleep` of the backoff
    in this process gives the machine's own wake-up lateness.

    The floor under the tools is measured the same way: `waymark-floor pause`, a loop that spawns
    the same program with a `nanosleep` of the backoff between spawns (the kernel's timer, with
    its 50 us slack) and nothing to record. Its net lateness is far above a bare sleep's: a spawn
    after the machine idled seems to cost more than one right after another, and the method
    charges that to the wake-up. A tool's lateness less the floor's, percentile by percentile,
    estimates its own share; waymark's is a lower bound, since its gap without a backoff holds
    the commit of the retry's start, which a backoff hides (see `raw` below). At p99 the
    difference of two tails is mostly noise."""
    def gaps(tool, b):
        with tempfile.TemporaryDirectory(dir=work) as d:
            d = Path(d)
            stamps = d / "stamps"
            argv = [str(floor), "stamp", str(stamps), "1"]
            if tool in ("waymark", "baseline"):
                flow = d / "backoff.toml"
                flow.write_text(f'name = "backoff"\n[[step]]\nname = "b"\nrun = {json.dumps(argv)}\n'
                                f'retry = {{ attempts = {attempts}, backoff_seconds = {b} }}\n')
                binary = waymark if tool == "waymark" else BASELINE
                cmd, env = [binary, "run", "--quiet", flow], state_env(d / "state")
            elif tool == "floor":
                cmd, env = [floor, "pause", str(attempts), str(b * 1000)] + argv, None
            else:
                # retry-cli: a fixed wait of `b` (factor 1, no jitter).
                wait = f"{round(b * 1000)}ms"
                cmd, env = [peers / "retry", "--attempts", str(attempts), "--min-duration", wait, "--max-duration",
                            wait, "--factor", "1", "--jitter", "0", "--"] + argv, None
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ns = [int(x) for x in stamps.read_text().split()]
        return [(b - a) / 1e6 for a, b in zip(ns, ns[1:])]

    def sleeps():
        out = []
        for _ in range(attempts - 1):
            start = time.perf_counter()
            time.sleep(backoff)
            out.append((time.perf_counter() - start - backoff) * 1000)
        return out

    late = {"waymark": [], "retry": [], "sleep": [], "baseline": [], "floor": []}
    # The gap less the backoff alone: the attempt's own cost plus the lateness, what a user sees.
    # waymark commits a retry's start while its backoff runs (3 ms ahead), so the gap without a
    # backoff, which waits for that commit, takes off more than the gap with one still holds:
    # this row is the one to compare between waymark binaries.
    raw = {"waymark": [], "retry": [], "baseline": [], "floor": []}
    own = []
    tools = ("waymark", "retry", "floor") + (("baseline",) if BASELINE else ())
    for r in range(rounds):
        for tool in (tools if r % 2 == 0 else tools[::-1]):
            base = statistics.median(gaps(tool, 0))
            if tool == "waymark":
                own.append(base)
            with_backoff = gaps(tool, backoff)
            late[tool] += [g - backoff * 1000 - base for g in with_backoff]
            raw[tool] += [g - backoff * 1000 for g in with_backoff]
        late["sleep"] += sleeps()
    t.add("attempt to attempt without backoff (child's side)", med_range([x / 1000 for x in own]))
    t.add(f"backoff net lateness ({backoff * 1000:.0f} ms backoff)", pcts(late["waymark"], 2),
          note="start-to-start gap - backoff - the gap without backoff")
    t.add("backoff net lateness, retry-cli", pcts(late["retry"], 2), note="the same, measured the same way")
    if BASELINE:
        t.add("backoff net lateness, baseline waymark", pcts(late["baseline"], 2), note="the same, measured the same way")
    t.add("backoff net lateness, the floor (waymark-floor pause)", pcts(late["floor"], 2),
          note="a nanosleep loop's: the machine's share of the rows above")
    t.add("backoff lateness above the floor's", above(late["waymark"], late["floor"]),
          note="waymark's own share, at least (p99: mostly noise)")
    t.add("backoff lateness above the floor's, retry-cli", above(late["retry"], late["floor"]), note="the same")
    if BASELINE:
        t.add("backoff lateness above the floor's, baseline waymark", above(late["baseline"], late["floor"]),
              note="the same")
    t.add("start-to-start gap less the backoff", pcts(raw["waymark"], 2), note="the attempt's own cost and the lateness")
    t.add("start-to-start gap less the backoff, retry-cli", pcts(raw["retry"], 2), note="the same")
    if BASELINE:
        t.add("start-to-start gap less the backoff, baseline waymark", pcts(raw["baseline"], 2), note="the same")
    t.add("start-to-start gap less the backoff, the floor", pcts(raw["floor"], 2), note="the same")
    t.add(f"a bare {backoff * 1000:.0f} ms sleep's lateness (python time.sleep)", pcts(late["sleep"], 2),
          note="the machine's own wake-up")


def bench_timeout(t, waymark, work, rounds, attempts=10, timeout=0.1):
    flow = work / "timeout.toml"
    flow.write_text(f'name = "timeout"\n[[step]]\nname = "t"\nrun = ["sleep", "100"]\ntimeout = {timeout}\nkill_grace = 0\n'
                    f'retry = {{ attempts = {attempts}, exception_types = ["ActionTimeout"] }}\n')
    late = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(dir=work) as state:
            evs = events([waymark, "run", "--json", flow], state_env(state))
        late += [e["duration_ms"] - timeout * 1000 for e in evs if e["event"] == "attempt.finished"]
    gnu = [(timed(["timeout", str(timeout), "sleep", "100"])[0] - timeout) * 1000 for _ in range(rounds * attempts)]
    t.add(f"timeout to death, waymark ({timeout * 1000:.0f} ms timeout, kill_grace 0)", pcts(late), note="attempt duration_ms - timeout")
    t.add("timeout to death, GNU timeout", pcts(gnu), note="its wall time - timeout")


# ---------------------------------------------------------------------------------------------------------------
# output: throughput and peak RSS


def bench_output(t, waymark, work, rounds, size=200 << 20):
    """A step writes `size` bytes. With the echo on, waymark's stdout is a file, against
    `sh -c 'cmd | cat > file'`; with it off (--quiet), against `sh -c 'cmd > file'`. Ratios are
    of throughput (the floor's time / waymark's): at least 0.9x is the target. With the echo on,
    waymark writes every byte twice, to its log and to its stdout (behind `o | ` on each line),
    where `cmd | cat > file` writes it once: a third floor, `sh -c 'cmd | tee log > file'`, writes
    it twice too. The files are on the scratch directory's disk, as waymark's logs are."""
    kinds = {
        "zeros": f"head -c {size} /dev/zero",
        "newline-rich": f"yes | head -c {size}",
    }
    out = work / "output.out"
    for kind, shell in kinds.items():
        flow = work / f"out-{kind}.toml"
        flow.write_text(f'name = "out"\n[[step]]\nname = "o"\nshell = "{shell}"\n')

        def wm(binary, mode):
            def go():
                with tempfile.TemporaryDirectory(dir=work) as state, open(out, "wb") as f, \
                        tempfile.TemporaryFile(dir=work) as err:
                    sec, _, rss = timed([binary, "run"] + mode + [flow], env=state_env(state), stdout=f, stderr=err)
                    err.seek(0)
                    # The display drops what stdout cannot take fast enough (the log keeps it)
                    # and says how much: a throughput is only worth what it showed.
                    dropped = sum(int(m) for m in re.findall(rb"(\d+) bytes of its std\w+ not shown", err.read()))
                rsss[(binary, tuple(mode))].append(rss)
                shown[(binary, tuple(mode))].append(1 - dropped / size)
                return sec
            return go

        rsss = {(b, m): [] for b in (waymark, BASELINE) for m in ((), ("--quiet",))}
        shown = {(b, m): [] for b in (waymark, BASELINE) for m in ((), ("--quiet",))}
        log_file = work / "output.log"
        res = interleave(rounds, {
            "floor on": lambda: timed(["sh", "-c", f"{shell} | cat > {out}"])[0],
            "floor tee": lambda: timed(["sh", "-c", f"{shell} | tee {log_file} > {out}"])[0],
            "floor off": lambda: timed(["sh", "-c", f"{shell} > {out}"])[0],
            "on": wm(waymark, []),
            "off": wm(waymark, ["--quiet"]),
            **({"baseline on": wm(BASELINE, []), "baseline off": wm(BASELINE, ["--quiet"])} if BASELINE else {}),
        })
        out.unlink(missing_ok=True)
        log_file.unlink(missing_ok=True)
        mbps = lambda secs: [size / 2**20 / x for x in secs]
        mb = lambda x: f"{x:.0f} MiB/s"
        for name, mode, floor in (("on", (), "cmd | cat > file"), ("off", ("--quiet",), "cmd > file")):
            t.add(f"output {kind}, sh -c '{floor}'", med_range(mbps(res[f"floor {name}"]), mb))
            rss = rsss[(waymark, mode)]
            seen = f", {min(shown[(waymark, mode)]):.1%} shown" if name == "on" else ""
            t.add(f"output {kind}, echo {name} (peak RSS {statistics.median(rss) / 1024:.0f} MiB{seen})",
                  med_range(mbps(res[name]), mb), ratio_str(ratios(res[f"floor {name}"], res[name])),
                  f"throughput of sh -c '{floor}'")
            if name == "on":
                t.add(f"output {kind}, sh -c 'cmd | tee log > file'", med_range(mbps(res["floor tee"]), mb),
                      ratio_str(ratios(res["floor tee"], res["on"])), "echo on's throughput against it")
            if BASELINE:
                seen = f", {min(shown[(BASELINE, mode)]):.1%} shown" if name == "on" else ""
                t.add(f"output {kind}, echo {name}, baseline waymark{seen}", med_range(mbps(res[f"baseline {name}"]), mb),
                      ratio_str(ratios(res[f"baseline {name}"], res[name])), "this waymark's throughput / the baseline's")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--scratch", default=str(ROOT / "target/bench"))
    ap.add_argument("--no-build", action="store_true", help="use the binaries built before")
    ap.add_argument("--baseline", help="another waymark binary to measure side by side with this one")
    ap.add_argument("--output-mib", type=int, default=200, help="bytes a step writes in the output rows, in MiB")
    args = ap.parse_args()
    global BASELINE
    BASELINE = str(Path(args.baseline).resolve()) if args.baseline else None
    scratch = Path(args.scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    only = args.only.split(",")
    for row in only:
        if row not in ROWS:
            sys.exit(f"unknown row `{row}`; rows: {', '.join(ROWS)}")
    if args.no_build:
        waymark, floor, peers = (ROOT / "target/release/waymark", scratch / "floor-target/release/waymark-floor",
                                 scratch / "peers/bin")
    else:
        waymark, floor, peers = build(scratch, "attempt" in only or "backoff" in only)
    work = scratch / "work"
    work.mkdir(exist_ok=True)
    t = Table()
    if "scale" in only:
        log("scale ...")
        bench_scale(t, waymark, work, args.rounds)
    if "step" in only:
        log("step ...")
        bench_step(t, waymark, floor, work, args.rounds)
    if "postgres" in only:
        log("postgres ...")
        bench_postgres(t, waymark, work, args.rounds)
    if "dispatch" in only:
        log("dispatch ...")
        bench_dispatch(t, waymark, work, args.rounds)
    if "attempt" in only:
        log("attempt ...")
        bench_attempt(t, waymark, floor, peers, work, args.rounds)
    if "backoff" in only:
        log("backoff ...")
        bench_backoff(t, waymark, floor, peers, work, args.rounds)
    if "timeout" in only:
        log("timeout ...")
        bench_timeout(t, waymark, work, args.rounds)
    if "output" in only:
        log("output ...")
        bench_output(t, waymark, work, max(3, args.rounds // 2), args.output_mib << 20)
    print()
    print(f"waymark bench, {time.strftime('%Y-%m-%d')}, {os.uname().machine}, {os.cpu_count()} cpus, "
          f"rounds={args.rounds}")
    print()
    t.print()


if __name__ == "__main__":
    main()
