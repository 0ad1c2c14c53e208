//! The platform code, in one place and private to the crate: process groups and `/proc`
//! ([`process`]), spawning and waiting for children ([`spawn`]), the runner's signals ([`signals`]), and opening files below the state directory
//! without following symlinks ([`fs`]). Everything else in waymark goes through these; the few
//! `unsafe` syscalls waymark needs are here, each with its reason.

pub(crate) mod fs;
pub(crate) mod process;
pub(crate) mod signals;
pub(crate) mod spawn;
pub(crate) mod timer;
