//! A state directory someone else prepared is not trusted (issue 7, defect 2): waymark refuses,
//! with exit 4 and a message naming the path, its owner and mode and what to do, a state
//! directory, database, lock or log directory that is not ours or that group or others can write,
//! and never follows a symlink below the state directory, including one a step planted there.

mod common;

use common::{Env, have_root, stderr};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), None).unwrap();
}

/// `name (uid N)`, as waymark names users.
fn user(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).unwrap() {
        Some(u) => format!("{} (uid {uid})", u.name),
        None => format!("uid {uid}"),
    }
}

const NOBODY: u32 = 65534;

const FLOW: &str = "name = 'f'\n[[step]]\nname = 'a'\nshell = 'echo x >> a.log'\n";

/// An empty state directory of our own, mode 0700.
fn private_state(env: &Env) -> std::path::PathBuf {
    let state = env.state();
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    state
}

fn run_exits_4_with(env: &Env, expected: &str) {
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(stderr(&out), expected);
    assert_eq!(env.count("a.log"), 0, "nothing ran");
}

fn symlink_message(what: &str, path: &Path, target: &Path) -> String {
    format!(
        "error: refusing to use the {what} {p}: it is a symbolic link (to {t}); waymark never follows links \
         inside its state directory: remove it (`rm {p}`), or choose another state directory with \
         --state-dir or WAYMARK_STATE_DIR\n",
        p = path.display(),
        t = target.display()
    )
}

#[test]
fn a_symlink_planted_at_the_lock_file_is_refused_and_its_target_kept() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let state = private_state(&env);
    std::fs::create_dir(state.join("locks")).unwrap();
    chmod(&state.join("locks"), 0o700);
    let victim = env.write("victim", "secret\n");
    let lock = state.join("locks/f.lock");
    symlink(&victim, &lock).unwrap();
    run_exits_4_with(&env, &symlink_message("lock file", &lock, &victim));
    assert_eq!(env.read("victim"), "secret\n", "the link's target was not written");

    std::fs::remove_file(&lock).unwrap();
    // A directory there is said to be one (not a permission to fix).
    std::fs::create_dir(&lock).unwrap();
    run_exits_4_with(
        &env,
        &format!(
            "error: refusing to use the lock file {}: it is a directory; remove it, or choose another state \
             directory with --state-dir or WAYMARK_STATE_DIR\n",
            lock.display()
        ),
    );
    std::fs::remove_dir(&lock).unwrap();
    env.cmd(&["run", "flow.toml"]).assert().success();
    assert_eq!(env.count("a.log"), 1);
}

#[test]
fn symlinked_locks_or_logs_directories_are_refused() {
    for (name, what) in [("locks", "lock directory"), ("logs", "log directory")] {
        let env = Env::new();
        env.write("flow.toml", FLOW);
        let state = private_state(&env);
        let elsewhere = env.path("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, state.join(name)).unwrap();
        run_exits_4_with(&env, &symlink_message(what, &state.join(name), &elsewhere));
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was written through {name}");
        // Looking is refused the same way: it would read what someone else put there.
        let out = env.cmd(&["history"]).output().unwrap();
        assert_eq!((out.status.code(), stderr(&out)), (Some(4), symlink_message(what, &state.join(name), &elsewhere)));
    }
}

#[test]
fn a_group_writable_state_directory_is_refused_and_0755_is_fine() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let state = private_state(&env);
    chmod(&state, 0o775);
    let me = user(nix::unistd::geteuid().as_raw());
    let expected = format!(
        "error: refusing to use the state directory {s}: its owner is {me}, but its mode 0775 lets its group \
         write to it; waymark keeps the commands it runs there, so no one but you may change it: fix it with \
         `chmod go-w {s}`, or choose another state directory with --state-dir or WAYMARK_STATE_DIR\n",
        s = state.display()
    );
    run_exits_4_with(&env, &expected);
    // Given through a symbolic link, the directory it leads to is named: `chmod` (or `chown -R`)
    // of the link would change the link alone.
    let link = env.path("link");
    symlink(&state, &link).unwrap();
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_STATE_DIR", &link).output().unwrap();
    let canonical = std::fs::canonicalize(&state).unwrap();
    let resolved = expected.replace(&state.display().to_string(), &canonical.display().to_string());
    assert_eq!((out.status.code(), stderr(&out)), (Some(4), resolved));
    chmod(&state, 0o755);
    env.cmd(&["run", "flow.toml"]).assert().success();
    assert_eq!(env.count("a.log"), 1);
}

#[test]
fn a_step_that_plants_a_symlink_for_a_later_steps_log_directory_is_refused() {
    let env = Env::new();
    let victim = env.path("victim");
    std::fs::create_dir(&victim).unwrap();
    env.write(
        "flow.toml",
        &format!(
            "name = 'plant'\n[[step]]\nname = 'a'\nshell = 'echo x >> a.log; [ -e planted ] || {{ touch planted; ln -s {v} \"$WAYMARK_STATE_DIR/logs/$WAYMARK_RUN_ID/b\"; }}'\n\
             [[step]]\nname = 'b'\nshell = 'echo x >> b.log'\n",
            v = victim.display()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let run = std::fs::read_dir(env.state().join("logs")).unwrap().next().unwrap().unwrap().path();
    let link = run.join("b");
    let expected = format!(
        "error: run {id} stopped; `waymark run` resumes it once the cause is fixed: cannot write attempt files: \
         {l} is a symbolic link (to {v}); waymark never follows links inside its state directory: remove it \
         (`rm {l}`) and run again\n",
        id = run.file_name().unwrap().to_str().unwrap(),
        l = link.display(),
        v = victim.display()
    );
    assert!(stderr(&out).ends_with(&expected), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0, "nothing was written through the link");
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 0));

    std::fs::remove_file(&link).unwrap();
    env.cmd(&["run", "flow.toml"]).assert().success();
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1), "each step ran once");
}

#[test]
fn an_attempt_that_swaps_its_own_log_directory_for_a_symlink_is_refused() {
    let env = Env::new();
    let victim = env.path("victim");
    std::fs::create_dir(&victim).unwrap();
    env.write(
        "flow.toml",
        &format!(
            "name = 'swap'\n[[step]]\nname = 's'\nretry = {{ attempts = 2 }}\n\
             shell = 'echo x >> s.log; [ $WAYMARK_ATTEMPT -ge 2 ] && exit 0; d=$(dirname \"$WAYMARK_ERROR_FILE\"); rm -rf \"$d\"; ln -s {v} \"$d\"; exit 1'\n",
            v = victim.display()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("is a symbolic link (to {}); waymark never follows links", victim.display())),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0, "nothing was written or deleted through the link");
    assert_eq!(env.count("s.log"), 1);
}

/// What waymark says of a `what` at `path` (mode `mode`) that belongs to nobody, to root.
fn owned_by_nobody(what: &str, path: &std::path::Path, mode: &str) -> String {
    format!(
        "error: refusing to use the {what} {p}: its owner is {nobody} (mode {mode}), but you are {me}; \
         waymark keeps the commands it runs there, so it uses only state that you own and no one else can write: \
         choose a state directory of your own with --state-dir or WAYMARK_STATE_DIR, or, if its contents are yours, \
         take it over with `chown -R root {p}`\n",
        p = path.display(),
        nobody = user(NOBODY),
        me = user(0)
    )
}

#[test]
fn a_state_directory_owned_by_another_user_is_refused() {
    if !have_root("a_state_directory_owned_by_another_user_is_refused", "chown to another user") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let state = private_state(&env);
    chmod(&state, 0o755);
    chown(&state, NOBODY);
    let expected = owned_by_nobody("state directory", &state, "0755");
    run_exits_4_with(&env, &expected);
    chown(&state, 0);
    env.cmd(&["run", "flow.toml"]).assert().success();
}

#[test]
fn a_database_planted_by_another_user_is_refused_and_its_run_not_resumed() {
    if !common::have_crash_hook("a_database_planted_by_another_user_is_refused_and_its_run_not_resumed") {
        return;
    }
    if !have_root("a_database_planted_by_another_user_is_refused_and_its_run_not_resumed", "chown to another user") {
        return;
    }
    let env = Env::new();
    // A run killed between its steps: `b` would run on resume.
    env.write("flow.toml", "name = 'f'\n[[step]]\nname = 'a'\nshell = 'echo x >> a.log'\n[[step]]\nname = 'b'\nshell = 'echo x >> b.log'\n");
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "a").output().unwrap();
    assert_eq!(out.status.code(), None, "{}", stderr(&out));
    let db = env.state().join("waymark.db");
    chown(&db, NOBODY);
    let expected = owned_by_nobody("state database", &db, "0600");
    for args in [&["run", "flow.toml"][..], &["status"], &["history"]] {
        let out = env.cmd(args).output().unwrap();
        assert_eq!((out.status.code(), stderr(&out)), (Some(4), expected.clone()), "{args:?}");
    }
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 0), "the planted run was not resumed");
}

#[test]
fn an_error_file_behind_a_step_directory_replaced_by_a_link_is_not_read() {
    let env = Env::new();
    let elsewhere = env.path("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    env.write("elsewhere/attempt-1.error.json", r#"{"type": "Planted"}"#);
    env.write(
        "flow.toml",
        &format!(
            "name = 'swap'\n[[step]]\nname = 's'\n\
             shell = 'd=$(dirname \"$WAYMARK_ERROR_FILE\"); rm -rf \"$d\"; ln -s {e} \"$d\"; exit 1'\n",
            e = elsewhere.display()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]\n"),
        "{err}"
    );
    assert!(!err.contains("Planted"), "{err}");
}
