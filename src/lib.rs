//! waymark: run a TOML workflow of child processes with durable, Waymark-style retries.
//!
//! The pipeline: [`flow`] loads and validates the file; `retry` decides what retries and when;
//! [`executor`] runs a flow: its dispatcher owns the run's state and decides, its launcher and
//! supervisors run the attempts, and it emits `events::Event`s (as do the run commands around it);
//! `reporter`s consume them and own the terminal; [`store`] keeps run state durable behind a
//! journal and a lease; [`classify`] names the errors of failed attempts; `os` is the platform
//! code.

#![warn(unreachable_pub)]
// The library's public surface is the binary's and the tests' only; its documentation is for the
// people working on waymark, built with the private items (`.cargo/config.toml`), which the module
// docs link to.
#![allow(rustdoc::private_intra_doc_links)]

/// `eprintln!` that never panics: a closed or full stderr (`waymark ... 2>&1 | head -1`) loses the
/// message instead of crashing the command, which has its state to keep.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod classify;
pub mod cli;
pub mod commands;
pub(crate) mod events;
pub mod executor;
pub mod flow;
mod os;
mod reporter;
mod retry;
mod secrets;
pub mod store;
mod suggest;
mod text;

/// The hasher of the maps keyed by step name, one entry per step (validation, the store's step
/// positions): names come from the user's own file or waymark's own database, so a hash that
/// resists flooding (std's SipHash) buys nothing, and foldhash is several times faster on short
/// keys.
pub(crate) type FastHash = foldhash::fast::RandomState;
