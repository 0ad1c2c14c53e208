//! A precise sleep. Tokio's timer counts in whole milliseconds and rounds a deadline up, and the
//! event loop's wait is rounded up again, so a 50 ms backoff woke 1 to 3 ms late. [`sleep_until`]
//! sleeps on tokio's timer until shortly before the deadline, then on a `timerfd` registered with
//! the event loop, which the kernel fires at the deadline itself (to within tens of microseconds).

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// How long before the deadline the coarse timer hands over to the precise one: more than
/// tokio's rounding, so the coarse timer never wakes after the deadline.
const HANDOVER: Duration = Duration::from_millis(3);

/// Wait until `deadline` (tokio's clock, so a test's paused clock is obeyed up to the last few
/// milliseconds). Cancel-safe: dropping the future drops its timer.
pub(crate) async fn sleep_until(deadline: Instant) {
    if let Some(early) = deadline.checked_sub(HANDOVER) {
        tokio::time::sleep_until(early).await;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return;
    }
    // The coarse timer stays armed too: it is the fallback where no timerfd can be had, and under
    // a test's paused clock it is the one that ends the sleep, in order with the test's other
    // timers. The timerfd counts real time, which runs on under a paused clock: when it fires
    // before the paused time reaches the deadline (a loaded machine), the coarse timer is awaited
    // still. Running for real, the timerfd's clock is `Instant`'s, and it is past the deadline.
    let coarse = tokio::time::sleep_until(deadline);
    tokio::pin!(coarse);
    tokio::select! {
        () = &mut coarse => {}
        Ok(()) = precise_sleep(left) => {
            if Instant::now() < deadline {
                coarse.await;
            }
        }
    }
}

/// A timerfd, for [`AsyncFd`] (which wants the raw descriptor).
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Sleep `left` on a one-shot monotonic timerfd watched by the event loop.
async fn precise_sleep(left: Duration) -> std::io::Result<()> {
    let fd = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)?;
    fd.set(Expiration::OneShot(TimeSpec::from_duration(left)), TimerSetTimeFlags::empty())?;
    // SAFETY: registers the descriptor with the event loop (epoll_ctl). `Timer` owns it and
    // neither closes nor replaces it while the `AsyncFd` holds it, as `register` requires.
    let timer = unsafe { AsyncFd::register_with_interest(Timer(fd), tokio::io::Interest::READABLE)? };
    let _ = timer.readable().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a test's paused clock the timerfd, which counts real time, may fire before the paused
    /// time reaches the deadline (here 20 ms of real time pass after it is armed for 2): the sleep
    /// still ends at the deadline on the paused clock, never before. (It ended 1 ms early in a
    /// dispatcher test on a loaded CI machine.)
    #[tokio::test(start_paused = true)]
    async fn under_a_paused_clock_a_sleep_ends_at_its_deadline_however_soon_the_real_timer_fires() {
        let deadline = Instant::now() + Duration::from_millis(2);
        let mut sleep = std::pin::pin!(sleep_until(deadline));
        // Polled once, which arms the timerfd for the 2 ms left.
        std::future::poll_fn(|cx| {
            let _ = sleep.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        std::thread::sleep(Duration::from_millis(20));
        sleep.await;
        assert_eq!(Instant::now(), deadline);
    }
}
