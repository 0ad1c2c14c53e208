//! `waymark check`: validate a flow and print what `run` would do.

use super::{CliError, EXIT_OK, print_warnings};
use crate::flow::model::{Catch, DEFAULT_MAX_PARALLEL};
use crate::flow::{self, Flow, Step};
use std::fmt::Write;
use std::path::Path;

/// Backoff waits listed in a plan before it says "…".
const SHOWN_WAITS: u32 = 5;

pub(crate) fn check(path: &Path, strict: bool, explain: bool) -> Result<i32, CliError> {
    let mut loaded = super::load_flow(path, strict)?;
    let shown = crate::text::shown_path(path);
    print_warnings(&loaded, &shown);
    // Its secrets are hidden as a run hides them, before the commands are quoted.
    // (A secret from an env file that cannot be read is not known here: its value can be in the
    // flow's commands only as the literal text that `run` warns of.)
    // The env file, read once for both.
    let file = crate::executor::environment::env_file_or_none(&loaded.flow);
    for what in crate::executor::environment::misspelt_secrets(&loaded.flow, &file) {
        if strict {
            return Err(CliError::Usage(format!("{what} (an error under --strict): correct the name in `secret_env`")));
        }
        note!("warning: {what} Correct the name in `secret_env`");
    }
    let secrets = crate::executor::environment::secrets_in(&loaded.flow, &file);
    // A default that holds a secret: `run` refuses a run that takes it (one given `--param` is
    // fine), so `check` warns, and refuses under `--strict`.
    if let Some(name) = loaded
        .flow
        .params
        .iter()
        .find(|(_, p)| p.default.as_deref().is_some_and(|d| secrets.redact(d) != d))
        .map(|(k, _)| k)
    {
        let what = format!(
            "{}; `waymark run` refuses a run that takes it (give `--param {name}=...`)",
            super::run::secret_in_param(&format!("the default of parameter `{name}` (`params.{name}` in {shown})"))
        );
        if strict {
            return Err(CliError::Usage(format!("{what} (an error under --strict)")));
        }
        note!("warning: {what}");
    }
    loaded.flow.hide_in_commands(&secrets);
    let mut text = plan(&loaded.flow, &shown);
    if explain {
        text.push_str(&explanation(&loaded.flow));
    }
    // And wherever else the plan shows a value of the flow's (a parameter's default, a class
    // name), as a run's messages do.
    let text = secrets.redact_string(text);
    // A flow's commands and names as written, but never a control character the terminal would
    // act on: `check` is how a flow is reviewed before it runs.
    super::output::print(crate::text::visible_owned(text))?;
    // The process exits next: freeing a flow of 10,000 steps piece by piece would cost about as
    // much as printing its plan.
    std::mem::forget(loaded);
    Ok(EXIT_OK)
}

fn human(d: std::time::Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The plan of a flow, as `check` prints it. A flow without the keys of the workflow structure
/// (`needs`, `catch`, `compensate`, `[hooks]`, ...) prints as it always did.
pub(crate) fn plan(flow: &Flow, shown: &str) -> String {
    let mut out = String::new();
    let n = flow.steps.len();
    let steps = format!("{n} step{}", if n == 1 { "" } else { "s" });
    // Without `needs`, every step needs the one before: nothing runs side by side.
    let parallel = flow.has_explicit_needs();
    if parallel {
        let _ = writeln!(
            out,
            "flow {} ({shown}): {steps}, each once the steps it needs have succeeded, at most {} at once",
            flow.name, flow.max_parallel
        );
    } else {
        let _ = writeln!(out, "flow {} ({shown}): {steps}, run in order", flow.name);
    }
    for (key, value) in settings(flow, parallel) {
        let _ = writeln!(out, "  {:<14}{}", format!("{key}:"), indented(&value, 16));
    }
    // A flow of thousands of steps mostly repeats the same timeout and retry: each line is
    // formatted once per run of equal steps, and every line goes straight into `out`.
    out.reserve(flow.steps.len() * 128);
    let mut timeouts = Memo::default();
    let mut retries = Memo::default();
    for (i, step) in flow.steps.iter().enumerate() {
        out.push_str("  ");
        // Without the formatting machinery: once per step.
        out.push_str(itoa::Buffer::new().format(i + 1));
        out.push_str(". ");
        out.push_str(&step.name);
        out.push('\n');
        if parallel {
            let _ = writeln!(out, "     needs:    {}", needs_line(flow, i));
        }
        out.push_str("     command:  ");
        let start = out.len();
        step.command.display_to(&mut out);
        indent_from(&mut out, start, 15);
        out.push_str("\n     timeout:  ");
        out.push_str(timeouts.get((step.timeout, step.kill_grace, step.kill_signal), || timeout_line(step)));
        out.push_str("\n     retry:    ");
        out.push_str(retries.get((&step.retry, &step.retry_name), || {
            let mut lines = retry_line(step);
            if step.retry.attempts > 1 && !step.retry.exception_types.is_empty() {
                lines.push_str("\n     backoff:  ");
                lines.push_str(&backoff_line(step));
            }
            lines
        }));
        out.push('\n');
        for handler in &step.catch {
            // A script's lines under its first, after the classes it handles.
            let line = catch_line(handler);
            let command_at = line.find(" -> ").map_or(0, |at| crate::text::columns(&line[..at]) + 4);
            let _ = writeln!(out, "     catch:    {}", indented(&line, 15 + command_at));
        }
        if let Some(undo) = &step.compensate {
            out.push_str("     compensate: ");
            let start = out.len();
            undo.display_to(&mut out);
            indent_from(&mut out, start, 17);
            out.push('\n');
        }
    }
    if parallel && let Some(order) = ready_order(flow) {
        let _ = writeln!(out, "  ready order: {order}");
    }
    out
}

/// `text` with each line after its first indented by `indent` columns, under the first: a
/// command of several lines (a `shell` script) stays in its column of the plan.
fn indented(text: &str, indent: usize) -> std::borrow::Cow<'_, str> {
    if !text.contains('\n') {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(text.replace('\n', &format!("\n{:indent$}", "")))
}

/// [`indented`] for what `out` got from `start` on.
fn indent_from(out: &mut String, start: usize, indent: usize) {
    if memchr::memchr(b'\n', &out.as_bytes()[start..]).is_some() {
        let written = out.split_off(start);
        out.push_str(&indented(&written, indent));
    }
}

/// The text last made from a key, made again only for another key.
struct Memo<K> {
    last: Option<(K, String)>,
}

impl<K> Default for Memo<K> {
    fn default() -> Self {
        Memo { last: None }
    }
}

impl<K: PartialEq> Memo<K> {
    fn get(&mut self, key: K, make: impl FnOnce() -> String) -> &str {
        if self.last.as_ref().is_none_or(|(k, _)| *k != key) {
            self.last = Some((key, make()));
        }
        self.last.as_ref().map_or("", |(_, text)| text.as_str())
    }
}

/// The flow-wide settings that differ from their defaults, as `(key, what it does)`.
fn settings(flow: &Flow, parallel: bool) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    if !parallel && flow.max_parallel != DEFAULT_MAX_PARALLEL {
        lines.push((
            "max_parallel",
            format!("{} (no step has `needs`, so each runs after the one before it)", flow.max_parallel),
        ));
    }
    if let Some(t) = flow.timeout {
        lines.push(("timeout", format!("{} for the whole run, then it fails with WorkflowTimeout", human(t))));
    }
    if flow.fail_fast {
        lines.push(("fail_fast", "a step that fails for good cancels the running steps".into()));
    }
    if !flow.params.is_empty() {
        let params: Vec<String> = flow
            .params
            .iter()
            .map(|(name, p)| match &p.default {
                Some(d) => format!("{name} = {}", flow::toml_quoted(d)),
                None => format!("{name} (required)"),
            })
            .collect();
        lines.push(("params", params.join(", ")));
    }
    if let Some(file) = &flow.env_file {
        lines.push(("env_file", file.display().to_string()));
    }
    if !flow.secret_env.is_empty() {
        lines.push(("secret_env", format!("{} (shown as ***)", flow.secret_env.join(", "))));
    }
    for (key, hook) in [
        ("on_success", &flow.hooks.on_success),
        ("on_failure", &flow.hooks.on_failure),
        ("on_exit", &flow.hooks.on_exit),
    ] {
        if let Some(command) = hook {
            lines.push((key, command.display()));
        }
    }
    lines
}

fn needs_line(flow: &Flow, i: usize) -> String {
    let step = &flow.steps[i];
    let names = || step.needs.iter().filter_map(|&j| flow.steps.get(j)).map(|s| s.name.as_str());
    match (step.needs_explicit, step.needs.is_empty()) {
        (true, true) => "none: a root, ready at once".into(),
        (true, false) => names().collect::<Vec<_>>().join(", "),
        (false, true) => "none: the first step, a root".into(),
        (false, false) => format!("{} (the step before it)", names().collect::<Vec<_>>().join(", ")),
    }
}

fn catch_line(handler: &Catch) -> String {
    let what = match &handler.command {
        Some(command) => command.display(),
        None => "nothing: the error is swallowed".into(),
    };
    format!("{} -> {what}", handler.exception_types.join(", "))
}

/// The steps by how deep they sit (a root first, then the steps that need only roots, ...), each
/// group in file order: `a, b; then c; then d`. A step starts as soon as the steps it needs have
/// succeeded, so it may start before the rest of the group before it is done.
fn ready_order(flow: &Flow) -> Option<String> {
    let needs: Vec<&[usize]> = flow.steps.iter().map(|s| &*s.needs).collect();
    let depths = flow::graph::depths(&needs)?;
    let mut waves: Vec<Vec<&str>> = vec![Vec::new(); depths.iter().max().map_or(0, |d| d + 1)];
    for (step, depth) in flow.steps.iter().zip(depths) {
        waves[depth].push(&step.name);
    }
    Some(waves.iter().map(|w| w.join(", ")).collect::<Vec<_>>().join("; then "))
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

/// The waits `run` will sleep, from the very function it calls ([`Backoff::nominal`](crate::retry::Backoff::nominal)).
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
        // Where they stop growing; when that is among the waits shown, they stay there from the
        // next retry on.
        let steady = b.steady_from(retries).max(SHOWN_WAITS + 1);
        let to = if steady == retries { String::new() } else { format!(" to {retries}") };
        waits.push(format!("… {} at retry {steady}{to}", human(b.nominal(steady))));
    }
    let jitter = if b.jitter { " (each times a random 0.5-1.0)" } else { "" };
    format!("{}{jitter}", waits.join(", "))
}

/// Attempts listed in a schedule before it says "…".
const SHOWN_ATTEMPTS: u32 = 6;

/// `check --explain`: for each step, when each attempt may start, which errors retry and which
/// do not, and the longest the step can take.
fn explanation(flow: &Flow) -> String {
    let mut out = String::from("explain:\n");
    for (i, step) in flow.steps.iter().enumerate() {
        let _ = writeln!(out, "  {}. {}", i + 1, step.name);
        let _ = writeln!(out, "     schedule:   {}", schedule_line(step));
        let _ = writeln!(out, "     retries:    {}", retries_line(step));
        let _ = writeln!(out, "     not:        {}", not_retried_line(flow, step));
        let _ = writeln!(out, "     worst case: {}", worst_case_line(flow, step));
    }
    out
}

/// The attempts that may run: at most `attempts`, none when nothing retries.
fn attempts(step: &Step) -> u32 {
    if step.retry.exception_types.is_empty() { 1 } else { step.retry.attempts.max(1) }
}

/// The sum of the nominal waits before retries 1..=`retries`: O(retries until the waits stop
/// growing), since they stay at their last value after that.
fn waits_before(step: &Step, retries: u32) -> std::time::Duration {
    let b = &step.retry.backoff;
    if retries == 0 {
        return std::time::Duration::ZERO;
    }
    let steady = b.steady_from(retries);
    let growing = (1..steady).fold(std::time::Duration::ZERO, |sum, k| sum.saturating_add(b.nominal(k)));
    growing.saturating_add(b.nominal(steady).saturating_mul(retries - steady + 1))
}

/// When attempt `k` may start, counted from the start of attempt 1, if every attempt before it
/// fails at once: the waits (with jitter, half of them at the least).
fn earliest(step: &Step, k: u32) -> std::time::Duration {
    let waits = waits_before(step, k - 1);
    if step.retry.backoff.jitter { waits.mul_f64(0.5) } else { waits }
}

fn schedule_line(step: &Step) -> String {
    let n = attempts(step);
    if n == 1 {
        return "attempt 1 only".into();
    }
    let at = |k: u32| {
        let t = earliest(step, k);
        if t.is_zero() { format!("{k} at once") } else { format!("{k} after {}", human(t)) }
    };
    let mut parts = vec!["attempt 1 at the start".to_owned()];
    parts.extend((2..=n.min(SHOWN_ATTEMPTS)).map(at));
    if n > SHOWN_ATTEMPTS {
        if n > SHOWN_ATTEMPTS + 1 {
            parts.push("…".into());
        }
        parts.push(at(n));
    }
    let jitter =
        if step.retry.backoff.jitter { " (jitter: each wait half its nominal value at the least)" } else { "" };
    format!("at the earliest, if each attempt fails at once{jitter}: {}", parts.join(", "))
}

fn retries_line(step: &Step) -> String {
    let p = &step.retry;
    if p.attempts <= 1 {
        return "nothing: the step runs once".into();
    }
    if p.exception_types.is_empty() {
        return "nothing: exception_types = [] matches no error".into();
    }
    let classes: Vec<String> = p.exception_types.iter().map(|c| format!("{c} and its subclasses")).collect();
    classes.join("; ")
}

/// The errors waymark itself reports and the classes the step's and flow's `exit_codes` name,
/// those the policy does not retry, each with `(Exception)` or `(BaseException)`: what
/// `exception_types = ["Exception"]` would not catch either.
fn not_retried_line(flow: &Flow, step: &Step) -> String {
    use crate::classify::classes::{
        ACTION_EXECUTION_LOST, ACTION_EXECUTION_NOT_STARTED, ACTION_TIMEOUT, CALLED_PROCESS_ERROR,
    };
    let mut candidates: Vec<&str> = step
        .exit_codes
        .codes
        .values()
        .chain(step.exit_codes.signals.values())
        .chain(flow.exit_codes.codes.values())
        .chain(flow.exit_codes.signals.values())
        .map(String::as_str)
        .collect();
    candidates.extend([CALLED_PROCESS_ERROR, ACTION_EXECUTION_NOT_STARTED, ACTION_TIMEOUT, ACTION_EXECUTION_LOST]);
    let mut seen = std::collections::HashSet::new();
    let retried = |class: &str| {
        step.retry.attempts > 1
            && step
                .retry
                .exception_types
                .iter()
                .any(|t| t == class || flow.classes.bases(class).is_some_and(|bases| bases.iter().any(|b| b == t)))
    };
    let not: Vec<String> = candidates
        .into_iter()
        .filter(|c| seen.insert(*c) && !retried(c))
        .map(|c| {
            let under_exception = flow.classes.bases(c).is_some_and(|b| b.iter().any(|b| b == "Exception"));
            format!("{c} ({})", if under_exception { "Exception" } else { "BaseException" })
        })
        .collect();
    if not.is_empty() { "none of waymark's own errors or the exit_codes classes".into() } else { not.join(", ") }
}

fn worst_case_line(flow: &Flow, step: &Step) -> String {
    let flow_ends = |line: &mut String, total: Option<std::time::Duration>| {
        if let Some(deadline) = flow.timeout
            && total.is_none_or(|total| deadline < total)
        {
            line.push_str(&format!("; the flow's timeout ends the run after {}", human(deadline)));
            // An attempt the deadline stops has its grace before SIGKILL, as for a timeout.
            if !step.kill_grace.is_zero() {
                line.push_str(&format!(
                    ", and an attempt it stops up to {} later (`kill_grace`)",
                    human(step.kill_grace)
                ));
            }
        }
    };
    let Some(timeout) = step.timeout else {
        let by = if flow.timeout.is_some() { " by the step" } else { "" };
        let mut line = format!("unbounded{by}: without a `timeout` an attempt may run forever");
        flow_ends(&mut line, None);
        return line;
    };
    let n = attempts(step);
    let per_attempt = timeout.saturating_add(step.kill_grace);
    let waits = waits_before(step, n - 1);
    let total = per_attempt.saturating_mul(n).saturating_add(waits);
    let each = if step.kill_grace.is_zero() {
        human(timeout)
    } else {
        format!("{} plus {} before SIGKILL", human(timeout), human(step.kill_grace))
    };
    let mut line = if n == 1 {
        format!("{} (one attempt of {each})", human(total))
    } else {
        format!("{} ({n} attempts of {each}, and {} of waits)", human(total), human(waits))
    };
    flow_ends(&mut line, Some(total));
    line
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
        step.retry = RetryPolicy { attempts, exception_types: vec!["Exception".into()], backoff }.into();
        backoff_line(&step)
    }

    /// The plan as each step's lines formatted one by one, without [`Memo`] or `itoa`.
    fn plan_line_by_line(flow: &Flow) -> String {
        let mut out = String::new();
        for (i, step) in flow.steps.iter().enumerate() {
            out.push_str(&format!("  {}. {}\n", i + 1, step.name));
            out.push_str(&format!("     command:  {}\n", indented(&step.command.display(), 15)));
            out.push_str(&format!("     timeout:  {}\n", timeout_line(step)));
            out.push_str(&format!("     retry:    {}\n", retry_line(step)));
            if step.retry.attempts > 1 && !step.retry.exception_types.is_empty() {
                out.push_str(&format!("     backoff:  {}\n", backoff_line(step)));
            }
        }
        out
    }

    #[test]
    fn a_plan_of_repeated_and_changing_steps_is_each_steps_own_lines() {
        let mut toml = String::from("[policies.net]\nattempts = 4\nexception_types = [\"OSError\"]\n");
        // Runs of equal steps, each run differing from the one before in one thing (each key of
        // the lines written once per run: the timeout, kill_signal, kill_grace, the retry policy
        // and its name), then back again.
        let variants = [
            "",
            "timeout = 5",
            "timeout = 5\nkill_signal = \"SIGINT\"",
            "timeout = 5\nkill_signal = \"SIGINT\"\nkill_grace = 0",
            "retry = \"net\"",
            "retry = { attempts = 4, exception_types = [\"OSError\"] }",
            "retry = { attempts = 4, exception_types = [\"OSError\"], backoff_seconds = 2 }",
            "retry = { attempts = 3 }",
            "shell = \"echo 'it''s'\"",
        ];
        for i in 0..120 {
            let extra = variants[(i / 3) % variants.len()];
            let run = if extra.starts_with("shell") { "" } else { "run = ['echo', 'a b']\n" };
            toml.push_str(&format!("[[step]]\nname = 's{i}'\n{run}{extra}\n"));
        }
        let flow = crate::flow::parse(&toml, Path::new("/x/f.toml")).unwrap().0;
        let plan = plan(&flow, "f.toml");
        let steps = plan.split_once('\n').unwrap().1;
        assert_eq!(steps, plan_line_by_line(&flow));
        assert!(steps.contains("  120. s119\n"), "{steps}");
    }

    #[test]
    fn backoff_line_shows_where_growth_stops() {
        assert_eq!(line(2000, 0.0, 2.0, None), "none: each retry starts at once");
        assert_eq!(line(100, 0.0, 1e9, Some(3.0)), "none: each retry starts at once");
        assert_eq!(line(4, 1.0, 2.0, Some(3.0)), "1s, 2s, 3s");
        assert_eq!(line(20, 1.0, 2.0, Some(5.0)), "1s, 2s, 4s, 5s, 5s, … 5s at retry 6 to 19");
        assert_eq!(line(7, 1.0, 2.0, Some(10.0)), "1s, 2s, 4s, 8s, 10s, … 10s at retry 6");
        assert_eq!(line(7, 3.0, 1.0, None), "3s, 3s, 3s, 3s, 3s, … 3s at retry 6");
        assert_eq!(line(20, 1.0, 2.0, Some(100.0)), "1s, 2s, 4s, 8s, 16s, … 1m 40s at retry 8 to 19");
        assert_eq!(line(9, 1.0, 2.0, None), "1s, 2s, 4s, 8s, 16s, … 2m 8s at retry 8");
        assert_eq!(line(2000, 1.0, 2.0, None), "1s, 2s, 4s, 8s, 16s, … 100years at retry 33 to 1999");
    }
}
