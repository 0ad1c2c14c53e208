//! Spawning a child by `posix_spawn(3)` with an environment built by waymark, and waiting for it
//! on the runner's event loop through a pidfd.
//!
//! std's `Command` copies the runner's whole environment into a map, and the map into new C
//! strings, for every spawn that sets a variable: with 36 inherited variables, a fifth of the
//! runner's instructions per attempt went there (callgrind, a run of 200 failing attempts). Here
//! the inherited variables become `NAME=value` C strings once per runner ([`BaseEnv`]), a step's
//! own once for the attempts that follow ([`StepEnv`]; the launcher makes them again when the
//! outputs of other steps have changed since), and a spawn makes C strings of the few variables
//! its attempt alone has.
//!
//! The child is started in a session of its own (and so a process group of its own, without a
//! controlling terminal), with SIGPIPE back to its default (the Rust runtime ignores it in the
//! runner), as std's `Command` starts one, and with no signal blocked (the runner unblocks them
//! all when it starts, so that a program std spawns gets the same). Without a terminal, as under
//! cron or systemd, a step that would read one (a password prompt: `sudo`, `ssh`, `git`'s
//! credentials) fails at once, instead of being stopped by SIGTTIN for good in a group the
//! terminal does not read for, and no step can change the terminal's settings through
//! `/dev/tty` or take its foreground (and with it the user's Ctrl-C). As under cron, the step's first process leads its
//! session, so it cannot move itself to another group (`setpgrp` fails with EPERM); its children
//! can.

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::{CString, OsStr, OsString, c_char};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

/// The environment a child inherits from the runner, as `NAME=value` C strings made once.
pub(crate) struct BaseEnv {
    vars: Vec<(OsString, CString)>,
}

impl BaseEnv {
    /// The runner's environment, without the variables `skip` names. A name the runner got twice
    /// is passed on once, with its last value (as std's `Command` passed it on).
    pub(crate) fn capture(skip: impl Fn(&OsStr) -> bool) -> BaseEnv {
        BaseEnv::of(std::env::vars_os().filter(|(name, _)| !skip(name)))
    }

    fn of(inherited: impl Iterator<Item = (OsString, OsString)>) -> BaseEnv {
        let mut vars: Vec<(OsString, CString)> = Vec::new();
        for (name, value) in inherited {
            // A variable the runner inherited cannot hold a NUL byte; none is left out.
            let Ok(entry) = entry(name.as_bytes(), value.as_bytes()) else { continue };
            match vars.iter_mut().find(|(seen, _)| *seen == name) {
                Some(var) => var.1 = entry,
                None => vars.push((name, entry)),
            }
        }
        BaseEnv { vars }
    }

    /// A step's environment, made once for the attempts that follow: the inherited variables,
    /// then `fixed` over them (a later one of the same name wins), leaving out the names in
    /// `late`, which each attempt sets itself ([`StepEnv::child`]). An error if a name or value of
    /// `fixed` holds a NUL byte.
    pub(crate) fn prepare(&self, fixed: &[(String, String)], late: &'static [&'static str]) -> io::Result<StepEnv> {
        // The last setting of each name, in the order the names were first set.
        let mut last: Vec<&(String, String)> = Vec::with_capacity(fixed.len());
        for var in fixed.iter().filter(|(name, _)| !late.contains(&name.as_str())) {
            match last.iter_mut().find(|v| v.0 == var.0) {
                Some(slot) => *slot = var,
                None => last.push(var),
            }
        }
        let own = last
            .iter()
            .map(|(name, value)| entry(name.as_bytes(), value.as_bytes()))
            .collect::<io::Result<Vec<CString>>>()?;
        // The names set here, sorted: each inherited name is looked up among them.
        let mut names: Vec<&[u8]> = last.iter().map(|(name, _)| name.as_bytes()).collect();
        names.extend(late.iter().map(|name| name.as_bytes()));
        names.sort_unstable();
        let inherited = (self.vars.iter().enumerate())
            .filter(|(_, (name, _))| names.binary_search(&name.as_bytes()).is_err())
            .map(|(i, _)| i)
            .collect();
        Ok(StepEnv { inherited, own, late })
    }
}

/// `NAME=value` as a C string, or the error std's spawn gives for a NUL byte.
fn entry(name: &[u8], value: &[u8]) -> io::Result<CString> {
    let mut entry = Vec::with_capacity(name.len() + 1 + value.len() + 1);
    entry.extend_from_slice(name);
    entry.push(b'=');
    entry.extend_from_slice(value);
    c_string(entry)
}

/// A step's part of its children's environment ([`BaseEnv::prepare`]): which inherited variables
/// it keeps, and its own variables as C strings.
pub(crate) struct StepEnv {
    /// Indexes into the [`BaseEnv`] it was made from, in its order.
    inherited: Vec<usize>,
    own: Vec<CString>,
    /// The names an attempt sets itself, left out of both.
    late: &'static [&'static str],
}

impl StepEnv {
    /// The environment of one child: `base` (the one this was prepared from) as the step keeps it,
    /// the step's own variables, then the attempt's `own`, whose names are among those prepared as
    /// `late` and set once each. An error if a name or value of `own` holds a NUL byte.
    pub(crate) fn child<'a>(&'a self, base: &'a BaseEnv, own: &[(String, String)]) -> io::Result<ChildEnv<'a>> {
        // A name set here but not prepared as late would be in the environment twice, and
        // `getenv` reads the first: the step's or the runner's value would win over the attempt's.
        debug_assert!(own.iter().all(|(name, _)| self.late.contains(&name.as_str())), "{own:?}");
        let own = own
            .iter()
            .map(|(name, value)| entry(name.as_bytes(), value.as_bytes()))
            .collect::<io::Result<Vec<CString>>>()?;
        let mut envp: Vec<*mut c_char> = Vec::with_capacity(self.inherited.len() + self.own.len() + own.len() + 1);
        envp.extend(self.inherited.iter().map(|&i| base.vars[i].1.as_ptr().cast_mut()));
        envp.extend(self.own.iter().chain(&own).map(|c| c.as_ptr().cast_mut()));
        envp.push(std::ptr::null_mut());
        Ok(ChildEnv { envp, _own: own, _held: std::marker::PhantomData })
    }
}

/// A child's `envp`: pointers into a [`BaseEnv`], a [`StepEnv`] and its own C strings, held here.
pub(crate) struct ChildEnv<'a> {
    envp: Vec<*mut c_char>,
    _own: Vec<CString>,
    _held: std::marker::PhantomData<(&'a BaseEnv, &'a StepEnv)>,
}

/// What to spawn, and where.
pub(crate) struct Spawn<'a> {
    /// The program's path (not looked up on PATH).
    pub(crate) program: &'a Path,
    /// The arguments, `argv[0]` first.
    pub(crate) argv: &'a [String],
    pub(crate) env: &'a ChildEnv<'a>,
    pub(crate) workdir: &'a Path,
    pub(crate) stdin: BorrowedFd<'a>,
    pub(crate) stdout: BorrowedFd<'a>,
    pub(crate) stderr: BorrowedFd<'a>,
}

/// A C string of `bytes`, or the error std's spawn gives for a NUL byte.
fn c_string(bytes: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "nul byte found in provided data"))
}

/// `posix_spawn` attributes, made only once initialised, destroyed when dropped.
struct Attr(libc::posix_spawnattr_t);

impl Attr {
    fn new() -> io::Result<Attr> {
        let mut attr = std::mem::MaybeUninit::uninit();
        // SAFETY: posix_spawnattr_init initialises the storage it is given; it is read only on
        // success.
        check(unsafe { libc::posix_spawnattr_init(attr.as_mut_ptr()) })?;
        Ok(Attr(unsafe { attr.assume_init() }))
    }
}

impl Drop for Attr {
    fn drop(&mut self) {
        // SAFETY: initialised by posix_spawnattr_init (`Attr::new`), destroyed once, here.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

/// `posix_spawn` file actions, made only once initialised, destroyed when dropped.
struct Actions(libc::posix_spawn_file_actions_t);

impl Actions {
    fn new() -> io::Result<Actions> {
        let mut actions = std::mem::MaybeUninit::uninit();
        // SAFETY: as for `Attr::new`.
        check(unsafe { libc::posix_spawn_file_actions_init(actions.as_mut_ptr()) })?;
        Ok(Actions(unsafe { actions.assume_init() }))
    }
}

impl Drop for Actions {
    fn drop(&mut self) {
        // SAFETY: initialised by posix_spawn_file_actions_init (`Actions::new`), destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// A `posix_spawn*` function's result: 0, or the error number itself.
fn check(r: libc::c_int) -> io::Result<()> {
    if r == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(r)) }
}

/// Spawn `s`; the child's pid. An error is the program's failure to start (not found, not
/// executable, its working directory gone...), with the error number `execve` or `chdir` gave.
pub(crate) fn spawn(s: &Spawn) -> io::Result<u32> {
    let program = c_string(s.program.as_os_str().as_bytes())?;
    let workdir = c_string(s.workdir.as_os_str().as_bytes())?;
    let argv = s.argv.iter().map(|a| c_string(a.as_bytes())).collect::<io::Result<Vec<CString>>>()?;
    let mut argp: Vec<*mut c_char> = argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argp.push(std::ptr::null_mut());
    let none = nix::sys::signal::SigSet::empty();
    let mut pipe = nix::sys::signal::SigSet::empty();
    pipe.add(nix::sys::signal::Signal::SIGPIPE);
    // SAFETY (each block below): the posix_spawn functions of libc, given an initialised `Attr`
    // or `Actions` and C strings and arrays that live until `posix_spawn` returns. They are not wrapped by nix with
    // `posix_spawn_file_actions_addchdir_np`, which a step's working directory needs.
    let mut attr = Attr::new()?;
    // A new session is a new process group too (POSIX_SPAWN_SETPGROUP would fail beside it:
    // a session leader cannot change its group).
    let flags = libc::POSIX_SPAWN_SETSID as libc::c_int | libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
    check(unsafe { libc::posix_spawnattr_setflags(&mut attr.0, flags as libc::c_short) })?;
    check(unsafe { libc::posix_spawnattr_setsigmask(&mut attr.0, none.as_ref()) })?;
    check(unsafe { libc::posix_spawnattr_setsigdefault(&mut attr.0, pipe.as_ref()) })?;
    let mut actions = Actions::new()?;
    for (fd, to) in [(s.stdin, 0), (s.stdout, 1), (s.stderr, 2)] {
        check(unsafe { libc::posix_spawn_file_actions_adddup2(&mut actions.0, fd.as_raw_fd(), to) })?;
    }
    check(unsafe { libc::posix_spawn_file_actions_addchdir_np(&mut actions.0, workdir.as_ptr()) })?;
    let mut pid: libc::pid_t = 0;
    check(unsafe {
        libc::posix_spawn(&mut pid, program.as_ptr(), &actions.0, &attr.0, argp.as_ptr(), s.env.envp.as_ptr())
    })?;
    Ok(pid as u32)
}

/// A child of the runner, waited for on the event loop: through a pidfd that becomes readable
/// when it exits, or (a kernel older than 5.3, or a sandbox that refuses `pidfd_open`) a blocking
/// thread of the runtime that waits for it without reaping it.
///
/// Its exit is seen without reaping it ([`Child::try_wait`], [`Child::wait`]): until
/// [`Child::reap`] (or its drop), the dead child keeps its pid, and so its process group's id,
/// from being given to another process. A group signalled after its leader was reaped might be
/// someone else's by then: with pid numbers going round (32768 of them by default), a new
/// process that led a group of the same number (any step's first process does) was killed.
#[derive(Debug)]
pub(crate) struct Child {
    pid: u32,
    exit: Exit,
    status: Option<ExitStatus>,
    reaped: bool,
}

#[derive(Debug)]
enum Exit {
    Pidfd(tokio::io::unix::AsyncFd<OwnedFd>),
    Thread(Option<tokio::task::JoinHandle<()>>),
}

impl Child {
    /// Take charge of child `pid`, spawned by this process and not waited for yet.
    pub(crate) fn new(pid: u32) -> Child {
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1 (nix
        // has no wrapper); the descriptor is owned by the OwnedFd made from it, only on success.
        // No PIDFD_NONBLOCK (Linux 5.10): the descriptor is only polled, never read or waited on.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
        // SAFETY: the pidfd is owned by the AsyncFd, neither replaced nor closed while registered.
        let registered = pidfd
            .map(|fd| unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) });
        match registered {
            Some(Ok(fd)) => Child { pid, exit: Exit::Pidfd(fd), status: None, reaped: false },
            _ => Child::with_thread(pid),
        }
    }

    /// Spawn `cmd` by std's `Command` (a program looked up on PATH), in a session of its own as
    /// [`spawn`] starts one, and take charge of the child.
    #[allow(clippy::zombie_processes, reason = "the child is waited for by its pid, through the Child returned")]
    pub(crate) fn spawned(cmd: &mut std::process::Command) -> io::Result<Child> {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid(2) is async-signal-safe and touches no memory of the parent's, as a
        // `pre_exec` hook must (std has no stable way to ask for a new session).
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(io::Error::from));
        }
        Ok(Child::new(cmd.spawn()?.id()))
    }

    /// A child waited for by a thread (what [`Child::new`] falls back to).
    pub(crate) fn with_thread(pid: u32) -> Child {
        let waiter = tokio::task::spawn_blocking(move || {
            // WNOWAIT: the child stays waitable, reaped by `reap` (or the drop) only.
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
            while let Err(Errno::EINTR) = nix::sys::wait::waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {}
        });
        Child { pid, exit: Exit::Thread(Some(waiter)), status: None, reaped: false }
    }

    pub(crate) fn id(&self) -> u32 {
        self.pid
    }

    /// The child's exit status if it has exited (it is not reaped: see [`Child::reap`]), else
    /// `None`.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let status = match nix::sys::wait::waitid(Id::Pid(Pid::from_raw(self.pid as i32)), flags)? {
            WaitStatus::Exited(_, code) => ExitStatus::from_raw((code & 0xff) << 8),
            WaitStatus::Signaled(_, sig, core) => ExitStatus::from_raw(sig as i32 | if core { 0x80 } else { 0 }),
            _ => return Ok(None),
        };
        self.status = Some(status);
        Ok(Some(status))
    }

    /// Let go of the child once it has exited, its pid free for another process: after the last
    /// signal to its process group.
    pub(crate) fn reap(&mut self) {
        if self.status.is_some() && !self.reaped {
            let _ = nix::sys::wait::waitpid(Pid::from_raw(self.pid as i32), Some(WaitPidFlag::WNOHANG));
            self.reaped = true;
        }
    }

    /// Wait for the child to exit (without reaping it: see [`Child::reap`]).
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            match &mut self.exit {
                Exit::Pidfd(fd) => fd.readable().await?.clear_ready(),
                // Awaited in place: a wait cut short (a timeout, a signal in a `select!`) leaves
                // the thread's handle for the next one.
                Exit::Thread(waiter) => match waiter {
                    Some(handle) => {
                        let joined = handle.await;
                        *waiter = None;
                        joined.map_err(io::Error::other)?;
                    }
                    // The thread saw it exit, yet it is not waitable: someone else reaped it.
                    None => return Err(io::Error::from(Errno::ECHILD)),
                },
            }
        }
    }
}

impl Drop for Child {
    /// A child that exited is reaped when let go of, so that none is left a zombie.
    fn drop(&mut self) {
        let _ = self.try_wait();
        self.reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    fn own(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// Spawn `sh -c script` in `workdir` with `env` over the runner's; its stdout, exit status
    /// and pid.
    async fn run(script: &str, workdir: &Path, env: &[(String, String)]) -> (String, ExitStatus, u32) {
        let base = BaseEnv::capture(|name| name == "WAYMARK_TEST_SKIPPED");
        let step = base.prepare(env, &[]).unwrap();
        let env = step.child(&base, &[]).unwrap();
        let (mut out_r, out_w) = std::io::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let argv = ["sh".to_owned(), "-c".to_owned(), script.to_owned()];
        let pid = spawn(&Spawn {
            program: Path::new("/bin/sh"),
            argv: &argv,
            env: &env,
            workdir,
            stdin: null.as_fd(),
            stdout: out_w.as_fd(),
            stderr: out_w.as_fd(),
        })
        .unwrap();
        drop(out_w);
        let status = Child::new(pid).wait().await.unwrap();
        let mut out = String::new();
        out_r.read_to_string(&mut out).unwrap();
        (out, status, pid)
    }

    #[tokio::test]
    async fn a_child_gets_its_variables_over_the_runner_s_its_directory_and_a_group_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        // A later setting of a name wins; the runner's own variable is replaced, not repeated.
        let env = own(&[("WM_A", "first"), ("WM_B", "b"), ("WM_A", "second"), ("HOME", "/elsewhere")]);
        let script = "echo \"$WM_A $WM_B $HOME\"; env | grep -c '^HOME='; pwd; \
                      cut -d' ' -f1,5 /proc/self/stat; read line || echo stdin empty";
        let (out, status, sh) = run(script, &dir, &env).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&lines[..3], ["second b /elsewhere", "1", dir.to_str().unwrap()], "{out}");
        // `cut`, the shell's child, is in the group the shell leads.
        let (cut, pgid) = lines[3].split_once(' ').unwrap();
        assert_ne!(cut, pgid);
        assert_eq!(pgid, sh.to_string(), "a group of its own");
        assert_eq!(lines[4], "stdin empty");
        assert_eq!(status.code(), Some(0));
    }

    #[tokio::test]
    async fn a_child_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
        // The runtime ignores SIGPIPE in the runner; block a signal here too.
        let mut usr1 = nix::sys::signal::SigSet::empty();
        usr1.add(nix::sys::signal::Signal::SIGUSR1);
        usr1.thread_block().unwrap();
        let (out, _, _) = run("grep -E '^Sig(Blk|Ign)' /proc/self/status", Path::new("/"), &[]).await;
        usr1.thread_unblock().unwrap();
        let mask = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{out}"));
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0, "{out}");
        assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
    }

    #[tokio::test]
    async fn a_child_s_end_is_waited_for_by_pidfd_or_by_a_thread() {
        for by_thread in [false, true] {
            let mut child = Child::spawned(std::process::Command::new("sh").args(["-c", "sleep 0.2; exit 7"])).unwrap();
            if by_thread {
                child = Child::with_thread(child.id());
            }
            assert!(child.try_wait().unwrap().is_none(), "still running");
            assert_eq!(child.wait().await.unwrap().code(), Some(7));
            assert_eq!(child.try_wait().unwrap().map(|s| s.code()), Some(Some(7)), "seen once, kept");
            let mut killed = Child::spawned(std::process::Command::new("sleep").arg("30")).unwrap();
            if by_thread {
                killed = Child::with_thread(killed.id());
            }
            nix::sys::signal::kill(Pid::from_raw(killed.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
            assert_eq!(killed.wait().await.unwrap().signal(), Some(libc::SIGTERM));
        }
    }

    /// `Supervisor::supervise` polls `wait()` inside a `select!`: a timeout, a signal forwarded
    /// or any control message drops the `wait()` future and polls a new one. A child waited for
    /// by a thread (pidfd_open failing: kernels before 5.10 reject PIDFD_NONBLOCK, seccomp
    /// profiles that deny pidfd_open) must still be waited for then, not reported as reaped by
    /// someone else (ECHILD): that made supervise SIGKILL the group at once, skipping
    /// `kill_grace`, and leave the child a zombie.
    #[tokio::test]
    async fn a_child_is_still_waited_for_after_a_wait_was_cut_short() {
        for by_thread in [false, true] {
            let mut child = Child::spawned(std::process::Command::new("sh").args(["-c", "sleep 0.5; exit 7"])).unwrap();
            if by_thread {
                child = Child::with_thread(child.id());
            }
            let cut_short = tokio::time::timeout(std::time::Duration::from_millis(100), child.wait()).await;
            assert!(cut_short.is_err(), "still running after 100ms");
            let status = child.wait().await;
            assert_eq!(status.unwrap().code(), Some(7), "by_thread: {by_thread}");
        }
    }

    /// The `NAME=value` entries of `env`, in its order.
    fn entries(env: &ChildEnv) -> Vec<String> {
        (env.envp[..env.envp.len() - 1].iter())
            // SAFETY: each pointer is to a C string that the base, the step or `env` holds.
            .map(|p| unsafe { std::ffi::CStr::from_ptr(*p) }.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_variable_inherited_twice_is_passed_on_once_with_its_last_value() {
        let pair = |k: &str, v: &str| (OsString::from(k), OsString::from(v));
        let base = BaseEnv::of([pair("DUP", "first"), pair("A", "a"), pair("DUP", "second")].into_iter());
        let step = base.prepare(&own(&[("B", "b")]), &[]).unwrap();
        assert_eq!(entries(&step.child(&base, &[]).unwrap()), ["DUP=second", "A=a", "B=b"]);
    }

    #[test]
    fn each_attempt_s_own_variables_come_last_over_its_step_s_and_the_inherited_ones() {
        let pair = |k: &str, v: &str| (OsString::from(k), OsString::from(v));
        let base = BaseEnv::of([pair("TRY", "runner's"), pair("A", "a"), pair("B", "runner's")].into_iter());
        // The step sets B over the runner's, and TRY, which each attempt sets itself.
        let step = base.prepare(&own(&[("TRY", "step's"), ("B", "b"), ("C", "c")]), &["TRY", "ID"]).unwrap();
        for n in ["1", "2"] {
            let env = step.child(&base, &own(&[("TRY", n), ("ID", n)])).unwrap();
            assert_eq!(entries(&env), ["A=a", "B=b", "C=c", &format!("TRY={n}"), &format!("ID={n}")]);
        }
    }

    #[test]
    fn a_nul_byte_or_a_missing_program_is_an_error_not_a_child() {
        let base = BaseEnv::capture(|_| false);
        let e = base.prepare(&own(&[("WM", "a\0b")]), &[]).err().unwrap();
        assert_eq!(e.to_string(), "nul byte found in provided data");
        let step = base.prepare(&[], &["WM"]).unwrap();
        let e = step.child(&base, &own(&[("WM", "a\0b")])).err().unwrap();
        assert_eq!(e.to_string(), "nul byte found in provided data", "an attempt's own");
        let env = step.child(&base, &[]).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let argv = ["missing".to_owned()];
        let spec = |program| Spawn {
            program,
            argv: &argv,
            env: &env,
            workdir: Path::new("/"),
            stdin: null.as_fd(),
            stdout: null.as_fd(),
            stderr: null.as_fd(),
        };
        let e = spawn(&spec(Path::new("/nonexistent/missing"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = spawn(&Spawn { workdir: Path::new("/nonexistent"), ..spec(Path::new("/bin/true")) }).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "the working directory");
    }
}
