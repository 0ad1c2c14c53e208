//! `waymark check`: validate a flow and print what `run` would do.

use super::{CliError, EXIT_OK, print_warnings};
use crate::flow::{self, Flow, Step};
use std::fmt::Write;
use std::path::Path;

/// Backoff waits listed in a plan before it says "…".
const SHOWN_WAITS: usize = 5;

pub fn check(path: &Path) -> Result<i32, CliError> {
    let loaded = flow::load(path)?;
    print_warnings(&loaded, &path.display().to_string());
    super::output::print(plan(&loaded.flow, &path.display().to_string()))?;
    Ok(EXIT_OK)
}

fn human(d: std::time::Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The plan of a flow, as `check` prints it.
pub fn plan(flow: &Flow, shown: &str) -> String {
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

fn backoff_line(step: &Step) -> String {
    let b = &step.retry.backoff;
    if b.initial.is_zero() {
        return "none: each retry starts at once".to_owned();
    }
    let retries = (step.retry.attempts - 1) as usize;
    let mut waits: Vec<String> = b.sequence().take(retries.min(SHOWN_WAITS)).map(human).collect();
    if retries > SHOWN_WAITS {
        waits.push("…".into());
    }
    let jitter = if b.jitter { " (each times a random 0.5-1.0)" } else { "" };
    format!("{}{jitter}", waits.join(", "))
}
