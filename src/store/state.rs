//! The one model of state: what a run, a step and an attempt can be, the names they are stored
//! under, and the moves between them that are legal. The runner reads states through it, the
//! store checks every write against [`can_move_to`](RunStatus::can_move_to), and `status` prints
//! their names. A stored name this binary does not know is an [`UnknownState`], never a default.

use serde::{Deserialize, Serialize};
use std::time::SystemTime;

/// A stored state name this binary does not know: the database is corrupt, or a newer waymark
/// wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} state `{value}`")]
pub(crate) struct UnknownState {
    pub(crate) kind: &'static str,
    pub(crate) value: String,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Interrupted,
    Abandoned,
}

impl RunStatus {
    const ALL: [RunStatus; 5] = [Self::Running, Self::Succeeded, Self::Failed, Self::Interrupted, Self::Abandoned];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Abandoned => "abandoned",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<RunStatus, UnknownState> {
        Self::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownState { kind: "run", value: s.into() })
    }

    /// Whether a run in this status may be given `to`. A running run may be claimed again (its
    /// runner died); an interrupted or failed one may be resumed; an unfinished one abandoned.
    /// Succeeded and abandoned runs are final.
    pub(crate) fn can_move_to(self, to: RunStatus) -> bool {
        use RunStatus::*;
        match self {
            Running => true,
            Interrupted => matches!(to, Running | Abandoned),
            Failed => to == Running,
            Succeeded | Abandoned => false,
        }
    }
}

/// A step's state as stored, without its data (see [`StepState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepStatus {
    Pending,
    Running,
    Waiting,
    Succeeded,
    Failed,
    /// Never ran (or ran no more) because the run failed or its deadline passed first.
    Skipped,
    /// Failed for good with an error that a catch handler matches: the handler is to run.
    Catching,
    /// Its error was caught: a handler matched it (and succeeded, if it has a command). Like
    /// succeeded, final, and its dependents run.
    Caught,
}

impl StepStatus {
    const ALL: [StepStatus; 8] = [
        Self::Pending,
        Self::Running,
        Self::Waiting,
        Self::Succeeded,
        Self::Failed,
        Self::Skipped,
        Self::Catching,
        Self::Caught,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Running => "running",
            StepStatus::Waiting => "waiting",
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::Skipped => "skipped",
            StepStatus::Catching => "catching",
            StepStatus::Caught => "caught",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<StepStatus, UnknownState> {
        Self::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownState { kind: "step", value: s.into() })
    }

    /// Whether a step in this state may move to `to`. An attempt starts from pending or waiting,
    /// or again from running (an attempt redelivered after its runner died); it ends in
    /// succeeded, failed, waiting (a retry) or pending (cancelled). A step that is pending or
    /// waiting when the run fails (or its deadline passes) is skipped, and so is one a dead runner
    /// left running that the run's next runner did not run again. A failed or skipped step
    /// is reopened (pending) by `waymark resume`. A step whose error a handler matches is
    /// catching until its handler ends: caught, failed, or catching again (the handler was
    /// cancelled, and runs again). Succeeded and caught are final.
    pub(crate) fn can_move_to(self, to: StepStatus) -> bool {
        use StepStatus::*;
        match self {
            Pending | Waiting => matches!(to, Running | Skipped),
            Running => true,
            Failed | Skipped => to == Pending,
            Catching => matches!(to, Catching | Caught | Failed | Skipped),
            Succeeded | Caught => false,
        }
    }

    /// The states a step may move to `to` from: the stores' `UPDATE`s check a step's state
    /// against them instead of reading it first.
    pub(crate) fn sources_of(to: StepStatus) -> impl Iterator<Item = StepStatus> {
        Self::ALL.into_iter().filter(move |from| from.can_move_to(to))
    }
}

/// Where a step stands, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StepState {
    Pending,
    Succeeded,
    Failed,
    Skipped,
    Caught,
    /// A catch handler is to run for the error of attempt `attempt`; `in_flight` is the handler's
    /// run (its row, pid and start time) when one was running as its runner stopped.
    Catching {
        attempt: u32,
        in_flight: Option<(i64, Option<u32>, Option<u64>)>,
    },
    /// A retry waits until `wake_at`.
    Waiting {
        next_attempt: u32,
        wake_at: SystemTime,
    },
    /// An attempt was running when its runner stopped.
    InFlight {
        attempt: u32,
        /// The attempt's row: with the run id, its `WAYMARK_ATTEMPT_ID`.
        row: i64,
        pid: Option<u32>,
        proc_start: Option<u64>,
    },
}

impl StepState {
    pub(crate) fn status(&self) -> StepStatus {
        match self {
            StepState::Pending => StepStatus::Pending,
            StepState::Succeeded => StepStatus::Succeeded,
            StepState::Failed => StepStatus::Failed,
            StepState::Skipped => StepStatus::Skipped,
            StepState::Caught => StepStatus::Caught,
            StepState::Catching { .. } => StepStatus::Catching,
            StepState::Waiting { .. } => StepStatus::Waiting,
            StepState::InFlight { .. } => StepStatus::Running,
        }
    }
}

/// How an attempt ended, as the executor reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    Succeeded,
    Failed,
    /// Stopped by a signal to the runner; does not use up the attempt.
    Cancelled,
}

impl AttemptOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        self.state().as_str()
    }

    /// The stored state of an attempt that ended so.
    pub(crate) fn state(self) -> AttemptState {
        match self {
            AttemptOutcome::Succeeded => AttemptState::Succeeded,
            AttemptOutcome::Failed => AttemptState::Failed,
            AttemptOutcome::Cancelled => AttemptState::Cancelled,
        }
    }
}

/// An attempt's state as stored: running until it ends, then how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Its runner died while it ran (recorded when the run is claimed again).
    RunnerLost,
}

impl AttemptState {
    const ALL: [AttemptState; 5] = [Self::Running, Self::Succeeded, Self::Failed, Self::Cancelled, Self::RunnerLost];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttemptState::Running => "running",
            AttemptState::Succeeded => "succeeded",
            AttemptState::Failed => "failed",
            AttemptState::Cancelled => "cancelled",
            AttemptState::RunnerLost => "runner_lost",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<AttemptState, UnknownState> {
        Self::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownState { kind: "attempt", value: s.into() })
    }

    /// Only a running attempt ends, and only once.
    pub(crate) fn can_move_to(self, to: AttemptState) -> bool {
        self == AttemptState::Running && to != AttemptState::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_stored_name() {
        for s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Ok(s));
        }
        for s in StepStatus::ALL {
            assert_eq!(StepStatus::parse(s.as_str()), Ok(s));
        }
        for s in AttemptState::ALL {
            assert_eq!(AttemptState::parse(s.as_str()), Ok(s));
        }
    }

    #[test]
    fn unknown_names_are_errors_not_defaults() {
        assert_eq!(RunStatus::parse("paused").unwrap_err().to_string(), "unknown run state `paused`");
        assert_eq!(StepStatus::parse("paused").unwrap_err().to_string(), "unknown step state `paused`");
        assert_eq!(AttemptState::parse("").unwrap_err().to_string(), "unknown attempt state ``");
        assert!(RunStatus::parse("Running").is_err(), "names are exact");
    }

    #[test]
    fn final_states_stay_final() {
        use StepStatus as S;
        for to in StepStatus::ALL {
            assert!(!S::Succeeded.can_move_to(to), "succeeded -> {to:?}");
        }
        assert!(S::Failed.can_move_to(S::Pending));
        assert!(!S::Failed.can_move_to(S::Running), "a failed step is reopened before it runs");
        assert!(S::Running.can_move_to(S::Running), "redelivery");
        assert!(!S::Pending.can_move_to(S::Succeeded), "a step succeeds only through an attempt");
        assert!(S::Pending.can_move_to(S::Skipped) && S::Waiting.can_move_to(S::Skipped));
        assert!(S::Running.can_move_to(S::Skipped), "left running by a dead runner, not run again");
        assert!(S::Skipped.can_move_to(S::Pending), "reopened by `waymark resume`");
        assert!(!S::Skipped.can_move_to(S::Running), "a skipped step is reopened before it runs");
        assert!(S::Running.can_move_to(S::Catching) && S::Running.can_move_to(S::Caught));
        assert!(S::Catching.can_move_to(S::Caught) && S::Catching.can_move_to(S::Failed));
        assert!(!S::Catching.can_move_to(S::Running), "a handler does not retry the step");
        for to in RunStatus::ALL {
            assert!(!RunStatus::Succeeded.can_move_to(to));
            assert!(!RunStatus::Abandoned.can_move_to(to));
        }
        assert!(RunStatus::Interrupted.can_move_to(RunStatus::Running));
        assert!(!RunStatus::Failed.can_move_to(RunStatus::Abandoned));
        assert!(AttemptState::Running.can_move_to(AttemptState::RunnerLost));
        assert!(!AttemptState::Failed.can_move_to(AttemptState::Succeeded));
    }
}
