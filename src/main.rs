use clap::Parser;
use std::io::Write;

fn main() {
    // Before anything else is opened: descriptors leaked to waymark must not reach the steps.
    waymark::executor::close_inherited_fds_on_exec();
    let cli = waymark::cli::Cli::parse();
    let code = match waymark::commands::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // A closed or full stderr leaves nothing to tell: the exit status still does.
            let _ = std::io::stderr().write_all(e.render().as_bytes());
            e.exit_code()
        }
    };
    std::process::exit(code);
}
