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
        format!("{}:{}:{:08x}", super::sqlite::host_name(), std::process::id(), fastrand::u32(..))
    }
}

#[cfg(test)]
mod tests {
    use super::Lease;

    #[test]
    fn owner_ids_name_the_host_and_pid_and_differ_within_a_process() {
        let a = Lease::new_owner();
        let b = Lease::new_owner();
        assert_ne!(a, b);
        let parts: Vec<&str> = a.rsplitn(3, ':').collect();
        assert_eq!(parts[1], std::process::id().to_string(), "{a}");
        assert_eq!(parts[2], super::super::sqlite::host_name(), "{a}");
    }
}
