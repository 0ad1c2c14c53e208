//! `waymark errors`: the class tree that retry filters and `exit_codes` name.

use super::{CliError, EXIT_OK};
use crate::classify::classes::ClassTree;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

pub(crate) fn errors(flow: Option<&Path>) -> Result<i32, CliError> {
    let tree = match flow {
        Some(path) => crate::flow::load(path)?.flow.classes,
        None => ClassTree::default(),
    };
    super::output::print(render(&tree))?;
    Ok(EXIT_OK)
}

/// The tree drawn top-down from `BaseException`; a class with several bases appears under each,
/// its other bases named in brackets.
pub(crate) fn render(tree: &ClassTree) -> String {
    let children = tree.children();
    let mut out = String::new();
    draw(tree, &children, "BaseException", "", true, true, &mut out);
    out
}

fn draw(
    tree: &ClassTree,
    children: &BTreeMap<String, Vec<String>>,
    name: &str,
    prefix: &str,
    last: bool,
    root: bool,
    out: &mut String,
) {
    let parents = tree.parents(name);
    let extra = if parents.len() > 1 { format!("  [bases: {}]", parents.join(", ")) } else { String::new() };
    if root {
        let _ = writeln!(out, "{name}{extra}");
    } else {
        let _ = writeln!(out, "{prefix}{}{name}{extra}", if last { "└── " } else { "├── " });
    }
    let kids = children.get(name).map(Vec::as_slice).unwrap_or_default();
    let next = if root { String::new() } else { format!("{prefix}{}", if last { "    " } else { "│   " }) };
    for (i, kid) in kids.iter().enumerate() {
        draw(tree, children, kid, &next, i + 1 == kids.len(), false, out);
    }
}
