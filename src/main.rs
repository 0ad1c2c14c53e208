use clap::{CommandFactory, FromArgMatches};

fn main() {
    // Before anything else is opened: descriptors leaked to waymark must not reach the steps.
    waymark::executor::close_inherited_fds_on_exec();
    // And before any thread is started: a blocked signal inherited from the parent is unblocked.
    waymark::executor::unblock_inherited_signals();
    // The shell asking for completions (`WAYMARK_COMPLETE=bash waymark ...`) is answered, and waymark exits.
    waymark::commands::complete::complete_if_asked();
    // `--color` is read first so that clap's own help and errors follow it too.
    let color = waymark::cli::ColorArg::from_args(std::env::args_os());
    waymark::commands::set_color(color);
    let args = waymark::cli::args(std::env::args_os());
    let parse =
        |args: &[std::ffi::OsString]| waymark::cli::Cli::command().color(color.clap()).try_get_matches_from(args);
    let parsed = match parse(&args) {
        Err(e) if let Some(again) = waymark::cli::help_asked_of_help(&args, &e) => parse(&again),
        parsed => parsed,
    };
    let matches = match parsed {
        Ok(matches) => matches,
        Err(e) if let Some(said) = waymark::cli::misplaced_option(&e) => {
            std::process::exit(waymark::commands::CliError::Usage(said).tell())
        }
        // Usage errors go to stderr with exit status 2, as clap words them.
        Err(e) if e.use_stderr() => e.exit(),
        // Help and version text, printed as every command's output is.
        Err(e) => std::process::exit(waymark::commands::print_clap_text(&e)),
    };
    let cli = waymark::cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let code = match waymark::commands::dispatch(cli) {
        Ok(code) => code,
        Err(e) => e.tell(),
    };
    std::process::exit(code);
}
