//! `waymark graph`: the step graph of a flow as Graphviz DOT or Mermaid text.

use super::{CliError, EXIT_OK, print_warnings};
use crate::cli::GraphFormat;
use crate::flow::{self, Flow, Step};
use std::fmt::Write;
use std::path::Path;

pub(crate) fn graph(path: &Path, format: GraphFormat) -> Result<i32, CliError> {
    let loaded = flow::load(path)?;
    print_warnings(&loaded, &path.display().to_string());
    let text = match format {
        GraphFormat::Dot => dot(&loaded.flow),
        GraphFormat::Mermaid => mermaid(&loaded.flow),
    };
    // A flow's values are shown with its secrets hidden, as `check` and a run show them.
    let text = crate::executor::environment::secrets_to_hide(&loaded.flow).redact_string(text);
    super::output::print(text)?;
    Ok(EXIT_OK)
}

/// A step's retry policy in short: `attempts 5, retries ConnectionError, TimeoutError`, or
/// `runs once`.
pub(crate) fn retry_short(step: &Step) -> String {
    let p = &step.retry;
    if p.attempts <= 1 || p.exception_types.is_empty() {
        return "runs once".into();
    }
    format!("attempts {}, retries {}", p.attempts, p.exception_types.join(", "))
}

/// The edges `need -> step`, by step in file order, each step's needs in the order written.
fn edges(flow: &Flow) -> impl Iterator<Item = (usize, usize)> + '_ {
    flow.steps.iter().enumerate().flat_map(|(i, s)| s.needs.iter().map(move |&j| (j, i)))
}

/// A DOT quoted string's contents.
fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz DOT: one box per step (its name, then its retry policy), an edge from each step to
/// those that need it.
pub(crate) fn dot(flow: &Flow) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_escape(&flow.name));
    let _ = writeln!(out, "  rankdir=LR;");
    let _ = writeln!(out, "  node [shape=box];");
    for step in &flow.steps {
        let name = dot_escape(&step.name);
        let _ = writeln!(out, "  \"{name}\" [label=\"{name}\\n{}\"];", dot_escape(&retry_short(step)));
    }
    for (from, to) in edges(flow) {
        let _ =
            writeln!(out, "  \"{}\" -> \"{}\";", dot_escape(&flow.steps[from].name), dot_escape(&flow.steps[to].name));
    }
    out.push_str("}\n");
    out
}

/// Mermaid text for a quoted label: `"` as an entity.
fn mermaid_escape(s: &str) -> String {
    s.replace('"', "#quot;")
}

/// A Mermaid flowchart: nodes `s1`, `s2`, ... in file order (a step's name may be a Mermaid
/// keyword such as `end`), labelled with the step's name and retry policy.
pub(crate) fn mermaid(flow: &Flow) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "---\ntitle: {}\n---", mermaid_escape(&flow.name));
    let _ = writeln!(out, "flowchart LR");
    for (i, step) in flow.steps.iter().enumerate() {
        let _ = writeln!(
            out,
            "  s{}[\"{}<br/>{}\"]",
            i + 1,
            mermaid_escape(&step.name),
            mermaid_escape(&retry_short(step))
        );
    }
    for (from, to) in edges(flow) {
        let _ = writeln!(out, "  s{} --> s{}", from + 1, to + 1);
    }
    out
}
