//! What went wrong in an attempt, as a named error class with its bases.
//!
//! `classes` holds the hierarchy; `error_file` and `traceback` read the names children report;
//! [`classify`] turns an attempt's end into an [`ErrorValue`] following the documented precedence.

pub mod classes;
pub mod error_file;
pub mod traceback;

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where an error's class came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorSource {
    /// The child wrote `WAYMARK_ERROR_FILE`.
    ErrorFile,
    /// The child's stderr ended with a Python traceback.
    Traceback,
    /// An `exit_codes` entry mapped the exit code or signal.
    ExitCodeMapping,
    /// A non-zero exit status with no mapping.
    ExitStatus,
    /// The child died of a signal waymark did not send.
    Signal,
    /// The attempt's timeout passed.
    Timeout,
    /// The child could not be started.
    NotStarted,
}

impl ErrorSource {
    pub fn describe(self) -> &'static str {
        match self {
            ErrorSource::ErrorFile => "error file",
            ErrorSource::Traceback => "traceback",
            ErrorSource::ExitCodeMapping => "exit code mapping",
            ErrorSource::ExitStatus => "exit status",
            ErrorSource::Signal => "signal",
            ErrorSource::Timeout => "timeout",
            ErrorSource::NotStarted => "start failure",
        }
    }
}

/// A failed attempt's error: its class, ordered bases (nearest first), message and source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorValue {
    pub class: String,
    pub bases: Vec<String>,
    pub message: String,
    pub source: ErrorSource,
}

impl ErrorValue {
    /// Whether an `except` clause naming any of `names` would catch this error.
    pub fn matches_any(&self, names: &[String]) -> bool {
        names
            .iter()
            .any(|n| *n == self.class || self.bases.iter().any(|b| b == n))
    }
}

impl fmt::Display for ErrorValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.class, self.bases.join(", "))?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}
