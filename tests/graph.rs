//! `waymark graph`: the step graph as Graphviz DOT and as Mermaid, asserted exactly.

mod common;

use common::Env;

const FLOW: &str = r#"name = "etl"

[policies.net]
attempts = 5
exception_types = ["ConnectionError", "TimeoutError"]

[[step]]
name = "fetch-a"
needs = []
run = ["true"]
retry = "net"

[[step]]
name = "fetch-b"
needs = []
run = ["true"]
retry = { attempts = 3 }

[[step]]
name = "load"
needs = ["fetch-a", "fetch-b"]
run = ["true"]

[[step]]
name = "end"
run = ["true"]
retry = { exception_types = [] }
"#;

/// `waymark graph ARGS flow.toml` with `flow` as the file: its stdout; it must succeed silently.
fn graph(flow: &str, args: &[&str]) -> String {
    let env = Env::new();
    env.write("flow.toml", flow);
    let mut all = vec!["graph"];
    all.extend(args);
    all.push("flow.toml");
    let out = env.cmd(&all).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stderr, "");
    assert!(!env.state().exists(), "graph runs nothing and writes no state");
    String::from_utf8(out.stdout).unwrap()
}

const DOT: &str = r#"digraph "etl" {
  rankdir=LR;
  node [shape=box];
  "fetch-a" [label="fetch-a\nattempts 5, retries ConnectionError, TimeoutError"];
  "fetch-b" [label="fetch-b\nattempts 3, retries Exception"];
  "load" [label="load\nruns once"];
  "end" [label="end\nruns once"];
  "fetch-a" -> "load";
  "fetch-b" -> "load";
  "load" -> "end";
}
"#;

#[test]
fn dot_is_the_default() {
    assert_eq!(graph(FLOW, &[]), DOT);
    assert_eq!(graph(FLOW, &["--format", "dot"]), DOT);
}

#[test]
fn mermaid_numbers_the_nodes() {
    assert_eq!(
        graph(FLOW, &["--format", "mermaid"]),
        "---\n\
         title: etl\n\
         ---\n\
         flowchart LR\n\
         \x20 s1[\"fetch-a<br/>attempts 5, retries ConnectionError, TimeoutError\"]\n\
         \x20 s2[\"fetch-b<br/>attempts 3, retries Exception\"]\n\
         \x20 s3[\"load<br/>runs once\"]\n\
         \x20 s4[\"end<br/>runs once\"]\n\
         \x20 s1 --> s3\n\
         \x20 s2 --> s3\n\
         \x20 s3 --> s4\n"
    );
}

#[test]
fn steps_without_needs_form_a_chain() {
    let flow = "[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'b'\nrun = ['true']\n";
    assert_eq!(
        graph(flow, &[]),
        "digraph \"flow\" {\n  rankdir=LR;\n  node [shape=box];\n  \"a\" [label=\"a\\nruns once\"];\n  \
         \"b\" [label=\"b\\nruns once\"];\n  \"a\" -> \"b\";\n}\n"
    );
}

#[test]
fn an_invalid_flow_prints_no_graph() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\n");
    let out = env.cmd(&["graph", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}
