//! Flow identity: without a `name` key a flow is its file (two files with the same stem in
//! different directories never share runs or a lock); with one, files of that name share runs.
//! Stale runs: `resume_within`. Old databases: runs recorded by schema 1 keep working.

mod common;

use common::{Env, SCHEMA, UNDO_SCHEMA_9, finish, kill, wait_until};
use serde_json::Value;

/// A flow whose step `a` records that it ran and whose step `b` writes `NAME.ready` and then
/// waits until the file `go` exists.
fn gated(tag: &str) -> String {
    format!(
        "[[step]]\nname = \"a\"\nshell = \"echo {tag} >> ../a.log\"\n\
         [[step]]\nname = \"b\"\nshell = \"echo {tag} >> ../b.log; touch ../{tag}.ready; \
         while [ ! -e ../go ]; do sleep 0.05; done\"\n"
    )
}

fn json(env: &Env, args: &[&str]) -> Value {
    let out = env.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `waymark run nightly.toml` inside `dir` of the temp dir.
fn run_in(env: &Env, dir: &str) -> assert_cmd::Command {
    let mut cmd = env.cmd(&["run", "nightly.toml"]);
    cmd.current_dir(env.path(dir));
    cmd
}

fn spawn_in(env: &Env, dir: &str, args: &[&str]) -> std::process::Child {
    std::process::Command::new(assert_cmd::cargo::cargo_bin("waymark"))
        .current_dir(env.path(dir))
        .env("WAYMARK_STATE_DIR", env.state())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Replace each run id (8 characters after "run ") by `ID`.
fn normalise(text: &str, ids: &[&str]) -> String {
    ids.iter().fold(text.to_owned(), |t, id| t.replace(id, "ID"))
}

/// What a command wrote on stderr, waymark's lines without their times (and the date line), with
/// pids and durations normalised.
fn stderr(out: &std::process::Output) -> String {
    common::normalise_plain(&common::untimed(&common::stderr(out)))
}

fn two_same_stem_flows(env: &Env) {
    env.write("app1/nightly.toml", &gated("app1"));
    env.write("app2/nightly.toml", &gated("app2"));
}

#[test]
fn same_stem_flows_in_different_directories_run_in_sequence_without_sharing_runs() {
    let env = Env::new();
    two_same_stem_flows(&env);
    // app1 is interrupted (its runner killed) in step b.
    let runner = spawn_in(&env, "app1", &["run", "nightly.toml"]);
    wait_until("app1 to reach step b", || env.path("app1.ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);

    // app2 does not resume app1's run: it runs its own steps, from the start.
    std::fs::write(env.path("go"), "").unwrap();
    let out = run_in(&env, "app2").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("resuming"), "{}", stderr(&out));
    assert_eq!(env.read("a.log"), "app1\napp2\n");
    assert_eq!(env.read("b.log"), "app1\napp2\n");

    // Each file has its own history; the display name is the stem for both.
    let app1 = std::fs::canonicalize(env.path("app1/nightly.toml")).unwrap();
    let app2 = std::fs::canonicalize(env.path("app2/nightly.toml")).unwrap();
    let h1 = json(&env, &["history", "app1/nightly.toml", "--json"]);
    let h2 = json(&env, &["history", &app2.display().to_string(), "--json"]);
    let summary = |h: &Value| -> Vec<(String, String, String)> {
        h.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["flow"].as_str().unwrap().into(),
                    r["path"].as_str().unwrap().into(),
                    r["status"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    assert_eq!(summary(&h1), vec![("nightly".into(), app1.display().to_string(), "running".into())]);
    assert_eq!(summary(&h2), vec![("nightly".into(), app2.display().to_string(), "succeeded".into())]);

    // The name alone is ambiguous: both flows are listed, newest first, and nothing is guessed.
    for args in [&["history", "nightly"][..], &["status", "nightly"][..]] {
        let out = env.cmd(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "error: 2 flows are named `nightly`; name one by its flow file's path (or give a run id) instead:\n  \
                 {}\n  {}\n",
                app2.display(),
                app1.display()
            )
        );
        assert!(out.stdout.is_empty());
    }

    // app1 then resumes its own run: step a is not run again, b is redelivered.
    let id1 = h1[0]["id"].as_str().unwrap().to_owned();
    let out = run_in(&env, "app1").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = normalise(&stderr(&out), &[&id1]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "waymark: resuming run ID of nightly: 1 of 2 steps done",
            "waymark: a: already succeeded, skipped",
            "waymark: b: started",
            "waymark: b: attempt 1/1 started (pid PID, redelivered)"
        ],
        "{err}"
    );
    assert_eq!(lines.last(), Some(&"waymark: run ID succeeded in DURATION"), "{err}");
    assert_eq!(env.read("a.log"), "app1\napp2\n");
    assert_eq!(env.read("b.log"), "app1\napp2\napp1\n");
    let status = json(&env, &["status", "app1/nightly.toml", "--json"]);
    assert_eq!((status["id"].as_str().unwrap(), status["status"].as_str().unwrap()), (id1.as_str(), "succeeded"));
}

#[test]
fn same_stem_flows_in_different_directories_run_concurrently() {
    let env = Env::new();
    two_same_stem_flows(&env);
    let first = spawn_in(&env, "app1", &["run", "nightly.toml"]);
    wait_until("app1 to reach step b", || env.path("app1.ready").exists());
    // app1's runner holds its lock and waits in step b; app2 is another flow with another lock.
    let second = spawn_in(&env, "app2", &["run", "nightly.toml"]);
    wait_until("app2 to reach step b", || env.path("app2.ready").exists());
    std::fs::write(env.path("go"), "").unwrap();
    let (first, second) = (finish(first), finish(second));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert!(!stderr(&second).contains("already running"), "{}", stderr(&second));
    let mut runs: Vec<String> = json(&env, &["history", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r["path"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    runs.sort();
    let canon = |p: &str| std::fs::canonicalize(env.path(p)).unwrap().display().to_string();
    assert_eq!(runs, vec![canon("app1/nightly.toml") + " succeeded", canon("app2/nightly.toml") + " succeeded"]);
    // Two lock files, one per file, named after the stem and a hash of the path.
    let mut locks: Vec<String> = std::fs::read_dir(env.state().join("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    locks.sort();
    assert_eq!(locks.len(), 2, "{locks:?}");
    assert_ne!(locks[0], locks[1]);
    assert!(locks.iter().all(|l| l.starts_with("nightly@") && l.ends_with(".lock")), "{locks:?}");
}

#[test]
fn files_that_declare_the_same_name_share_runs_and_say_so() {
    let env = Env::new();
    let flow = |tag: &str| format!("name = \"shared\"\n{}", gated(tag));
    env.write("app1/nightly.toml", &flow("app1"));
    env.write("app2/nightly.toml", &flow("app2"));
    let runner = spawn_in(&env, "app1", &["run", "nightly.toml"]);
    wait_until("app1 to reach step b", || env.path("app1.ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);

    std::fs::write(env.path("go"), "").unwrap();
    let out = run_in(&env, "app2").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = json(&env, &["history", "shared", "--json"])[0]["id"].as_str().unwrap().to_owned();
    let app1 = std::fs::canonicalize(env.path("app1/nightly.toml")).unwrap();
    let first_line = stderr(&out).lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        first_line,
        format!(
            "waymark: run {id} of flow `shared` was started from {}; resuming it with the definition recorded then, \
             in this file's directory (files that declare the same `name` share runs; use --fresh to start over with \
             nightly.toml)",
            app1.display()
        )
    );
    // Not followed by a notice that nightly.toml changed: it is another file, whose text differs.
    assert!(!stderr(&out).contains("changed since run"), "{}", stderr(&out));
    // The recorded definition (app1's) ran: app2's steps did not.
    assert_eq!(env.read("b.log"), "app1\napp1\n");
    assert_eq!(json(&env, &["history", "shared", "--json"]).as_array().unwrap().len(), 1);
}

/// A run resumed from a file of the same `name` at another path (the next release's directory,
/// another host's checkout; here the first directory is gone): its steps run in the new file's
/// directory, and the env file there is read, as a run started there would; a path outside the
/// old directory stays as recorded.
#[test]
fn a_run_resumed_from_a_moved_file_runs_in_the_new_file_s_directory() {
    let env = Env::new();
    let flow = "name = \"release\"\nenv_file = \".env\"\n\
                [[step]]\nname = \"a\"\nshell = \"echo a >> ../a.log\"\n\
                [[step]]\nname = \"b\"\nworkdir = \"work\"\n\
                shell = \"echo $(pwd) $FROM >> ../../b.log; [ -e ../../go ] || { touch ../../ready; sleep 300; }\"\n";
    for dir in ["r1", "r2"] {
        env.write(&format!("{dir}/nightly.toml"), flow);
        env.write(&format!("{dir}/.env"), &format!("FROM={dir}\n"));
        std::fs::create_dir_all(env.path(&format!("{dir}/work"))).unwrap();
    }
    let runner = spawn_in(&env, "r1", &["run", "nightly.toml"]);
    wait_until("step b to start in r1", || env.path("ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);
    let r1 = std::fs::canonicalize(env.path("r1")).unwrap();
    std::fs::remove_dir_all(env.path("r1")).unwrap();
    std::fs::write(env.path("go"), "").unwrap();
    let out = run_in(&env, "r2").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r2 = std::fs::canonicalize(env.path("r2")).unwrap();
    assert_eq!(
        env.read("b.log"),
        format!("{}/work r1\n{}/work r2\n", r1.display(), r2.display()),
        "attempt 1 in r1, the resumed one in r2 with r2's env file"
    );
    assert_eq!(env.read("a.log"), "a\n", "the step that succeeded in r1 is not run again");
}

/// Make run `id` look `ms` milliseconds older.
fn backdate(env: &Env, id: &str, ms: i64) {
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    let n =
        db.execute("UPDATE runs SET started_at = started_at - ?2 WHERE id = ?1", rusqlite::params![id, ms]).unwrap();
    assert_eq!(n, 1);
}

const STALE: &str = "resume_within = \"1h\"\n[[step]]\nname = \"a\"\nshell = \"echo x >> a.log\"\n\
                     [[step]]\nname = \"b\"\nshell = \"echo x >> b.log; [ -e go ] || { touch ready; sleep 300; }\"\n";

/// Run `flow.toml` until step b waits, kill the runner; the run's id.
fn interrupted_run(env: &Env) -> String {
    interrupted_run_of(env, "flow.toml")
}

/// Run the flow file `file` until step b waits, kill the runner; the run's id.
fn interrupted_run_of(env: &Env, file: &str) -> String {
    let runner = env.spawn(&["run", file]);
    wait_until("step b to start", || env.path("ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);
    json(env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned()
}

#[test]
fn a_run_older_than_resume_within_is_abandoned_and_a_new_run_starts() {
    let env = Env::new();
    env.write("flow.toml", STALE);
    let old = interrupted_run(&env);
    backdate(&env, &old, 2 * 3600 * 1000);

    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let runs = json(&env, &["history", "--json"]);
    let new = runs[0]["id"].as_str().unwrap().to_owned();
    let err = normalise(&stderr(&out), &[&old]).replace(&new, "NEW");
    assert_eq!(
        err,
        "waymark: warning: b: killed 2 leftover process(es) of attempt 1 from the previous runner\n\
         waymark: abandoned unfinished run ID of flow `flow`: it started 2h ago, longer than resume_within = 1h in \
         flow.toml; starting a new run (`waymark status ID` shows the abandoned one)\n\
         waymark: run NEW of flow: 2 step(s)\n\
         waymark: a: started\n\
         waymark: a: attempt 1/1 started (pid PID)\n\
         waymark: a: attempt 1/1 succeeded\n\
         waymark: a: succeeded (1 attempt)\n\
         waymark: b: started\n\
         waymark: b: attempt 1/1 started (pid PID)\n\
         waymark: b: attempt 1/1 succeeded\n\
         waymark: b: succeeded (1 attempt)\n\
         waymark: steps of run NEW:\n\
         \x20 STEP  STATUS  ATTEMPTS    DURATION  DETAIL\n\
         \x20 a     ok           1/1    DURATION\n\
         \x20 b     ok           1/1    DURATION\n\
         waymark: run NEW succeeded in DURATION\n"
    );
    // The old run's leftover (sleep 300) was killed, and every step ran again in the new run.
    assert_eq!((env.count("a.log"), env.count("b.log")), (2, 2));
    let statuses: Vec<&str> = runs.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["succeeded", "abandoned"]);
    // As the line says: `status` shows the abandoned run; it cannot be resumed (the line said it
    // could, once).
    let status = json(&env, &["status", &old, "--json"]);
    assert_eq!(status["status"], "abandoned");
    let resume = env.cmd(&["resume", &old]).output().unwrap();
    assert_eq!(resume.status.code(), Some(2));
    assert_eq!(
        normalise(&stderr(&resume), &[&old]),
        "error: run ID was abandoned and cannot be resumed; `waymark run` starts a new one\n"
    );
}

#[test]
fn a_run_younger_than_resume_within_is_resumed() {
    let env = Env::new();
    env.write("flow.toml", STALE);
    let old = interrupted_run(&env);
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        normalise(&stderr(&out), &[&old]).lines().next(),
        Some("waymark: resuming run ID of flow: 1 of 2 steps done")
    );
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 2));
}

#[test]
fn waymark_resume_ignores_resume_within() {
    let env = Env::new();
    env.write("flow.toml", STALE);
    let old = interrupted_run(&env);
    backdate(&env, &old, 2 * 3600 * 1000);
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["resume", &old]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("abandoned"), "{}", stderr(&out));
    assert_eq!(
        normalise(&stderr(&out), &[&old]).lines().next(),
        Some("waymark: resuming run ID of flow: 1 of 2 steps done")
    );
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 2));
    assert_eq!(json(&env, &["history", "--json"]).as_array().unwrap().len(), 1);
}

/// Turn the state database back into schema 1, as the binary before flow identity wrote it: no
/// `flow_key` column (nor an attempt's `host`, from schema 3, nor a run's lease, from schema 4, nor
/// a step's outputs, from schema 5, nor the index of unfinished runs, from schema 7, nor the lease
/// index, from schema 8, nor the definitions table, from schema 9), `user_version` 1.
fn downgrade_to_schema_1(env: &Env) {
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    db.execute_batch(&format!(
        "{UNDO_SCHEMA_9} DROP INDEX runs_lease; DROP INDEX runs_unfinished; ALTER TABLE attempts DROP COLUMN kind; ALTER TABLE steps DROP COLUMN outputs; ALTER TABLE runs DROP COLUMN lease_owner; ALTER TABLE runs DROP COLUMN lease_token; \
         ALTER TABLE attempts DROP COLUMN host; DROP INDEX runs_by_key; ALTER TABLE runs DROP COLUMN flow_key; \
         PRAGMA user_version = 1;",
    ))
    .unwrap();
}

#[test]
fn runs_recorded_by_schema_1_are_read_and_resumed() {
    let env = Env::new();
    // Schema 1 knew runs by name only. `legacy.toml` has no `name`, `other.toml` declares one.
    let flow = |name: &str| {
        format!(
            "{name}[[step]]\nname = \"a\"\nshell = \"echo x >> a.log\"\n\
             [[step]]\nname = \"b\"\nshell = \"echo x >> b.log; [ -e go ] || {{ touch ready; sleep 300; }}\"\n"
        )
    };
    env.write("legacy.toml", &flow(""));
    env.write("other.toml", &flow("name = \"shared\"\n"));
    let mut ids = Vec::new();
    for file in ["legacy.toml", "other.toml"] {
        let _ = std::fs::remove_file(env.path("ready"));
        let runner = env.spawn(&["run", file]);
        wait_until("step b to start", || env.path("ready").exists());
        kill(runner.id(), "KILL");
        finish(runner);
        ids.push(json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned());
    }
    downgrade_to_schema_1(&env);

    // Looking does not migrate (it writes nothing) and still finds the runs by name and by file.
    assert_eq!(json(&env, &["status", "legacy", "--json"])["id"], ids[0].as_str());
    assert_eq!(json(&env, &["status", "legacy.toml", "--json"])["id"], ids[0].as_str());
    assert_eq!(json(&env, &["history", "shared", "--json"])[0]["id"], ids[1].as_str());
    let version = |env: &Env| -> i64 {
        let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
        db.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(version(&env), 1);

    // A runner migrates: the file's old run belongs to the file, the named one to its name.
    std::fs::write(env.path("go"), "").unwrap();
    for (file, id) in ["legacy.toml", "other.toml"].iter().zip(&ids) {
        let out = env.cmd(&["run", file]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let name = if *file == "legacy.toml" { "legacy" } else { "shared" };
        assert_eq!(
            stderr(&out).lines().next(),
            Some(format!("waymark: resuming run {id} of {name}: 1 of 2 steps done").as_str())
        );
    }
    assert_eq!(version(&env), SCHEMA, "migrated to the current schema");
    assert_eq!((env.count("a.log"), env.count("b.log")), (2, 4));
    let statuses: Vec<String> = json(&env, &["history", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["succeeded", "succeeded"]);
}

/// `same.toml` of [`STALE`] declaring `name`, its runner SIGKILLed in step b; the run's id.
fn killed_in_step_b(env: &Env, name: &str) -> String {
    env.write("same.toml", &STALE.replace("resume_within = \"1h\"\n", &format!("name = \"{name}\"\n")));
    interrupted_run_of(env, "same.toml")
}

#[test]
fn a_run_of_the_same_file_and_name_under_the_other_kind_of_key_is_resumed() {
    // Schema 1 cannot tell a declared name equal to the file's stem from the default name: such a
    // run is migrated as the file's. It is still this flow's run (same file, same name), so
    // `waymark run` resumes it instead of running its succeeded steps again.
    let env = Env::new();
    let old = killed_in_step_b(&env, "same");
    downgrade_to_schema_1(&env);

    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "same.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = std::fs::canonicalize(env.path("same.toml")).unwrap();
    let err = normalise(&stderr(&out), &[&old]);
    let lines: Vec<&str> = err.lines().take(2).collect();
    assert_eq!(
        lines,
        [
            format!(
                "waymark: run ID of {0} was recorded under path:{0} (a declared `name` equal to the file's stem and \
                 the default name are the same flow); resuming it",
                path.display()
            )
            .as_str(),
            "waymark: resuming run ID of same: 1 of 2 steps done"
        ]
    );
    // Step a ran once; b once killed, once to the end. One run, finished.
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 2));
    let statuses: Vec<String> = json(&env, &["history", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["succeeded"]);
}

#[test]
fn a_run_of_the_same_file_under_another_name_is_named_not_resumed() {
    // The file's `name` changed since: another flow's run, which `waymark run` names, not resumes.
    let env = Env::new();
    let old = killed_in_step_b(&env, "before");

    env.write("same.toml", STALE.replace("resume_within = \"1h\"\n", "name = \"after\"\n").as_str());
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "same.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = std::fs::canonicalize(env.path("same.toml")).unwrap();
    assert_eq!(
        normalise(&stderr(&out), &[&old]).lines().next(),
        Some(
            format!(
                "waymark: unfinished run ID of {} belongs to the flow name `before`, not to this flow (its `name` key \
                 changed since, or the run predates flow identity), so it is not resumed; `waymark resume ID` \
                 resumes it",
                path.display()
            )
            .as_str()
        )
    );
    let out = env.cmd(&["resume", &old]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!((env.count("a.log"), env.count("b.log")), (2, 3));
}

#[test]
fn a_run_of_a_flow_file_that_was_moved_is_named_not_silently_left() {
    let env = Env::new();
    env.write("x/nightly.toml", &gated("x"));
    let runner = spawn_in(&env, "x", &["run", "nightly.toml"]);
    wait_until("x to reach step b", || env.path("x.ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);
    let old = json(&env, &["status", "--json"])["id"].as_str().unwrap().to_owned();
    std::fs::create_dir(env.path("y")).unwrap();
    std::fs::rename(env.path("x/nightly.toml"), env.path("y/nightly.toml")).unwrap();

    // The moved file is another flow: it starts anew, and says where the old run is.
    std::fs::write(env.path("go"), "").unwrap();
    let out = run_in(&env, "y").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let gone = env.dir.path().canonicalize().unwrap().join("x/nightly.toml");
    let first = stderr(&out).lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        first,
        format!(
            "waymark: unfinished run {old} of flow `nightly` was started from {}, which is gone; a flow without a \
             `name` key is its file, so it is not resumed here: `waymark resume {old}` resumes it (or declare the \
             same `name` in both places to share runs)",
            gone.display()
        )
    );
    // `waymark resume` still finishes the old run.
    env.cmd(&["resume", &old]).assert().success();
    assert_eq!(env.read("b.log"), "x\nx\nx\n");
}

/// Without a `name`, the file's stem is only the flow's display name: a file named as people name
/// files (`nightly backup.toml`) runs and is looked up by its path, as any file is; a stem no line
/// can show (a control character) is refused, naming it.
#[test]
fn a_flow_file_whose_stem_is_no_flow_name_runs_under_its_stem() {
    let env = Env::new();
    let step = "[[step]]\nname = 'a'\nshell = 'echo \"$WAYMARK_FLOW\" >> ran'\n";
    env.write("nightly backup.toml", step);
    env.cmd(&["run", "-q", "nightly backup.toml"]).assert().success().stdout("").stderr("");
    assert_eq!(env.read("ran"), "nightly backup\n");
    let history = json(&env, &["history", "./nightly backup.toml", "--json"]);
    assert_eq!(
        (history[0]["flow"].as_str(), history[0]["status"].as_str()),
        (Some("nightly backup"), Some("succeeded"))
    );
    // Its name, as `history` shows it, finds it too.
    assert_eq!(json(&env, &["history", "nightly backup", "--json"]), history);
    let tab = env.write("bad\tname.toml", step);
    env.cmd(&["check", tab.to_str().unwrap()]).assert().code(2).stdout("").stderr(format!(
        "error: the file name `bad\u{2409}name` cannot name the flow: it holds a character that a line cannot show \
         as it is (a control character, one that reorders text, or a byte that is not UTF-8)\n--> {file}\n = help: set `name = \"...\"` at the top of the file (letters, digits, `_`, `.`, `-`; at most 250 \
         bytes)\n\nerror: {file} is not a valid flow (1 error); nothing was run\n",
        file = env.path("bad\u{2409}name.toml").display()
    ));
}
