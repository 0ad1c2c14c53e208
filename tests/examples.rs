//! The example flows that need more than `waymark run` (a server, a concurrent runner, a kill),
//! run as a user would run them, and the flow file of README.md's first example. The others are
//! checked and run by `examples_are_valid_and_run` in tests/run.rs.

mod common;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::{Env, finish, kill, wait_until};
use serde_json::Value;

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples").join(name).display().to_string()
}

/// Whether curl is installed. Outside CI a missing curl skips the test with a visible `SKIPPED`
/// line; under CI it fails the test.
fn have_curl(test: &str) -> bool {
    use std::io::Write;
    if Command::new("curl").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{test} needs curl and CI must have it");
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs curl on the PATH; install it to include it");
    false
}

/// examples/helpers/flaky_http_server.py answering with `responses`; stopped when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(responses: &str) -> Server {
        let mut child = Command::new("python3")
            .arg(example("helpers/flaky_http_server.py"))
            .args(["--responses", responses, "--body", "the payload\n"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the test server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the server printed no port: {line:?}"));
        Server { child, port }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on which nothing listens: bound by the OS, then released.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `waymark run --json examples/download.toml` from `url` into `env`'s `out.txt`: exit status and
/// the step's attempts as (attempt, outcome, error class, error source).
/// An attempt as its `attempt.finished` event tells it: number, outcome, error class, error source.
type Attempt = (u64, String, String, String);

fn download(env: &Env, url: &str) -> (Option<i32>, Vec<Attempt>) {
    let out = env
        .cmd(&["run", "--json", &example("download.toml")])
        .env("DOWNLOAD_URL", url)
        .env("DOWNLOAD_DEST", env.path("out.txt"))
        .output()
        .unwrap();
    let attempts = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "attempt.finished")
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
            (e["attempt"].as_u64().unwrap(), s(&e["outcome"]), s(&e["error"]["type"]), s(&e["error"]["source"]))
        })
        .collect();
    (out.status.code(), attempts)
}

fn attempt(n: u64, outcome: &str, class: &str, source: &str) -> Attempt {
    (n, outcome.into(), class.into(), source.into())
}

#[test]
fn download_retries_a_5xx_and_a_reset_then_saves_the_file() {
    if !have_curl("download_retries_a_5xx_and_a_reset_then_saves_the_file") {
        return;
    }
    let env = Env::new();
    let server = Server::start("503,reset,200");
    let (code, attempts) = download(&env, &format!("http://127.0.0.1:{}/data.txt", server.port));
    assert_eq!(
        attempts,
        [
            attempt(1, "failed", "HttpServerError", "exit_code_mapping"),
            attempt(2, "failed", "ConnectionResetError", "exit_code_mapping"),
            attempt(3, "succeeded", "-", "-"),
        ]
    );
    assert_eq!(code, Some(0));
    assert_eq!(env.read("out.txt"), "the payload\n");
    assert!(!env.path("out.txt.part").exists(), "the partial file was renamed");
}

#[test]
fn download_without_a_server_is_retried_to_its_budget_as_connection_refused() {
    if !have_curl("download_without_a_server_is_retried_to_its_budget_as_connection_refused") {
        return;
    }
    let env = Env::new();
    let (code, attempts) = download(&env, &format!("http://127.0.0.1:{}/", closed_port()));
    let refused = |n| attempt(n, "failed", "ConnectionRefusedError", "exit_code_mapping");
    assert_eq!(attempts, [refused(1), refused(2), refused(3), refused(4)]);
    assert_eq!(code, Some(1));
    let status: Value =
        serde_json::from_slice(&env.cmd(&["status", "download-demo", "--json"]).output().unwrap().stdout).unwrap();
    let step = &status["steps"][0];
    assert_eq!((step["state"].as_str(), step["attempts_used"].as_u64()), (Some("failed"), Some(4)));
    assert_eq!(
        step["last_error"]["text"],
        "ConnectionRefusedError(ConnectionError, OSError, Exception, BaseException): exit status 7"
    );
    assert!(!env.path("out.txt").exists() && !env.path("out.txt.part").exists());
}

#[test]
fn download_of_a_missing_file_is_not_retried() {
    if !have_curl("download_of_a_missing_file_is_not_retried") {
        return;
    }
    let env = Env::new();
    let server = Server::start("404,200");
    let (code, attempts) = download(&env, &format!("http://127.0.0.1:{}/nope", server.port));
    assert_eq!(attempts, [attempt(1, "failed", "HttpClientError", "exit_code_mapping")]);
    assert_eq!(code, Some(1));
}

/// `waymark run -q examples/cron.toml` as cron runs it, with the demo's files under `env`.
fn cron_run(env: &Env, compress_seconds: &str) -> assert_cmd::Command {
    let mut cmd = env.cmd(&["run", "-q", &example("cron.toml")]);
    cmd.env("CRON_DEMO_DIR", env.path("out")).env("CRON_DEMO_COMPRESS_SECONDS", compress_seconds);
    cmd
}

#[test]
fn cron_example_is_silent_runs_alone_and_resumes_after_a_kill() {
    let env = Env::new();
    // A night that succeeds prints nothing: cron mails nothing.
    cron_run(&env, "0").assert().success().stdout("").stderr("");
    assert_eq!(env.read("out/steps.log"), "export\ncompress\npublish\n");

    // The next night's run is slow in `compress`; a run started meanwhile exits 3 and says why.
    let mut slow = Command::new(assert_cmd::cargo::cargo_bin("waymark"));
    slow.args(["run", "-q", &example("cron.toml")])
        .env("WAYMARK_STATE_DIR", env.state())
        .env("CRON_DEMO_DIR", env.path("out"))
        .env("CRON_DEMO_COMPRESS_SECONDS", "300")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let runner = slow.spawn().unwrap();
    wait_until("the second night's compress to start", || env.count("out/steps.log") == 5);
    let overlap = cron_run(&env, "0").output().unwrap();
    assert_eq!(overlap.status.code(), Some(3));
    assert_eq!(overlap.stdout, b"");
    let said = common::stderr(&overlap);
    assert!(said.starts_with("error: flow `cron-demo` is already running: run "), "{said}");

    // The runner is killed mid-step; the next run resumes that run, silently: `export` is not
    // run again, `compress` runs again and the run finishes.
    kill(runner.id(), "KILL");
    let _ = finish(runner);
    cron_run(&env, "0").assert().success().stdout("").stderr("");
    assert_eq!(env.read("out/steps.log"), "export\ncompress\npublish\nexport\ncompress\ncompress\npublish\n");
    let runs: Value =
        serde_json::from_slice(&env.cmd(&["history", "cron-demo", "--json"]).output().unwrap().stdout).unwrap();
    let statuses: Vec<_> = runs.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["succeeded", "succeeded"], "the killed run was resumed, not replaced");
}

/// The first ```toml block of README.md: the flow file that opens its documentation.
fn readme_flow() -> String {
    let readme = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme.find("```toml\n").expect("README.md has a toml block") + "```toml\n".len();
    let len = readme[start..].find("```\n").unwrap();
    readme[start..start + len].to_owned()
}

#[test]
fn readme_flow_retries_the_errors_of_curl_its_policy_names() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let flow = readme_flow();
    assert!(flow.starts_with("name = \"nightly\""), "{flow}");
    env.write("jobs/load.py", "import sys\nopen(sys.argv[1]).read()\n");
    // A curl that is refused on attempt 1, times out on attempt 2 and then writes its -o file.
    let bin = env.path("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(
        bin.join("curl"),
        "#!/bin/sh\ncase $WAYMARK_ATTEMPT in\n  1) echo 'curl: (7) Failed to connect' >&2; exit 7 ;;\n  2) exit 28 ;;\nesac\n\
         while [ $# -gt 1 ]; do [ \"$1\" = -o ] && echo '{}' > \"$2\"; shift; done\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(bin.join("curl"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    // The data file is written in the flow's directory; `load` runs in jobs/ and reads it there.
    std::fs::write(env.path("nightly.toml"), flow.replace("\"data.json\",", "\"jobs/data.json\",")).unwrap();

    let out = env.cmd(&["run", "--json", "nightly.toml"]).env("PATH", &path).output().unwrap();
    let classes: Vec<(String, String)> = String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "attempt.finished" && e["step"] == "fetch")
        .map(|e| (e["outcome"].as_str().unwrap().to_owned(), e["error"]["type"].as_str().unwrap_or("-").to_owned()))
        .collect();
    assert_eq!(
        classes,
        [
            ("failed".into(), "ConnectionRefusedError".into()),
            ("failed".into(), "TimeoutError".into()),
            ("succeeded".into(), "-".into())
        ]
    );
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
}
