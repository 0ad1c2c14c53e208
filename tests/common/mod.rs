//! Test support: a temp directory with its own state dir, and the real `waymark` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Long enough for a loaded 2-core machine; tests wait on events, never on fixed sleeps.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The schema of the state database that a runner of this build leaves.
pub const SCHEMA: i64 = 11;

/// SQL that undoes schemas 11, 10 and 9 in a state database: no time of a failed run's reopening;
/// a row for every step (pending where none was written yet), as schemas 1 to 9 wrote them with
/// their run; its run definitions back in the runs' rows, where schemas 1 to 8 kept them, no index
/// of compensations and hooks, no record of a kill after the grace. The first step of turning it
/// into an older schema.
pub const UNDO_SCHEMA_9: &str = "ALTER TABLE runs DROP COLUMN reopened_at; \
     INSERT OR IGNORE INTO steps (run_id, position, name, state) \
     SELECT d.run_id, j.key, j.value, 'pending' FROM definitions d, json_each(d.steps) j WHERE d.steps IS NOT NULL; \
     ALTER TABLE definitions DROP COLUMN steps; \
     ALTER TABLE runs ADD COLUMN definition TEXT NOT NULL DEFAULT ''; \
     UPDATE runs SET definition = (SELECT d.definition FROM definitions d WHERE d.run_id = runs.id); \
     DROP TABLE definitions; DROP INDEX attempts_aux; ALTER TABLE attempts DROP COLUMN killed;";

pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    /// Write a file into the temp dir and return its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.path(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, contents).unwrap();
        p
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// Lines in a side-effect file (how many times something ran).
    pub fn count(&self, name: &str) -> usize {
        self.read(name).lines().count()
    }

    /// `waymark ARGS` in the temp dir with its own state dir.
    pub fn cmd(&self, args: &[&str]) -> assert_cmd::Command {
        let mut c = assert_cmd::Command::cargo_bin("waymark").unwrap();
        c.current_dir(self.dir.path())
            .env("WAYMARK_STATE_DIR", self.state())
            .env_remove("XDG_STATE_HOME")
            .args(args)
            .timeout(PATIENCE);
        c
    }

    /// Start `waymark ARGS` in the background, its output captured.
    pub fn spawn(&self, args: &[&str]) -> Child {
        Command::new(assert_cmd::cargo::cargo_bin("waymark"))
            .current_dir(self.dir.path())
            .env("WAYMARK_STATE_DIR", self.state())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Start `waymark ARGS` in the background; its stderr is collected as it comes, for tests that
    /// wait for a message.
    pub fn spawn_watched(&self, args: &[&str]) -> (Child, std::sync::Arc<std::sync::Mutex<String>>) {
        let mut child = self.spawn(args);
        let seen = watch_stderr(&mut child);
        (child, seen)
    }

    /// Give a background waymark time to run ahead of a reader that has not started: wait until
    /// it exits or blocks (its state in /proc is sleeping for a while), bounded by [`PATIENCE`].
    pub fn wait_for_lines_or_exit(&self, child: &mut Child) {
        let start = Instant::now();
        let mut quiet_since = Instant::now();
        let mut last = String::new();
        while start.elapsed() < PATIENCE {
            if child.try_wait().unwrap().is_some() {
                return;
            }
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap_or_default();
            let cpu: String = stat.split_whitespace().skip(13).take(2).collect::<Vec<_>>().join(" ");
            if cpu != last {
                last = cpu;
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() > Duration::from_millis(500) {
                return; // no CPU used for a while: waiting on its full pipe
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `waymark run flow.toml` in the background until `ready` has a line, then `signal` to the
    /// runner; returns how it ended.
    pub fn run_until(&self, ready: &str, signal: &str) -> std::process::Output {
        assert_not_ignored(signal);
        let runner = self.spawn(&["run", "flow.toml"]);
        self.wait_for_lines(ready, 1);
        kill(runner.id(), signal);
        finish(runner)
    }

    /// Wait until `name` exists and holds at least `lines` lines.
    pub fn wait_for_lines(&self, name: &str, lines: usize) {
        wait_until(&format!("{name} to have {lines} line(s)"), || self.count(name) >= lines);
    }
}

/// Poll `cond` until it holds, panicking after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process is alive (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

/// Send a signal by name to a pid.
pub fn kill(pid: u32, signal: &str) {
    assert_not_ignored(signal);
    let status = Command::new("kill").args(["-s", signal, &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

/// Wait for a child with a generous bound; returns its output.
pub fn finish(child: Child) -> std::process::Output {
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let start = Instant::now();
    while !waiter.is_finished() {
        if start.elapsed() > PATIENCE {
            kill(pid, "KILL");
            panic!("waymark did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().unwrap()
}

pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// Whether the tests that need root can run. Outside CI a user who is not root gets a visible
/// `SKIPPED` line on the terminal (written past the test harness's capture) and the test returns
/// early; in CI (`CI` set, as `.ci/run` runs) a missing root fails the test, so CI proves they ran.
pub fn have_root(test: &str, why: &str) -> bool {
    use std::io::Write;
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{test} needs root ({why}) and CI must run it as root");
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs root ({why}); run the tests as root to include it");
    false
}

/// Whether the reliability suite runs its long mode (`WAYMARK_LONG=1 cargo test`).
pub fn long_mode() -> bool {
    std::env::var_os("WAYMARK_LONG").is_some_and(|v| v != "0" && !v.is_empty())
}

/// Iterations for a reliability test: `ci` normally, `long` under [`long_mode`].
pub fn iterations(ci: usize, long: usize) -> usize {
    if long_mode() { long } else { ci }
}

/// The environment variable that marks every process of a reliability test: the flow's `env`
/// sets it to the test's temp dir, and children inherit it, so a leaked process is found by
/// scanning `/proc` even when its pid was never written down.
pub const MARK: &str = "WAYMARK_SUITE_MARK";

impl Env {
    /// The value of [`MARK`] for this test's processes.
    pub fn mark(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// A flow's top-level `env` line that marks its processes.
    pub fn mark_env(&self) -> String {
        format!("env = {{ {MARK} = \"{}\" }}\n", self.mark())
    }
}

/// Live processes (zombies excluded) whose environment holds `MARK=mark`, as `pid cmdline`.
pub fn marked_processes(mark: &str) -> Vec<(u32, String)> {
    let needle = format!("{MARK}={mark}");
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return found };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) && alive(pid) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim_end().to_owned()));
        }
    }
    found
}

/// Assert that no process of the test (found by [`MARK`] or by a pid it wrote down) is alive.
/// Waits a few seconds first: a SIGKILLed process needs to be scheduled once to die.
pub fn assert_no_survivors(mark: &str, pids: &[u32], context: &str) {
    let start = Instant::now();
    loop {
        let mut left = marked_processes(mark);
        for &pid in pids {
            if alive(pid) && !left.iter().any(|(p, _)| *p == pid) {
                left.push((pid, "(pid written by the step)".to_owned()));
            }
        }
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{context}: processes of the steps are still alive: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills every process that carries the test's mark when dropped, so a failing test leaves no
/// `sleep 300` behind.
pub struct Sweeper(pub String);

impl Drop for Sweeper {
    fn drop(&mut self) {
        for (pid, _) in marked_processes(&self.0) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Whether the runner's crash hook (`WAYMARK_TEST_CRASH_AFTER`, compiled into debug builds only)
/// is there: under `cargo test --release` the tests that need it pass as skipped, with a visible
/// `SKIPPED` line as [`have_root`] writes; under CI they fail instead, so CI proves they ran.
pub fn have_crash_hook(test: &str) -> bool {
    use std::io::Write;
    if cfg!(debug_assertions) {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{test} needs a debug build and CI must run it");
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs the crash hook of a debug build; run `cargo test` without --release to include it"
    );
    false
}

/// Collect a spawned child's stderr as it comes, for tests that wait for a message.
pub fn watch_stderr(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let mut stderr = child.stderr.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    seen
}

/// Run the shell `script` (which calls the binary as `$WAYMARK`) in the temp dir, in a mount
/// namespace of its own where the state directory is a 1 MiB tmpfs; the script may call `ro` and
/// `rw` to remount it. Needs root ([`have_root`]).
pub fn on_tmpfs_state(env: &Env, script: &str) {
    let script = format!(
        "set -u; ro() {{ mount -o remount,ro state; }}; rw() {{ mount -o remount,rw state; }}; mkdir -p state; \
         mount -t tmpfs -o size=1m,mode=0700 tmpfs state || exit 99; {script}"
    );
    let status = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .env("WAYMARK", assert_cmd::cargo::cargo_bin("waymark"))
        .status()
        .unwrap();
    assert!(status.success(), "the script in the mount namespace failed: {status}");
}

/// `text` with what changes from run to run in waymark's reports replaced: every RFC 3339 time by
/// `TIME`, and the duration of an attempt (`took 1s 5ms:`) by `took DURATION:`.
pub fn normalise_times(text: &str) -> String {
    let time = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").unwrap();
    let took = regex::Regex::new(r"took (\d+[a-z]+ ?)+:").unwrap();
    let text = time.replace_all(text, "TIME");
    took.replace_all(&text, "took DURATION:").into_owned()
}

/// `status` text with each step's duration (whole seconds, which a loaded machine can change)
/// replaced by `Ns`.
pub fn normalise_status_durations(text: &str) -> String {
    let durations =
        regex::Regex::new(&format!(r"(attempts \d+/\d+(?: \(\+\d+ before resume\))?)  (?:<1ms|{DURATION})(\n|  )"))
            .unwrap();
    durations.replace_all(text, "$1  Ns$2").into_owned()
}

/// Plain-mode output as before its lines had times: the time of day that starts each of
/// waymark's lines taken off, and the `date` line left out (the golden files of
/// `tests/reporting.rs` pin both), for tests about what the lines say.
pub fn untimed(text: &str) -> String {
    let time = regex::Regex::new(r"^\d\d:\d\d:\d\d\.\d{3} waymark: ").unwrap();
    text.split_inclusive('\n')
        .map(|line| time.replace(line, "waymark: "))
        .filter(|line| !line.starts_with("waymark: date "))
        .collect()
}

/// A duration as waymark writes one (`1s 5ms`, `200ms`, `1day 2h`).
const DURATION: &str = r"\d+(?:years?|months?|days?|h|m|s|ms|us|ns)(?: \d+(?:years?|months?|days?|h|m|s|ms|us|ns))*\b";

/// Plain-mode output with what changes from run to run replaced, on top of [`normalise_times`]:
/// the time of day that starts each of waymark's lines by `HH:MM:SS.mmm`, the date and UTC offset
/// of the `date` line, a retry's wake-up time, pids, the wait before a retry (`(in DURATION)`),
/// the duration of a run that succeeded, and the summary table's duration cells (by `DURATION`,
/// right-aligned in the same width, so the table's alignment is still compared).
pub fn normalise_plain(text: &str) -> String {
    let re = |pattern: &str| regex::Regex::new(pattern).unwrap();
    let text = normalise_times(text);
    let text = re(r"(?m)^\d\d:\d\d:\d\d\.\d{3} ").replace_all(&text, "HH:MM:SS.mmm ");
    let text =
        re(r"waymark: date \d{4}-\d\d-\d\d \(UTC[+-]\d\d:\d\d\)").replace_all(&text, "waymark: date DATE (UTC OFFSET)");
    let text = re(r"retry at (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d\.\d{3}").replace_all(&text, "retry at HH:MM:SS.mmm");
    let text = re(r"\(pid \d+").replace_all(&text, "(pid PID");
    let text = re(&format!(r"(\(in |waymark: run \S+ succeeded in ){DURATION}")).replace_all(&text, "${1}DURATION");
    let cell =
        re(&format!(r"^(  \S+ +\S+(?: run)? +(?:\d+/\d+(?: \(\+\d+ before resume\))?|-))( +{DURATION})(  |\n|$)"));
    let mut out = String::with_capacity(text.len());
    let mut in_table = false;
    for line in text.split_inclusive('\n') {
        in_table = (in_table && line.starts_with("  ")) || line.contains("waymark: steps of run ");
        match cell.captures(line).filter(|_| in_table) {
            Some(c) => {
                let width = c[2].len();
                out.push_str(&format!("{}{:>width$}{}", &c[1], "DURATION", &line[c.get(2).unwrap().end()..]));
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Compare `actual` with the golden file `tests/fixtures/NAME`, byte for byte; with
/// `WAYMARK_BLESS=1`, write it there first (then review the diff).
pub fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    if std::env::var_os("WAYMARK_BLESS").is_some_and(|v| !v.is_empty() && v != "0") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; `WAYMARK_BLESS=1 cargo test` writes it", path.display()));
    assert!(
        actual == expected,
        "{} differs (`WAYMARK_BLESS=1 cargo test` rewrites it):\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

/// A `PATH` on which `programs` exist (as stubs in `dir/stub-bin`) before the test's own PATH:
/// `check` warns about a program missing from the PATH, and the tests that check flows naming
/// `curl` must not depend on whether this machine has it.
pub fn path_with_stubs(dir: &Path, programs: &[&str]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("stub-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for program in programs {
        let stub = bin.join(program);
        std::fs::write(&stub, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

/// The PostgreSQL database the backend tests use: `$WAYMARK_TEST_PG` (`.ci/run` starts a
/// throwaway cluster with `.ci/postgres.sh` and sets it). Outside CI, without it, the test writes a
/// visible `SKIPPED` line (as [`have_root`] does) and returns early; under CI a missing database
/// fails the test, so CI proves they ran.
pub fn postgres_url(test: &str) -> Option<String> {
    use std::io::Write;
    if let Some(url) = std::env::var("WAYMARK_TEST_PG").ok().filter(|u| !u.is_empty()) {
        return Some(url);
    }
    assert!(std::env::var_os("CI").is_none(), "{test} needs PostgreSQL: CI must set WAYMARK_TEST_PG (.ci/run does)");
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs PostgreSQL; `eval \"$(bash .ci/postgres.sh start)\"` starts one and sets WAYMARK_TEST_PG"
    );
    None
}

/// Fail at once, saying why, when this test process was started with `signal` ignored (under
/// `nohup`, say, which ignores SIGHUP, or a background job of a non-interactive shell, which
/// ignores SIGINT and SIGQUIT): waymark keeps a signal its parent ignored ignored, as a
/// well-behaved child does, so a test sending it would wait in vain.
fn assert_not_ignored(signal: &str) {
    let number = match signal {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "TERM" => 15,
        "USR1" => 10,
        "USR2" => 12,
        "ALRM" => 14,
        _ => return,
    };
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return };
    let Some(mask) = status.lines().find_map(|l| l.strip_prefix("SigIgn:")) else { return };
    let Ok(mask) = u64::from_str_radix(mask.trim(), 16) else { return };
    assert!(
        mask & (1 << (number - 1)) == 0,
        "the tests were started with SIG{signal} ignored (SigIgn {mask:#x} in /proc/self/status: under nohup, or \
         as a background job of a script?), and waymark inherits that, so this test cannot send it; run the \
         tests in the foreground of a shell that does not ignore it"
    );
}
