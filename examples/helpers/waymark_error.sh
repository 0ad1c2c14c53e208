# waymark_error.sh: report a step's error class to waymark from a POSIX shell script.
#
# Source it, then call `waymark_error NAME [MESSAGE] [BASE...]` before exiting non-zero. It writes
# {"type": NAME, "bases": [BASE...], "message": MESSAGE} to $WAYMARK_ERROR_FILE ("bases" and
# "message" only when given); outside waymark (no WAYMARK_ERROR_FILE) it does nothing.
#
#   . "$(dirname "$0")/waymark_error.sh"
#   curl -fsS "$url" -o data.csv || {
#       waymark_error ConnectionError "download of $url failed" OSError Exception
#       exit 1
#   }
#
# or, to give any failure that reported nothing a class of its own:
#
#   trap 'rc=$?; [ "$rc" -eq 0 ] || [ -s "${WAYMARK_ERROR_FILE:-/dev/null}" ] ||
#       waymark_error ScriptFailed "exit status $rc"' EXIT
#
# Needs only printf and sed (no jq, no python).

# A sed script that escapes text as the inside of a JSON string: backslash and double quote, then
# control characters (tab and carriage return by name, the rest as \u00XX), then joins the lines
# with \n. Built once, because the control characters have to be made with printf.
_waymark_sed='s/\\/\\\\/g
s/"/\\"/g
'
_waymark_i=1
while [ "$_waymark_i" -lt 32 ]; do
    case $_waymark_i in
        9) _waymark_sed="${_waymark_sed}s/$(printf '\t')/\\\\t/g
" ;;
        10) ;; # newline: sed's line separator, joined below
        13) _waymark_sed="${_waymark_sed}s/$(printf '\r')/\\\\r/g
" ;;
        *) _waymark_sed="${_waymark_sed}s/$(printf "\\$(printf '%03o' "$_waymark_i")")/\\\\u$(printf '%04x' "$_waymark_i")/g
" ;;
    esac
    _waymark_i=$((_waymark_i + 1))
done
unset _waymark_i
# Collect every line in the hold space; at the last one, join them with a literal \n.
_waymark_sed="${_waymark_sed}H
\$!d
x
s/^\\n//
s/\\n/\\\\n/g"

# Print "$1" as a JSON string, quotes included. The added newline makes sed see complete lines
# (so a trailing newline in "$1" survives); LC_ALL=C makes it work byte by byte, which leaves
# UTF-8 text intact.
_waymark_json_string() {
    printf '"%s"' "$(printf '%s\n' "$1" | LC_ALL=C sed "$_waymark_sed")"
}

# waymark_error NAME [MESSAGE] [BASE...]. Runs in a subshell, so it leaves no variables behind.
waymark_error() (
    if [ $# -eq 0 ]; then
        echo "usage: waymark_error NAME [MESSAGE] [BASE...]" >&2
        exit 2
    fi
    [ -n "${WAYMARK_ERROR_FILE-}" ] || exit 0
    json="{\"type\": $(_waymark_json_string "$1")"
    if [ $# -ge 2 ]; then
        message=$(_waymark_json_string "$2")
        shift 2
        if [ $# -gt 0 ]; then
            bases=
            for base in "$@"; do
                bases="${bases:+$bases, }$(_waymark_json_string "$base")"
            done
            json="$json, \"bases\": [$bases]"
        fi
        json="$json, \"message\": $message"
    fi
    printf '%s}\n' "$json" >"$WAYMARK_ERROR_FILE"
)
