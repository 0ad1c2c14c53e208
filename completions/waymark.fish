# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_waymark_global_optspecs
    string join \n state-dir= store= host-id= color= h/help V/version
end

function __fish_waymark_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_waymark_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_waymark_using_subcommand
    set -l cmd (__fish_waymark_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c waymark -n "__fish_waymark_needs_command" -l state-dir -d 'Where runs and logs are kept, for the commands that keep or read them (run, resume, history, status, logs, gc); the others ignore it, so an alias may always pass it. The same option after the command wins' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_needs_command" -l store -d 'Where runs are recorded, for the same commands as --state-dir; the others ignore it. The same option after the command wins' -r -f
complete -c waymark -n "__fish_waymark_needs_command" -l host-id -d 'The name of this runner\'s host, for the commands that take a flow\'s lease (run, resume, gc); the others ignore it. The same option after the command wins' -r -f
complete -c waymark -n "__fish_waymark_needs_command" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_needs_command" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_needs_command" -s V -l version -d 'Print version'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "run" -d 'Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "resume" -d 'Resume a given run, including a failed one (its failed step gets a fresh attempt budget)'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "check" -d 'Validate a flow file and print its plan; runs nothing'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "graph" -d 'Print the step graph (each step\'s needs, and its retry policy) as Graphviz DOT or Mermaid'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "history" -d 'List runs, newest first'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "status" -d 'Show a run step by step: state, attempts, last error, next retry'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "logs" -d 'Print the output an attempt of a step wrote'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "gc" -d 'Delete finished runs (succeeded, failed, abandoned) and their logs'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "errors" -d 'Print the error class tree that retry filters match against'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "man" -d 'Print waymark\'s manual page (roff), or one command\'s'
complete -c waymark -n "__fish_waymark_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c waymark -n "__fish_waymark_using_subcommand run" -l max-parallel -d 'Run at most N steps at once, instead of the flow\'s `max_parallel` (default 4)' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand run" -l param -d 'Set a parameter declared in the flow\'s `[params]`; repeat for each one' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand run" -l progress -d 'How the run is shown on a terminal: `live` draws a line per running step (attempt, time left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it' -r -f -a "auto\t''
live\t''
plain\t''"
complete -c waymark -n "__fish_waymark_using_subcommand run" -l output -d 'Whose output to show as it comes: `all` (every line, behind its step\'s name), `failed` (an attempt\'s lines only if it fails, when it ends), or `none`; the log files keep all of it either way' -r -f -a "all\t'Every line of every attempt'
failed\t'The lines of the attempts that fail'
none\t'No child output'"
complete -c waymark -n "__fish_waymark_using_subcommand run" -l state-dir -d 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_using_subcommand run" -l store -d 'Where runs are recorded: `sqlite:` (the state directory\'s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand run" -l host-id -d 'The name of this runner\'s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand run" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand run" -l fresh -d 'Abandon an unfinished run of this flow and start a new one'
complete -c waymark -n "__fish_waymark_using_subcommand run" -l wait -d 'Wait for another runner of the same flow instead of exiting with status 3'
complete -c waymark -n "__fish_waymark_using_subcommand run" -l strict -d 'Treat every warning about the flow file as an error: report them and exit 2, running nothing'
complete -c waymark -n "__fish_waymark_using_subcommand run" -s q -l quiet -d 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps\' output is kept in the log files'
complete -c waymark -n "__fish_waymark_using_subcommand run" -l json -d 'Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the steps\' output goes only to the log files'
complete -c waymark -n "__fish_waymark_using_subcommand run" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l progress -d 'How the run is shown on a terminal: `live` draws a line per running step (attempt, time left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it' -r -f -a "auto\t''
live\t''
plain\t''"
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l output -d 'Whose output to show as it comes: `all` (every line, behind its step\'s name), `failed` (an attempt\'s lines only if it fails, when it ends), or `none`; the log files keep all of it either way' -r -f -a "all\t'Every line of every attempt'
failed\t'The lines of the attempts that fail'
none\t'No child output'"
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l state-dir -d 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l store -d 'Where runs are recorded: `sqlite:` (the state directory\'s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l host-id -d 'The name of this runner\'s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l wait -d 'Wait for another runner of the same flow instead of exiting with status 3'
complete -c waymark -n "__fish_waymark_using_subcommand resume" -s q -l quiet -d 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps\' output is kept in the log files'
complete -c waymark -n "__fish_waymark_using_subcommand resume" -l json -d 'Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the steps\' output goes only to the log files'
complete -c waymark -n "__fish_waymark_using_subcommand resume" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand check" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand check" -l strict -d 'Treat every warning about the flow file as an error: report them and exit 2'
complete -c waymark -n "__fish_waymark_using_subcommand check" -l explain -d 'Also print, for each step, when each attempt may start, which errors retry and which do not, and the longest the step can take'
complete -c waymark -n "__fish_waymark_using_subcommand check" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand graph" -l format -d 'The output format: `dot` for Graphviz, `mermaid` for Markdown that renders it' -r -f -a "dot\t'Graphviz DOT (`dot -Tsvg`)'
mermaid\t'A Mermaid flowchart'"
complete -c waymark -n "__fish_waymark_using_subcommand graph" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand graph" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c waymark -n "__fish_waymark_using_subcommand history" -l limit -d 'How many runs to show' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand history" -l state-dir -d 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_using_subcommand history" -l store -d 'Where runs are recorded: `sqlite:` (the state directory\'s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand history" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand history" -l json -d 'Print a JSON array'
complete -c waymark -n "__fish_waymark_using_subcommand history" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand status" -l state-dir -d 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_using_subcommand status" -l store -d 'Where runs are recorded: `sqlite:` (the state directory\'s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand status" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand status" -l json -d 'Print JSON'
complete -c waymark -n "__fish_waymark_using_subcommand status" -l attempts -d 'List every attempt of each step (when it started, how long it took, how it ended), with --json too'
complete -c waymark -n "__fish_waymark_using_subcommand status" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand logs" -l attempt -d 'Which attempt, from 1 [default: the last one]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand logs" -l stream -d 'Only this stream [default: both]' -r -f -a "stdout\t''
stderr\t''"
complete -c waymark -n "__fish_waymark_using_subcommand logs" -l state-dir -d 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_using_subcommand logs" -l store -d 'Where runs are recorded: `sqlite:` (the state directory\'s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand logs" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand logs" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand gc" -l older-than -d 'Delete the runs that ended longer ago than this: seconds (`3600`, `0.5`) or a duration such as `30d`, `12h`, `1h 30m`, as in flow files' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand gc" -l state-dir -d 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]' -r -f -a "(__fish_complete_directories)"
complete -c waymark -n "__fish_waymark_using_subcommand gc" -l store -d 'Where runs are recorded: `sqlite:` (the state directory\'s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand gc" -l host-id -d 'The name of this runner\'s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]' -r -f
complete -c waymark -n "__fish_waymark_using_subcommand gc" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand gc" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand errors" -l flow -d 'Include this flow file\'s own classes' -r -F
complete -c waymark -n "__fish_waymark_using_subcommand errors" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand errors" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand completions" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand completions" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand man" -l color -d 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c waymark -n "__fish_waymark_using_subcommand man" -s h -l help -d 'Print help'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "run" -d 'Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "resume" -d 'Resume a given run, including a failed one (its failed step gets a fresh attempt budget)'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "check" -d 'Validate a flow file and print its plan; runs nothing'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "graph" -d 'Print the step graph (each step\'s needs, and its retry policy) as Graphviz DOT or Mermaid'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "history" -d 'List runs, newest first'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "status" -d 'Show a run step by step: state, attempts, last error, next retry'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "logs" -d 'Print the output an attempt of a step wrote'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "gc" -d 'Delete finished runs (succeeded, failed, abandoned) and their logs'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "errors" -d 'Print the error class tree that retry filters match against'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "completions" -d 'Print a shell completion script'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "man" -d 'Print waymark\'s manual page (roff), or one command\'s'
complete -c waymark -n "__fish_waymark_using_subcommand help; and not __fish_seen_subcommand_from run resume check graph history status logs gc errors completions man help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
