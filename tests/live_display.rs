//! The live display (`--progress live`, and `auto` on a terminal), read off a real terminal: tmux
//! runs waymark in a detached session of 120x40 and `capture-pane` reads the screen. The steps
//! wait for files the test creates, so each screen is awaited, never timed. Without tmux the tests
//! say SKIPPED (and fail under `CI`, where tmux is expected).
//!
//! And the other side: nothing of the display reaches a stderr that is not a terminal, nor one
//! that is with `--progress plain`.

mod common;

use common::{Env, PATIENCE};
use regex::Regex;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A tmux server of the test's own (its own socket), with one session running waymark.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Whether tmux is here; if not, say so (and fail under `CI`).
    fn available(test: &str) -> bool {
        let ok = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
        if !ok {
            assert!(std::env::var_os("CI").is_none(), "{test}: tmux is required under CI (apt-get install tmux)");
            eprintln!("SKIPPED {test}: tmux is not installed");
        }
        ok
    }

    /// Start `waymark ARGS` in `env`'s directory on a terminal of 120x40; once it ends, the pane
    /// shows `EXIT=STATUS` and stays. With `gate`, waymark starts only once the file `start`
    /// exists (so that the pane's output can be piped somewhere first).
    fn start(env: &Env, args: &[&str], gate: bool) -> Tmux {
        Tmux::start_on(env, args, gate, (120, 40))
    }

    /// [`Tmux::start`] on a terminal of `cols` by `rows`.
    fn start_on(env: &Env, args: &[&str], gate: bool, (cols, rows): (u16, u16)) -> Tmux {
        // Unique: the test process and its temp directory.
        let dir = env.dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let socket = format!("waymark-test-{}-{dir}", std::process::id());
        let waymark = assert_cmd::cargo::cargo_bin("waymark");
        let args: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        let wait = if gate { "while [ ! -e start ]; do sleep 0.02; done\n" } else { "" };
        let script = env.write(
            "run.sh",
            &format!(
                // The shell traps SIGINT (a Ctrl-C would end it, and the pane, with waymark); a trap
                // is not inherited, so waymark gets the signal as it would at a prompt.
                "trap true INT\ncd '{dir}'\n{wait}WAYMARK_STATE_DIR='{state}' '{waymark}' {args}\necho \"EXIT=$?\"\n\
                 exec sleep 3600\n",
                dir = env.dir.path().display(),
                state = env.state().display(),
                waymark = waymark.display(),
                args = args.join(" "),
            ),
        );
        let tmux = Tmux { socket };
        let (cols, rows) = (cols.to_string(), rows.to_string());
        let session = ["new-session", "-d", "-x", &cols, "-y", &rows, "-s", "w"];
        let out = tmux.run(&[&session[..], &["sh", &script.display().to_string()]].concat());
        assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .env_remove("TMUX")
            .env("LANG", "C.UTF-8")
            .env_remove("XDG_STATE_HOME")
            .output()
            .expect("tmux runs")
    }

    /// The screen as text, row by row, without the blank rows at its end. indicatif fills each
    /// line of a bar to the last column, so the terminal takes the next one for its wrapped rest:
    /// the rows are not joined while the bars are there.
    fn screen(&self) -> String {
        self.capture(false)
    }

    /// With `joined`, lines wrapped to several rows are one.
    fn capture(&self, joined: bool) -> String {
        let join: &[&str] = if joined { &["-J"] } else { &[] };
        let out = self.run(&[&["capture-pane", "-p", "-t", "w"], join].concat());
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        let end = lines.iter().rposition(|l| !l.is_empty()).map_or(0, |i| i + 1);
        lines[..end].join("\n")
    }

    /// Poll the screen until `done` holds for it (bounded by [`PATIENCE`]); returns that screen.
    fn wait_for(&self, what: &str, mut done: impl FnMut(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}; the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The screen and all the scrollback above it, wrapped lines joined.
    fn history(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", "w"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Wait for the run to end; returns the final screen, wrapped lines joined.
    fn wait_exit(&self) -> String {
        self.wait_for("waymark to exit", |s| s.lines().any(|l| l.starts_with("EXIT=")));
        self.capture(true)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn touch(env: &Env, name: &str) -> PathBuf {
    env.write(name, "")
}

/// The run id and the attempts' durations, which change from run to run.
fn normalise(screen: &str) -> String {
    let run = Regex::new(r"run [0-9a-z]{8}\b").unwrap();
    common::normalise_plain(&run.replace_all(screen, "run RUN"))
}

/// A line of a bar or of a step on the display: what must be gone once the run has ended.
fn display_line() -> Regex {
    Regex::new(r"(?m)^(\[[=> ]*\] \d+/\d+ done|. \S+ +attempt \d+/\d+|  \S+ +retry \d+/\d+ in )").unwrap()
}

const RETRY_FLOW: &str = r#"name = "live"

[exit_codes]
"75" = "ConnectionResetError"

[[step]]
name = "fetch"
timeout = "5m"
retry = { attempts = 3, exception_types = ["ConnectionError"], backoff_seconds = 6 }
shell = '''
echo "attempt $WAYMARK_ATTEMPT"
while [ ! -e "go$WAYMARK_ATTEMPT" ]; do sleep 0.02; done
[ "$WAYMARK_ATTEMPT" -ge 2 ] || { echo "peer reset" >&2; exit 75; }
'''

[[step]]
name = "report"
run = ["echo", "done"]
"#;

#[test]
fn the_live_display_shows_attempts_the_countdown_and_the_overall_bar_then_clears_them() {
    if !Tmux::available("the_live_display_shows_attempts_the_countdown_and_the_overall_bar_then_clears_them") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", RETRY_FLOW);
    let tmux = Tmux::start(&env, &["run", "flow.toml"], false);

    // The first attempt runs: its spinner line with the attempt, its time and the time left
    // before its 5m timeout, above the overall bar.
    let running = Regex::new(r"(?m)^. fetch +attempt 1/3 +\d+\.\ds +timeout in 4m\d\ds$").unwrap();
    let overall = Regex::new(r"(?m)^\[ {30}\] 0/2 done +\d+\.\ds$").unwrap();
    tmux.wait_for("the first attempt's line and the overall bar", |s| running.is_match(s) && overall.is_match(s));
    touch(&env, "go1");

    // It failed with a mapped error: the step counts down to its second attempt.
    let waiting = Regex::new(r"(?m)^  fetch +retry 2/3 in (\d+\.\d)s after ConnectionResetError$").unwrap();
    let second = Regex::new(r"(?m)^. fetch +attempt 2/3").unwrap();
    let mut seen: Vec<String> = Vec::new();
    tmux.wait_for("the countdown to show two values", |s| {
        assert!(!second.is_match(s), "the second attempt started before the countdown was seen:\n{s}");
        if let Some(c) = waiting.captures(s) {
            let left = c[1].to_owned();
            if seen.last() != Some(&left) {
                seen.push(left);
            }
        }
        seen.len() >= 2
    });
    let left: Vec<f64> = seen.iter().map(|s| s.parse().unwrap()).collect();
    assert!(left[0] <= 6.0 && left[1] < left[0], "the countdown goes down from 6s: {seen:?}");

    let second = Regex::new(r"(?m)^. fetch +attempt 2/3 +\d+\.\ds +timeout in 4m\d\ds$").unwrap();
    tmux.wait_for("the second attempt's line", |s| second.is_match(s) && overall.is_match(s));
    touch(&env, "go2");

    let end = tmux.wait_exit();
    assert!(!display_line().is_match(&end), "the bars are left on the screen:\n{end}");
    assert_eq!(
        normalise(&end),
        "waymark: run RUN of live: 2 step(s)
waymark: fetch: started
fetch | attempt 1
fetch | peer reset
waymark: fetch: attempt 1/3 failed: ConnectionResetError: exit status 75 [exit code mapping]
waymark: fetch: retry at HH:MM:SS.mmm (in DURATION): attempt 2/3
fetch | attempt 2
waymark: fetch: attempt 2/3 succeeded
waymark: fetch: succeeded (2 attempts)
waymark: report: started
report | done
waymark: report: attempt 1/1 succeeded
waymark: report: succeeded (1 attempt)
waymark: steps of run RUN:
  STEP    STATUS  ATTEMPTS    DURATION  DETAIL
  fetch   flaky        2/3    DURATION  ok on attempt 2 after ConnectionResetError
  report  ok           1/1    DURATION
waymark: run RUN succeeded in DURATION
EXIT=0"
    );
}

#[test]
fn every_running_parallel_step_has_its_line_and_a_failed_run_ends_with_its_report() {
    if !Tmux::available("every_running_parallel_step_has_its_line_and_a_failed_run_ends_with_its_report") {
        return;
    }
    let env = Env::new();
    let wait = "while [ ! -e go ]; do sleep 0.02; done";
    env.write(
        "flow.toml",
        &format!(
            "name = \"fan\"\n\
             [[step]]\nname = \"fetch-a\"\nshell = '{wait}'\n\
             [[step]]\nname = \"fetch-b\"\nneeds = []\nshell = '{wait}'\n\
             [[step]]\nname = \"fetch-c\"\nneeds = []\ntimeout = \"10m\"\nshell = '{wait}; exit 3'\n\
             [[step]]\nname = \"join\"\nneeds = [\"fetch-a\", \"fetch-b\", \"fetch-c\"]\nrun = [\"true\"]\n"
        ),
    );
    let tmux = Tmux::start(&env, &["run", "flow.toml"], false);
    let lines = [
        Regex::new(r"(?m)^. fetch-a +attempt 1/1 +\d+\.\ds$").unwrap(),
        Regex::new(r"(?m)^. fetch-b +attempt 1/1 +\d+\.\ds$").unwrap(),
        Regex::new(r"(?m)^. fetch-c +attempt 1/1 +\d+\.\ds +timeout in 9m\d\ds$").unwrap(),
        Regex::new(r"(?m)^\[ {30}\] 0/4 done +\d+\.\ds$").unwrap(),
    ];
    tmux.wait_for("a line for each of the three running steps", |s| lines.iter().all(|l| l.is_match(s)));
    touch(&env, "go");

    let end = tmux.wait_exit();
    assert!(!display_line().is_match(&end), "the bars are left on the screen:\n{end}");
    let end = normalise(&end);
    assert!(end.ends_with("\nEXIT=1"), "{end}");
    let report = end.find("waymark: run RUN failed").unwrap_or_else(|| panic!("no failure report:\n{end}"));
    assert!(end[report..].contains("fetch-c"), "{end}");
}

/// Ctrl-C at the terminal, which echoes `^C` after the display's last line: the display is
/// cleared all the same, every line of it, and none is left in the scrollback.
#[test]
fn a_ctrl_c_at_the_terminal_leaves_no_line_of_the_display() {
    if !Tmux::available("a_ctrl_c_at_the_terminal_leaves_no_line_of_the_display") {
        return;
    }
    let env = Env::new();
    let wait = "while [ ! -e go ]; do sleep 0.02; done";
    env.write(
        "flow.toml",
        &format!(
            "name = \"ctrlc\"\n\
             [[step]]\nname = \"a-fairly-long-step-name\"\ntimeout = \"1m\"\nshell = '{wait}'\n\
             [[step]]\nname = \"beside\"\nneeds = []\nshell = '{wait}'\n"
        ),
    );
    let tmux = Tmux::start_on(&env, &["run", "flow.toml"], false, (80, 12));
    let lines = [
        Regex::new(r"(?m)^. a-fairly-long-step-name +attempt 1/1 +\d+\.\ds +timeout in \d+\.\ds$").unwrap(),
        Regex::new(r"(?m)^. beside +attempt 1/1 +\d+\.\ds$").unwrap(),
        Regex::new(r"(?m)^\[ {30}\] 0/2 done +\d+\.\ds$").unwrap(),
    ];
    tmux.wait_for("both steps' lines and the overall bar", |s| lines.iter().all(|l| l.is_match(s)));
    tmux.run(&["send-keys", "-t", "w", "C-c"]);
    let end = tmux.wait_exit();
    assert!(normalise(&end).ends_with("\nEXIT=130"), "{end}");
    let history = tmux.history();
    assert!(!display_line().is_match(&history), "a line of the display is left:\n{history}");
}

/// A step whose attempt `fail_fast` cancelled does not go on in the run: its line goes, rather than
/// stay on the display while the compensations run.
#[test]
fn a_step_cancelled_by_fail_fast_leaves_the_display_while_compensations_run() {
    if !Tmux::available("a_step_cancelled_by_fail_fast_leaves_the_display_while_compensations_run") {
        return;
    }
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = \"ff\"\nfail_fast = true\n\
         [[step]]\nname = \"made\"\nrun = [\"true\"]\ncompensate = 'while [ ! -e go ]; do sleep 0.02; done'\n\
         [[step]]\nname = \"slow\"\nneeds = []\nshell = 'touch started; exec sleep 600'\n\
         [[step]]\nname = \"bad\"\nneeds = [\"made\"]\nshell = 'while [ ! -e started ]; do sleep 0.02; done; exit 3'\n",
    );
    let tmux = Tmux::start(&env, &["run", "flow.toml"], false);
    let compensating = Regex::new(r"(?m)^. made +compensating +\d+\.\ds$").unwrap();
    let screen = tmux.wait_for("the compensation's line", |s| compensating.is_match(s));
    let slow = Regex::new(r"(?m)^. slow ").unwrap();
    assert!(!slow.is_match(&screen), "the cancelled step's line is still shown:\n{screen}");
    touch(&env, "go");
    let end = normalise(&tmux.wait_exit());
    assert!(end.ends_with("\nEXIT=1"), "{end}");
}

/// More steps running than the terminal has rows: the display takes no more rows than the
/// terminal has less one, so that each redraw erases the last one whole, and no copy of the bars is
/// left in the scrollback while waymark's lines and the steps' output scroll above them.
#[test]
fn a_display_taller_than_the_terminal_leaves_no_copy_of_itself_in_the_scrollback() {
    if !Tmux::available("a_display_taller_than_the_terminal_leaves_no_copy_of_itself_in_the_scrollback") {
        return;
    }
    let env = Env::new();
    let mut flow = String::from("name = \"tall\"\nmax_parallel = 20\n");
    for i in 0..20 {
        flow.push_str(&format!(
            "[[step]]\nname = \"s{i:02}\"\nneeds = []\nshell = 'echo s{i}; while [ ! -e go ]; do sleep 0.02; done; echo done'\n"
        ));
    }
    env.write("flow.toml", &flow);
    let tmux = Tmux::start_on(&env, &["run", "flow.toml"], false, (80, 12));
    let bar = Regex::new(r"(?m)^. s\d\d +attempt 1/1 +\d+\.\ds$").unwrap();
    // 12 rows: the display takes 11, the overall bar among them, always drawn at the bottom with
    // how many running steps have no line.
    let overall = Regex::new(r"^\[ +\] 0/20 done  \d+\.\ds  \(\+10 more under way\)$").unwrap();
    tmux.wait_for("the display to fill the terminal, the overall bar under it", |s| {
        bar.find_iter(s).count() == 10 && s.lines().last().is_some_and(|l| overall.is_match(l))
    });
    touch(&env, "go");
    let end = tmux.wait_exit();
    assert!(normalise(&end).ends_with("\nEXIT=0"), "{end}");
    let history = tmux.history();
    assert!(!display_line().is_match(&history), "a copy of the bars is left in the scrollback:\n{history}");
    assert_eq!(history.lines().filter(|l| l.starts_with("s") && l.ends_with("| done")).count(), 20, "{history}");
}

/// A terminal narrower than the steps' lines: each line is cut to its width (ending `…`) rather
/// than wrapped onto a second row, which would push the overall bar off the display; the bar
/// gives way to the count of steps without a line. Long names take at most two fifths of it, cut
/// in the middle (their ends tell them apart), so that every line still says what its step does.
#[test]
fn on_a_narrow_terminal_each_line_is_cut_to_its_width_and_the_count_stays_at_the_bottom() {
    if !Tmux::available("on_a_narrow_terminal_each_line_is_cut_to_its_width_and_the_count_stays_at_the_bottom") {
        return;
    }
    let env = Env::new();
    let mut flow = String::from("name = \"narrow\"\nmax_parallel = 6\n");
    for i in 0..6 {
        flow.push_str(&format!(
            "[[step]]\nname = \"fetch-the-orders-from-upstream-{i}\"\nneeds = []\ntimeout = \"2m\"\n\
             shell = 'while [ ! -e go ]; do sleep 0.02; done'\n"
        ));
    }
    env.write("flow.toml", &flow);
    let tmux = Tmux::start_on(&env, &["run", "flow.toml"], false, (40, 6));
    // 6 rows: 5 for the display, 4 steps and the count under them.
    // Each cut to 38 columns: the display leaves the last two free (a Ctrl-C's echo goes there).
    let step = Regex::new(r"^. fetch-t…tream-\d  attempt 1/1  \d+\.\ds *…$").unwrap();
    let overall = Regex::new(r"^0/6 done  \d+\.\ds  \(\+2 more under way\)$").unwrap();
    tmux.wait_for("four cut lines and the count under them", |s| {
        let lines: Vec<&str> = s.lines().collect();
        lines.len() >= 5
            && lines[lines.len() - 5..].iter().all(|l| l.trim_end().chars().count() <= 38)
            && lines[lines.len() - 5..lines.len() - 1].iter().all(|l| step.is_match(l))
            && overall.is_match(lines[lines.len() - 1])
    });
    touch(&env, "go");
    let end = tmux.wait_exit();
    assert!(normalise(&end).ends_with("\nEXIT=0"), "{end}");
}

const QUICK_FLOW: &str = r#"[exit_codes]
"75" = "ConnectionResetError"

[[step]]
name = "flaky"
retry = { attempts = 2, exception_types = ["ConnectionError"], backoff_seconds = 0.1 }
shell = '''
echo "attempt $WAYMARK_ATTEMPT"
[ "$WAYMARK_ATTEMPT" -ge 2 ] || { echo "peer reset" >&2; exit 75; }
'''
"#;

/// Nothing of the display (an escape sequence, a carriage return) in `text`, which has `line`.
fn assert_plain(text: &[u8], line: &str, what: &str) {
    let shown = String::from_utf8_lossy(text);
    assert!(!text.contains(&0x1b), "{what}: an escape sequence:\n{shown:?}");
    assert!(!text.contains(&b'\r'), "{what}: a carriage return:\n{shown:?}");
    assert!(shown.contains(line), "{what}: `{line}` is missing:\n{shown}");
}

#[test]
fn a_stderr_that_is_not_a_terminal_gets_plain_lines_and_live_only_when_asked() {
    let env = Env::new();
    env.write("flow.toml", QUICK_FLOW);
    for args in [
        &["run", "flow.toml"][..],
        &["run", "--progress", "plain", "flow.toml"],
        &["run", "--progress", "auto", "flow.toml"],
    ] {
        let out = env.cmd(args).env("TERM", "xterm-256color").output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_plain(&out.stdout, "flaky | attempt 2", &format!("stdout of {args:?}"));
        assert_plain(&out.stderr, "waymark: flaky: attempt 1/2 failed", &format!("stderr of {args:?}"));
    }
    // `--progress live` draws all the same (the escapes are there), and `--json` wins over it.
    let out = env.cmd(&["run", "--progress", "live", "flow.toml"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.windows(2).any(|w| w == b"\x1b["), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.cmd(&["run", "--progress", "live", "--json", "flow.toml"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty() && !out.stdout.contains(&0x1b), "{out:?}");
}

/// What waymark writes to its terminal, byte for byte (tmux's `pipe-pane`), under `--progress WHEN`.
fn raw_terminal_output(when: &str) -> Option<Vec<u8>> {
    let env = Env::new();
    env.write("flow.toml", QUICK_FLOW);
    let tmux = Tmux::start(&env, &["run", "--progress", when, "flow.toml"], true);
    let raw = env.path("raw");
    let out = tmux.run(&["pipe-pane", "-t", "w", &format!("cat > '{}'", raw.display())]);
    assert!(out.status.success(), "tmux pipe-pane: {}", String::from_utf8_lossy(&out.stderr));
    touch(&env, "start");
    tmux.wait_exit();
    // `EXIT=` is the shell's, after waymark's last byte: the pipe has it all once it has that.
    let start = Instant::now();
    loop {
        let bytes = std::fs::read(&raw).unwrap_or_default();
        if bytes.windows(5).any(|w| w == b"EXIT=") {
            return Some(bytes);
        }
        assert!(start.elapsed() < PATIENCE, "the piped pane never got EXIT=");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn on_a_terminal_plain_progress_writes_no_escape_and_no_carriage_return_of_its_own() {
    if !Tmux::available("on_a_terminal_plain_progress_writes_no_escape_and_no_carriage_return_of_its_own") {
        return;
    }
    // The terminal turns each newline into CR LF: a carriage return before a newline is its own.
    let own_cr = |bytes: &[u8]| bytes.iter().enumerate().any(|(i, b)| *b == b'\r' && bytes.get(i + 1) != Some(&b'\n'));
    let Some(plain) = raw_terminal_output("plain") else { return };
    let shown = String::from_utf8_lossy(&plain);
    assert!(!plain.contains(&0x1b), "an escape sequence in plain mode:\n{shown:?}");
    assert!(!own_cr(&plain), "a carriage return in plain mode:\n{shown:?}");
    assert!(shown.contains("waymark: flaky: attempt 1/2 failed"), "{shown}");
    // The same capture of the live display has both: the test sees what it looks for.
    let Some(live) = raw_terminal_output("auto") else { return };
    assert!(live.windows(2).any(|w| w == b"\x1b[") && own_cr(&live), "{:?}", String::from_utf8_lossy(&live));
}
