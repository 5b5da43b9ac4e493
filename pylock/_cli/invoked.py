"""The name the pylock command was invoked by, which starts its messages.

Installed or linked under the name flock, the command is `pylock run` and
speaks as util-linux flock(1) does ("flock: getting lock took ..."), so
scripts and tests written for flock(1) read the messages they expect.
"""

from __future__ import annotations

import os

FLOCK = "flock"

name = "pylock"


def as_flock(argv0: str) -> bool:
    """Whether argv0 (sys.argv[0]) invokes the command as flock: a link or copy named flock."""
    base = os.path.basename(argv0)
    return base == FLOCK or (os.name == "nt" and base.lower() in ("flock.exe", "flock-script.py"))
