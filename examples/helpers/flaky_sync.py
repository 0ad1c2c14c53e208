"""Example job for examples/python.toml: fails like a dropped connection once."""
import os

import waymark_errors  # noqa: F401  (reports uncaught exceptions with their full MRO)

if os.environ.get("WAYMARK_ATTEMPT") == "1":
    raise ConnectionResetError(104, "Connection reset by peer")
print("synced on attempt", os.environ.get("WAYMARK_ATTEMPT"))
