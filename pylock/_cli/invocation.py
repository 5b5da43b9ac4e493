"""pylock run's command line, read: what to lock, how, and what to run.

An option is one more Option in OPTIONS with its default in DEFAULTS, read
back from Invocation.opts; the forms are in pylock._cli.run's USAGE.
"""

from __future__ import annotations

import os

from . import args
from .args import Option, UsageError

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

SHARED, EXCLUSIVE, UNLOCK = "shared", "exclusive", "unlock"

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
    args.HELP,
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


class Invocation:
    """A parsed command line: what to lock, how, and what to run."""

    opts: dict[str, Any]
    help: bool
    version: bool
    mode: str
    nonblock: bool
    timeout: float | None
    conflict_exit: int
    quiet: bool
    verbose: bool
    close: bool
    no_fork: bool
    path: str | None  # the lock file or directory (the etcd lock's NAME with --etcd)
    fd: int | None  # an inherited descriptor to lock instead
    command: list[str] | None
    takeover: float | None

    def __init__(self, argv: Sequence[str]) -> None:
        opts, rest = args.parse(OPTIONS, argv, DEFAULTS)
        self.opts = opts
        self.help = bool(opts["help"])
        self.version = bool(opts["version"])
        if self.help or self.version:
            return
        if opts["etcd"] is not None:
            self._read_etcd(opts, rest)
            return
        self._refuse_unsupported(opts)
        self._read_waiting(opts)
        self.mode = opts["mode"]
        self.verbose = bool(opts["verbose"])
        self.close = bool(opts["close"])
        self.no_fork = bool(opts["no_fork"])
        self._read_target(rest, opts["fd"], opts["command"])
        self.takeover = opts["takeover"]
        if self.takeover is not None:
            self._check_takeover(opts)

    def _read_etcd(self, opts: dict[str, Any], rest: list[str]) -> None:
        """--etcd: NAME [--] COMMAND..., or NAME -c STRING (pylock._cli.etcd checks the rest)."""
        from .etcd import ttl_seconds

        opts["ttl"] = None if opts["ttl"] is None else ttl_seconds(opts["ttl"])
        self._read_waiting(opts)
        self.path = rest[0] if rest else None
        self.command = None
        self._command_from(rest[1:], opts["command"])

    @staticmethod
    def _refuse_unsupported(opts: dict[str, Any]) -> None:
        if opts["ttl"] is not None:
            raise UsageError("--ttl goes with --etcd")
        if opts["fcntl"] is not None:
            raise UsageError(
                "--fcntl, --start and --length are not supported: pylock locks whole "
                "files with flock(2)"
            )
        if opts["no_fork"] and opts["close"]:
            raise UsageError("the --no-fork and --close options are incompatible")

    def _read_waiting(self, opts: dict[str, Any]) -> None:
        """Whether and how long to wait, and what a conflict does."""
        timeout: float | None = opts["timeout"]
        self.nonblock = bool(opts["nonblock"]) or timeout == 0
        self.timeout = None if self.nonblock else timeout
        self.conflict_exit = opts["conflict_exit"]
        self.quiet = bool(opts["quiet"])

    def _read_target(self, rest: list[str], fd: int | None, shell_command: str | None) -> None:
        """FILE|DIRECTORY or NUMBER (or --fd N), and the command after it."""
        self.path = None
        self.fd = fd
        self.command = None
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
            self.fd = _descriptor_operand(rest[0])
        else:
            raise UsageError("requires file descriptor, file or directory")

    def _check_takeover(self, opts: dict[str, Any]) -> None:
        """--takeover GRACE FILE COMMAND: the command replaces pylock (same pid), so the
        record names the service itself and the next takeover signals it, not a wrapper."""
        if self.path is None or self.command is None:
            raise UsageError("--takeover needs FILE and a COMMAND to run in the holder's place")
        if self.mode != EXCLUSIVE or self.close or opts["timeout"] is not None:
            raise UsageError("--takeover takes an exclusive lock at once: no -s, -u, -o or -w")
        self.no_fork = True
        self.nonblock = True  # a holder that cannot be verified is a conflict, not a wait

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


def _descriptor_operand(text: str) -> int:
    """The NUMBER form's descriptor, as flock(1) reads it (any 32-bit int): a
    negative one is a descriptor that cannot be locked (65), not a usage error."""
    value = args.decimal(text, "bad file descriptor")
    if not -(2**31) <= value < 2**31:
        raise UsageError(f"bad file descriptor: '{text}'")
    return value


def _shell(text: str) -> list[str]:
    return [os.environ.get("SHELL") or "/bin/sh", "-c", text]
