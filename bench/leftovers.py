#!/usr/bin/env python3
"""How long a resume takes to kill what a dead runner left running, before it runs anything.

    python3 bench/leftovers.py [--steps N] [--procs P] [--rounds R] WAYMARK [BASELINE]

Each round, for each binary (interleaved): a flow of N parallel steps, each leaving P processes
(P-1 `sleep 300 &` and the shell, which becomes one more), is run until every step has started,
the runner is killed with SIGKILL, and the next `waymark run` (whose steps then exit at once) is
timed from the outside, whole process: it kills the leftovers, then runs the N steps again. Prints the median [min-max] of each
and, with a baseline, the median [min-max] of the per-round ratios. Not part of the test suite.
"""
import argparse, os, signal, statistics, subprocess, tempfile, time


def one(binary, steps, procs):
    with tempfile.TemporaryDirectory() as d:
        flow = [f"max_parallel = {steps}"]
        sleeps = "".join("sleep 300 & " for _ in range(procs - 1))
        for i in range(steps):
            flow.append(f"[[step]]\nname = 's{i}'\nneeds = []\n"
                        f"shell = '[ -e go ] && exit 0; {sleeps}echo $$ >> started; exec sleep 300'")
        open(os.path.join(d, "flow.toml"), "w").write("\n".join(flow) + "\n")
        env = dict(os.environ, WAYMARK_STATE_DIR=os.path.join(d, "state"))
        first = subprocess.Popen([binary, "run", "-q", "flow.toml"], cwd=d, env=env)
        started = os.path.join(d, "started")
        deadline = time.monotonic() + 60
        while not (os.path.exists(started) and len(open(started).read().split()) >= steps):
            if time.monotonic() > deadline:
                raise SystemExit("the steps did not start")
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait()
        open(os.path.join(d, "go"), "w").close()
        t = time.perf_counter()
        out = subprocess.run([binary, "run", "-q", "flow.toml"], cwd=d, env=env)
        took = time.perf_counter() - t
        if out.returncode != 0:
            raise SystemExit(f"{binary}: the resume exited {out.returncode}")
        return took


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("binaries", nargs="+")
    a = p.parse_args()
    a.binaries = [os.path.abspath(b) for b in a.binaries]
    times = {b: [] for b in a.binaries}
    ratios = []
    for _ in range(a.rounds):
        round_ = {b: one(b, a.steps, a.procs) for b in a.binaries}
        for b, t in round_.items():
            times[b].append(t)
        if len(a.binaries) == 2:
            ratios.append(round_[a.binaries[0]] / round_[a.binaries[1]])
    ms = lambda v: f"{v * 1000:.0f} ms"
    print(f"resume after kill -9, {a.steps} steps of {a.procs} process(es) each, {a.rounds} rounds")
    for b in a.binaries:
        print(f"  {b}: {ms(statistics.median(times[b]))} [{ms(min(times[b]))}-{ms(max(times[b]))}]")
    if ratios:
        print(f"  ratio: {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] "
              f"(first / second, per round)")


main()
