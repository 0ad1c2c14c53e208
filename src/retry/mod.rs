//! Waymark's retry model, as pure functions: which errors retry, how many attempts, and how long
//! to wait before each retry. Nothing here touches a clock or a process.

mod backoff;

pub(crate) use backoff::Backoff;

use crate::classify::ErrorValue;
use serde::{Deserialize, Serialize};

/// Attempts of a policy that leaves `attempts` out: 100 retries, 101 executions in all.
pub(crate) const DEFAULT_ATTEMPTS: u32 = 101;

/// A step's retry policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RetryPolicy {
    /// Total executions, at least 1.
    pub(crate) attempts: u32,
    /// Class names that retry; matched against the error's class and bases.
    pub(crate) exception_types: Vec<String>,
    pub(crate) backoff: Backoff,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Run attempt `next` after waiting the backoff for retry `next - 1`.
    Retry { next: u32 },
    /// The error is not one the policy retries.
    NotRetryable,
    /// The error would retry, but every attempt has been used.
    Exhausted,
}

impl RetryPolicy {
    /// The policy of a step with no `retry`: one execution.
    pub(crate) fn run_once() -> RetryPolicy {
        RetryPolicy { attempts: 1, exception_types: Vec::new(), backoff: Backoff::default() }
    }

    /// Decide after attempt `attempt` (1-based) failed with `error`.
    pub(crate) fn decide(&self, error: &ErrorValue, attempt: u32) -> Decision {
        if !error.matches_any(&self.exception_types) {
            Decision::NotRetryable
        } else if attempt >= self.attempts {
            Decision::Exhausted
        } else {
            Decision::Retry { next: attempt + 1 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{ErrorSource, classes::ClassTree};

    fn error(class: &str) -> ErrorValue {
        ErrorValue {
            class: class.into(),
            bases: ClassTree::default().bases(class).unwrap_or_default(),
            message: String::new(),
            source: ErrorSource::ExitStatus,
        }
    }

    fn policy(attempts: u32, types: &[&str]) -> RetryPolicy {
        RetryPolicy {
            attempts,
            exception_types: types.iter().map(|s| s.to_string()).collect(),
            backoff: Backoff::default(),
        }
    }

    #[test]
    fn matches_through_bases_like_except() {
        let p = policy(3, &["ConnectionError"]);
        assert_eq!(p.decide(&error("ConnectionResetError"), 1), Decision::Retry { next: 2 });
        assert_eq!(p.decide(&error("ConnectionError"), 1), Decision::Retry { next: 2 });
        assert_eq!(p.decide(&error("OSError"), 1), Decision::NotRetryable);
        assert_eq!(p.decide(&error("ValueError"), 1), Decision::NotRetryable);
        let os = policy(3, &["OSError"]);
        assert_eq!(os.decide(&error("TimeoutError"), 1), Decision::Retry { next: 2 });
    }

    #[test]
    fn attempts_count_total_executions() {
        let p = policy(3, &["Exception"]);
        assert_eq!(p.decide(&error("ValueError"), 2), Decision::Retry { next: 3 });
        assert_eq!(p.decide(&error("ValueError"), 3), Decision::Exhausted);
        assert_eq!(RetryPolicy::run_once().decide(&error("ValueError"), 1), Decision::NotRetryable);
    }

    #[test]
    fn runtime_errors_need_an_explicit_opt_in() {
        let ordinary = policy(5, &["Exception"]);
        for class in ["ActionTimeout", "ActionExecutionLost"] {
            assert_eq!(ordinary.decide(&error(class), 1), Decision::NotRetryable);
            assert_eq!(policy(5, &[class]).decide(&error(class), 1), Decision::Retry { next: 2 });
            assert_eq!(policy(5, &["BaseException"]).decide(&error(class), 1), Decision::Retry { next: 2 });
        }
        assert_eq!(ordinary.decide(&error("ActionExecutionNotStarted"), 1), Decision::Retry { next: 2 });
        assert_eq!(ordinary.decide(&error("CalledProcessError"), 1), Decision::Retry { next: 2 });
    }

    #[test]
    fn empty_list_retries_nothing() {
        assert_eq!(policy(5, &[]).decide(&error("ValueError"), 1), Decision::NotRetryable);
    }
}
