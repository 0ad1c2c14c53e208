//! Processes: process groups, `/proc`, exit statuses, and finding an attempt's processes by the
//! id in their environment.

use crate::flow::Signal;
use nix::sys::signal::{self, Signal as NixSignal};
use nix::unistd::Pid;
use std::time::Duration;

/// Send `sig` to every process in group `pgid`. A group that is already gone is not an error.
pub(crate) fn signal_group(pgid: u32, sig: NixSignal) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    if raw <= 1 {
        return; // never signal our own group or init's by accident
    }
    // ESRCH: the group is gone already. EPERM: it belongs to someone else now, so nothing of
    // ours is in it. Neither is an error.
    let _ = signal::killpg(Pid::from_raw(raw), sig);
}

/// SIGKILL every process in group `pgid`.
pub(crate) fn kill_group(pgid: u32) {
    signal_group(pgid, NixSignal::SIGKILL);
}

/// Watches whether a live process is still in group `pgid` (its leader may be gone). A zombie is
/// not one: it has ended, and waits for a parent (init, or waymark when it is a container's first
/// process) to reap it, which may take long. A look costs what the group's members cost, not what
/// the machine's processes do: a scan of `/proc` finds the members, later looks read only theirs,
/// and scan again once all of them are gone (one may have forked another before it ended).
pub(crate) struct GroupWatch {
    pgid: u32,
    members: Vec<u32>,
}

impl GroupWatch {
    pub(crate) fn new(pgid: u32) -> Self {
        Self { pgid, members: Vec::new() }
    }

    /// Whether the group has a live member.
    pub(crate) fn alive(&mut self) -> bool {
        let Ok(raw) = i32::try_from(self.pgid) else { return false };
        // Signal 0 checks without sending (ESRCH: none is left; EPERM: the group is someone else's
        // now); only a group that has members is looked for in `/proc`.
        if raw <= 1 || signal::killpg(Pid::from_raw(raw), None).is_err() {
            return false;
        }
        let pgid = self.pgid.to_string();
        let member = |pid: &u32| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // fields[0] = state, [2] = pgrp. A pid reused since is in another group.
            stat_fields(&stat).is_some_and(|f| f.first() != Some(&"Z") && f.get(2) == Some(&pgid.as_str()))
        };
        self.members.retain(member);
        if self.members.is_empty() {
            let Some(pids) = proc_pids() else { return true };
            self.members = pids.filter(member).collect();
        }
        !self.members.is_empty()
    }
}

/// The pids of the processes `/proc` shows; `None` without it.
fn proc_pids() -> Option<impl Iterator<Item = u32>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(dir.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()))
}

/// The read end of a child's output pipe, non-blocking and registered with the runner's event
/// loop, so one thread reads every running attempt's output. The write end, the child's, stays
/// blocking: a child that writes faster than waymark reads waits on the full pipe.
pub(crate) fn async_pipe(pipe: std::io::PipeReader) -> std::io::Result<tokio::net::unix::pipe::Receiver> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let fd = std::os::fd::OwnedFd::from(pipe);
    // The read end was just made by `pipe2(O_CLOEXEC)`: no status flag is set that this drops.
    fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd)
}

/// How a child ended, decoded from its wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitKind {
    Code(i32),
    Signal(Signal),
}

pub(crate) fn exit_kind(status: std::process::ExitStatus) -> ExitKind {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitKind::Code(code),
        (None, Some(sig)) => match Signal::from_number(sig) {
            Some(s) => ExitKind::Signal(s),
            None => ExitKind::Code(128 + sig),
        },
        (None, None) => ExitKind::Code(-1),
    }
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22), which together
/// with the pid identifies one process across pid reuse. `None` where `/proc` is unavailable.
/// Read once per attempt: one `read` into a stack buffer (the kernel produces the whole line in
/// one read; it is far shorter than the buffer), no allocation for the contents.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    use nix::fcntl::{OFlag, open};
    let fd =
        open(format!("/proc/{pid}/stat").as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
            .ok()?;
    let mut buf = [0u8; 1024];
    let n = nix::unistd::read(&fd, &mut buf).ok()?;
    // A line that filled the buffer may be cut: not trusted.
    if n == buf.len() {
        return None;
    }
    // After `comm` (which may hold spaces and any byte): state is field 3, starttime field 22.
    let stat = &buf[..n];
    let after = &stat[stat.iter().rposition(|b| *b == b')')? + 1..];
    let field = after.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty()).nth(19)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Fields after `comm` in a `/proc/PID/stat` line (field 3 onward), `comm` may hold spaces.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().collect())
}

/// The variable that tags every process of an attempt, inherited by all its descendants.
pub(crate) const ATTEMPT_ID_VAR: &str = "WAYMARK_ATTEMPT_ID";
/// The variable that tags the processes of a nested run's steps with the attempt ids of the
/// steps it runs under (comma-separated): a nested runner sets it, so that the processes of its
/// steps are found by an outer attempt's id too, even when the nested runner is gone.
pub(crate) const OUTER_IDS_VAR: &str = "WAYMARK_OUTER_ATTEMPT_IDS";

/// Live processes whose environment holds `WAYMARK_ATTEMPT_ID=attempt_id`: an attempt's
/// processes, including those that left its process group with setsid(). Reads `/proc`, so it is
/// only called when something already looks wrong (not on every attempt).
/// With `outer`, also those found by `WAYMARK_OUTER_ATTEMPT_IDS` (a nested run's steps).
fn marked(attempt_id: &str, outer: bool) -> Vec<u32> {
    let me = std::process::id();
    let Some(pids) = proc_pids() else { return Vec::new() };
    pids.filter(|pid| *pid != me)
        .filter(|pid| attempt_ids(*pid, outer).iter().any(|id| id == attempt_id.as_bytes()))
        .filter(|pid| is_alive(*pid, None))
        .collect()
}

/// The attempt ids in the environment of process `pid`: the values of `WAYMARK_ATTEMPT_ID` (a
/// process may hold the variable twice), and with `outer` those of `WAYMARK_OUTER_ATTEMPT_IDS` (a
/// nested run's step is an outer attempt's process too). None when it cannot be read.
fn attempt_ids(pid: u32, outer: bool) -> Vec<Vec<u8>> {
    let (own, outer) = (format!("{ATTEMPT_ID_VAR}="), outer.then(|| format!("{OUTER_IDS_VAR}=")));
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let mut ids = Vec::new();
    for var in env.split(|b| *b == 0) {
        if let Some(id) = var.strip_prefix(own.as_bytes()) {
            ids.push(id.to_vec());
        } else if let Some(list) = outer.as_ref().and_then(|outer| var.strip_prefix(outer.as_bytes())) {
            ids.extend(list.split(|b| *b == b',').filter(|id| !id.is_empty()).map(<[u8]>::to_vec));
        }
    }
    ids
}

/// The process group of `pid`, if it is alive.
fn group_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat)?.get(2)?.parse().ok()
}

/// SIGKILL every live process of an attempt found by its id; returns how many of them had left
/// the attempt's process group `group` (members of the group, SIGKILLed with it a moment ago, may
/// not be gone yet: they are not news).
pub(crate) fn kill_marked(attempt_id: &str, group: u32) -> usize {
    kill_escaped(attempt_id, group, |_| true)
}

/// Send `sig` to every live process of an attempt, found by its id, that left the attempt's process
/// group `group` (a daemon it started with `setsid`): a timeout's or a cancel's signal, which they
/// get with the group, to clean up within the same grace. Each, with its start time, for
/// [`alive_of`]; [`kill_marked`] kills what is left at the end.
pub(crate) fn signal_escaped(attempt_id: &str, group: u32, sig: NixSignal) -> Vec<(u32, Option<u64>)> {
    // Not a nested run's steps, found by their outer attempt ids: their runner, in the group, gets
    // the signal and passes it on (twice would be its "second signal", which kills at once).
    let found: Vec<(u32, Option<u64>)> = marked(attempt_id, false)
        .into_iter()
        .filter(|pid| group_of(*pid) != Some(group))
        .map(|pid| (pid, process_start_time(pid)))
        .collect();
    for (pid, _) in &found {
        if let Ok(raw) = i32::try_from(*pid) {
            let _ = signal::kill(Pid::from_raw(raw), sig);
        }
    }
    found
}

/// Keeps those of `processes` (pid and start time, from [`signal_escaped`]) that are alive, not a
/// zombie, and the same process (not its pid given to another); whether one is.
pub(crate) fn alive_of(processes: &mut Vec<(u32, Option<u64>)>) -> bool {
    processes.retain(|(pid, start)| is_alive(*pid, *start));
    !processes.is_empty()
}

/// [`kill_marked`], but only the processes that hold a pipe the runner reads: the attempt's output.
/// A daemon that closed its output is let be, as after a normal exit it should, even while
/// another escaped process holds the output open. (The runner's pipes are close-on-exec: a
/// child holds only its own attempt's.) A process whose open files cannot be read (it made
/// itself undumpable, or runs a setuid program) is taken to hold it.
pub(crate) fn kill_marked_holding_output(attempt_id: &str, group: u32) -> usize {
    let ours = pipes_of("self").unwrap_or_default();
    kill_escaped(attempt_id, group, |pid| {
        pipes_of(&pid.to_string()).is_none_or(|pipes| pipes.iter().any(|pipe| ours.contains(pipe)))
    })
}

/// SIGKILL the processes of an attempt, found by its id, that left its group and that `which`
/// picks; how many. `/proc` is read again until it shows none not killed already (at most
/// [`ESCAPED_PASSES`] times): one that kept forking (`while :; do setsid cmd & done`) made new
/// ones between a read and its kill, which a single pass left alive.
fn kill_escaped(attempt_id: &str, group: u32, which: impl Fn(u32) -> bool) -> usize {
    let mut killed = std::collections::HashSet::new();
    for _ in 0..ESCAPED_PASSES {
        let found: Vec<u32> = marked(attempt_id, true)
            .into_iter()
            .filter(|pid| !killed.contains(pid) && group_of(*pid) != Some(group) && which(*pid))
            .collect();
        if found.is_empty() {
            break;
        }
        for pid in found {
            if let Ok(raw) = i32::try_from(pid) {
                let _ = signal::kill(Pid::from_raw(raw), NixSignal::SIGKILL);
            }
            killed.insert(pid);
        }
    }
    killed.len()
}

/// How many times [`kill_escaped`] reads `/proc` at most: a bound on a fork bomb, far above what
/// an escaped loop that forks as fast as it can takes (a pass kills its forker, the next the
/// children it made meanwhile).
const ESCAPED_PASSES: usize = 64;

/// The pipes (their inodes) among the open files of process `pid` (`self`: this one); `None`
/// when they cannot be read (none: it is gone).
fn pipes_of(pid: &str) -> Option<Vec<u64>> {
    let dir = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(dir) => dir,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Vec::new()),
        Err(_) => return None,
    };
    Some(
        dir.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|target| target.to_str()?.strip_prefix("pipe:[")?.strip_suffix(']')?.parse().ok())
            .collect(),
    )
}

/// What is left of a dead runner's attempt to look for: the processes of its group (led by
/// `pgid`, whose leader started at `leader_start`) and those marked with its `attempt_id`.
pub(crate) struct Leftover<'a> {
    pub(crate) pgid: Option<u32>,
    pub(crate) leader_start: Option<u64>,
    pub(crate) attempt_id: &'a str,
}

/// A live process as one scan of `/proc` saw it.
struct Seen {
    pid: u32,
    pgrp: Option<u32>,
    start: Option<u64>,
    /// The attempt ids in its environment ([`attempt_ids`]).
    attempts: Vec<Vec<u8>>,
}

/// Every live process, this one among them, with its group, start time and attempt ids: one read
/// of each's `stat` and `environ`. `None` without `/proc`.
fn scan() -> Option<Vec<Seen>> {
    let mut seen = Vec::new();
    for pid in proc_pids()? {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(fields) = stat_fields(&stat) else { continue };
        // fields[0] = state, [2] = pgrp, [19] = starttime
        if fields.first() == Some(&"Z") {
            continue;
        }
        let attempts = attempt_ids(pid, true);
        let (pgrp, start) = (fields.get(2).and_then(|s| s.parse().ok()), fields.get(19).and_then(|s| s.parse().ok()));
        seen.push(Seen { pid, pgrp, start, attempts });
    }
    Some(seen)
}

/// The live processes of `leftover` among `seen` (a scan; `None`: no `/proc`), never this one. Its
/// group counts if its leader is alive with the recorded start time, or if the leader is gone but
/// members remain (the kernel does not reuse a pid while it names a live group); a group whose
/// leader is another process now (this one too, its pid reused) is someone else's, and so is the
/// group this process is in.
fn leftovers_of(leftover: &Leftover<'_>, seen: Option<&[Seen]>) -> Vec<u32> {
    let me = std::process::id();
    let Some(seen) = seen else {
        // No /proc: trust the pgid only if the leader still lives.
        return leftover.pgid.filter(|g| *g != me && is_alive(*g, leftover.leader_start)).into_iter().collect();
    };
    let mut pids = Vec::new();
    if let Some(pgid) = leftover.pgid {
        let in_it = |p: &&Seen| p.pgrp == Some(pgid);
        let someone_else = seen.iter().filter(in_it).any(|p| {
            p.pid == me || (p.pid == pgid && leftover.leader_start.is_some() && p.start != leftover.leader_start)
        });
        if !someone_else {
            pids.extend(seen.iter().filter(in_it).map(|p| p.pid));
        }
    }
    let id = leftover.attempt_id.as_bytes();
    pids.extend(seen.iter().filter(|p| p.pid != me && p.attempts.iter().any(|a| a == id)).map(|p| p.pid));
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kill what is left of each of a dead runner's attempts (its group, and its processes that left
/// the group) and wait, up to `limit` for all of them, until they are gone: one scan of `/proc`
/// a round for all of them, not two per attempt (a resume of 100 steps left running took 1.7 s).
/// Only those with processes left are looked for again. Returns, for each, how many processes
/// there were, and those still alive at the end.
pub(crate) fn kill_leftovers(leftovers: &[Leftover<'_>], limit: Duration) -> Vec<(usize, Vec<u32>)> {
    let seen = scan();
    let found: Vec<Vec<u32>> = leftovers.iter().map(|l| leftovers_of(l, seen.as_deref())).collect();
    let start = std::time::Instant::now();
    let mut left = found.clone();
    while left.iter().any(|pids| !pids.is_empty()) && start.elapsed() < limit {
        for pid in left.iter().flatten() {
            if let Ok(raw) = i32::try_from(*pid) {
                let _ = signal::kill(Pid::from_raw(raw), NixSignal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
        let seen = scan();
        for (pids, leftover) in left.iter_mut().zip(leftovers) {
            if !pids.is_empty() {
                *pids = leftovers_of(leftover, seen.as_deref());
            }
        }
    }
    found.iter().zip(left).map(|(found, left)| (found.len(), left)).collect()
}

/// Descriptors one running attempt may hold: its two pipes, their log files, its pidfd, its
/// step's directory, with room to spare.
const FILES_PER_ATTEMPT: u64 = 8;
/// Descriptors the runner may open besides those it holds already and its attempts': a store's
/// new connection or journal, the terminal's, with room to spare.
const FILES_OF_THE_RUNNER: u64 = 32;

/// Raise the soft limit on open files, within the hard one, as far as `at_once` attempts running
/// side by side need beside what the runner holds now, and no further: the steps inherit it. At
/// the usual soft limit of 1024, about 200 attempts at once stopped the run (`Too many open
/// files`). When even the hard limit falls short, `Err` with how many attempts at once it allows
/// (at least 1) and the warning that says so: the runner then starts no more than that, rather
/// than fail the steps it cannot start.
pub(crate) fn allow_open_files_for(at_once: usize) -> Result<(), (usize, String)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return Ok(()) };
    // What the runner holds now (the store, its lock, the runtime's), else a generous guess; not
    // counted where the soft limit leaves room even for that guess (4 steps under 1024).
    const GUESS: u64 = 256;
    let attempts = (at_once as u64).saturating_mul(FILES_PER_ATTEMPT);
    if attempts.saturating_add(GUESS) <= soft {
        return Ok(());
    }
    let held = std::fs::read_dir("/proc/self/fd").map_or(GUESS, |dir| dir.count() as u64);
    let runner = held.saturating_add(FILES_OF_THE_RUNNER);
    let need = attempts.saturating_add(runner);
    if need <= soft {
        return Ok(());
    }
    let _ = setrlimit(Resource::RLIMIT_NOFILE, need.min(hard), hard);
    if need <= hard {
        return Ok(());
    }
    let fits = usize::try_from(hard.saturating_sub(runner) / FILES_PER_ATTEMPT).unwrap_or(usize::MAX);
    let message = match fits {
        0 => format!(
            "this process may open at most {hard} files (`ulimit -Hn`), fewer than waymark may need for itself \
             and one step (about {}): a step that finds none left fails with ActionExecutionNotStarted; raise the \
             hard limit",
            runner + FILES_PER_ATTEMPT
        ),
        _ => format!(
            "{at_once} steps at once may need about {need} open files, and this process may open at most {hard} \
             (`ulimit -Hn`): this runner starts at most {fits} at once (the others wait for a slot, and a \
             step's timeout counts that wait); raise the hard limit to run more side by side"
        ),
    };
    Err((fits.max(1), message))
}

/// Mark every file descriptor above 2 close-on-exec: descriptors that whoever started waymark
/// leaked to it (opened without `O_CLOEXEC`) must not reach the steps. Called once at startup,
/// before waymark opens anything of its own (everything it opens later is close-on-exec), so
/// children are still started with posix_spawn rather than a `pre_exec` hook that closes them.
pub fn close_inherited_fds_on_exec() {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use std::os::fd::BorrowedFd;
    // Collected first: the directory's own descriptor is closed once the listing is read.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<i32> =
        dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).filter(|fd| *fd > 2).collect();
    for raw in fds {
        // The listing's own descriptor was among them and is closed now.
        if std::fs::symlink_metadata(format!("/proc/self/fd/{raw}")).is_err() {
            continue;
        }
        // SAFETY: the descriptor is open (just checked) and stays open while it is borrowed for
        // the two fcntl calls below: waymark runs no other thread yet and closes nothing here.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        if let Ok(bits) = fcntl(fd, FcntlArg::F_GETFD) {
            let flags = FdFlag::from_bits_truncate(bits) | FdFlag::FD_CLOEXEC;
            let _ = fcntl(fd, FcntlArg::F_SETFD(flags));
        }
    }
}

/// Whether a process with this pid and start time is alive (not a zombie).
pub(crate) fn is_alive(pid: u32, start: Option<u64>) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return i32::try_from(pid).is_ok_and(|p| signal::kill(Pid::from_raw(p), None).is_ok());
    };
    let Some(fields) = stat_fields(&stat) else { return false };
    fields.first() != Some(&"Z") && (start.is_none() || fields.get(19).and_then(|s| s.parse().ok()) == start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose first members are gone is still alive while a process one of them forked
    /// is: the watch looks for members again once those it knew of have ended.
    #[test]
    fn a_group_is_alive_while_a_member_forked_by_one_that_ended_lives() {
        use std::os::unix::process::CommandExt;
        let dir = std::env::temp_dir().join(format!("waymark-group-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pid");
        // The shell waits for a line before it forks its sleep, so the first look finds it alone.
        let script = format!("read go; sleep 60 & echo $! > {}.tmp; mv {0}.tmp {0}; exit 0", pidfile.display());
        let mut leader = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id();
        let mut watch = GroupWatch::new(pgid);
        assert!(watch.alive(), "the shell");
        // The shell, the one member the first look found, forks its sleep and ends (and is
        // reaped): the sleep is left.
        std::io::Write::write_all(&mut leader.stdin.take().unwrap(), b"go\n").unwrap();
        assert!(leader.wait().unwrap().success());
        let sleeper: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(watch.alive(), "the sleep the shell forked");
        signal::kill(Pid::from_raw(sleeper), NixSignal::SIGKILL).unwrap();
        let gone = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !watch.alive()
        });
        assert!(gone, "the group is empty once the sleep is killed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn seen(pid: u32, pgrp: u32, start: u64, attempts: &[&str]) -> Seen {
        let attempts = attempts.iter().map(|a| a.as_bytes().to_vec()).collect();
        Seen { pid, pgrp: Some(pgrp), start: Some(start), attempts }
    }

    /// What is left of a dead runner's attempt is its group (unless its leader's pid now names
    /// another process, or the group is this runner's own: a recorded pid reused by this runner,
    /// which leads or shares its group, must not get its job mates killed) and the processes
    /// marked with its attempt id, wherever that is in their environment; never this process.
    #[test]
    fn leftovers_are_the_group_and_the_marked_never_this_process_nor_its_group() {
        let me = std::process::id();
        let left = |pgid, leader_start| Leftover { pgid: Some(pgid), leader_start, attempt_id: "run.7" };
        let procs = [
            seen(100, 100, 5, &[]),
            seen(101, 100, 6, &[]),
            seen(300, 300, 9, &["decoy", "run.7"]),
            seen(me, 500, 1, &["run.7"]),
            seen(501, 500, 2, &[]),
        ];
        assert_eq!(leftovers_of(&left(100, Some(5)), Some(&procs)), [100, 101, 300]);
        assert_eq!(leftovers_of(&left(100, None), Some(&procs)), [100, 101, 300]);
        // The leader's pid names another process now: the group is someone else's.
        assert_eq!(leftovers_of(&left(100, Some(4)), Some(&procs)), [300]);
        // This runner's own group (its pid reused, or a member of it): never.
        assert_eq!(leftovers_of(&left(500, None), Some(&procs)), [300]);
        let led = [seen(me, me, 1, &[]), seen(601, me, 2, &[])];
        assert_eq!(leftovers_of(&left(me, Some(7)), Some(&led)), Vec::<u32>::new());
        assert_eq!(leftovers_of(&left(me, None), Some(&led)), Vec::<u32>::new());
    }

    #[test]
    fn the_variable_processes_are_found_by_is_the_one_each_attempt_is_given() {
        assert_eq!(ATTEMPT_ID_VAR, crate::flow::model::var::ATTEMPT_ID);
    }

    #[test]
    fn reads_start_time_of_self_and_parses_odd_comm() {
        assert!(process_start_time(std::process::id()).is_some());
        let f = stat_fields("12 (a b) c) S 1 12 12 0").unwrap();
        assert_eq!(f[0], "S");
        assert_eq!(f[2], "12");
    }
}
