//! The wait before each retry: `initial * multiplier^(k-1)`, capped, optionally jittered.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest wait waymark will ever compute (100 years), so arithmetic never overflows.
const CEILING_SECS: f64 = 100.0 * 365.25 * 86_400.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    /// The wait before the first retry.
    pub initial: Duration,
    /// Growth factor per retry, at least 1.0.
    pub multiplier: f64,
    /// Cap on any single wait.
    pub max: Option<Duration>,
    /// Multiply each wait by a uniform factor in [0.5, 1.0].
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::ZERO, multiplier: 1.0, max: None, jitter: false }
    }
}

impl Backoff {
    /// The wait before retry `k` (1-based) without jitter.
    pub fn nominal(&self, k: u32) -> Duration {
        let exp = i32::try_from(k.saturating_sub(1)).unwrap_or(i32::MAX);
        let mut secs = self.initial.as_secs_f64() * self.multiplier.powi(exp);
        if let Some(max) = self.max {
            secs = secs.min(max.as_secs_f64());
        }
        Duration::from_secs_f64(secs.clamp(0.0, CEILING_SECS))
    }

    /// The wait before retry `k`, with jitter drawn from `rng` when enabled.
    pub fn delay(&self, k: u32, rng: &mut fastrand::Rng) -> Duration {
        let nominal = self.nominal(k);
        if self.jitter { nominal.mul_f64(0.5 + 0.5 * rng.f64()) } else { nominal }
    }

    /// The nominal waits before retries 1, 2, 3, …
    pub fn sequence(&self) -> impl Iterator<Item = Duration> + '_ {
        (1..).map(|k| self.nominal(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn fixed_by_default() {
        let b = Backoff { initial: secs(1.5), ..Backoff::default() };
        assert_eq!(b.sequence().take(3).collect::<Vec<_>>(), [secs(1.5); 3]);
        assert_eq!(Backoff::default().nominal(7), Duration::ZERO);
    }

    #[test]
    fn exponential_and_capped() {
        let b = Backoff { initial: secs(1.0), multiplier: 2.0, max: Some(secs(5.0)), jitter: false };
        let got: Vec<_> = b.sequence().take(5).collect();
        assert_eq!(got, [secs(1.0), secs(2.0), secs(4.0), secs(5.0), secs(5.0)]);
    }

    #[test]
    fn huge_retries_do_not_overflow() {
        let b = Backoff { initial: secs(1.0), multiplier: 10.0, max: None, jitter: false };
        assert_eq!(b.nominal(1000), secs(CEILING_SECS));
    }

    #[test]
    fn jitter_stays_in_half_to_full_and_is_seedable() {
        let b = Backoff { initial: secs(10.0), multiplier: 1.0, max: None, jitter: true };
        let mut rng = fastrand::Rng::with_seed(7);
        let first: Vec<_> = (1..200).map(|k| b.delay(k, &mut rng)).collect();
        assert!(first.iter().all(|d| *d >= secs(5.0) && *d <= secs(10.0)));
        assert!(first.iter().any(|d| *d < secs(7.5)) && first.iter().any(|d| *d > secs(7.5)));
        let mut again = fastrand::Rng::with_seed(7);
        assert_eq!(first, (1..200).map(|k| b.delay(k, &mut again)).collect::<Vec<_>>());
    }
}
