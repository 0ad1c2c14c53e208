"""Report a step's Python exception to waymark through $WAYMARK_ERROR_FILE.

`import waymark_errors` installs a sys.excepthook that writes an uncaught exception's class,
bases and message to the error file, then prints the traceback as usual (exit status 1).
To report a handled failure explicitly (nothing is written outside waymark):

    waymark_errors.report("DownloadFailed", "HTTP 503", bases=["ConnectionError"])
    sys.exit(1)
"""
import json
import os
import sys


def report(type_name, message="", bases=None):
    """Write {"type", "bases", "message"} to $WAYMARK_ERROR_FILE, if set."""
    path = os.environ.get("WAYMARK_ERROR_FILE")
    if path:
        error = {"type": type_name, "message": str(message)}
        if bases is not None:
            error["bases"] = list(bases)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(error, f)


def install():
    """Report uncaught exceptions, then run the previous hook. Idempotent."""
    previous = sys.excepthook
    if not getattr(previous, "waymark", False):
        def hook(etype, value, tb):
            try:
                report(etype.__name__, value, [c.__name__ for c in etype.__mro__[1:] if c is not object])
            except Exception:  # a reporting failure must not hide the real error
                pass
            previous(etype, value, tb)
        hook.waymark = True
        sys.excepthook = hook


install()
