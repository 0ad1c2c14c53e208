//! Crash and resume: generated flows of 20 steps with random failures, retries and backoffs; the
//! runner is SIGKILLed at random moments and resumed until the run ends. Every attempt appends a
//! line (attempt number, its pid, a background grandchild's pid) before it does anything; the
//! side effect is appended only by the attempt that succeeds. One step in ten also leaves a
//! process in a session of its own that holds the output open (README: found by its
//! `WAYMARK_ATTEMPT_ID` and killed, by the runner or by the resume).
//!
//! `WAYMARK_LONG=1` runs 500 iterations instead of 30; `WAYMARK_SEED=N` starts at iteration seed
//! N (a failure prints the seed to rerun).

mod common;

use common::{Env, Sweeper, assert_no_survivors, finish, iterations};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::{Duration, Instant};

const STEPS: usize = 20;

/// One generated step: its policy and how many of its first attempts fail.
#[derive(Debug, Clone)]
struct Step {
    name: String,
    /// `None`: no `retry` key, so the step runs once.
    attempts: Option<u32>,
    /// `exception_types`: `["ConnectionError"]`, the default `["Exception"]`, or `["BaseException"]`.
    types: Types,
    backoff_ms: u32,
    multiplier: u32,
    jitter: bool,
    /// Attempts with a number up to `fail_first` fail, this way.
    fail_first: u32,
    failure: Failure,
    work_ms: u32,
    /// Also leaves a process in a session of its own that holds the output open.
    escapes: bool,
}

#[derive(Debug, Clone, Copy)]
enum Types {
    Connection,
    Exception,
    Base,
}

/// How a failing attempt fails, and the class waymark gives it.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// Exit 3, mapped to `Busy`, a `ConnectionError`.
    Busy,
    /// Exit 4, mapped to `BadInput`, a `ValueError`.
    BadInput,
    /// Killed by a signal waymark did not send: `ActionExecutionLost`, a `BaseException` only.
    Lost,
}

impl Failure {
    fn retried_by(self, types: Types) -> bool {
        matches!(
            (self, types),
            (Failure::Busy, _) | (Failure::BadInput, Types::Exception | Types::Base) | (Failure::Lost, Types::Base)
        )
    }

    fn shell(self) -> &'static str {
        match self {
            Failure::Busy => "exit 3",
            Failure::BadInput => "exit 4",
            Failure::Lost => "kill -KILL $$",
        }
    }
}

impl Step {
    fn generate(rng: &mut fastrand::Rng, i: usize) -> Step {
        let attempts = if rng.f32() < 0.15 { None } else { Some(rng.u32(1..=4)) };
        let allowed = attempts.unwrap_or(1);
        // Mostly a step that gets through within its budget; about one in a hundred fails for good.
        let fail_first = if rng.f32() < 0.01 { allowed } else { rng.u32(0..allowed) };
        let types = [Types::Connection, Types::Exception, Types::Base][rng.usize(0..3)];
        // A failure that the policy does not retry fails the run: rare.
        let failure = loop {
            let failure = [Failure::Busy, Failure::BadInput, Failure::Lost][rng.usize(0..3)];
            if failure.retried_by(types) || rng.f32() < 0.02 {
                break failure;
            }
        };
        Step {
            name: format!("s{i:02}"),
            attempts,
            types,
            backoff_ms: rng.u32(0..=50),
            multiplier: rng.u32(1..=2),
            jitter: rng.bool(),
            fail_first,
            failure,
            work_ms: rng.u32(0..=30),
            escapes: rng.f32() < 0.1,
        }
    }

    fn allowed(&self) -> u32 {
        self.attempts.unwrap_or(1)
    }

    /// What the retry model does with this step: (attempts used, succeeded).
    fn expected(&self) -> (u32, bool) {
        if self.fail_first == 0 {
            return (1, true);
        }
        let retried = self.attempts.is_some() && self.failure.retried_by(self.types);
        if !retried {
            (1, false)
        } else if self.fail_first < self.allowed() {
            (self.fail_first + 1, true)
        } else {
            (self.allowed(), false)
        }
    }

    fn toml(&self) -> String {
        let name = &self.name;
        let mut s = format!(
            "[[step]]\nname = '{name}'\nshell = '{}sleep 300 & echo \"$WAYMARK_ATTEMPT $$ $!\" >> att/{name}; sleep 0.{:03}; \
             [ \"$WAYMARK_ATTEMPT\" -gt {} ] || {}; echo \"$WAYMARK_ATTEMPT\" >> fx/{name}'\n",
            if self.escapes { "setsid sleep 300 & " } else { "" },
            self.work_ms,
            self.fail_first,
            self.failure.shell()
        );
        if let Some(attempts) = self.attempts {
            let types = match self.types {
                Types::Connection => ", exception_types = [\"ConnectionError\"]",
                Types::Exception => "",
                Types::Base => ", exception_types = [\"BaseException\"]",
            };
            s += &format!(
                "retry = {{ attempts = {attempts}{types}, backoff_seconds = {}, backoff_multiplier = {}, jitter = {} }}\n",
                f64::from(self.backoff_ms) / 1000.0,
                self.multiplier,
                self.jitter
            );
        }
        s
    }
}

fn flow(env: &Env, steps: &[Step]) -> String {
    let mut s = format!(
        "name = 'crash'\n{}[errors]\nBusy = ['ConnectionError']\nBadInput = ['ValueError']\n[exit_codes]\n'3' = 'Busy'\n'4' = 'BadInput'\n",
        env.mark_env()
    );
    for step in steps {
        s += &step.toml();
    }
    s
}

/// The attempt lines of a step: (attempt number, shell pid, grandchild pid).
fn attempts(env: &Env, step: &str) -> Vec<(u32, u32, u32)> {
    env.read(&format!("att/{step}"))
        .lines()
        .map(|l| {
            let f: Vec<u32> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[0], f[1], f[2])
        })
        .collect()
}

fn total_attempt_lines(env: &Env, steps: &[Step]) -> usize {
    steps.iter().map(|s| env.count(&format!("att/{}", s.name))).sum()
}

fn json(env: &Env, args: &[&str]) -> Option<Value> {
    let out = env.cmd(args).output().unwrap();
    if !out.status.success() {
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// SIGKILL the runner at a random moment: after a random delay, or once a random number of new
/// attempts have started (plus a little jitter). Returns how it ended: `None` if it was killed,
/// its exit code if it finished first.
fn kill_at_random(env: &Env, steps: &[Step], rng: &mut fastrand::Rng, mut runner: Child) -> Option<i32> {
    let start = Instant::now();
    if rng.f32() < 0.3 {
        let delay = Duration::from_millis(rng.u64(0..=300));
        while start.elapsed() < delay && runner.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
    } else {
        let target = total_attempt_lines(env, steps) + rng.usize(1..=10);
        while total_attempt_lines(env, steps) < target && runner.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < common::PATIENCE, "the runner made no progress");
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(rng.u64(0..=20)));
    }
    // Killing a runner that has exited but is not reaped yet is harmless: it is a zombie.
    let _ = runner.kill();
    let out = finish(runner);
    match out.status.signal() {
        Some(9) => None,
        _ => Some(out.status.code().unwrap_or_else(|| panic!("runner ended with {:?}", out.status))),
    }
}

/// Prints the seed of a failing iteration.
struct SeedReport(u64);

impl Drop for SeedReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "crash_resume failed for seed {0}: rerun with WAYMARK_SEED={0} cargo test --test crash_resume",
                self.0
            );
        }
    }
}

/// What an iteration went through, summed up for the closing line.
#[derive(Default)]
struct Tally {
    kills: u32,
    kills_in_flight: u32,
    failed_runs: u32,
    repeated_effects: u32,
}

fn one_iteration(seed: u64, tally: &mut Tally) {
    let _report = SeedReport(seed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let env = Env::new();
    let _sweeper = Sweeper(env.mark());
    let steps: Vec<Step> = (0..STEPS).map(|i| Step::generate(&mut rng, i)).collect();
    env.write("flow.toml", &flow(&env, &steps));
    std::fs::create_dir_all(env.path("att")).unwrap();
    std::fs::create_dir_all(env.path("fx")).unwrap();

    // Kill the runner one to three times, then let a resume finish the run.
    let kills = rng.u32(1..=3);
    let mut in_flight_kills: BTreeMap<String, u32> = BTreeMap::new();
    let mut killed = 0;
    let mut exit = None;
    for _ in 0..kills {
        let runner = env.spawn(&["run", "flow.toml"]);
        if let Some(code) = kill_at_random(&env, &steps, &mut rng, runner) {
            exit = Some(code);
            break;
        }
        killed += 1;
        // The step whose attempt was in flight when the runner died: `status` shows it
        // `interrupted` (these flows have no catch handler, and SIGKILL cancels no attempt).
        if let Some(status) = json(&env, &["status", "crash", "--json"]) {
            // Killed after it recorded the end of the run: nothing is left to resume (a new
            // `run` would start a new run), and the exit status is the one it was about to give.
            match status["status"].as_str() {
                Some("succeeded") => exit = Some(0),
                Some("failed") => exit = Some(1),
                _ => {}
            }
            if exit.is_some() {
                break;
            }
            for step in status["steps"].as_array().unwrap() {
                if step["state"] == "interrupted" {
                    *in_flight_kills.entry(step["step"].as_str().unwrap().to_owned()).or_default() += 1;
                }
            }
        }
    }
    let exit = exit.unwrap_or_else(|| {
        let out = finish(env.spawn(&["run", "flow.toml"]));
        out.status.code().unwrap_or_else(|| panic!("the last runner ended with {:?}", out.status))
    });

    // The model: steps run in order until one fails for good.
    let mut expected = Vec::new();
    for step in &steps {
        let (used, ok) = step.expected();
        expected.push((step, used, ok));
        if !ok {
            break;
        }
    }
    let failed = expected.iter().find(|(_, _, ok)| !ok).map(|(s, _, _)| s.name.clone());
    let context =
        format!("seed {seed}, {killed} kill(s), in flight at a kill: {in_flight_kills:?}, failing step {failed:?}");
    assert_eq!(exit, if failed.is_some() { 1 } else { 0 }, "{context}: exit status");
    tally.kills += killed;
    tally.kills_in_flight += in_flight_kills.values().sum::<u32>();
    tally.failed_runs += u32::from(failed.is_some());

    let runs = json(&env, &["history", "crash", "--json"]).expect("history");
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 1, "{context}: resumes continue the one run: {runs:?}");
    let want_status = if failed.is_some() { "failed" } else { "succeeded" };
    assert_eq!(runs[0]["status"], want_status, "{context}: history");
    assert_eq!(runs[0]["failed_step"], failed.clone().map_or(Value::Null, Value::from), "{context}: history");

    let status = json(&env, &["status", "crash", "--json"]).expect("status");
    assert_eq!(status["status"], want_status, "{context}: status");
    let rows = status["steps"].as_array().unwrap();
    assert_eq!(rows.len(), STEPS);

    let mut pids = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let name = &step.name;
        let row = &rows[i];
        let seen = attempts(&env, name);
        pids.extend(seen.iter().flat_map(|&(_, a, b)| [a, b]));
        let effects = env.count(&format!("fx/{name}"));
        let extra = in_flight_kills.get(name).copied().unwrap_or(0) as usize;
        let ctx = format!("{context}: step {step:?}, attempts seen {seen:?}, {effects} side effect(s)");
        assert_eq!(row["attempts_allowed"], step.allowed(), "{ctx}");
        let Some(&(_, used, ok)) = expected.get(i) else {
            assert_eq!(row["state"], "skipped", "{ctx}: after the failed step");
            assert!(seen.is_empty() && effects == 0, "{ctx}: a step after the failed one ran");
            continue;
        };
        assert_eq!(row["state"], if ok { "succeeded" } else { "failed" }, "{ctx}");
        assert_eq!(row["attempts_used"], used, "{ctx}: attempts used");
        // Every attempt number up to the last ran; none beyond the budget; an attempt number
        // runs again only when the runner died while it was in flight.
        for n in 1..=used {
            let runs = seen.iter().filter(|a| a.0 == n).count();
            assert!(runs >= 1, "{ctx}: attempt {n} never ran");
            assert!(runs <= 1 + extra, "{ctx}: attempt {n} ran {runs} times");
        }
        assert!(seen.iter().all(|a| a.0 <= used), "{ctx}: an attempt beyond the {used} the model allows ran");
        assert!(seen.len() <= used as usize + extra, "{ctx}: more executions than attempts and redeliveries");
        if ok {
            assert!(effects >= 1, "{ctx}: a succeeded step's side effect is missing");
            assert!(effects <= 1 + extra, "{ctx}: side effect repeated");
            tally.repeated_effects += u32::from(effects > 1);
            if extra == 0 {
                assert_eq!(effects, 1, "{ctx}: a succeeded step's side effect happened more than once");
            }
        } else {
            assert_eq!(effects, 0, "{ctx}");
        }
    }
    assert_no_survivors(&env.mark(), &pids, &context);
}

#[test]
fn sigkilled_runs_resume_to_the_right_end_with_every_side_effect_once() {
    let base = std::env::var("WAYMARK_SEED").ok().map(|s| s.parse::<u64>().expect("WAYMARK_SEED is a number"));
    let base = base.unwrap_or_else(|| fastrand::u64(..u64::MAX / 2));
    let n = iterations(30, 500);
    let start = Instant::now();
    let mut tally = Tally::default();
    for i in 0..n as u64 {
        one_iteration(base + i, &mut tally);
    }
    eprintln!(
        "crash_resume: {n} iterations from seed {base} in {:?}: {} SIGKILLs, {} with an attempt in flight, \
         {} side effects repeated by a redelivery, {} runs failed as generated",
        start.elapsed(),
        tally.kills,
        tally.kills_in_flight,
        tally.repeated_effects,
        tally.failed_runs
    );
}
