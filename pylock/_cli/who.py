"""pylock who: free or held, and by whom, as the kernel shows it."""

from __future__ import annotations

import errno
import os
import sys

from .args import HELP, Option, UsageError, parse
from .exits import EX_NOINPUT, path_problem, say
from .report import describe, holder_json, path_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

OPTIONS = [
    Option("a", ("all",), "all", "every process holding the file (inherited descriptors too)"),
    Option("", ("json",), "json", "print JSON: one object per PATH"),
    HELP,
    Option("", ("etcd",), "etcd", "NAMEs are etcd locks at ENDPOINTS", str, metavar="ENDPOINTS"),
    Option("", ("system",), "system", "every lock on this host ('pylock who --system -h')"),
]

USAGE = """\
Usage:
 pylock who [--all] [--json] PATH...
 pylock who --etcd ENDPOINTS [--json] NAME...
 pylock who --system [--json] [--watch] [--path PREFIX] [--pid PID,...] [--user USER,...]

Say whether each lock is free or held, and by whom: pid, program, host,
since when and for how long, and whether the kernel verified it (or why
not).  Shared holders are all listed; --all also lists every process that
shares a holder's descriptor.  Directories and devices locked with flock(1)
are named from the kernel alone.

Exit status: 0 every PATH is held, 1 some PATH is free, 66 some PATH cannot
be inspected (it is named on stderr).

Options:
"""


class PathProblem(Exception):
    """PATH cannot be inspected: exit 66."""


def main(argv: Sequence[str]) -> int:
    from .system import asks_for_system

    if asks_for_system(argv):
        from .system import main as main_system

        return main_system(argv)
    defaults = {"all": False, "json": False, "help": False, "etcd": None, "system": False}
    opts, paths = parse(OPTIONS, argv, defaults)
    if opts["help"]:
        from .main import print_help

        print_help(USAGE, OPTIONS)
        return 0
    if not paths:
        raise UsageError("no PATH given")
    if opts["etcd"] is not None:
        from .etcd import main_who

        return main_who(opts["etcd"], paths, as_json=bool(opts["json"]))
    reports: list[tuple[str, list[Any] | None, str]] = []
    status = 0
    for path in paths:
        full = os.path.abspath(path)
        try:
            found = who(full, every=bool(opts["all"]))
        except PathProblem as exc:
            say(str(exc))
            status = EX_NOINPUT
            reports.append((full, None, str(exc)))
            continue
        reports.append((full, found, ""))
        if not found and status == 0:
            status = 1
    if opts["json"]:
        import json

        sys.stdout.write(json.dumps([_json(*report) for report in reports], indent=2) + "\n")
    else:
        for path, holders, _ in reports:
            if holders is not None:
                sys.stdout.write(describe(path, holders))
    return status


def _json(path: str, found: list[Any] | None, error: str) -> dict[str, Any]:
    """One PATH as JSON: held null and error set when it cannot be inspected."""
    doc = path_json(path)
    doc.update(
        held=None if found is None else bool(found),
        holders=[holder_json(h) for h in found or ()],
        error=error or None,
    )
    return doc


def who(path: str, every: bool = False) -> list[Any]:
    """The holders of the lock at path: [] when free.  Raises PathProblem."""
    from .._core.errors import NOT_REGULAR, LockFileError
    from .._lock.lookup import lock_holders

    full = os.path.abspath(path)
    try:
        return lock_holders(full, every)
    except LockFileError as exc:
        if exc.code not in (errno.EISDIR, NOT_REGULAR):
            raise PathProblem(str(exc)) from None
    except OSError as exc:
        raise PathProblem(path_problem(full, exc)) from None
    return _kernel_only(full, every)


def _kernel_only(path: str, every: bool) -> list[Any]:
    """A directory, device or FIFO: flock(1) writes no record, the kernel
    alone names holders.  Looked at, never opened (pylock._core.peek)."""
    from .._core.peek import Peek
    from .._lock.kernel_view import kernel_holders

    try:
        with Peek(path) as look:
            key = look.key()
    except OSError as exc:
        raise PathProblem(path_problem(path, exc)) from None
    return kernel_holders(key, every)
