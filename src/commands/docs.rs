//! `completions` and `man`: documents generated from the command line's own definition, so they
//! cannot describe another CLI than this binary's. The copies committed under `completions/` and
//! `man/` are these outputs (`tests/cli_files.rs` fails when they differ).

use super::{CliError, EXIT_OK};
use crate::cli::Cli;
use clap::CommandFactory;
use clap_mangen::roff::{Roff, roman};
use std::io::Write;

pub(crate) fn completions(shell: clap_complete::Shell) -> Result<i32, CliError> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "waymark", &mut script);
    super::output::print(script)?;
    Ok(EXIT_OK)
}

/// Print the manual page of waymark, or of one of its commands (`waymark-run(1)`).
pub(crate) fn man(command: Option<&str>) -> Result<i32, CliError> {
    let page = page(command).map_err(|e| CliError::Internal(anyhow::anyhow!("cannot render the manual page: {e}")))?;
    super::output::print(page)?;
    Ok(EXIT_OK)
}

/// The environment variables waymark itself reads, for the main page (README's "Environment"
/// lists the same).
const ENVIRONMENT: [(&str, &str); 11] = [
    ("WAYMARK_STATE_DIR", "Where runs and logs are kept, unless --state-dir is given."),
    ("XDG_STATE_HOME", "Without WAYMARK_STATE_DIR, runs and logs are kept in $XDG_STATE_HOME/waymark."),
    ("HOME", "Without either, runs and logs are kept in ~/.local/state/waymark."),
    (
        "WAYMARK_STORE",
        "The store that keeps the runs, unless --store is given: postgres://... for one shared by hosts, \
         sqlite:DIR for a state directory.",
    ),
    ("WAYMARK_HOST_ID", "This host's name in a shared store, unless --host-id is given; else the host name."),
    ("WAYMARK_LEASE_TTL", "How long a runner's lease on a flow lasts in a shared store (15s)."),
    ("WAYMARK_LEASE_RENEW", "How often a runner renews its lease (5s); at most half WAYMARK_LEASE_TTL."),
    (
        "NO_COLOR",
        "Set to anything but the empty string, waymark's messages are not colored, unless --color always is given.",
    ),
    ("TERM", "`dumb`: no live display on a terminal (--progress auto shows plain lines)."),
    ("TZ", "The time zone of the times waymark shows (else /etc/localtime)."),
    ("WAYMARK_COMPLETE", "Set, waymark answers a shell's completion request instead of running a command."),
];

fn page(command: Option<&str>) -> std::io::Result<Vec<u8>> {
    // `waymark help` is clap's own and has no page; the pages list only waymark's commands.
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    let cmd = match command {
        None => root.clone(),
        // `COMMANDS` (the argument's possible values) is kept equal to the subcommands by a test.
        Some(name) => root.find_subcommand(name).cloned().unwrap_or(root.clone()),
    };
    let source = format!("waymark {}", root.get_version().unwrap_or_default());
    let man = clap_mangen::Man::new(cmd.clone()).source(source);
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut out)?;
    }
    let mut roff = Roff::default();
    if let Some(after) = cmd.get_after_help() {
        after_help_sections(&mut roff, &after.to_string());
    }
    if command.is_none() {
        roff.control("SH", ["ENVIRONMENT"]);
        for (name, meaning) in ENVIRONMENT {
            roff.control("TP", []);
            roff.text([roman(name)]);
            roff.text([roman(meaning)]);
        }
    } else {
        roff.control("SH", ["SEE ALSO"]);
        roff.text([roman("waymark(1)")]);
    }
    roff.to_writer(&mut out)?;
    if command.is_none() {
        man.render_version_section(&mut out)?;
    }
    out.flush()?;
    Ok(out)
}

/// The `--help` epilogue as man sections: each paragraph that starts with a label (`Examples:`,
/// `Exit status: ...`) is a section of that name. A label alone on its line is followed by lines
/// laid out by hand (examples), kept as they are; a label with text after it heads running text.
fn after_help_sections(roff: &mut Roff, text: &str) {
    for block in text.split("\n\n") {
        let mut lines = block.lines();
        let Some(first) = lines.next() else { continue };
        let Some((label, rest)) = first.split_once(':') else {
            roff.control("PP", []);
            roff.text([roman(block)]);
            continue;
        };
        roff.control("SH", [label.to_uppercase().as_str()]);
        let rest = rest.trim();
        if rest.is_empty() {
            let body: Vec<&str> = lines.collect();
            let indent = body.iter().map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
            roff.control("nf", []);
            for line in body {
                roff.text([roman(line.get(indent..).unwrap_or(line))]);
            }
            roff.control("fi", []);
        } else {
            let body: Vec<&str> = std::iter::once(rest).chain(lines.map(str::trim)).collect();
            roff.text([roman(body.join(" "))]);
        }
    }
}
