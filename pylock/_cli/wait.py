"""pylock wait and pylock wait-exit: sleep in the kernel until a lock is free or processes exit."""

from __future__ import annotations

import errno
import os
import time

from . import args
from .args import Option, UsageError
from .exits import EX_NOINPUT, path_problem, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

_TIMEOUT = Option(
    "w",
    ("timeout", "wait"),
    "timeout",
    "give up after SECS seconds (exit 1)",
    args.seconds,
    metavar="SECS",
)
_QUIET = Option("q", ("quiet",), "quiet", "no status line or holder message")

WAIT_OPTIONS = [_TIMEOUT, _QUIET, args.HELP]
WAIT_EXIT_OPTIONS = [_TIMEOUT, args.HELP]

WAIT_USAGE = """\
Usage:
 pylock wait [-w SECS] [-q] PATH

Block until nobody holds the lock at PATH, without keeping it: the kernel
wakes this command when the lock is released or its holder dies (no polling).
To learn that, it is granted the lock for an instant and gives it back at
once, writing nothing; a non-blocking taker that races with that instant
sees the lock held.  A missing lock file is free.

Exit status: 0 free, 1 still held after SECS (the holder is named), 66 PATH
cannot be used.

Options:
"""

WAIT_EXIT_USAGE = """\
Usage:
 pylock wait-exit [-w SECS] PID...

Block until every PID has exited (pidfd on Linux, kqueue on macOS, process
handles on Windows; no polling).  A process that has already exited counts
as exited.  A thread id is not a process: usage error.

Exit status: 0 all exited, 1 some still ran after SECS.

Options:
"""


def main_wait(argv: Sequence[str]) -> int:
    opts, rest = args.parse(WAIT_OPTIONS, argv, {"timeout": None, "quiet": False, "help": False})
    if opts["help"]:
        from .main import print_help

        print_help(WAIT_USAGE, WAIT_OPTIONS)
        return 0
    if len(rest) != 1:
        raise UsageError("needs exactly one PATH")
    path = os.path.abspath(rest[0])
    timeout: float | None = opts["timeout"]
    quiet = bool(opts["quiet"])
    from .._core.display import display
    from .fdlock import Conflict, kernel_holders, lock_descriptor, open_existing

    try:
        fd = open_existing(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.isdir(os.path.dirname(path)):
            return 0  # no file: nobody can hold it
        say(path_problem(path, exc))
        return EX_NOINPUT
    try:
        from .status import StatusLine, wanted

        def holder() -> str:
            found = kernel_holders(fd)
            return found[0].describe() if found else "a process pylock cannot see"

        try:
            if wanted(quiet) and timeout != 0:
                with StatusLine(display(path), holder):
                    lock_descriptor(fd, False, timeout != 0, timeout)
            else:
                lock_descriptor(fd, False, timeout != 0, timeout)
        except Conflict:
            if not quiet:
                say(f"{path} is still held by {holder()}")
            return 1
        # Given back at once: this command only wanted to see it free.
        os.close(fd)
        fd = -1
        return 0
    finally:
        if fd >= 0:
            os.close(fd)


def main_wait_exit(argv: Sequence[str]) -> int:
    opts, rest = args.parse(WAIT_EXIT_OPTIONS, argv, {"timeout": None, "help": False})
    if opts["help"]:
        from .main import print_help

        print_help(WAIT_EXIT_USAGE, WAIT_EXIT_OPTIONS)
        return 0
    if not rest:
        raise UsageError("needs at least one PID")
    pids = [_pid(word) for word in rest]
    timeout: float | None = opts["timeout"]
    deadline = None if timeout is None else time.monotonic() + timeout
    from .._exit.api import wait_exit

    for pid in pids:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            if not wait_exit(pid, timeout=left):
                return 1
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return 0


def _pid(word: str) -> int:
    pid = args.decimal(word, "not a process id")
    if not 0 < pid < 2**31:
        raise UsageError(f"not a process id: '{word}'")
    if pid == os.getpid():
        raise UsageError(f"{pid} is this pylock process itself")
    from .._core.procfs import thread_group

    tgid = thread_group(pid)
    if tgid is not None and tgid != pid:
        raise UsageError(f"{pid} is a thread of process {tgid}, not a process")
    return pid
