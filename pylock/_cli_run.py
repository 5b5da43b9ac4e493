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
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import time

from . import _cli_args as args
from ._cli_args import Option, UsageError

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

# sysexits.h, as flock(1) uses them.
EX_DATAERR = 65
EX_NOINPUT = 66
EX_UNAVAILABLE = 69
EX_OSERR = 71
EX_CANTCREAT = 73

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
            from ._cli_etcd import ttl_seconds

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


def _say(text: str) -> None:
    sys.stderr.write(f"pylock: {text}\n")
    sys.stderr.flush()


class Exit(Exception):
    """Leave pylock run with this status (after the message was printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def main(argv: Sequence[str]) -> int:
    call = Invocation(argv)
    if call.help:
        from ._cli import print_help

        print_help(USAGE, OPTIONS, EPILOG)
        return 0
    if call.version:
        from ._cli import print_version

        print_version()
        return 0
    if call.opts["etcd"] is not None:
        from ._cli_etcd import main_run

        return main_run(call)
    try:
        return _run(call)
    except Exit as done:
        return done.status


def _run(call: Invocation) -> int:
    started = time.monotonic()
    if call.path is not None:
        fd, keep = _lock_path(call, call.path)
    else:
        assert call.fd is not None
        from ._cli_fdlock import describe_descriptor

        fd, keep = call.fd, None
        _lock_fd(call, fd, f"{call.fd}", describe_descriptor(fd))
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
    status = _execute(call, fd)
    del keep  # closing (never unlocking) our copy: the command may still hold it
    return status


# -- taking the lock ------------------------------------------------------------


def _lock_path(call: Invocation, path: str) -> tuple[int, Any]:
    """Open and lock the file at path; returns its descriptor and what keeps it open."""
    from ._errors import NOT_REGULAR, LockFileError, LockHeld, LockTimeout, UnsafeFilesystem

    if call.mode == UNLOCK or _foreign_content(path):
        # -u only unlocks; a file with someone else's bytes (a script that
        # locks itself, a data file) is locked as it is, never written.
        fd = _open_or_exit(path, create=True)
        _lock_fd(call, fd, path)
        return fd, None
    from ._lock import Lock

    try:
        mode = 0o666 & ~_umask()
        lock = Lock(path, shared=call.mode == SHARED, mode=mode, info=call.opts["info"])
        # A file pylock may lock but not write (read-only, another user's)
        # is locked as flock(1) locks it, silently: the record only explains.
        lock._record_warned = True
        try:
            if call.takeover is not None:
                from ._singleton import take_over

                take_over(lock, call.takeover)
            elif call.nonblock:
                lock.acquire(blocking=False)
            elif _status_line(call):
                with _status(path, lambda: _holder_text(lock.holder())):
                    lock.acquire(timeout=call.timeout)
            else:
                lock.acquire(timeout=call.timeout)
        except BaseException:
            lock.close()
            raise
    except LockHeld as held:
        _conflict(call, str(held), timed_out=isinstance(held, LockTimeout))
    except LockFileError as exc:
        if exc.code not in (errno.EISDIR, NOT_REGULAR):
            _open_failed(path, exc)
        # A directory or a device: locked as flock(1) does, without a record.
        fd = _open_or_exit(path, create=False)
        _lock_fd(call, fd, path)
        return fd, None
    except UnsafeFilesystem as exc:
        _say(str(exc))
        raise Exit(EX_NOINPUT) from None
    except OSError as exc:
        _say(f"{path}: {exc.strerror}")
        raise Exit(EX_OSERR if exc.errno in (errno.ENOLCK, errno.ENOMEM) else EX_DATAERR) from None
    return lock._handle, lock


def _foreign_content(path: str) -> bool:
    """Whether path is a regular file holding bytes that are not a pylock record."""
    from ._record import MAGIC

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # missing, a symlink, unreadable: Lock decides and explains
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, len(MAGIC))
    except OSError:
        return False
    finally:
        os.close(fd)
    return bool(head) and head != MAGIC


def _lock_fd(call: Invocation, fd: int, name: str, label: str = "") -> None:
    """Lock fd; errors name it as flock(1) does (name), conflicts say what it is (label)."""
    from ._cli_fdlock import Conflict, lock_descriptor, unlock_descriptor

    try:
        if call.mode == UNLOCK:
            unlock_descriptor(fd)
        elif _status_line(call) and not call.nonblock:
            with _status(label or name, lambda: _fd_holder_text(fd)):
                lock_descriptor(fd, call.mode == SHARED, True, call.timeout)
        else:
            lock_descriptor(fd, call.mode == SHARED, not call.nonblock, call.timeout)
    except Conflict as conflict:
        message = ""
        if not call.quiet:
            who = _fd_holder_text(fd)
            if conflict.timed_out:
                what = label or name
                message = f"timed out after {call.timeout:g} s waiting for {what}: held by {who}"
            else:
                message = f"{label or name} is held by {who}"
        _conflict(call, message, conflict.timed_out)
    except OSError as exc:
        _say(f"{name}: {exc.strerror}")
        raise Exit(EX_OSERR if exc.errno in (errno.ENOLCK, errno.ENOMEM) else EX_DATAERR) from None


def _conflict(call: Invocation, message: str, timed_out: bool) -> NoReturn:
    if call.verbose:
        _say("timeout while waiting to get lock" if timed_out else "failed to get lock")
    if not call.quiet and message:
        _say(message)
    raise Exit(call.conflict_exit)


def _open_or_exit(path: str, create: bool) -> int:
    """A read-only descriptor for a record-less lock on path (created with -u, as flock(1))."""
    from ._cli_fdlock import open_existing

    try:
        fd = -1
        if create:
            # O_NONBLOCK: a FIFO at the path must not hang the open.
            flags = os.O_RDONLY | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(path, flags | os.O_CREAT, 0o666)
                os.set_blocking(fd, True)  # the command shares this open file description
            except (IsADirectoryError, FileExistsError):
                pass
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
        if fd < 0:
            fd = open_existing(path)
    except OSError as exc:
        _open_failed(path, exc)
    _refuse_network_filesystem(path, fd)
    return fd


def _refuse_network_filesystem(path: str, fd: int) -> None:
    """As pylock.Lock refuses them: flock there is emulated or local to one client."""
    from . import _fs
    from ._errors import UnsafeFilesystem
    from ._native import ffi, lib

    fs = ffi.new("pl_fs_info *")
    if lib.pl_fs_stat(fd, fs) != 0:
        return
    name = _fs.network_filesystem(fs.magic, fs.remote, ffi.string(fs.name).decode())
    if name is not None:
        os.close(fd)
        _say(str(UnsafeFilesystem(path, name)))
        raise Exit(EX_NOINPUT)


def _open_failed(path: str, exc: OSError) -> NoReturn:
    from ._errors import LockFileError

    if isinstance(exc, LockFileError):
        _say(str(exc))
    else:
        _say(f"cannot open lock file {path}: {exc.strerror}")
    code = exc.errno
    if code in (errno.ENOMEM, errno.EMFILE, errno.ENFILE):
        raise Exit(EX_OSERR)
    if code in (errno.EROFS, errno.ENOSPC):
        raise Exit(EX_CANTCREAT)
    raise Exit(EX_NOINPUT)


def _umask() -> int:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # one thread here: reading it by setting it is safe
    os.umask(mask)
    return mask


def _status_line(call: Invocation) -> bool:
    return not call.quiet and os.isatty(2)


def _status(what: str, holder: Any) -> Any:
    from ._cli_status import StatusLine

    return StatusLine(what, holder)


def _holder_text(holder: Any) -> str:
    from ._errors import describe_holder

    return describe_holder(holder) if holder is not None else "nobody (about to be granted)"


def _fd_holder_text(fd: int) -> str:
    from ._cli_fdlock import kernel_holders

    found = kernel_holders(fd)
    if not found:
        return "a process pylock cannot see (another user's, or in another pid namespace)"
    text = found[0].describe()
    return text if len(found) == 1 else f"{text} and {len(found) - 1} more"


# -- running the command ----------------------------------------------------------


def _execute(call: Invocation, fd: int) -> int:
    """Run the command as flock(1) does (fork, exec, wait) and return its status."""
    assert call.command is not None
    # As flock(1): a SIGCHLD the caller ignored would make waitpid fail.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    inherited = -1
    if not call.close:
        # The command gets its own descriptor on the locked open file (the
        # same lock): nothing that tidies pylock's descriptors in a forked
        # child can take it away.  An inherited descriptor is passed as is.
        inherited = fd if call.path is None else os.dup(fd)
        os.set_inheritable(inherited, True)
    # From here on the wrapper behaves as flock(1) does: Ctrl-C and SIGTERM
    # end it (the command, in the same process group, gets its own Ctrl-C
    # from the terminal; nothing is forwarded), and the command's status is
    # taken straight from waitpid, with no handler that could lose it.
    _restore_default_interrupt()
    if call.no_fork:
        _exec(call.command)
    try:
        pid = os.fork()
    except OSError as exc:
        _say(f"fork failed: {exc.strerror}")
        return EX_OSERR
    if pid == 0:
        if call.close and call.path is None:
            os.close(fd)
        _exec(call.command)
    if inherited >= 0 and inherited != fd:
        os.close(inherited)  # closing, never unlocking: the command holds the lock now
    try:
        _, status = os.waitpid(pid, 0)  # retried on EINTR (PEP 475)
    except ChildProcessError as exc:
        _say(f"waitpid failed: {exc.strerror}")
        return 1
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else EX_OSERR


def _exec(command: list[str]) -> NoReturn:
    """Become the command; if it cannot run, say so and exit 69 (71 without memory)."""
    # Python ignores these for itself at start; the command gets the default.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        code = exc.errno
        message = f"pylock: failed to execute {command[0]}: {exc.strerror}\n"
    try:  # noqa: SIM105 (contextlib costs start-up time)
        os.write(2, message.encode(errors="replace"))
    except OSError:
        pass  # nowhere to say it; the status still tells
    os._exit(EX_OSERR if code == errno.ENOMEM else EX_UNAVAILABLE)


def _restore_default_interrupt() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
