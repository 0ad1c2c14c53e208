//! The wait before each retry: `initial * multiplier^(k-1)`, capped, optionally jittered.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest wait waymark will ever compute (100 years), so arithmetic never overflows.
const CEILING_SECS: f64 = 100.0 * 365.25 * 86_400.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Backoff {
    /// The wait before the first retry.
    pub(crate) initial: Duration,
    /// Growth factor per retry, at least 1.0.
    pub(crate) multiplier: f64,
    /// Cap on any single wait.
    pub(crate) max: Option<Duration>,
    /// Multiply each wait by a uniform factor in [0.5, 1.0].
    pub(crate) jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::ZERO, multiplier: 1.0, max: None, jitter: false }
    }
}

impl Backoff {
    /// The longest single wait this backoff can produce: the cap, or 100 years without one.
    pub(crate) fn ceiling(&self) -> Duration {
        let ceiling = Duration::from_secs_f64(CEILING_SECS);
        self.max.map_or(ceiling, |max| max.min(ceiling))
    }

    /// The wait before retry `k` (1-based) without jitter.
    ///
    /// Total: never NaN, never a panic, whatever `k` and the policy. A zero `initial` stays zero
    /// for every retry (no `0 × ∞`); growth past what a `Duration` holds saturates at
    /// [`Backoff::ceiling`]. `waymark check` prints these very values.
    pub(crate) fn nominal(&self, k: u32) -> Duration {
        if self.initial.is_zero() {
            return Duration::ZERO;
        }
        // Validation keeps the multiplier finite and at least 1; a stored definition is trusted
        // no further than that.
        let multiplier = if self.multiplier >= 1.0 { self.multiplier } else { 1.0 };
        let exp = i32::try_from(k.saturating_sub(1)).unwrap_or(i32::MAX);
        // `initial > 0` and `multiplier^exp` in [1, ∞]: the product is in (0, ∞], never NaN.
        let secs = self.initial.as_secs_f64() * multiplier.powi(exp);
        Duration::try_from_secs_f64(secs).map_or(self.ceiling(), |d| d.min(self.ceiling()))
    }

    /// The wait before retry `k`, with jitter drawn from `rng` when enabled.
    pub(crate) fn delay(&self, k: u32, rng: &mut fastrand::Rng) -> Duration {
        let nominal = self.nominal(k);
        // A factor in [0.5, 1.0] of a wait of at most 100 years cannot overflow.
        if self.jitter { nominal.mul_f64(0.5 + 0.5 * rng.f64()) } else { nominal }
    }

    /// The nominal waits before retries 1, 2, 3, …
    #[cfg(test)]
    pub(crate) fn sequence(&self) -> impl Iterator<Item = Duration> + '_ {
        (1..).map(|k| self.nominal(k))
    }

    /// The first retry (1-based, at most `retries`) from which every wait equals the last one,
    /// `retries` itself when the waits still grow at the end. Waits never shrink, so this is
    /// found by bisection: what `check` shows as "then X from retry K on".
    pub(crate) fn steady_from(&self, retries: u32) -> u32 {
        if retries == 0 {
            return 0;
        }
        let last = self.nominal(retries);
        let (mut lo, mut hi) = (1, retries);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.nominal(mid) >= last { hi = mid } else { lo = mid + 1 }
        }
        lo
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

    /// The policies of defect 1 of issue 7: `0 × 2^1024` was NaN and panicked at retry 1025,
    /// `0 × 1e9^35` at retry 36; with a cap, NaN became the cap while `check` said "none".
    #[test]
    fn zero_initial_stays_zero_whatever_the_growth() {
        for (multiplier, max) in [(2.0, None), (1e9, None), (1e9, Some(secs(3.0))), (f64::MAX, None)] {
            let b = Backoff { initial: Duration::ZERO, multiplier, max, jitter: true };
            let mut rng = fastrand::Rng::with_seed(1);
            for k in [1, 35, 36, 37, 1024, 1025, 1026, 999_999, u32::MAX] {
                assert_eq!(b.nominal(k), Duration::ZERO, "{multiplier} {max:?} retry {k}");
                assert_eq!(b.delay(k, &mut rng), Duration::ZERO);
            }
        }
    }

    #[test]
    fn growth_saturates_at_the_cap_or_100_years() {
        let ceiling = secs(CEILING_SECS);
        let capped = Backoff { initial: secs(1.0), multiplier: 1e9, max: Some(secs(3.0)), jitter: false };
        assert_eq!(capped.nominal(1), secs(1.0));
        assert_eq!(capped.nominal(2), secs(3.0));
        assert_eq!(capped.nominal(u32::MAX), secs(3.0));
        for multiplier in [2.0, 1e9, 1e300, f64::MAX, f64::INFINITY] {
            let b = Backoff { initial: Duration::from_nanos(1), multiplier, max: None, jitter: true };
            let mut rng = fastrand::Rng::with_seed(3);
            for k in [1025, 1_000_000, u32::MAX] {
                assert_eq!(b.nominal(k), ceiling, "{multiplier} retry {k}");
                assert!(b.delay(k, &mut rng) <= ceiling);
            }
        }
        // A cap above 100 years is still held to 100 years.
        let huge_cap = Backoff { initial: secs(1.0), multiplier: 10.0, max: Some(secs(1e12)), jitter: false };
        assert_eq!(huge_cap.nominal(40), ceiling);
        // A multiplier no validation would let through is treated as 1.0, not as NaN.
        let bad = Backoff { initial: secs(2.0), multiplier: f64::NAN, max: None, jitter: false };
        assert_eq!(bad.nominal(1000), secs(2.0));
    }

    #[test]
    fn steady_from_finds_where_the_waits_stop_growing() {
        let b = Backoff { initial: secs(1.0), multiplier: 2.0, max: Some(secs(5.0)), jitter: false };
        assert_eq!(b.steady_from(10), 4);
        assert_eq!(b.steady_from(3), 3);
        let fixed = Backoff { initial: secs(1.0), ..Backoff::default() };
        assert_eq!(fixed.steady_from(1_000_000), 1);
        let unbounded = Backoff { initial: secs(1.0), multiplier: 2.0, max: None, jitter: false };
        // 2^k seconds passes 100 years (3.16e9 s) at k = 32, retry 33.
        assert_eq!(unbounded.steady_from(2000), 33);
        assert_eq!(Backoff::default().steady_from(0), 0);
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
