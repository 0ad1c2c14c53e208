
use builtin;
use str;

set edit:completion:arg-completer[waymark] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'waymark'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'waymark'= {
            cand --state-dir 'Where runs and logs are kept, for the commands that keep or read them (run, resume, history, status, logs, gc); the others ignore it, so an alias may always pass it. The same option after the command wins'
            cand --store 'Where runs are recorded, for the same commands as --state-dir; the others ignore it. The same option after the command wins'
            cand --host-id 'The name of this runner''s host, for the commands that take a flow''s lease (run, resume, gc); the others ignore it. The same option after the command wins'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
            cand run 'Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)'
            cand resume 'Resume a given run, including a failed one (its failed step gets a fresh attempt budget)'
            cand check 'Validate a flow file and print its plan; runs nothing'
            cand graph 'Print the step graph (each step''s needs, and its retry policy) as Graphviz DOT or Mermaid'
            cand history 'List runs, newest first'
            cand status 'Show a run step by step: state, attempts, last error, next retry'
            cand logs 'Print the output an attempt of a step wrote'
            cand gc 'Delete finished runs (succeeded, failed, abandoned) and their logs'
            cand errors 'Print the error class tree that retry filters match against'
            cand completions 'Print a shell completion script'
            cand man 'Print waymark''s manual page (roff), or one command''s'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'waymark;run'= {
            cand --max-parallel 'Run at most N steps at once, instead of the flow''s `max_parallel` (default 4)'
            cand --param 'Set a parameter declared in the flow''s `[params]`; repeat for each one'
            cand --progress 'How the run is shown on a terminal: `live` draws a line per running step (attempt, time left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it'
            cand --output 'Whose output to show as it comes: `all` (every line, behind its step''s name), `failed` (an attempt''s lines only if it fails, when it ends), or `none`; the log files keep all of it either way'
            cand --state-dir 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]'
            cand --store 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]'
            cand --host-id 'The name of this runner''s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand --fresh 'Abandon an unfinished run of this flow and start a new one'
            cand --wait 'Wait for another runner of the same flow instead of exiting with status 3'
            cand --strict 'Treat every warning about the flow file as an error: report them and exit 2, running nothing'
            cand -q 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files'
            cand --quiet 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files'
            cand --json 'Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the steps'' output goes only to the log files'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;resume'= {
            cand --progress 'How the run is shown on a terminal: `live` draws a line per running step (attempt, time left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it'
            cand --output 'Whose output to show as it comes: `all` (every line, behind its step''s name), `failed` (an attempt''s lines only if it fails, when it ends), or `none`; the log files keep all of it either way'
            cand --state-dir 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]'
            cand --store 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]'
            cand --host-id 'The name of this runner''s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand --wait 'Wait for another runner of the same flow instead of exiting with status 3'
            cand -q 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files'
            cand --quiet 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files'
            cand --json 'Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the steps'' output goes only to the log files'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;check'= {
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand --strict 'Treat every warning about the flow file as an error: report them and exit 2'
            cand --explain 'Also print, for each step, when each attempt may start, which errors retry and which do not, and the longest the step can take'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;graph'= {
            cand --format 'The output format: `dot` for Graphviz, `mermaid` for Markdown that renders it'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'waymark;history'= {
            cand --limit 'How many runs to show'
            cand --state-dir 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]'
            cand --store 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand --json 'Print a JSON array'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;status'= {
            cand --state-dir 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]'
            cand --store 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand --json 'Print JSON'
            cand --attempts 'List every attempt of each step (when it started, how long it took, how it ended), with --json too'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;logs'= {
            cand --attempt 'Which attempt, from 1 [default: the last one]'
            cand --stream 'Only this stream [default: both]'
            cand --state-dir 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]'
            cand --store 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;gc'= {
            cand --older-than 'Delete the runs that ended longer ago than this: seconds (`3600`, `0.5`) or a duration such as `30d`, `12h`, `1h 30m`, as in flow files'
            cand --state-dir 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]'
            cand --store 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]'
            cand --host-id 'The name of this runner''s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;errors'= {
            cand --flow 'Include this flow file''s own classes'
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;completions'= {
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;man'= {
            cand --color 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'waymark;help'= {
            cand run 'Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)'
            cand resume 'Resume a given run, including a failed one (its failed step gets a fresh attempt budget)'
            cand check 'Validate a flow file and print its plan; runs nothing'
            cand graph 'Print the step graph (each step''s needs, and its retry policy) as Graphviz DOT or Mermaid'
            cand history 'List runs, newest first'
            cand status 'Show a run step by step: state, attempts, last error, next retry'
            cand logs 'Print the output an attempt of a step wrote'
            cand gc 'Delete finished runs (succeeded, failed, abandoned) and their logs'
            cand errors 'Print the error class tree that retry filters match against'
            cand completions 'Print a shell completion script'
            cand man 'Print waymark''s manual page (roff), or one command''s'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'waymark;help;run'= {
        }
        &'waymark;help;resume'= {
        }
        &'waymark;help;check'= {
        }
        &'waymark;help;graph'= {
        }
        &'waymark;help;history'= {
        }
        &'waymark;help;status'= {
        }
        &'waymark;help;logs'= {
        }
        &'waymark;help;gc'= {
        }
        &'waymark;help;errors'= {
        }
        &'waymark;help;completions'= {
        }
        &'waymark;help;man'= {
        }
        &'waymark;help;help'= {
        }
    ]
    $completions[$command]
}
