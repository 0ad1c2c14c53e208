//! Owning a run is a lease: an owner id and a fencing token. `create_run` and `claim` give the
//! runner a [`Lease`]; every write the runner then makes to its run carries it, and the store
//! checks it in the same transaction as the write. A claim (and abandoning the run) raises the
//! run's token, so once another runner has claimed or abandoned the run, the earlier owner's writes
//! are refused with [`StoreError::LeaseLost`](super::StoreError::LeaseLost) and change nothing.
//!
//! The lease says who may write; it does not keep a second runner out. Making it exclusive is the
//! store's part: the SQLite store relies on the per-flow file lock (`lock.rs`), taken before a run
//! is created or claimed and held until the runner's last write is done, so with a working lock a
//! lease is never lost. The token is what still protects the run when the lock does not hold (its
//! lock file deleted while a runner holds it, a file system whose locks do not work), and what a
//! networked store, which has no file lock to lean on, builds on.

/// The right to write to one run, as `create_run` or `claim` gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it: `HOST:PID:RANDOM`, shown in messages.
    pub owner: String,
    /// The fencing token: every claim of the run (and its abandon) raises it, and only the newest
    /// is accepted.
    pub token: i64,
}

impl Lease {
    /// A new owner id for this process: `HOST:PID:RANDOM` (the random part tells apart two owners
    /// in one process, or a pid reused after a reboot).
    pub fn new_owner() -> String {
        format!("{}:{}:{:08x}", host_id(), std::process::id(), fastrand::u32(..))
    }
}

/// `--host-id`, set once by the command line before anything asks for [`host_id`].
static HOST_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name this runner's host: `--host-id`, else `$WAYMARK_HOST_ID` (see [`host_id`]). An empty or
/// multi-line id is refused.
pub(crate) fn set_host_id(flag: Option<&str>) -> Result<(), String> {
    let env = std::env::var("WAYMARK_HOST_ID").ok().filter(|v| !v.is_empty());
    let Some(id) = flag.map(str::to_owned).or(env) else { return Ok(()) };
    if id.trim().is_empty() || id.chars().any(char::is_control) || id.len() > 255 {
        return Err(format!(
            "host id `{}` cannot name a host: give a non-empty id of at most 255 characters without control \
             characters (--host-id or WAYMARK_HOST_ID)",
            id.escape_debug()
        ));
    }
    let _ = HOST_ID.set(id);
    Ok(())
}

/// The host this runner names in leases, attempts and messages: `--host-id`, `$WAYMARK_HOST_ID`,
/// else the machine's host name. Two runners on one machine with different ids are two hosts.
pub(crate) fn host_id() -> &'static str {
    HOST_ID.get_or_init(|| {
        std::env::var("WAYMARK_HOST_ID").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
            nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into())
        })
    })
}

/// How long a lease on a shared store lasts and how often its runner renews it: 15 s and 5 s, or
/// `$WAYMARK_LEASE_TTL` and `$WAYMARK_LEASE_RENEW` (durations as flow files write them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseTiming {
    pub(crate) ttl: std::time::Duration,
    pub(crate) renew: std::time::Duration,
}

impl LeaseTiming {
    pub(crate) fn from_env() -> Result<LeaseTiming, String> {
        let read = |name: &str, default: u64| -> Result<std::time::Duration, String> {
            match std::env::var(name).ok().filter(|v| !v.is_empty()) {
                None => Ok(std::time::Duration::from_secs(default)),
                Some(v) => crate::flow::duration::from_arg(&v, false).map_err(|e| format!("{name}=`{v}`: {e}")),
            }
        };
        let ttl = read("WAYMARK_LEASE_TTL", 15)?;
        let renew = read("WAYMARK_LEASE_RENEW", 5)?;
        if renew * 2 > ttl {
            return Err(format!(
                "WAYMARK_LEASE_RENEW ({}) must be at most half of WAYMARK_LEASE_TTL ({}), so that one renewal can \
                 fail without losing the lease",
                humantime::format_duration(renew),
                humantime::format_duration(ttl)
            ));
        }
        Ok(LeaseTiming { ttl, renew })
    }

    /// How long before its lease would expire a runner that could not renew it stops its attempts:
    /// a quarter of the time to live, time enough to kill them before another runner may take over.
    pub(crate) fn margin(&self) -> std::time::Duration {
        self.ttl / 4
    }

    /// [`LeaseTiming::margin`] in milliseconds, as the database's checks take it.
    pub(crate) fn margin_ms(&self) -> f64 {
        self.margin().as_secs_f64() * 1000.0
    }
}

/// A runner's view of its lease on a shared store: until when it holds for sure (each renewal
/// moves it to the renewal's start plus the time to live, a time the database's own expiry is
/// never earlier than), and whether the runner has fenced itself off. Shared by the thread that
/// renews the lease, the journal that writes the run, and the dispatcher that kills the attempts.
#[derive(Debug)]
pub struct LeaseClock {
    timing: LeaseTiming,
    state: std::sync::Mutex<ClockState>,
}

#[derive(Debug)]
struct ClockState {
    valid_until: std::time::Instant,
    /// Why the runner stopped, once it has.
    fenced: Option<String>,
    /// The last renewal's failure, for the message if the lease runs out.
    last_error: Option<String>,
    /// Since when the run's write on the database has waited for its answer, while one does.
    writing_since: Option<std::time::Instant>,
    /// When the renewal under way was sent, while one is.
    renewing_since: Option<std::time::Instant>,
}

/// How long a runner that has fenced itself off waits for a thread still stuck on the database
/// (a write or a renewal on a connection that no longer answers) before it lets the thread go and
/// exits: the process's end closes the connection (the database refuses what it was writing; see
/// `PgStore::write`).
pub(crate) const LET_GO_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

impl LeaseClock {
    /// A lease taken (or renewed) by a statement sent at `sent`.
    pub(crate) fn new(timing: LeaseTiming, sent: std::time::Instant) -> LeaseClock {
        let state = ClockState {
            valid_until: sent + timing.ttl,
            fenced: None,
            last_error: None,
            writing_since: None,
            renewing_since: None,
        };
        LeaseClock { timing, state: std::sync::Mutex::new(state) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// A renewal sent at `sent` went through.
    pub(crate) fn renewed(&self, sent: std::time::Instant) {
        let mut s = self.lock();
        s.valid_until = s.valid_until.max(sent + self.timing.ttl);
        s.last_error = None;
    }

    /// A renewal was sent at `sent` (`Some`), or answered (`None`).
    pub(crate) fn renewing(&self, sent: Option<std::time::Instant>) {
        self.lock().renewing_since = sent;
    }

    /// A renewal failed (the database could not be reached, say).
    pub(crate) fn renewal_failed(&self, why: String) {
        self.lock().last_error = Some(why);
    }

    /// A write of the run was sent to the database (`true`), or answered (`false`).
    pub(crate) fn writing(&self, now: bool) {
        self.lock().writing_since = now.then(std::time::Instant::now);
    }

    /// Whether the lease may be renewed: not while a write of the run has waited a whole time to
    /// live for the database's answer. The client bounds no statement, and a connection that
    /// stopped answering without closing (a proxy or pooler that hung, a server stopped) would
    /// hold the write, and the runner waiting for it, for as long as renewals on another
    /// connection go through; left unrenewed, the lease fences the runner off in time.
    pub(crate) fn may_renew(&self) -> Result<(), String> {
        match self.lock().writing_since {
            Some(since) if since.elapsed() >= self.timing.ttl => Err(format!(
                "a write of the run has had no answer from the database for as long as a lease lasts ({})",
                humantime::format_duration(self.timing.ttl)
            )),
            _ => Ok(()),
        }
    }

    /// The lease is gone for sure (another runner holds it now): stop at once.
    pub(crate) fn lost(&self, why: String) {
        let mut s = self.lock();
        s.fenced.get_or_insert(why);
    }

    /// When the runner must have stopped its attempts if no renewal comes: the lease's end less
    /// the margin.
    pub(crate) fn fence_at(&self) -> std::time::Instant {
        self.lock().valid_until - self.timing.margin()
    }

    /// Why the runner is fenced off, if it is: the lease was lost, or its fence time passed (which
    /// fences it from then on, even if a late renewal comes).
    pub(crate) fn fenced(&self) -> Option<String> {
        let mut s = self.lock();
        if s.fenced.is_none() && std::time::Instant::now() >= s.valid_until - self.timing.margin() {
            // A renewal under way for longer than the time between two (not one merely on its
            // way) is the latest word: an earlier failure is not why.
            let stuck = s.renewing_since.filter(|sent| sent.elapsed() > self.timing.renew);
            let unanswered = |sent: std::time::Instant| {
                format!(
                    "could not renew its lease before it would expire (its renewal, sent {:.1}s before, has had no \
                     answer from the database)",
                    sent.elapsed().as_secs_f64()
                )
            };
            let why = match (stuck, &s.last_error, s.renewing_since) {
                (Some(sent), _, _) => unanswered(sent),
                (None, Some(e), _) => format!("could not renew its lease before it would expire ({e})"),
                // One on its way, with no failure before it: the database has not answered it yet.
                (None, None, Some(sent)) => unanswered(sent),
                // No renewal failed, none is under way: none was sent in time, the runner itself
                // not running (stopped by SIGSTOP, a suspended VM, starved of CPU).
                (None, None, None) => format!(
                    "could not renew its lease before it would expire (no renewal was sent for {:.1}s after the last \
                     one went through: was this runner stopped, or starved of CPU?)",
                    (s.valid_until - self.timing.ttl).elapsed().as_secs_f64()
                ),
            };
            s.fenced = Some(why);
        }
        s.fenced.clone()
    }

    /// Resolves once the runner is fenced off, with why.
    pub(crate) async fn until_fenced(&self) -> String {
        loop {
            if let Some(why) = self.fenced() {
                return why;
            }
            let at = self.fence_at().min(std::time::Instant::now() + std::time::Duration::from_millis(200));
            tokio::time::sleep_until(at.into()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Lease, LeaseClock, LeaseTiming};
    use std::time::{Duration, Instant};

    /// A write stuck a whole time to live stops the renewals, so the lease fences the runner
    /// off; one that is answered in time, or none at all, does not.
    #[test]
    fn a_write_unanswered_for_a_time_to_live_stops_the_renewals() {
        let timing = LeaseTiming { ttl: Duration::from_millis(200), renew: Duration::from_millis(50) };
        let clock = LeaseClock::new(timing, Instant::now());
        assert_eq!(clock.may_renew(), Ok(()));
        clock.writing(true);
        assert_eq!(clock.may_renew(), Ok(()), "a write just sent");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(
            clock.may_renew().unwrap_err(),
            "a write of the run has had no answer from the database for as long as a lease lasts (200ms)"
        );
        clock.writing(false);
        assert_eq!(clock.may_renew(), Ok(()), "the write was answered");
    }

    /// A renewal that has had no answer for longer than the time between two when the lease is
    /// about to expire is why the runner is fenced off; without one, or with one just sent, the
    /// last renewal's failure is.
    #[test]
    fn a_renewal_left_unanswered_is_why_the_lease_ran_out() {
        let timing = LeaseTiming { ttl: Duration::from_millis(400), renew: Duration::from_millis(200) };
        let refused = "could not renew its lease before it would expire (the database refused it)";
        // `Some(true)`: a renewal sent at the start; `Some(false)`: one sent as the lease runs out.
        let fenced = |renewal: Option<bool>| {
            let clock = LeaseClock::new(timing, Instant::now());
            clock.renewal_failed("the database refused it".to_owned());
            if renewal == Some(true) {
                clock.renewing(Some(Instant::now()));
            }
            std::thread::sleep(timing.ttl - timing.margin());
            if renewal == Some(false) {
                clock.renewing(Some(Instant::now()));
            }
            clock.fenced().expect("fenced off once the margin is reached")
        };
        let why = fenced(Some(true));
        let (head, tail) = (
            "could not renew its lease before it would expire (its renewal, sent ",
            "s before, has had no answer from the database)",
        );
        assert!(why.starts_with(head) && why.ends_with(tail), "{why}");
        let seconds: f64 = why[head.len()..why.len() - tail.len()].parse().unwrap();
        assert!(seconds >= 0.3, "{why}");
        assert_eq!(fenced(Some(false)), refused);
        assert_eq!(fenced(None), refused);
        // A renewal on its way (sent later than the time between two before the end), no failure
        // before it: the database has not answered it, not a runner that did not send one.
        let clock = LeaseClock::new(timing, Instant::now());
        std::thread::sleep(timing.ttl - timing.margin() - Duration::from_millis(50));
        clock.renewing(Some(Instant::now()));
        std::thread::sleep(Duration::from_millis(60));
        let why = clock.fenced().expect("fenced off once the margin is reached");
        assert!(why.starts_with(head) && why.ends_with(tail), "{why}");
        // Neither a failure nor a renewal under way: none was sent (the runner stopped, say).
        let clock = LeaseClock::new(timing, Instant::now());
        std::thread::sleep(timing.ttl - timing.margin());
        let why = clock.fenced().expect("fenced off once the margin is reached");
        let (head, tail) = (
            "could not renew its lease before it would expire (no renewal was sent for ",
            "s after the last one went through: was this runner stopped, or starved of CPU?)",
        );
        assert!(why.starts_with(head) && why.ends_with(tail), "{why}");
        let seconds: f64 = why[head.len()..why.len() - tail.len()].parse().unwrap();
        assert!(seconds >= (timing.ttl - timing.margin()).as_secs_f64() - 0.05, "{why}");
    }

    #[test]
    fn owner_ids_name_the_host_and_pid_and_differ_within_a_process() {
        let a = Lease::new_owner();
        let b = Lease::new_owner();
        assert_ne!(a, b);
        let parts: Vec<&str> = a.rsplitn(3, ':').collect();
        assert_eq!(parts[1], std::process::id().to_string(), "{a}");
        assert_eq!(parts[2], super::host_id(), "{a}");
    }
}
