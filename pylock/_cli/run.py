"""pylock run: util-linux flock(1), command line and behaviour, plus the holder's name.

    pylock run [options] FILE|DIRECTORY [--] COMMAND [ARG...]
    pylock run [options] FILE|DIRECTORY -c COMMAND_STRING
    pylock run [options] -c COMMAND_STRING FILE|DIRECTORY
    pylock run [options] NUMBER            (or --fd NUMBER [COMMAND...])

Regular files are locked through pylock.Lock (which writes its holder record
only where the record rules allow); directories, devices, files pylock may
only read, and inherited descriptors are locked without a record.  Like
flock(1), the command inherits the locked descriptor (unless -o), and
pylock run never unlocks: it only closes its own copy, so the lock lives as
long as any process holding that descriptor (a background grandchild too).

pylock._cli.invocation reads the command line, pylock._cli.take takes the
lock, pylock._cli.exec runs the command; this module puts them together.
"""

from __future__ import annotations

import sys
import time

from .exec import execute
from .exits import Exit
from .invocation import OPTIONS, Invocation
from .take import lock_fd, lock_path

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from collections.abc import Sequence


USAGE = """\
Usage:
 pylock run [options] FILE|DIRECTORY [--] COMMAND [ARG...]
 pylock run [options] FILE|DIRECTORY -c COMMAND_STRING
 pylock run [options] -c COMMAND_STRING FILE|DIRECTORY
 pylock run [options] NUMBER
 pylock run [options] --fd NUMBER [COMMAND [ARG...] | -c COMMAND_STRING]
 pylock run --takeover GRACE FILE [--] COMMAND [ARG...]
 pylock run --etcd ENDPOINTS [--ttl SECS] [options] NAME [--] COMMAND [ARG...]

Run a command holding a lock, exactly as util-linux flock(1) does: the same
options, exit codes and process behaviour (the command inherits the locked
descriptor; pylock run never unlocks, it only closes its own copy; signals
are not forwarded).  On a conflict or timeout it also says who holds the
lock: pid, program, host, since when (-q: silent, as flock(1) is).  The
NUMBER form locks a descriptor the caller opened: ( pylock run -n 9 || exit
1; ... ) 9>FILE.  On a terminal, a wait over a second shows a status line.

Options:
"""

EPILOG = """
Exit status: the command's; 1 (or -E N) on conflict or timeout; 64 usage;
65 the descriptor cannot be locked; 66 the lock file cannot be opened;
69 the command cannot be run; 71 a system error; 73 the file cannot be
created.  Unlike flock(1), a lock path that is a symbolic link is refused:
another user could point it at a file of yours.
"""


def main(argv: Sequence[str]) -> int:
    call = Invocation(argv)
    if call.help:
        from .main import print_help

        print_help(USAGE, OPTIONS, EPILOG)
        return 0
    if call.version:
        from .main import print_version

        print_version()
        return 0
    if call.opts["etcd"] is not None:
        from .etcd import main_run

        return main_run(call)
    try:
        return _run(call)
    except Exit as done:
        return done.status


def _run(call: Invocation) -> int:
    started = time.monotonic()
    if call.path is not None:
        fd, keep = lock_path(call, call.path)
    else:
        assert call.fd is not None
        from .fdlock import describe_descriptor

        fd, keep = call.fd, None
        lock_fd(call, fd, f"{call.fd}", describe_descriptor(fd))
    from .invoked import name

    if call.verbose:
        micros = int((time.monotonic() - started) * 1e6)
        sys.stdout.write(
            f"{name}: getting lock took {micros // 10**6}.{micros % 10**6:06d} seconds\n"
        )
        sys.stdout.flush()
    if call.command is None:
        return 0
    if call.verbose:
        from .._core.display import display

        sys.stdout.write(f"{name}: executing {display(call.command[0])}\n")
        sys.stdout.flush()
    status = execute(call, fd)
    del keep  # closing (never unlocking) our copy: the command may still hold it
    return status
