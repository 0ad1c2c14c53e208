//! The PostgreSQL store shared by a fleet of runners, through the real binary: runners on
//! different `--host-id`s (each with a state directory of its own, as separate hosts have) on one
//! database. Each test uses a database of its own on `$WAYMARK_TEST_PG` (`.ci/postgres.sh`).

mod common;

use common::{Env, PATIENCE, alive, finish, kill, postgres_url, stderr, wait_until, watch_stderr};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A database of its own for one test, dropped when the test ends (however it ends), so a
/// long-lived server given as `$WAYMARK_TEST_PG` does not fill with test databases.
struct TestDatabase {
    /// Its URL.
    url: String,
    /// The server's URL the test was given, to drop it from.
    admin: String,
    name: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // FORCE: a runner the test killed may still hold a connection the server has not noticed.
        let dropped = postgres::Client::connect(&self.admin, postgres::NoTls)
            .and_then(|mut admin| admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)));
        if let Err(e) = dropped {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

fn fresh_database(url: &str) -> TestDatabase {
    let mut admin = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let name = format!("waymark_it_{:016x}", fastrand_u64());
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let base = url.rsplit_once('/').unwrap().0;
    TestDatabase { url: format!("{base}/{name}"), admin: url.to_owned(), name }
}

/// The test `test`'s own database on `$WAYMARK_TEST_PG` (dropped with the first of the three), its
/// URL, and a directory; `None` when there is no server (the test skips, saying so).
fn fresh_test(test: &str) -> Option<(TestDatabase, String, Env)> {
    let database = fresh_database(&postgres_url(test)?);
    let url = database.url.clone();
    Some((database, url, Env::new()))
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    h.finish()
}

/// `waymark ARGS` as host `host` (its own state directory under the test's), on store `url`.
fn runner(env: &Env, url: &str, host: &str, args: &[&str]) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("waymark"));
    c.current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.path(&format!("state-{host}")))
        .env("WAYMARK_STORE", url)
        .env("WAYMARK_HOST_ID", host)
        .env("WAYMARK_LEASE_TTL", "3s")
        .env("WAYMARK_LEASE_RENEW", "0.5s")
        .env_remove("XDG_STATE_HOME")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn query(url: &str, sql: &str) -> Vec<postgres::Row> {
    postgres::Client::connect(url, postgres::NoTls).unwrap().query(sql, &[]).unwrap()
}

/// Kill what a test's steps left behind (by the pid files they wrote): their whole groups.
fn kill_groups(env: &Env, names: &[&str]) {
    for name in names {
        if let Ok(pid) = std::fs::read_to_string(env.path(name)) {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", pid.trim())]).status();
        }
    }
}

#[test]
fn ten_runners_on_ten_hosts_start_one_flow_at_once_and_exactly_one_runs_it() {
    let Some((_database, url, env)) =
        fresh_test("ten_runners_on_ten_hosts_start_one_flow_at_once_and_exactly_one_runs_it")
    else {
        return;
    };
    env.write("flow.toml", "name = 'race'\n[[step]]\nname = 'a'\nshell = 'echo $WAYMARK_RUN_ID >> ran.log; sleep 1'\n");
    let runners: Vec<Child> = (0..10)
        .map(|i| runner(&env, &url, &format!("host{i}"), &["run", "--quiet", "flow.toml"]).spawn().unwrap())
        .collect();
    let outputs: Vec<std::process::Output> = runners.into_iter().map(finish).collect();
    let codes: Vec<i32> = outputs.iter().map(|o| o.status.code().unwrap()).collect();
    assert_eq!(codes.iter().filter(|c| **c == 0).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 3).count(), 9, "{codes:?}");
    assert_eq!(env.count("ran.log"), 1, "the step ran once");
    let runs = query(&url, "SELECT count(*) FROM waymark_runs");
    assert_eq!(runs[0].get::<_, i64>(0), 1, "one run was created");
    // Those that did not run say who did.
    let refused = outputs.iter().find(|o| o.status.code() == Some(3)).unwrap();
    let text = stderr(refused);
    assert!(text.starts_with("error: flow `race` is already running: "), "{text}");
    assert!(text.contains(", its lease expires at "), "{text}");
    assert!(text.contains("on host host"), "{text}");
}

#[test]
fn when_the_owner_is_killed_another_host_takes_the_run_over_and_succeeded_steps_stay_done() {
    let Some((_database, url, env)) =
        fresh_test("when_the_owner_is_killed_another_host_takes_the_run_over_and_succeeded_steps_stay_done")
    else {
        return;
    };
    // `b` waits in its first run (on host-a) until the test says go; on host-b it finishes.
    env.write(
        "flow.toml",
        "name = 'failover'\n\
         [[step]]\nname = 'a'\nshell = 'echo once >> a.log; printf \"a said this \\\\377\\\\376\\\\n\"'\n\
         [[step]]\nname = 'b'\nretry = { attempts = 3, backoff_seconds = 0 }\n\
         shell = 'echo $WAYMARK_HOST_ID >> b.log; if [ ! -e b-on-a.pid ]; then echo $$ > b-on-a.pid; sleep 300; fi'\n\
         [[step]]\nname = 'c'\nshell = 'echo once >> c.log'\n",
    );
    let mut owner = runner(&env, &url, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    wait_until("step b to start on host-a", || env.path("b-on-a.pid").exists());
    kill(owner.id(), "KILL");
    owner.wait().unwrap();
    // Another host: its lease is still live, so it waits (--wait) until it expires, then takes over.
    let other = runner(&env, &url, "host-b", &["run", "--wait", "flow.toml"]).spawn().unwrap();
    let out = finish(other);
    kill_groups(&env, &["b-on-a.pid"]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("is already running (run "), "it waited for the live lease: {text}");
    assert!(
        text.contains("attempt 1 was in flight on host host-a, whose runner was lost (ActionExecutionLost); it is redelivered here as attempt 1"),
        "{text}"
    );
    assert_eq!(env.count("a.log"), 1, "a succeeded step is not run again");
    assert_eq!(env.read("b.log"), "host-a\nhost-b\n", "the step in flight ran at most twice");
    assert_eq!(env.count("c.log"), 1);
    let attempts =
        query(&url, "SELECT step, attempt, outcome, host, redelivered FROM waymark_attempts ORDER BY row_id");
    let attempts: Vec<(String, i64, String, String, bool)> =
        attempts.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    let expected = [
        ("a", 1, "succeeded", "host-a", false),
        ("b", 1, "runner_lost", "host-a", false),
        ("b", 1, "succeeded", "host-b", true),
        ("c", 1, "succeeded", "host-b", false),
    ];
    let expected: Vec<(String, i64, String, String, bool)> =
        expected.iter().map(|(s, a, o, h, r)| (s.to_string(), *a, o.to_string(), h.to_string(), *r)).collect();
    assert_eq!(attempts, expected);
    // From any host: the output of an attempt that ran elsewhere, from the database, even where
    // a file is at its path here (hosts that lay out their state directories alike).
    let logs = runner(&env, &url, "host-b", &["logs", "failover", "a", "--stream", "stdout"]).output().unwrap();
    assert_eq!(logs.status.code(), Some(0), "{}", stderr(&logs));
    assert!(stderr(&logs).starts_with("waymark: the full log is on host host-a at "), "{}", stderr(&logs));
    assert_eq!(logs.stdout, b"a said this \xff\xfe\n", "byte for byte, as recorded");
    // A stream the attempt never wrote left no file on its host; the store says it was empty.
    let logs = runner(&env, &url, "host-b", &["logs", "failover", "a", "--stream", "stderr"]).output().unwrap();
    assert_eq!(
        (logs.status.code(), stderr(&logs).as_str()),
        (Some(0), "waymark: attempt 1 of step `a` wrote nothing to stderr\n")
    );
    assert_eq!(logs.stdout, b"");
    // On its own host, whose logs are gone (a container restarted with the same host id): the end
    // recorded in the store, not a missing directory.
    std::fs::remove_dir_all(env.path("state-host-a")).unwrap();
    let logs = runner(&env, &url, "host-a", &["logs", "failover", "a", "--stream", "stdout"]).output().unwrap();
    assert_eq!(logs.status.code(), Some(0), "{}", stderr(&logs));
    let said = stderr(&logs);
    assert!(
        said.starts_with("waymark: the log ")
            && said.ends_with(" is gone from this host; here are its last 64 KiB, as recorded\n"),
        "{said}"
    );
    assert_eq!(logs.stdout, b"a said this \xff\xfe\n", "byte for byte, as recorded");
}

/// A step's log directory removed while its attempt ran: the store records no end of its logs
/// (nothing is known of them), and `logs` says that they are gone rather than that it wrote
/// nothing.
/// Taken over while a step's catch handler ran on the lost host: the new host says that the
/// handler runs again, not that the step's attempt (which had ended) is redelivered.
#[test]
fn a_catch_handler_left_running_on_a_lost_host_is_said_to_run_again() {
    let Some((_database, url, env)) = fresh_test("a_catch_handler_left_running_on_a_lost_host_is_said_to_run_again")
    else {
        return;
    };
    env.write(
        "flow.toml",
        "name = 'handover'\n[[step]]\nname = 's'\nshell = 'echo once >> s.log; exit 1'\n\
         catch = [{ shell = 'if [ ! -e handler-on-a.pid ]; then echo $$ > handler-on-a.pid; sleep 300; fi' }]\n",
    );
    let mut owner = runner(&env, &url, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    wait_until("the handler to start on host-a", || env.path("handler-on-a.pid").exists());
    kill(owner.id(), "KILL");
    owner.wait().unwrap();
    let out = finish(runner(&env, &url, "host-b", &["run", "--wait", "flow.toml"]).spawn().unwrap());
    kill_groups(&env, &["handler-on-a.pid"]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "s: the catch handler of attempt 1 was left running on host host-a, whose runner was lost; it is run \
             again here ("
        ),
        "{text}"
    );
    assert!(!text.contains("redelivered"), "{text}");
    assert_eq!(env.count("s.log"), 1, "the step's attempt ran once");
}

/// The logs of an attempt whose host's runner died, asked for on another host once its lease has
/// expired: its end was not recorded because its runner died, not "recorded when it ends".
#[test]
fn logs_of_an_attempt_whose_host_died_say_its_runner_died() {
    let Some((_database, url, env)) = fresh_test("logs_of_an_attempt_whose_host_died_say_its_runner_died") else {
        return;
    };
    env.write("flow.toml", "name = 'dead'\n[[step]]\nname = 'a'\nshell = 'echo $$ > a.pid; exec sleep 300'\n");
    let mut owner = runner(&env, &url, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    wait_until("a to start on host-a", || env.path("a.pid").exists());
    kill(owner.id(), "KILL");
    owner.wait().unwrap();
    kill_groups(&env, &["a.pid"]);
    wait_until("host-a's lease to expire", || {
        let out = runner(&env, &url, "host-b", &["status", "dead", "--json"]).output().unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|st| st["runner_alive"] == false)
    });
    let out = runner(&env, &url, "host-b", &["logs", "dead", "a", "--stream", "stdout"]).output().unwrap();
    let text = stderr(&out);
    assert!(text.ends_with("; its end was not recorded here: the attempt's runner died\n"), "{text}");
}

/// On a shared store as on SQLite, `status` names the stderr log of a compensation that wrote to
/// it and says of one that wrote nothing that it did, rather than name a file that is not there.
#[test]
fn status_names_only_the_compensation_logs_that_exist_on_a_shared_store() {
    let Some((_database, url, env)) =
        fresh_test("status_names_only_the_compensation_logs_that_exist_on_a_shared_store")
    else {
        return;
    };
    env.write(
        "flow.toml",
        "name = 'undo'\n[[step]]\nname = 'a'\nshell = 'true'\ncompensate = 'exit 7'\n\
         [[step]]\nname = 'b'\nshell = 'true'\ncompensate = 'echo cannot >&2; exit 8'\n\
         [[step]]\nname = 'z'\nshell = 'exit 1'\n",
    );
    let out = runner(&env, &url, "host-a", &["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let status = runner(&env, &url, "host-a", &["status", "undo"]).output().unwrap();
    let text = String::from_utf8(status.stdout).unwrap();
    let last = text.lines().last().unwrap();
    assert!(
        last.contains("/b/compensate.stderr says why; `a` wrote nothing to stderr: its line above says how it ended)"),
        "{text}"
    );
}

#[test]
fn logs_removed_while_the_attempt_ran_are_said_to_be_gone() {
    let Some((_database, url, env)) = fresh_test("logs_removed_while_the_attempt_ran_are_said_to_be_gone") else {
        return;
    };
    env.write(
        "flow.toml",
        "name = 'lost'\n[[step]]\nname = 'a'\n\
         shell = 'echo hello; echo >> ready; while [ ! -e go ]; do sleep 0.05; done'\n",
    );
    let runner_a = runner(&env, &url, "host-a", &["run", "--quiet", "flow.toml"]).spawn().unwrap();
    env.wait_for_lines("ready", 1);
    let logs = env.path("state-host-a/logs");
    let run_dir = std::fs::read_dir(&logs).unwrap().next().unwrap().unwrap().path();
    // The log is created on its first byte: the runner has written it before it is removed (a
    // log the runner cannot create fails the run, another story).
    let log = run_dir.join("a/attempt-1.stdout");
    wait_until("the attempt's stdout log to hold its line", || std::fs::read(&log).is_ok_and(|l| l == b"hello\n"));
    std::fs::remove_dir_all(run_dir.join("a")).unwrap();
    env.write("go", "");
    let out = finish(runner_a);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = run_dir.file_name().unwrap().to_string_lossy().into_owned();
    let shown = runner(&env, &url, "host-a", &["logs", &id, "a"]).output().unwrap();
    assert_eq!(
        (shown.status.code(), stderr(&shown)),
        (
            Some(4),
            format!(
                "error: cannot show the logs of attempt 1 of step `a`: its log directory {} is gone (removed or moved \
                 since the attempt ran; waymark keeps an attempt's logs there until `waymark gc` deletes its run); \
                 `waymark status {id} --attempts` says how it ended\n",
                run_dir.join("a").display()
            )
        )
    );
    // Seen from another host, the log is there, and its end was not recorded here.
    let elsewhere = runner(&env, &url, "host-b", &["logs", &id, "a"]).output().unwrap();
    let stem = run_dir.join("a/attempt-1");
    let said = |stream: &str| {
        format!(
            "waymark: the {stream} log of attempt 1 of step `a` is on host host-a at {}.{stream}; its end was not \
             recorded here: its log could not be read there when the attempt ended (its directory was gone, say)\n",
            stem.display()
        )
    };
    assert_eq!(
        (elsewhere.status.code(), stderr(&elsewhere), String::from_utf8_lossy(&elsewhere.stdout).into_owned()),
        (Some(0), said("stdout") + &said("stderr"), String::new())
    );
}

/// On a shared store too, a step whose attempt a dead host's runner made is not running because
/// another host's runner has taken the run over: until that runner runs it again (it waits for the
/// one slot `--max-parallel 1` leaves), `status` shows it `interrupted`, with a line saying that
/// the run's new runner runs it again.
#[test]
fn status_shows_a_step_whose_attempt_died_with_the_host_that_lost_the_run_interrupted() {
    let test = "status_shows_a_step_whose_attempt_died_with_the_host_that_lost_the_run_interrupted";
    let Some((_database, url, env)) = fresh_test(test) else {
        return;
    };
    env.write(
        "flow.toml",
        "name = 'taken'\nmax_parallel = 2\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'echo $$ >> a.pids; exec sleep 300'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'echo $$ >> b.pids; exec sleep 300'\n",
    );
    let mut owner = runner(&env, &url, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    env.wait_for_lines("a.pids", 1);
    env.wait_for_lines("b.pids", 1);
    kill(owner.id(), "KILL");
    owner.wait().unwrap();
    // host-b waits for host-a's lease to expire, takes the run over and runs `a` again, the
    // first in the file; `b` waits for the slot.
    let other = runner(&env, &url, "host-b", &["run", "--wait", "--max-parallel", "1", "flow.toml"]).spawn().unwrap();
    env.wait_for_lines("a.pids", 2);
    let status = runner(&env, &url, "host-b", &["status", "taken"]).output().unwrap();
    kill(other.id(), "TERM");
    let out = finish(other);
    // What host-a left running, which host-b cannot kill (another host's processes).
    for name in ["a.pids", "b.pids"] {
        for pid in env.read(name).lines() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        }
    }
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let text = common::normalise_status_durations(&common::normalise_times(&String::from_utf8_lossy(&status.stdout)));
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            // Where each last ran: `a` again on host-b, `b` on host-a, which died.
            "  a                    running      attempts 1/1  Ns  on host-b",
            "  b                    interrupted  attempts 1/1  Ns  on host-a",
            "                       attempt 1 did not finish: its runner died; the run's new runner runs it again",
        ],
        "{text}"
    );
    assert!(text.starts_with("run ") && text.lines().next().unwrap().ends_with(": running, started TIME"), "{text}");
}

/// A TCP proxy the test controls: the runner reaches the database through it; `cut` drops every
/// connection and refuses new ones, as a network partition does.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    /// While set, nothing is forwarded either way and no new connection is made: the connections
    /// stay open and say nothing, as through a proxy or pooler that hung.
    frozen: Arc<AtomicBool>,
    /// While set, the connections that have recorded an attempt's pid (or sent `writer`) are frozen
    /// too: the runner's writes hang while its lease renewals, on a connection of their own, and
    /// new connections go on.
    writes_frozen: Arc<AtomicBool>,
    /// What makes a connection one that `writes_frozen` freezes.
    writer: Arc<Mutex<&'static [u8]>>,
    /// While set, a new connection is answered as a server at `max_connections` answers.
    reject: Arc<AtomicBool>,
    /// The connections that have sent `writer`.
    writers: Arc<std::sync::atomic::AtomicUsize>,
    /// Once a connection sends this (in plain text), everything is frozen, as by `freeze`, before
    /// it is passed on.
    freeze_on: Arc<Mutex<Option<&'static [u8]>>>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    /// The threads forwarding data, while they run.
    forwarding: Arc<std::sync::atomic::AtomicUsize>,
}

impl Proxy {
    fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let flag = || Arc::new(AtomicBool::new(false));
        let (cut, frozen, writes_frozen, reject) = (flag(), flag(), flag(), flag());
        let r = Arc::clone(&reject);
        let writers = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ws = Arc::clone(&writers);
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let forwarding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (c, s, n) = (Arc::clone(&cut), Arc::clone(&streams), Arc::clone(&forwarding));
        let (f, w) = (Arc::clone(&frozen), Arc::clone(&writes_frozen));
        let freeze_on: Arc<Mutex<Option<&'static [u8]>>> = Arc::default();
        let on = Arc::clone(&freeze_on);
        // The journal's record of a spawned attempt's pid (not the migration's
        // `CREATE TABLE waymark_attempts`, which the lease's connection may make).
        let writer_text: Arc<Mutex<&'static [u8]>> = Arc::new(Mutex::new(b"UPDATE waymark_attempts SET pid"));
        let wt = Arc::clone(&writer_text);
        // Held while `frozen`, or while `writes` and the connection has recorded a pid.
        let hold = move |frozen: &AtomicBool, writes: &AtomicBool, writer: &AtomicBool| {
            while frozen.load(Ordering::SeqCst) || (writes.load(Ordering::SeqCst) && writer.load(Ordering::SeqCst)) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                hold(&f, &AtomicBool::new(false), &AtomicBool::new(false));
                if c.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                if r.load(Ordering::SeqCst) {
                    let mut client = client;
                    let fields = b"SFATAL\0VFATAL\0C53300\0Msorry, too many clients already\0\0";
                    let mut error = vec![b'E'];
                    error.extend_from_slice(&u32::try_from(fields.len() + 4).unwrap().to_be_bytes());
                    error.extend_from_slice(fields);
                    let _ = client.write_all(&error);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                s.lock().unwrap().extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let writer = flag();
                let pairs = [(client.try_clone().unwrap(), server.try_clone().unwrap(), true), (server, client, false)];
                for (mut from, mut to, to_server) in pairs {
                    let (f, w, n, writer) = (Arc::clone(&f), Arc::clone(&w), Arc::clone(&n), Arc::clone(&writer));
                    let (on, wt, ws) = (Arc::clone(&on), Arc::clone(&wt), Arc::clone(&ws));
                    n.fetch_add(1, Ordering::SeqCst);
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(got) = from.read(&mut buf) {
                            let seen = |p: &[u8]| buf[..got].windows(p.len()).any(|w| w == p);
                            if to_server && seen(*wt.lock().unwrap()) && !writer.swap(true, Ordering::SeqCst) {
                                ws.fetch_add(1, Ordering::SeqCst);
                            }
                            if to_server && on.lock().unwrap().is_some_and(seen) {
                                f.store(true, Ordering::SeqCst);
                            }
                            hold(&f, &w, &writer);
                            if got == 0 || to.write_all(&buf[..got]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        n.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            }
        });
        Proxy { port, cut, frozen, writes_frozen, writer: writer_text, reject, writers, freeze_on, streams, forwarding }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Take connections again after `cut` (those it cut stay closed), as a restarted server does.
    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }

    /// Freeze the connections that have recorded an attempt's pid (not those that renew leases).
    fn freeze_writes(&self) {
        self.writes_frozen.store(true, Ordering::SeqCst);
    }

    /// Freeze the connection that sends `text` (before it reaches the server), and only it: new
    /// connections, and the others, go on.
    fn freeze_connection_on(&self, text: &'static [u8]) {
        *self.writer.lock().unwrap() = text;
        self.writes_frozen.store(true, Ordering::SeqCst);
    }

    /// Answer new connections as a server at `max_connections` does (`too many clients`), or not.
    fn reject(&self, reject: bool) {
        self.reject.store(reject, Ordering::SeqCst);
    }

    /// Let the connections `freeze_connection_on` froze go on.
    fn thaw_connections(&self) {
        self.writes_frozen.store(false, Ordering::SeqCst);
    }

    /// Freeze everything once a connection sends `text` (before it reaches the server).
    fn freeze_on(&self, text: &'static [u8]) {
        *self.freeze_on.lock().unwrap() = Some(text);
    }

    /// A proxy in front of the server of `url`, and `url` through it in plain text (for the proxy
    /// to tell statements apart) with a `connect_timeout` of 1 s (a statement's watch probes
    /// after as long).
    fn plain_in_front_of(url: &str) -> (Proxy, String) {
        let proxy = Proxy::start(port_of(url));
        let plain = format!("{}?connect_timeout=1&sslmode=disable", proxy.in_front_of(url));
        (proxy, plain)
    }

    /// `url`, through this proxy.
    fn in_front_of(&self, url: &str) -> String {
        let port: u16 = url.rsplit_once(':').unwrap().1.split('/').next().unwrap().parse().unwrap();
        url.replace(&format!(":{port}/"), &format!(":{}/", self.port))
    }
}

/// waymark's tables in the database of `url`: a run of a flow of its own (`first`) makes them.
fn make_tables(env: &Env, url: &str) {
    env.write("first.toml", "name = 'first'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    assert_eq!(runner(env, url, "a", &["run", "--quiet", "first.toml"]).output().unwrap().status.code(), Some(0));
}

/// The flow of `flow.toml`, which leaves `ran`, did not run, and runs now on host `host` (once
/// the lease of a runner stopped before it expires).
fn runs_once_more(env: &Env, url: &str, host: &str) {
    assert!(!env.path("ran").exists());
    let out = runner(env, url, host, &["run", "--quiet", "--wait", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.path("ran").exists());
}

/// The port of the server of `url`.
fn port_of(url: &str) -> u16 {
    url.rsplit_once(':').unwrap().1.split('/').next().unwrap().parse().unwrap()
}

#[test]
fn a_runner_cut_off_from_the_database_kills_its_attempts_and_exits_4_and_nothing_it_writes_is_accepted() {
    let Some(url) = postgres_url(
        "a_runner_cut_off_from_the_database_kills_its_attempts_and_exits_4_and_nothing_it_writes_is_accepted",
    ) else {
        return;
    };
    let database = fresh_database(&url);
    let url = database.url.clone();
    let proxy = Proxy::start(port_of(&url));
    let via_proxy = proxy.in_front_of(&url);
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'partition'\n[[step]]\nname = 'a'\nshell = 'echo $$ > a.pid; sleep 300; echo late >> a.log'\n",
    );
    let mut owner = runner(&env, &via_proxy, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    let seen = watch_stderr(&mut owner);
    // Cut once the runner has recorded the child's pid (its one write after the spawn, said by
    // the attempt's line): the next thing it needs from the database is its lease's renewal,
    // which is what this is about. (The pid in the table is not enough: the commit's reply may
    // still be on its way through the proxy.)
    wait_until("a's attempt to be recorded with its pid", || {
        seen.lock().unwrap().contains("a: attempt 1/1 started (pid ")
    });
    let pid: u32 = env.read("a.pid").trim().parse().unwrap();
    proxy.cut();
    let out = finish(owner);
    wait_until("the runner's stderr to be read to its end", || std::sync::Arc::strong_count(&seen) == 1);
    let text = seen.lock().unwrap().clone();
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("(host-a:") && text.contains(") could not renew its lease before it would expire"), "{text}");
    assert!(
        text.contains("it stopped, killing any attempt it had running, and nothing more of the run is recorded by it"),
        "{text}"
    );
    assert!(!alive(pid), "the attempt was killed when the runner fenced itself off");
    // Nothing of its end was recorded: the attempt is still `running`, for the next runner.
    let rows = query(&url, "SELECT outcome FROM waymark_attempts");
    assert_eq!(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["running"]);
    let status = query(&url, "SELECT status FROM waymark_runs");
    assert_eq!(status[0].get::<_, String>(0), "running");
    let _ = PATIENCE;
}

/// The database stops answering (a proxy or pooler in front of it hangs, the connections stay
/// open) while the runner writes an attempt's end: the runner fences itself off when its lease
/// would expire and exits with status 4, instead of waiting for the stuck write for as long as
/// the connection stays frozen. The connection comes back while the runner still waits (its
/// lease about to expire): the held-up write and renewal then reach the database, which refuses
/// both, so nothing of what it was writing is committed (the next step never started) and its
/// lease is not brought back.
#[test]
fn a_runner_whose_database_hangs_mid_write_exits_4_and_its_write_is_never_committed() {
    let Some((_database, url, env)) =
        fresh_test("a_runner_whose_database_hangs_mid_write_exits_4_and_its_write_is_never_committed")
    else {
        return;
    };
    let proxy = Proxy::start(port_of(&url));
    env.write("flow.toml", HANGS);
    let mut owner = runner(&env, &proxy.in_front_of(&url), "host-a", &["run", "flow.toml"]).spawn().unwrap();
    let seen = watch_stderr(&mut owner);
    wait_until("a's attempt to be recorded with its pid", || {
        seen.lock().unwrap().contains("a: attempt 1/1 started (pid ")
    });
    // Frozen, then the step ends: the runner's next write (a's end with b's start) is stuck.
    proxy.freeze(true);
    env.write("go", "");
    // Thawed once the lease has less left than the runner's margin (0.75 s of 3 s): the runner
    // has fenced itself off by then, and waits up to 3 s for the stuck write before it exits.
    let left = || -> f64 {
        query(&url, "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM waymark_leases")[0].get(0)
    };
    wait_until("the lease to be about to expire", || left() < 0.7);
    proxy.freeze(false);
    let out = finish(owner);
    wait_until("the runner's stderr to be read to its end", || Arc::strong_count(&seen) == 1);
    let text = seen.lock().unwrap().clone();
    assert_eq!(out.status.code(), Some(4), "{text}");
    // Why: the renewal the freeze held up.
    assert!(
        text.contains(") could not renew its lease before it would expire (its renewal, sent ")
            && text.contains("s before, has had no answer from the database); it stopped"),
        "{text}"
    );
    wait_until("the proxy to pass on what it held, and close", || proxy.forwarding.load(Ordering::SeqCst) == 0);
    let rows = query(&url, "SELECT step, outcome FROM waymark_attempts ORDER BY row_id");
    let rows: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, [("a".to_owned(), "running".to_owned())], "a's end and b's start were not committed");
    assert!(!env.path("b-ran").exists());
    assert!(left() < 0.7, "the held-up renewal did not bring the lease back");
}

/// A step that waits for `go`, then one that leaves `b-ran`.
const HANGS: &str = "name = 'hung'\n[[step]]\nname = 'a'\nshell = 'while [ ! -e go ]; do sleep 0.05; done'\n\
                     [[step]]\nname = 'b'\nrun = ['touch', 'b-ran']\n";

/// Only the run's writes hang (their connection stays open and says nothing), while the lease's
/// renewals, on a connection of their own, go through: the runner does not wait for the stuck
/// write for ever. A write with no answer for a whole time to live stops the renewals, so the
/// runner fences itself off, says why, and exits with status 4.
#[test]
fn a_runner_whose_writes_hang_while_its_renewals_go_through_exits_4() {
    let Some((_database, url, env)) = fresh_test("a_runner_whose_writes_hang_while_its_renewals_go_through_exits_4")
    else {
        return;
    };
    let proxy = Proxy::start(port_of(&url));
    env.write("flow.toml", HANGS);
    // In plain text, for the proxy to tell the run's writes by their statements.
    let plain = format!("{}?sslmode=disable", proxy.in_front_of(&url));
    let mut owner = runner(&env, &plain, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    let seen = watch_stderr(&mut owner);
    wait_until("a's attempt to be recorded with its pid", || {
        seen.lock().unwrap().contains("a: attempt 1/1 started (pid ")
    });
    proxy.freeze_writes();
    env.write("go", "");
    let out = finish(owner);
    wait_until("the runner's stderr to be read to its end", || Arc::strong_count(&seen) == 1);
    let text = seen.lock().unwrap().clone();
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(
        text.contains(
            ") could not renew its lease before it would expire (a write of the run has had no answer from the \
             database for as long as a lease lasts (3s))"
        ),
        "{text}"
    );
    assert!(!env.path("b-ran").exists());
}

#[test]
fn bad_store_urls_and_an_unreachable_database_say_what_to_do_without_the_password() {
    let env = Env::new();
    env.write("flow.toml", "name = 'x'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let out = env.cmd(&["--store", "mysql://root:hunter2@db/x", "run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: store `mysql://root@db/x` is not one waymark knows; give `sqlite:` (the state directory's database, \
         the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DATABASE`\n"
    );
    // Nothing listens on this port.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://fleet:hunter2@127.0.0.1:{port}/waymark");
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_STORE", &url).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    let text = stderr(&out);
    assert!(
        text.starts_with(&format!(
            "error: cannot reach the state database postgres://fleet@127.0.0.1:{port}/waymark: "
        )),
        "{text}"
    );
    assert!(text.contains("\nhint: check that PostgreSQL runs at "), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

/// `url` with its port and database name replaced by `PORT` and `DB`, for golden messages.
fn normalised(text: &str, url: &str) -> String {
    let (base, db) = url.rsplit_once('/').unwrap();
    let port = base.rsplit_once(':').unwrap().1;
    text.replace(&format!(":{port}/{db}"), ":PORT/DB")
}

#[test]
fn a_read_only_database_refuses_a_run_before_any_step_and_still_answers_history_and_status() {
    let Some((_database, url, env)) =
        fresh_test("a_read_only_database_refuses_a_run_before_any_step_and_still_answers_history_and_status")
    else {
        return;
    };
    env.write("flow.toml", "name = 'replica'\n[[step]]\nname = 'a'\nshell = 'echo ran >> ran.log'\n");
    let first = runner(&env, &url, "host-a", &["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let db = url.rsplit_once('/').unwrap().1;
    // What a hot standby answers to a write: SQLSTATE 25006.
    postgres::Client::connect(&url, postgres::NoTls)
        .unwrap()
        .batch_execute(&format!("ALTER DATABASE {db} SET default_transaction_read_only = on"))
        .unwrap();
    let out = runner(&env, &url, "host-b", &["run", "--fresh", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        normalised(&stderr(&out), &url),
        "error: the state database postgres://waymark@127.0.0.1:PORT/DB takes no writes: cannot execute INSERT in \
         a read-only transaction\n\
         hint: postgres://waymark@127.0.0.1:PORT/DB is a read-only server (a hot standby, or \
         `default_transaction_read_only` is on): point --store (or WAYMARK_STORE) at the primary, then try again \
         (nothing is lost: a run resumes where it stopped); `history`, `status` and `logs` can read from it\n"
    );
    assert_eq!(env.count("ran.log"), 1, "no step ran against the read-only database");
    let runs = query(&url, "SELECT status FROM waymark_runs");
    assert_eq!(runs.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["succeeded"], "nothing was lost");
    // The reading commands work against it.
    let history = runner(&env, &url, "host-b", &["history"]).output().unwrap();
    assert_eq!(history.status.code(), Some(0), "{}", stderr(&history));
    let lines: Vec<String> = String::from_utf8_lossy(&history.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[1].contains(" replica ") && lines[1].contains(" succeeded "), "{lines:?}");
    let status = runner(&env, &url, "host-b", &["status", "replica"]).output().unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(": succeeded, started ") && text.contains("\n  a "), "{text}");
}

#[test]
fn eight_processes_on_a_fresh_database_migrate_it_once_and_all_succeed() {
    let Some((_database, url, env)) = fresh_test("eight_processes_on_a_fresh_database_migrate_it_once_and_all_succeed")
    else {
        return;
    };
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    // The test holds the migrations' advisory lock ("waymark" in ASCII) until the four runners
    // found the database empty and wait for it: then they migrate at once, as hosts started
    // together do. The four listing runs find no runs there and migrate nothing: they do not wait.
    let mut gate = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    gate.execute("SELECT pg_advisory_lock($1)", &[&0x0077_6179_6d61_726b_i64]).unwrap();
    // Half list runs, half run a flow of their own host (a flow without a name is its host's).
    let mut children: Vec<Child> = (0..8)
        .map(|i| {
            let args: &[&str] = if i % 2 == 0 { &["history"] } else { &["run", "--quiet", "flow.toml"] };
            runner(&env, &url, &format!("host{i}"), args).spawn().unwrap()
        })
        .collect();
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    wait_until("the four runners to wait for the migration lock", || {
        gate.query_one(waiting, &[]).unwrap().get::<_, i64>(0) == 4
    });
    // And the four listing runs to have looked, and ended, before there are tables to find.
    wait_until("the four listing runs to end", || {
        children.iter_mut().step_by(2).all(|child| child.try_wait().unwrap().is_some())
    });
    gate.execute("SELECT pg_advisory_unlock($1)", &[&0x0077_6179_6d61_726b_i64]).unwrap();
    for (i, out) in children.into_iter().map(finish).enumerate() {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        // `history` found no tables (it looked while the runners waited to create them); the
        // runners say nothing.
        let said = match i % 2 {
            0 => format!(
                "no runs yet in the store {} (chosen by WAYMARK_STORE): it has no waymark tables, so no run was ever \
                 recorded there; `--store URL` (or WAYMARK_STORE) looks in another\n",
                without_password(&url)
            ),
            _ => String::new(),
        };
        assert_eq!(stderr(&out), said, "no process reports an error");
    }
    let schema = query(&url, "SELECT version FROM waymark_schema");
    assert_eq!(
        schema.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(),
        [4],
        "one row: migrated once, to the current schema"
    );
    let tables = query(
        &url,
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'waymark_%' ORDER BY 1",
    );
    assert_eq!(
        tables.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(),
        [
            "waymark_attempts",
            "waymark_deleted_runs",
            "waymark_leases",
            "waymark_runs",
            "waymark_schema",
            "waymark_steps"
        ]
    );
    let runs = query(&url, "SELECT count(*) FROM waymark_runs WHERE status = 'succeeded'");
    assert_eq!(runs[0].get::<_, i64>(0), 4, "each runner's run was recorded");
}

#[test]
fn a_wrong_password_exits_4_naming_the_url_without_it() {
    let Some(url) = postgres_url("a_wrong_password_exits_4_naming_the_url_without_it") else {
        return;
    };
    let env = Env::new();
    env.write("flow.toml", "name = 'x'\n[[step]]\nname = 'a'\nshell = 'echo ran >> ran.log'\n");
    let wrong = url.replacen(":waymark@", ":not-the-password@", 1);
    assert_ne!(wrong, url, "the test URL has the form postgres://waymark:waymark@HOST:PORT/DB");
    for command in [&["run", "flow.toml"][..], &["history"]] {
        let out = runner(&env, &wrong, "host-a", command).output().unwrap();
        assert_eq!(out.status.code(), Some(4), "{command:?}: {}", stderr(&out));
        assert_eq!(
            normalised(&stderr(&out), &url),
            "error: the state database postgres://waymark@127.0.0.1:PORT/DB refused this user's credentials: \
             password authentication failed for user \"waymark\"\n\
             hint: check the user and password of the URL (`postgres://USER:PASSWORD@HOST/DATABASE`) and that the \
             server's pg_hba.conf lets this user in from this host, then try again (nothing is lost: a run \
             resumes where it stopped)\n",
            "{command:?}"
        );
    }
    // No password at all: the same, saying that the URL gives none.
    let none = url.replacen(":waymark@", "@", 1);
    let out = runner(&env, &none, "host-a", &["history"]).output().unwrap();
    assert_eq!(
        (out.status.code(), normalised(&stderr(&out), &url)),
        (
            Some(4),
            "error: the state database postgres://waymark@127.0.0.1:PORT/DB refused this user's credentials: the \
             server asks for a password, and the URL gives none (waymark reads it from the URL only, not from \
             PGPASSWORD or ~/.pgpass)\n\
             hint: check the user and password of the URL (`postgres://USER:PASSWORD@HOST/DATABASE`) and that the \
             server's pg_hba.conf lets this user in from this host, then try again (nothing is lost: a run \
             resumes where it stopped)\n"
                .to_owned()
        )
    );
    assert!(!env.path("ran.log").exists(), "nothing ran");
}

/// The commands that look, and those that change runs but a run (`resume`, `gc`), on a database
/// where nothing was recorded find no runs and write nothing: they create no tables, and a
/// read-only database (a hot standby) is read the same way. Only `run` creates the tables.
#[test]
fn commands_on_an_empty_database_find_no_runs_and_create_nothing() {
    let Some(url) = postgres_url("commands_on_an_empty_database_find_no_runs_and_create_nothing") else {
        return;
    };
    let database = fresh_database(&url);
    let env = Env::new();
    let read_only = format!("{}?options=-c%20default_transaction_read_only%3Don", database.url);
    for url in [&read_only, &database.url] {
        let place = format!(
            "in the store {} (chosen by WAYMARK_STORE): it has no waymark tables, so no run was ever recorded there",
            without_password(url)
        );
        let elsewhere = "`--store URL` (or WAYMARK_STORE) looks in another";
        let history = runner(&env, url, "host-a", &["history"]).output().unwrap();
        assert_eq!((history.status.code(), stderr(&history)), (Some(0), format!("no runs yet {place}; {elsewhere}\n")));
        let status = runner(&env, url, "host-a", &["status", "abcdefgh"]).output().unwrap();
        assert_eq!(
            (status.status.code(), stderr(&status)),
            (
                Some(2),
                format!(
                    "error: no run with id `abcdefgh` and no runs of a flow named `abcdefgh` {place}; {elsewhere}\n"
                )
            )
        );
        let resume = runner(&env, url, "host-a", &["resume", "abcdefgh"]).output().unwrap();
        assert_eq!(
            (resume.status.code(), stderr(&resume)),
            (Some(2), format!("error: no run with id `abcdefgh` {place}; {elsewhere}\n"))
        );
        let gc = runner(&env, url, "host-a", &["gc", "--older-than", "0s"]).output().unwrap();
        assert_eq!((gc.status.code(), stderr(&gc)), (Some(0), format!("waymark: deleted no runs {place}\n")));
    }
    let tables = query(&database.url, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'waymark_%'");
    assert_eq!(tables[0].get::<_, i64>(0), 0, "no table was created");
}

#[test]
fn gc_deletes_the_finished_runs_of_every_host_from_the_shared_database() {
    let Some((_database, url, env)) = fresh_test("gc_deletes_the_finished_runs_of_every_host_from_the_shared_database")
    else {
        return;
    };
    env.write("flow.toml", "name = 'nightly'\n[[step]]\nname = 'a'\nshell = 'echo ran >> ran.log'\n");
    for host in ["host-a", "host-b"] {
        let out = runner(&env, &url, host, &["run", "--quiet", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let count = |table: &str| query(&url, &format!("SELECT count(*) FROM {table}"))[0].get::<_, i64>(0);
    assert_eq!((count("waymark_runs"), count("waymark_attempts")), (2, 2));
    let gc = runner(&env, &url, "host-c", &["gc", "--older-than", "0"]).output().unwrap();
    assert_eq!(gc.status.code(), Some(0), "{}", stderr(&gc));
    assert_eq!(stderr(&gc), "waymark: deleted 2 finished run(s) older than 0s\n");
    assert_eq!((count("waymark_runs"), count("waymark_attempts")), (0, 0), "the runs and their attempts are gone");
    // Each host keeps the logs of its own run, which host-c's gc could not reach; the next gc on
    // that host deletes them, and keeps the logs of a run of another store kept there.
    let logs = |host: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(env.path(&format!("state-{host}/logs")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!((logs("host-a").len(), logs("host-b").len()), (1, 1));
    std::fs::create_dir(env.path("state-host-a/logs/zzzzzzzz")).unwrap();
    let gc = runner(&env, &url, "host-a", &["gc", "--older-than", "1d"]).output().unwrap();
    assert_eq!(
        (gc.status.code(), stderr(&gc).as_str()),
        (
            Some(0),
            "waymark: deleted 0 finished run(s) older than 1 day, and the logs of 1 run(s) deleted by gc on another host\n"
        )
    );
    assert_eq!(logs("host-a"), ["zzzzzzzz"], "the logs of the deleted run are gone, the other store's kept");
    assert_eq!(logs("host-b").len(), 1, "until gc runs on host-b");
    let history = runner(&env, &url, "host-a", &["history"]).output().unwrap();
    assert_eq!(history.status.code(), Some(0), "{}", stderr(&history));
    // Where it looked: the store, without its password, and the variable that chose it (not the
    // state directory, which keeps only this host's logs).
    let store = without_password(&url);
    assert_ne!(store, url);
    let env_chose = format!("in the store {store} (chosen by WAYMARK_STORE)");
    assert_eq!(
        (String::from_utf8_lossy(&history.stdout).as_ref(), stderr(&history).as_str()),
        ("", format!("no runs yet {env_chose}; `--store URL` (or WAYMARK_STORE) looks in another\n").as_str())
    );
    let status = runner(&env, &url, "host-a", &["status"]).output().unwrap();
    assert_eq!(
        (status.status.code(), stderr(&status)),
        (
            Some(2),
            format!(
                "error: there are no runs yet {env_chose}; `waymark run FLOW` starts one, `--store URL` (or \
             WAYMARK_STORE) looks in another\n"
            )
        )
    );
    let status = runner(&env, &url, "host-a", &["status", "flow.toml"]).output().unwrap();
    assert_eq!(
        (status.status.code(), stderr(&status)),
        (
            Some(2),
            format!(
                "error: no runs of the flow file {} {env_chose}; `waymark run flow.toml` starts one, `waymark history` \
             lists the runs kept there\n",
                std::fs::canonicalize(env.path("flow.toml")).unwrap().display()
            )
        )
    );
    let resume = runner(&env, &url, "host-a", &["resume", "abcdefgh"]).output().unwrap();
    assert_eq!(
        (resume.status.code(), stderr(&resume)),
        (
            Some(2),
            format!("error: no run with id `abcdefgh` {env_chose}; `waymark history` lists the runs kept there\n")
        )
    );
    let mut given = runner(&env, "sqlite:", "host-a", &["history", "--store", &url]);
    let history = given.output().unwrap();
    assert_eq!(
        stderr(&history),
        format!("no runs yet in the store {store} (chosen by --store); `--store URL` looks in another\n")
    );
    // Chosen by `--store`, the listing needs it again: `waymark history` alone reads elsewhere.
    let resume = runner(&env, "sqlite:", "host-a", &["resume", "abcdefgh", "--store", &url]).output().unwrap();
    assert_eq!(
        (resume.status.code(), stderr(&resume)),
        (
            Some(2),
            format!(
                "error: no run with id `abcdefgh` in the store {store} (chosen by --store); `waymark history --store \
                 URL`, with the same URL, lists the runs kept there\n"
            )
        )
    );
}

/// A store URL as waymark shows it: without its password.
fn without_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => format!("{}@{host}", user.split_once(':').map_or(user, |(u, _)| u)),
        None => authority.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// A session that holds the leases locked inside a transaction and says nothing more (its host
/// vanished mid-write, which the server's TCP notices only after hours) blocks a runner at most
/// for the session limit waymark sets (30 s): the runner then fails as busy, exit status 4, instead
/// of waiting without a word; once the lock is gone, the flow runs.
#[test]
fn a_lock_held_by_a_silent_session_stops_a_runner_as_busy_instead_of_blocking_it() {
    let Some((_database, url, env)) =
        fresh_test("a_lock_held_by_a_silent_session_stops_a_runner_as_busy_instead_of_blocking_it")
    else {
        return;
    };
    env.write("flow.toml", "name = 'held'\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    make_tables(&env, &url);
    let mut silent = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut held = silent.transaction().unwrap();
    held.batch_execute("LOCK TABLE waymark_leases IN ACCESS EXCLUSIVE MODE").unwrap();
    let out = finish(runner(&env, &url, "a", &["run", "--quiet", "flow.toml"]).spawn().unwrap());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("is locked by another process: canceling statement due to lock timeout"), "{err}");
    assert!(!env.path("ran").exists());
    held.rollback().unwrap();
    let out = runner(&env, &url, "a", &["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.path("ran").exists());
}

/// A server that takes the connection and then never answers (hung, or a pooler or proxy in front
/// of one that is gone): the handshake is bounded by `connect_timeout` as the TCP connection is,
/// and the command exits with status 4 saying so, instead of waiting for ever. No server needed.
#[test]
fn a_server_that_never_answers_is_unreachable_after_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Takes every connection and keeps it, saying nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for client in listener.incoming().flatten() {
            held.push(client);
        }
    });
    let env = Env::new();
    let url = format!("postgres://waymark:secret@127.0.0.1:{port}/waymark?connect_timeout=1&sslmode=disable");
    let out = finish(runner(&env, &url, "a", &["history"]).spawn().unwrap());
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (
            Some(4),
            format!(
                "error: cannot reach the state database postgres://waymark@127.0.0.1:{port}/waymark?connect_timeout=1\
                 &sslmode=disable: the server took the connection but did not finish the handshake within 1s \
                 (`connect_timeout`)\n\
                 hint: check that PostgreSQL runs at postgres://waymark@127.0.0.1:{port}/waymark?connect_timeout=1\
                 &sslmode=disable and takes connections from this host (host, port, firewall, sslmode), then try again \
                 (nothing is lost: a run resumes where it stopped); --store or WAYMARK_STORE selects another store\n"
            )
        )
    );
}

/// The database stops answering after the handshake (a proxy or pooler in front of it hung) while
/// a command waits for a statement's answer: after `connect_timeout` a new connection is tried,
/// and when it gets no answer either, the command exits with status 4 saying so, instead of
/// waiting for ever. `history` looks; a runner stalled in its set-up (after it took the flow's
/// lease) has started no step, and the next runner runs the flow once that lease expires. (A
/// statement of a server that still answers a new connection is waited for: the lock test above.)
#[test]
fn a_database_that_stops_answering_after_the_handshake_ends_a_command_with_status_4() {
    let Some((_database, url, env)) =
        fresh_test("a_database_that_stops_answering_after_the_handshake_ends_a_command_with_status_4")
    else {
        return;
    };
    env.write("flow.toml", "name = 'stalled'\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    make_tables(&env, &url);
    let cases: [(&[&str], &'static [u8]); 2] =
        [(&["history"], b"FROM waymark_runs"), (&["run", "--quiet", "flow.toml"], b"INSERT INTO waymark_runs")];
    for (args, statement) in cases {
        let (proxy, plain) = Proxy::plain_in_front_of(&url);
        proxy.freeze_on(statement);
        let out = finish(runner(&env, &plain, "a", args).spawn().unwrap());
        let shown = without_password(&plain);
        assert_eq!(
            (out.status.code(), stderr(&out)),
            (
                Some(4),
                format!(
                    "error: cannot reach the state database {shown}: a statement had no answer within 1s, and a new \
                     connection got none either (the server took the connection but did not finish the handshake \
                     within 1s (`connect_timeout`)): the server, or a proxy or pooler in front of it, has stopped \
                     answering\n\
                     hint: check that PostgreSQL runs at {shown} and takes connections from this host (host, port, \
                     firewall, sslmode), then try again (nothing is lost: a run resumes where it stopped); --store or \
                     WAYMARK_STORE selects another store\n"
                )
            ),
            "{args:?}"
        );
        proxy.freeze(false);
    }
    runs_once_more(&env, &url, "a");
}

/// Only the connection a statement went on hangs (a pooler stuck on one session), while new
/// connections are answered: the probe finds the statement's session waiting for it (idle, in its
/// transaction) for as long as the statement waited, so the statement is stuck on the way, and the
/// command exits with status 4 instead of waiting for ever. A runner stuck so in its set-up no
/// longer keeps its lease renewed for ever: the next runner takes the flow once it expires.
#[test]
fn a_statement_stuck_on_its_own_connection_ends_the_command_with_status_4() {
    let Some((_database, url, env)) =
        fresh_test("a_statement_stuck_on_its_own_connection_ends_the_command_with_status_4")
    else {
        return;
    };
    env.write("flow.toml", "name = 'stuck'\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    make_tables(&env, &url);
    let waited = regex::Regex::new(r"while the server has waited \d+\.\ds for the next one").unwrap();
    let cases: [(&[&str], &'static [u8]); 2] =
        [(&["history"], b"FROM waymark_runs"), (&["run", "--quiet", "flow.toml"], b"INSERT INTO waymark_runs")];
    for (args, statement) in cases {
        let (proxy, plain) = Proxy::plain_in_front_of(&url);
        proxy.freeze_connection_on(statement);
        let out = finish(runner(&env, &plain, "a", args).spawn().unwrap());
        let shown = without_password(&plain);
        let err = waited.replace(&stderr(&out), "while the server has waited Ns for the next one").into_owned();
        assert_eq!(
            (out.status.code(), err),
            (
                Some(4),
                format!(
                    "error: cannot reach the state database {shown}: a statement had no answer within 1s, while the \
                     server has waited Ns for the next one on its connection: what it answered, or the statement \
                     itself, is stuck on the way, in a proxy or pooler between waymark and the server\n\
                     hint: the server at {shown} answers: check the proxy or pooler between this host and it, then \
                     try again (nothing is lost: a run resumes where it stopped)\n"
                )
            ),
            "{args:?}"
        );
        // Its session on the server ends with the proxy's connections (else it would hold the
        // lease's row locked until the server ends it as idle in its transaction, 30 s on).
        proxy.cut();
    }
    runs_once_more(&env, &url, "b");
}

/// A statement held up while the server answers new connections with an error (at its
/// `max_connections`): the server is there, so the command waits for the statement, rather than
/// saying the server does not answer; it ends as usual once the statement is answered.
#[test]
fn a_server_that_answers_the_probe_with_an_error_is_waited_for() {
    let Some((_database, url, env)) = fresh_test("a_server_that_answers_the_probe_with_an_error_is_waited_for") else {
        return;
    };
    make_tables(&env, &url);
    let (proxy, plain) = Proxy::plain_in_front_of(&url);
    proxy.freeze_connection_on(b"FROM waymark_runs");
    let mut history = runner(&env, &plain, "a", &["history"]).spawn().unwrap();
    wait_until("history's statement to be held", || proxy.writers.load(Ordering::SeqCst) == 1);
    proxy.reject(true);
    // Twice as long as the probe takes to give up on a server that does not answer.
    std::thread::sleep(std::time::Duration::from_secs(3));
    if history.try_wait().unwrap().is_some() {
        let out = history.wait_with_output().unwrap();
        panic!("the command gave up on a server that answers: {}", stderr(&out));
    }
    proxy.reject(false);
    proxy.thaw_connections();
    let out = finish(history);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(" first "), "{}", String::from_utf8_lossy(&out.stdout));
    // Not without end: after six times `connect_timeout` of refusals, the command gives up.
    let (proxy, plain) = Proxy::plain_in_front_of(&url);
    proxy.freeze_connection_on(b"FROM waymark_runs");
    let history = runner(&env, &plain, "a", &["history"]).spawn().unwrap();
    wait_until("history's statement to be held", || proxy.writers.load(Ordering::SeqCst) == 1);
    proxy.reject(true);
    let out = finish(history);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(
            ": a statement had no answer within 1s, and for 6s the server has refused every new connection (sorry, \
             too many clients already), so it cannot say whether it is at work on it\n"
        ),
        "{err}"
    );
}

/// The lease's row is locked by another session for longer than a lease lasts (a runner's set-up
/// left in its transaction, until the server ends it): the runner waits for it, and its lease
/// counts from when the database set it, not from when it asked, so it runs the flow instead of
/// fencing itself off at once.
#[test]
fn a_lease_taken_after_waiting_for_a_lock_counts_from_when_it_was_taken() {
    let Some((_database, url, env)) =
        fresh_test("a_lease_taken_after_waiting_for_a_lock_counts_from_when_it_was_taken")
    else {
        return;
    };
    env.write("flow.toml", "name = 'late'\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    make_tables(&env, &url);
    let (locked, held) = std::sync::mpsc::channel();
    let holder = {
        let url = url.clone();
        std::thread::spawn(move || {
            let mut session = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut tx = session.transaction().unwrap();
            tx.batch_execute("LOCK TABLE waymark_leases IN ACCESS EXCLUSIVE MODE").unwrap();
            locked.send(()).unwrap();
            // Longer than the lease lasts (3 s in these tests).
            std::thread::sleep(std::time::Duration::from_secs(4));
            tx.commit().unwrap();
        })
    };
    held.recv().unwrap();
    let out = runner(&env, &url, "a", &["run", "--quiet", "flow.toml"]).output().unwrap();
    holder.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.path("ran").exists());
}

/// Steps inherit `WAYMARK_STORE`, so that a nested waymark reaches the same store; its password
/// is a secret of the run: a step that prints it shows `***`, in its log and on the terminal.
#[test]
fn a_step_printing_the_store_url_shows_its_password_as_a_secret() {
    let Some((database, url, env)) = fresh_test("a_step_printing_the_store_url_shows_its_password_as_a_secret") else {
        return;
    };
    // A role of its own, whose password is not also its name (as the test server's role's is).
    let role = format!("printer_{:08x}", fastrand_u64() as u32);
    let mut admin = postgres::Client::connect(&database.admin, postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'pr1nt-s3cret'; ALTER DATABASE {} OWNER TO {role}",
            database.name
        ))
        .unwrap();
    let (_, host) = url.split_once('@').unwrap();
    let url = format!("postgres://{role}:pr1nt-s3cret@{host}");
    env.write("flow.toml", "name = 'printer'\n[[step]]\nname = 'a'\nshell = 'echo \"store: $WAYMARK_STORE\"'\n");
    let out = runner(&env, &url, "a", &["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let masked = format!("postgres://{role}:***@{host}");
    let logs = runner(&env, &url, "a", &["logs", "flow.toml", "a"]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout).into_owned();
    assert_eq!(logs.lines().last(), Some(format!("store: {masked}").as_str()), "{logs}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("a | store: {masked}\n"));
    drop(database);
    admin.batch_execute(&format!("DROP ROLE {role}")).unwrap();
}

/// A flow without a `name` is its file on its host: `history FLOW` and `status FLOW` on one host
/// show that host's runs of the file, not another host's runs of a file at the same path; plain
/// `history` lists every host's runs.
#[test]
fn a_nameless_flow_s_history_is_its_host_s() {
    let Some((_database, url, env)) = fresh_test("a_nameless_flow_s_history_is_its_host_s") else {
        return;
    };
    env.write("flow.toml", "[[step]]\nname = 'a'\nshell = 'echo $WAYMARK_RUN_ID >> ids-$WAYMARK_HOST_ID'\n");
    for host in ["host-a", "host-b"] {
        let out = runner(&env, &url, host, &["run", "--quiet", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let id = |host: &str| env.read(&format!("ids-{host}")).trim().to_owned();
    let listed = |args: &[&str]| {
        let out = runner(&env, &url, "host-a", args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut ids: Vec<String> =
            [id("host-a"), id("host-b")].into_iter().filter(|id| text.contains(id.as_str())).collect();
        ids.sort();
        ids
    };
    assert_eq!(listed(&["history", "flow.toml"]), [id("host-a")]);
    assert_eq!(listed(&["history", "flow"]), [id("host-a")]);
    let mut both = vec![id("host-a"), id("host-b")];
    both.sort();
    assert_eq!(listed(&["history"]), both);
    let status = runner(&env, &url, "host-a", &["status", "flow.toml"]).output().unwrap();
    assert!(String::from_utf8_lossy(&status.stdout).contains(&id("host-a")), "{}", stderr(&status));
    // A host without runs of its own of the file is told of the other hosts' and how to see them.
    let store = without_password(&url);
    let path = std::fs::canonicalize(env.path("flow.toml")).unwrap();
    let elsewhere = "a flow without `name` is its file on each host, and hosts host-a and host-b have runs of \
                     their own of it: `waymark history` lists every host's runs (a `name` in the flow makes one flow \
                     of them), `--store URL` (or WAYMARK_STORE) looks in another";
    let history = runner(&env, &url, "host-c", &["history", "flow.toml"]).output().unwrap();
    assert_eq!(
        (history.status.code(), stderr(&history)),
        (
            Some(0),
            format!(
                "no runs yet of flow `flow.toml` on this host (host-c) in the store {store} (chosen by \
                 WAYMARK_STORE); {elsewhere}\n"
            )
        )
    );
    let status = runner(&env, &url, "host-c", &["status", "flow.toml"]).output().unwrap();
    assert_eq!(
        (status.status.code(), stderr(&status)),
        (
            Some(2),
            format!(
                "error: no runs of the flow file {} on this host (host-c) in the store {store} (chosen by \
                 WAYMARK_STORE); {elsewhere}\n",
                path.display()
            )
        )
    );
}

/// `--fresh` on another host, after the owner was killed mid-step: the abandoned run's attempt
/// may still run on the lost host, and waymark never kills by a pid recorded there, so it says so,
/// as a takeover does.
#[test]
fn a_fresh_run_on_another_host_says_what_it_does_not_kill_there() {
    let Some((_database, url, env)) = fresh_test("a_fresh_run_on_another_host_says_what_it_does_not_kill_there") else {
        return;
    };
    env.write(
        "flow.toml",
        "name = 'fresh'\n[[step]]\nname = 'b'\n\
         shell = 'if [ ! -e b-on-a.pid ]; then echo $$ > b-on-a.pid; sleep 300; fi'\n",
    );
    let mut owner = runner(&env, &url, "host-a", &["run", "flow.toml"]).spawn().unwrap();
    wait_until("step b to start on host-a", || env.path("b-on-a.pid").exists());
    kill(owner.id(), "KILL");
    owner.wait().unwrap();
    let id = query(&url, "SELECT id FROM waymark_runs")[0].get::<_, String>(0);
    let out = runner(&env, &url, "host-b", &["run", "--wait", "--fresh", "flow.toml"]).output().unwrap();
    kill_groups(&env, &["b-on-a.pid"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said: Vec<String> =
        common::untimed(&stderr(&out)).lines().filter(|l| l.contains("warning:")).map(str::to_owned).collect();
    assert_eq!(
        said,
        [format!(
            "waymark: warning: b: attempt 1 was running on host host-a when run {id} was abandoned; it is not killed \
             from here (waymark never kills by a pid recorded on another host): stop it there if it still runs"
        )]
    );
    // A catch handler left running there is said too.
    env.write(
        "catch.toml",
        "name = 'fresh-catch'\n[[step]]\nname = 'c'\nrun = ['false']\n\
         catch = [{ exception_types = ['Exception'], shell = '[ -e handler.pid ] || { echo $$ > handler.pid; sleep 300; }' }]\n",
    );
    let mut owner = runner(&env, &url, "host-a", &["run", "catch.toml"]).spawn().unwrap();
    wait_until("the catch handler to start on host-a", || env.path("handler.pid").exists());
    kill(owner.id(), "KILL");
    owner.wait().unwrap();
    let id = query(&url, "SELECT id FROM waymark_runs WHERE flow = 'fresh-catch'")[0].get::<_, String>(0);
    let out = runner(&env, &url, "host-b", &["run", "--wait", "--fresh", "catch.toml"]).output().unwrap();
    kill_groups(&env, &["handler.pid"]);
    let said: Vec<String> =
        common::untimed(&stderr(&out)).lines().filter(|l| l.contains("warning:")).map(str::to_owned).collect();
    assert_eq!(
        said.first().map(String::as_str),
        Some(
            format!(
                "waymark: warning: c: the catch handler of attempt 1 was running on host host-a when run {id} was \
                 abandoned; it is not killed from here (waymark never kills by a pid recorded on another host): stop \
                 it there if it still runs"
            )
            .as_str()
        ),
        "{}",
        stderr(&out)
    );
}

/// A runner waiting (`--wait`) for another's lease rides out a database that is away for less
/// than a lease lasts (a restart, a failover), as the holder does; it takes the flow once the
/// holder is done. It gave up with exit 4 at the first refused connection.
#[test]
fn a_waiting_runner_rides_out_a_short_database_outage() {
    let Some((_database, url, env)) = fresh_test("a_waiting_runner_rides_out_a_short_database_outage") else {
        return;
    };
    env.write(
        "flow.toml",
        "name = 'outage'\n[[step]]\nname = 'a'\nshell = 'echo $WAYMARK_HOST_ID >> a.log; touch started; \
         while [ ! -e go ]; do sleep 0.05; done'\n",
    );
    let holder = runner(&env, &url, "host-a", &["run", "--quiet", "flow.toml"]).spawn().unwrap();
    wait_until("step a to start on host-a", || env.path("started").exists());
    let (proxy, through) = Proxy::plain_in_front_of(&url);
    let mut waiter = runner(&env, &through, "host-b", &["run", "--wait", "flow.toml"]).spawn().unwrap();
    let said = watch_stderr(&mut waiter);
    wait_until("host-b to wait for the lease", || said.lock().unwrap().contains("waiting"));
    proxy.cut();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    proxy.restore();
    std::fs::write(env.path("go"), "").unwrap();
    let holder = finish(holder);
    assert_eq!(holder.status.code(), Some(0), "{}", stderr(&holder));
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", said.lock().unwrap());
    assert_eq!(env.read("a.log"), "host-a\nhost-b\n", "the waiter ran the flow once the holder was done");
}
