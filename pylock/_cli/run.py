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

This module reads the command line; _cli_take takes the lock, _cli_exec runs
the command.  An option is one more Option in OPTIONS with its default in
DEFAULTS, read back from Invocation.opts.
"""

from __future__ import annotations

import os
import sys
import time

from . import args
from .args import Option, UsageError
from .exec import execute
from .take import EXCLUSIVE, SHARED, UNLOCK, Exit, lock_fd, lock_path

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


OPTIONS: list[Option] = [
    Option("s", ("shared",), "mode", "get a shared lock", const=SHARED),
    Option("xe", ("exclusive",), "mode", "get an exclusive lock (default)", const=EXCLUSIVE),
    Option("u", ("unlock",), "mode", "remove a lock (descriptor form)", const=UNLOCK),
    Option("n", ("nonblock", "nonblocking", "nb"), "nonblock", "fail rather than wait"),
    Option(
        "w",
        ("timeout", "wait"),
        "timeout",
        "wait at most SECS seconds (fractions; 0 is -n)",
        args.seconds,
        metavar="SECS",
    ),
    Option(
        "E",
        ("conflict-exit-code",),
        "conflict_exit",
        "exit code after a conflict or timeout (0..255, default 1)",
        args.exit_code,
        metavar="N",
    ),
    Option("o", ("close",), "close", "close the lock's descriptor before running the command"),
    Option(
        "c",
        ("command",),
        "command",
        "run COMMAND through $SHELL (default /bin/sh)",
        str,
        metavar="COMMAND",
    ),
    Option("", ("fd",), "fd", "lock this inherited descriptor", args.descriptor, metavar="N"),
    Option("F", ("no-fork",), "no_fork", "execute the command without forking"),
    Option(
        "",
        ("takeover",),
        "takeover",
        "replace the verified holder (SIGTERM, SIGKILL after GRACE s), then exec the command",
        args.seconds,
        metavar="GRACE",
    ),
    Option("q", ("quiet",), "quiet", "do not say who holds the lock (silent as flock(1))"),
    Option(
        "",
        ("info",),
        "info",
        "a JSON object recorded with the holder (regular files)",
        args.json_object,
        metavar="JSON",
    ),
    Option("", ("verbose",), "verbose", "flock(1)'s messages: time to lock, command run"),
    Option("", ("fcntl",), "fcntl", "refused: pylock locks with flock(2) only"),
    Option("", ("start",), "fcntl", "refused: no byte ranges", str, metavar="OFFSET"),
    Option("", ("length",), "fcntl", "refused: no byte ranges", str, metavar="N"),
    Option("h", ("help",), "help", "show this help and exit"),
    Option("V", ("version",), "version", "show pylock's version and exit"),
    Option(
        "",
        ("etcd",),
        "etcd",
        "lock NAME in the etcd cluster at ENDPOINTS (host:port,...) instead of a file",
        str,
        metavar="ENDPOINTS",
    ),
    Option("", ("ttl",), "ttl", "the etcd lease's TTL (default 10)", str, metavar="SECS"),
]

DEFAULTS: dict[str, Any] = {
    "mode": EXCLUSIVE,
    "nonblock": False,
    "timeout": None,
    "conflict_exit": 1,
    "close": False,
    "command": None,
    "fd": None,
    "no_fork": False,
    "takeover": None,
    "quiet": False,
    "info": None,
    "verbose": False,
    "fcntl": None,
    "help": False,
    "version": False,
    "etcd": None,
    "ttl": None,
}

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


class Invocation:
    """A parsed command line: what to lock, how, and what to run."""

    def __init__(self, argv: Sequence[str]) -> None:
        opts, rest = args.parse(OPTIONS, argv, DEFAULTS)
        self.opts = opts
        self.help = bool(opts["help"])
        self.version = bool(opts["version"])
        if self.help or self.version:
            return
        if opts["etcd"] is not None:  # NAME [--] COMMAND..., or NAME -c STRING
            from .etcd import ttl_seconds

            opts["ttl"] = None if opts["ttl"] is None else ttl_seconds(opts["ttl"])
            self.etcd_names(rest)
            return
        if opts["ttl"] is not None:
            raise UsageError("--ttl goes with --etcd")
        if opts["fcntl"] is not None:
            raise UsageError(
                "--fcntl, --start and --length are not supported: pylock locks whole "
                "files with flock(2)"
            )
        if opts["no_fork"] and opts["close"]:
            raise UsageError("the --no-fork and --close options are incompatible")
        self.mode: str = opts["mode"]
        timeout: float | None = opts["timeout"]
        self.nonblock: bool = bool(opts["nonblock"]) or timeout == 0
        self.timeout = None if self.nonblock else timeout
        self.conflict_exit: int = opts["conflict_exit"]
        self.quiet: bool = bool(opts["quiet"])
        self.verbose: bool = bool(opts["verbose"])
        self.close: bool = bool(opts["close"])
        self.no_fork: bool = bool(opts["no_fork"])
        self.path: str | None = None
        self.fd: int | None = opts["fd"]
        self.command: list[str] | None = None
        shell_command: str | None = opts["command"]
        if self.fd is not None:
            self._command_from(rest, shell_command)
        elif shell_command is not None:
            if len(rest) != 1:
                raise UsageError("-c COMMAND needs exactly one FILE|DIRECTORY after it")
            self.path = rest[0]
            self.command = _shell(shell_command)
        elif len(rest) >= 2:
            self.path = rest[0]
            self._command_from(rest[1:], None)
        elif rest:
            self.fd = args.descriptor(rest[0])
        else:
            raise UsageError("requires file descriptor, file or directory")
        self.takeover: float | None = opts["takeover"]
        if self.takeover is not None:
            self._check_takeover(opts)

    def _check_takeover(self, opts: dict[str, Any]) -> None:
        """--takeover GRACE FILE COMMAND: the command replaces pylock (same pid), so the
        record names the service itself and the next takeover signals it, not a wrapper."""
        if self.path is None or self.command is None:
            raise UsageError("--takeover needs FILE and a COMMAND to run in the holder's place")
        if self.mode != EXCLUSIVE or self.close or opts["timeout"] is not None:
            raise UsageError("--takeover takes an exclusive lock at once: no -s, -u, -o or -w")
        self.no_fork = True
        self.nonblock = True  # a holder that cannot be verified is a conflict, not a wait

    def etcd_names(self, rest: list[str]) -> None:
        opts = self.opts
        timeout: float | None = opts["timeout"]
        self.nonblock = bool(opts["nonblock"]) or timeout == 0
        self.timeout = None if self.nonblock else timeout
        self.conflict_exit = opts["conflict_exit"]
        self.quiet = bool(opts["quiet"])
        self.path = rest[0] if rest else None
        self.command = None
        self._command_from(rest[1:], opts["command"])

    def _command_from(self, words: list[str], shell_command: str | None) -> None:
        if shell_command is not None:
            if words:
                raise UsageError("-c requires exactly one command argument")
            self.command = _shell(shell_command)
            return
        if not words:
            return
        if words[0] in ("-c", "--command"):
            if len(words) != 2:
                raise UsageError(f"{words[0]} requires exactly one command argument")
            self.command = _shell(words[1])
            return
        if words[0] == "--":
            words = words[1:]
            if not words:
                raise UsageError("no command after '--'")
        self.command = words


def _shell(text: str) -> list[str]:
    return [os.environ.get("SHELL") or "/bin/sh", "-c", text]


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
    if call.verbose:
        micros = int((time.monotonic() - started) * 1e6)
        sys.stdout.write(
            f"pylock: getting lock took {micros // 10**6}.{micros % 10**6:06d} seconds\n"
        )
        sys.stdout.flush()
    if call.command is None:
        return 0
    if call.verbose:
        sys.stdout.write(f"pylock: executing {call.command[0]}\n")
        sys.stdout.flush()
    status = execute(call, fd)
    del keep  # closing (never unlocking) our copy: the command may still hold it
    return status
