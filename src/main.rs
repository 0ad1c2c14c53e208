use clap::Parser;

fn main() {
    let cli = waymark::cli::Cli::parse();
    let code = match waymark::commands::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprint!("{}", e.render());
            e.exit_code()
        }
    };
    std::process::exit(code);
}
