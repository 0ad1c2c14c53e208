//! `waymark-floor spawn N PROGRAM`, `waymark-floor flush N PROGRAM DB` and `waymark-floor record N
//! PROGRAM DB`: the floors that
//! `bench/bench.py` holds waymark against. `waymark-floor pause N MS PROGRAM [ARG...]` spawns
//! PROGRAM N times with a sleep of MS milliseconds (a decimal) before each spawn but the first
//! (`nanosleep`: the kernel's timer, with its slack of 50 us): a retry loop with nothing to record,
//! the floor of the backoff rows. `waymark-floor stamp FILE CODE` is a step's program
//! instead: it appends the wall-clock time in nanoseconds to FILE and exits with CODE, so that the
//! benchmark reads when each attempt started from the child's side, to the microsecond. Each iteration spawns PROGRAM (std's `Command`, which
//! uses posix_spawn on Linux when, as here, no pre-exec hook is set) with stdio inherited and waits
//! for it; `flush` also commits one row to the SQLite database DB (WAL, synchronous=FULL: one
//! fsync of the WAL per commit) after each wait, and `record` the same with synchronous=NORMAL
//! (no fsync: the commit survives a SIGKILL of the process, not a power loss, as a failed
//! attempt's record in waymark does). It prints nothing: the benchmark times the whole process
//! from outside, as it times waymark.
//!
//! `waymark-floor kept-record N PROGRAM DB` and `kept-flush` are the floors of an attempt that
//! keeps README's guarantees, not only its record: PROGRAM is spawned in a process group of its
//! own (a timeout kills the whole group), with its stdout and stderr through pipes read to their
//! end (its output is logged), its pid committed once it runs (so that the next runner finds and
//! kills what a runner killed with SIGKILL left running), and its end committed after it
//! (`kept-flush`: with synchronous=FULL, as a step's success is; the pid's commit stays NORMAL),
//! on one connection, as waymark's are.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("stamp") => return stamp(&args[2..]),
        Some("pause") => return pause(&args[2..]),
        _ => {}
    }
    let usage = || {
        eprintln!(
            "usage: waymark-floor spawn N PROGRAM | waymark-floor flush|record|kept-flush|kept-record N PROGRAM DB | waymark-floor pause N MS PROGRAM [ARG...] | waymark-floor stamp FILE CODE"
        );
        ExitCode::from(2)
    };
    let (Some(mode), Some(n), Some(program)) =
        (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok()), args.get(3))
    else {
        return usage();
    };
    let db = match (mode.as_str(), args.get(4)) {
        ("spawn", None) => None,
        ("flush" | "record" | "kept-flush" | "kept-record", Some(path)) => {
            let conn = rusqlite::Connection::open(path).expect("open the database");
            conn.pragma_update(None, "journal_mode", "WAL").expect("WAL");
            let sync = if mode.ends_with("flush") { "FULL" } else { "NORMAL" };
            conn.pragma_update(None, "synchronous", sync).expect("synchronous");
            conn.execute_batch("CREATE TABLE IF NOT EXISTS t (i INTEGER PRIMARY KEY, v INTEGER)").expect("table");
            Some(conn)
        }
        _ => return usage(),
    };
    if let Some(conn) = db.as_ref().filter(|_| mode.starts_with("kept-")) {
        kept(n, program, conn, mode == "kept-flush");
        return ExitCode::SUCCESS;
    }
    for _ in 0..n {
        let status = Command::new(program).status().expect("spawn the program");
        if let Some(conn) = &db {
            let code = status.code().unwrap_or(-1);
            conn.execute("INSERT INTO t (v) VALUES (?1)", [code]).expect("commit");
        }
    }
    ExitCode::SUCCESS
}

/// `kept-record` and `kept-flush` (see the module documentation), on one connection as waymark
/// does: with `flush`, the end's commit is synced (synchronous=FULL around it), the pid's not.
fn kept(n: u64, program: &str, conn: &rusqlite::Connection, flush: bool) {
    use std::os::unix::process::CommandExt;
    let sync = |level: &str| conn.pragma_update(None, "synchronous", level).expect("synchronous");
    if flush {
        sync("NORMAL");
    }
    for _ in 0..n {
        let child = Command::new(program)
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the program");
        conn.execute("INSERT INTO t (v) VALUES (?1)", [child.id()]).expect("commit the pid");
        // Both pipes read to their end on this thread (poll), then the child waited for.
        let out = child.wait_with_output().expect("read the output");
        if flush {
            sync("FULL");
        }
        conn.execute("INSERT INTO t (v) VALUES (?1)", [out.status.code().unwrap_or(-1)]).expect("commit the end");
        if flush {
            sync("NORMAL");
        }
    }
}

fn pause(args: &[String]) -> ExitCode {
    let (Some(n), Some(wait), Some(program)) = (
        args.first().and_then(|n| n.parse::<u64>().ok()),
        args.get(1)
            .and_then(|ms| ms.parse::<f64>().ok())
            .and_then(|ms| std::time::Duration::try_from_secs_f64(ms / 1000.0).ok()),
        args.get(2),
    ) else {
        eprintln!("usage: waymark-floor pause N MS PROGRAM [ARG...]");
        return ExitCode::from(2);
    };
    for i in 0..n {
        if i > 0 {
            std::thread::sleep(wait);
        }
        Command::new(program).args(&args[3..]).status().expect("spawn the program");
    }
    ExitCode::SUCCESS
}

fn stamp(args: &[String]) -> ExitCode {
    use std::io::Write;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("a clock after 1970");
    let (Some(file), Some(code)) = (args.first(), args.get(1).and_then(|c| c.parse::<u8>().ok())) else {
        eprintln!("usage: waymark-floor stamp FILE CODE");
        return ExitCode::from(2);
    };
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file).expect("open the stamp file");
    writeln!(f, "{}", now.as_nanos()).expect("write the stamp");
    ExitCode::from(code)
}
