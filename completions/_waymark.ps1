
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'waymark' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'waymark'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'waymark' {
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept, for the commands that keep or read them (run, resume, history, status, logs, gc); the others ignore it, so an alias may always pass it. The same option after the command wins')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded, for the same commands as --state-dir; the others ignore it. The same option after the command wins')
            [CompletionResult]::new('--host-id', '--host-id', [CompletionResultType]::ParameterName, 'The name of this runner''s host, for the commands that take a flow''s lease (run, resume, gc); the others ignore it. The same option after the command wins')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)')
            [CompletionResult]::new('resume', 'resume', [CompletionResultType]::ParameterValue, 'Resume a given run, including a failed one (its failed step gets a fresh attempt budget)')
            [CompletionResult]::new('check', 'check', [CompletionResultType]::ParameterValue, 'Validate a flow file and print its plan; runs nothing')
            [CompletionResult]::new('graph', 'graph', [CompletionResultType]::ParameterValue, 'Print the step graph (each step''s needs, and its retry policy) as Graphviz DOT or Mermaid')
            [CompletionResult]::new('history', 'history', [CompletionResultType]::ParameterValue, 'List runs, newest first')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show a run step by step: state, attempts, last error, next retry')
            [CompletionResult]::new('logs', 'logs', [CompletionResultType]::ParameterValue, 'Print the output an attempt of a step wrote')
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete finished runs (succeeded, failed, abandoned) and their logs')
            [CompletionResult]::new('errors', 'errors', [CompletionResultType]::ParameterValue, 'Print the error class tree that retry filters match against')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('man', 'man', [CompletionResultType]::ParameterValue, 'Print waymark''s manual page (roff), or one command''s')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'waymark;run' {
            [CompletionResult]::new('--max-parallel', '--max-parallel', [CompletionResultType]::ParameterName, 'Run at most N steps at once, instead of the flow''s `max_parallel` (default 4)')
            [CompletionResult]::new('--param', '--param', [CompletionResultType]::ParameterName, 'Set a parameter declared in the flow''s `[params]`; repeat for each one')
            [CompletionResult]::new('--progress', '--progress', [CompletionResultType]::ParameterName, 'How the run is shown on a terminal: `live` draws a line per running step (attempt, time left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Whose output to show as it comes: `all` (every line, behind its step''s name), `failed` (an attempt''s lines only if it fails, when it ends), or `none`; the log files keep all of it either way')
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]')
            [CompletionResult]::new('--host-id', '--host-id', [CompletionResultType]::ParameterName, 'The name of this runner''s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('--fresh', '--fresh', [CompletionResultType]::ParameterName, 'Abandon an unfinished run of this flow and start a new one')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for another runner of the same flow instead of exiting with status 3')
            [CompletionResult]::new('--strict', '--strict', [CompletionResultType]::ParameterName, 'Treat every warning about the flow file as an error: report them and exit 2, running nothing')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the steps'' output goes only to the log files')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;resume' {
            [CompletionResult]::new('--progress', '--progress', [CompletionResultType]::ParameterName, 'How the run is shown on a terminal: `live` draws a line per running step (attempt, time left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Whose output to show as it comes: `all` (every line, behind its step''s name), `failed` (an attempt''s lines only if it fails, when it ends), or `none`; the log files keep all of it either way')
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]')
            [CompletionResult]::new('--host-id', '--host-id', [CompletionResultType]::ParameterName, 'The name of this runner''s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for another runner of the same flow instead of exiting with status 3')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for cron). The steps'' output is kept in the log files')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the steps'' output goes only to the log files')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;check' {
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('--strict', '--strict', [CompletionResultType]::ParameterName, 'Treat every warning about the flow file as an error: report them and exit 2')
            [CompletionResult]::new('--explain', '--explain', [CompletionResultType]::ParameterName, 'Also print, for each step, when each attempt may start, which errors retry and which do not, and the longest the step can take')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;graph' {
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'The output format: `dot` for Graphviz, `mermaid` for Markdown that renders it')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'waymark;history' {
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'How many runs to show')
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print a JSON array')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;status' {
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print JSON')
            [CompletionResult]::new('--attempts', '--attempts', [CompletionResultType]::ParameterName, 'List every attempt of each step (when it started, how long it took, how it ended), with --json too')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;logs' {
            [CompletionResult]::new('--attempt', '--attempt', [CompletionResultType]::ParameterName, 'Which attempt, from 1 [default: the last one]')
            [CompletionResult]::new('--stream', '--stream', [CompletionResultType]::ParameterName, 'Only this stream [default: both]')
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;gc' {
            [CompletionResult]::new('--older-than', '--older-than', [CompletionResultType]::ParameterName, 'Delete the runs that ended longer ago than this: seconds (`3600`, `0.5`) or a duration such as `30d`, `12h`, `1h 30m`, as in flow files')
            [CompletionResult]::new('--state-dir', '--state-dir', [CompletionResultType]::ParameterName, 'Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where runs are recorded: `sqlite:` (the state directory''s database, the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default: $WAYMARK_STORE, else `sqlite:`]')
            [CompletionResult]::new('--host-id', '--host-id', [CompletionResultType]::ParameterName, 'The name of this runner''s host in leases, attempts and messages [default: $WAYMARK_HOST_ID, else the host name]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;errors' {
            [CompletionResult]::new('--flow', '--flow', [CompletionResultType]::ParameterName, 'Include this flow file''s own classes')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;completions' {
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;man' {
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'waymark;help' {
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)')
            [CompletionResult]::new('resume', 'resume', [CompletionResultType]::ParameterValue, 'Resume a given run, including a failed one (its failed step gets a fresh attempt budget)')
            [CompletionResult]::new('check', 'check', [CompletionResultType]::ParameterValue, 'Validate a flow file and print its plan; runs nothing')
            [CompletionResult]::new('graph', 'graph', [CompletionResultType]::ParameterValue, 'Print the step graph (each step''s needs, and its retry policy) as Graphviz DOT or Mermaid')
            [CompletionResult]::new('history', 'history', [CompletionResultType]::ParameterValue, 'List runs, newest first')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show a run step by step: state, attempts, last error, next retry')
            [CompletionResult]::new('logs', 'logs', [CompletionResultType]::ParameterValue, 'Print the output an attempt of a step wrote')
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete finished runs (succeeded, failed, abandoned) and their logs')
            [CompletionResult]::new('errors', 'errors', [CompletionResultType]::ParameterValue, 'Print the error class tree that retry filters match against')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('man', 'man', [CompletionResultType]::ParameterValue, 'Print waymark''s manual page (roff), or one command''s')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'waymark;help;run' {
            break
        }
        'waymark;help;resume' {
            break
        }
        'waymark;help;check' {
            break
        }
        'waymark;help;graph' {
            break
        }
        'waymark;help;history' {
            break
        }
        'waymark;help;status' {
            break
        }
        'waymark;help;logs' {
            break
        }
        'waymark;help;gc' {
            break
        }
        'waymark;help;errors' {
            break
        }
        'waymark;help;completions' {
            break
        }
        'waymark;help;man' {
            break
        }
        'waymark;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
