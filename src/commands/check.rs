//! `waymark check`: validate a flow and print what `run` would do.

use super::{CliError, EXIT_OK, print_warnings};
use crate::flow::{self, Flow, Step};
use std::fmt::Write;
use std::path::Path;

/// Backoff waits listed in a plan before it says "…".
const SHOWN_WAITS: u32 = 5;

pub(crate) fn check(path: &Path) -> Result<i32, CliError> {
    let loaded = flow::load(path)?;
    print_warnings(&loaded, &path.display().to_string());
    super::output::print(plan(&loaded.flow, &path.display().to_string()))?;
    Ok(EXIT_OK)
}

fn human(d: std::time::Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The plan of a flow, as `check` prints it.
pub(crate) fn plan(flow: &Flow, shown: &str) -> String {
    let mut out = String::new();
    let n = flow.steps.len();
    let _ = writeln!(out, "flow {} ({shown}): {n} step{}, run in order", flow.name, if n == 1 { "" } else { "s" });
    for (i, step) in flow.steps.iter().enumerate() {
        let _ = writeln!(out, "  {}. {}", i + 1, step.name);
        let _ = writeln!(out, "     command:  {}", step.command.display());
        let _ = writeln!(out, "     timeout:  {}", timeout_line(step));
        let _ = writeln!(out, "     retry:    {}", retry_line(step));
        if step.retry.attempts > 1 && !step.retry.exception_types.is_empty() {
            let _ = writeln!(out, "     backoff:  {}", backoff_line(step));
        }
    }
    out
}

fn timeout_line(step: &Step) -> String {
    let stop = if step.kill_grace.is_zero() {
        "then SIGKILL".to_owned()
    } else {
        format!("then {}, SIGKILL after {}", step.kill_signal.name(), human(step.kill_grace))
    };
    match step.timeout {
        Some(t) => format!("{} per attempt, {stop}", human(t)),
        None => "none (an attempt may run forever)".to_owned(),
    }
}

fn retry_line(step: &Step) -> String {
    let p = &step.retry;
    let from = step.retry_name.as_ref().map(|n| format!(" (policy `{n}`)")).unwrap_or_default();
    if p.attempts == 1 {
        return format!("none: runs once{from}");
    }
    if p.exception_types.is_empty() {
        return format!("nothing (exception_types = []): runs once{from}");
    }
    format!("up to {} attempts on {}{from}", p.attempts, p.exception_types.join(", "))
}

/// The waits `run` will sleep, from the very function it calls ([`Backoff::nominal`]).
fn backoff_line(step: &Step) -> String {
    let b = &step.retry.backoff;
    let retries = step.retry.attempts - 1;
    // Waits never shrink: when the last one is zero, all are.
    if b.nominal(retries).is_zero() {
        return "none: each retry starts at once".to_owned();
    }
    let shown = retries.min(SHOWN_WAITS);
    let mut waits: Vec<String> = (1..=shown).map(|k| human(b.nominal(k))).collect();
    if retries > SHOWN_WAITS {
        let steady = b.steady_from(retries);
        if steady > SHOWN_WAITS {
            let to = if steady == retries { String::new() } else { format!(" to {retries}") };
            waits.push(format!("… {} at retry {steady}{to}", human(b.nominal(steady))));
        } else {
            waits.push("…".into());
        }
    }
    let jitter = if b.jitter { " (each times a random 0.5-1.0)" } else { "" };
    format!("{}{jitter}", waits.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::{Backoff, RetryPolicy};
    use std::time::Duration;

    fn line(attempts: u32, initial: f64, multiplier: f64, max: Option<f64>) -> String {
        let backoff = Backoff {
            initial: Duration::from_secs_f64(initial),
            multiplier,
            max: max.map(Duration::from_secs_f64),
            jitter: false,
        };
        let flow = crate::flow::parse("[[step]]\nname = 'a'\nrun = ['true']\n", Path::new("/x/f.toml")).unwrap().0;
        let mut step = flow.steps[0].clone();
        step.retry = RetryPolicy { attempts, exception_types: vec!["Exception".into()], backoff };
        backoff_line(&step)
    }

    #[test]
    fn backoff_line_shows_where_growth_stops() {
        assert_eq!(line(2000, 0.0, 2.0, None), "none: each retry starts at once");
        assert_eq!(line(100, 0.0, 1e9, Some(3.0)), "none: each retry starts at once");
        assert_eq!(line(4, 1.0, 2.0, Some(3.0)), "1s, 2s, 3s");
        assert_eq!(line(20, 1.0, 2.0, Some(5.0)), "1s, 2s, 4s, 5s, 5s, …");
        assert_eq!(line(20, 1.0, 2.0, Some(100.0)), "1s, 2s, 4s, 8s, 16s, … 1m 40s at retry 8 to 19");
        assert_eq!(line(9, 1.0, 2.0, None), "1s, 2s, 4s, 8s, 16s, … 2m 8s at retry 8");
        assert_eq!(line(2000, 1.0, 2.0, None), "1s, 2s, 4s, 8s, 16s, … 100years at retry 33 to 1999");
    }
}
