"""The pylock command: one entry point, each subcommand in a module of its own.

Only the chosen subcommand's module is imported (start-up time matters to
shell loops and cron).  Every usage mistake ends with one line and exit 64;
Ctrl-C ends the command as a SIGINT death the shell recognises (130); no
traceback ever reaches the user.
"""

from __future__ import annotations

import os
import signal
import sys

from . import invoked
from .args import Option, UsageError, help_lines
from .exits import EX_OSERR, EX_SOFTWARE, EX_USAGE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# name -> (module, its function taking the arguments after the name, one-line summary).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "main", "run a command holding a lock (util-linux flock(1) compatible)"),
    "who": ("who", "main", "say who holds a lock (exit 0 held, 1 free)"),
    "wait": ("wait", "main_wait", "wait until a lock is free, without taking it"),
    "wait-exit": ("wait", "main_wait_exit", "wait until processes exit"),
    "list": ("list", "main", "the lock files of a directory; --clean removes stale ones"),
}

TOP_HELP = """\
Usage:
 pylock COMMAND [options] ...
 pylock -h | --help | -V | --version

Locks that know who holds them.  Commands:
{commands}

'pylock COMMAND -h' describes each one.  Usage errors exit 64.
"""


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if argv is None and invoked.as_flock(sys.argv[0]):
        invoked.name = invoked.FLOCK  # flock(1) by another name: `pylock run`
        words.insert(0, "run")
    command = words[0] if words else ""
    try:
        return _dispatch(words)
    except UsageError as exc:
        where = f"pylock {command}" if command in COMMANDS else "pylock"
        where = where if invoked.name == "pylock" else invoked.name
        _stderr(f"{where}: {exc}; see '{where} -h'")
        return EX_USAGE
    except KeyboardInterrupt:
        _die_by(signal.SIGINT)
    except BrokenPipeError:
        _die_by(signal.SIGPIPE)
    except MemoryError:
        _stderr(f"{invoked.name}: out of memory")
        return EX_OSERR
    except Exception as exc:  # the promise: one line, never a traceback
        if os.environ.get("PYLOCK_DEBUG"):
            raise
        what = f"unexpected {type(exc).__name__}: {exc} (PYLOCK_DEBUG=1 shows where)"
        _stderr(f"{invoked.name}: {what}")
        return EX_SOFTWARE
    return 0  # not reached: _die_by does not return


def _dispatch(words: list[str]) -> int:
    if not words:
        raise UsageError("no command given (run, who, wait, wait-exit, list)")
    first = words[0]
    if first in ("-h", "--help"):
        commands = "\n".join(f"  {name:<10} {entry[2]}" for name, entry in COMMANDS.items())
        sys.stdout.write(TOP_HELP.format(commands=commands))
        return 0
    if first in ("-V", "--version"):
        print_version()
        return 0
    if first not in COMMANDS:
        if first.startswith("-"):
            raise UsageError(f"unrecognized option '{first}'")
        raise UsageError(f"unknown command '{first}' (run, who, wait, wait-exit, list)")
    module_name, function, _ = COMMANDS[first]
    import importlib

    module = importlib.import_module(f"pylock._cli.{module_name}")
    entry: Callable[[Sequence[str]], int] = getattr(module, function)
    return entry(words[1:])


def print_help(usage: str, options: Sequence[Option], epilog: str = "") -> None:
    text = usage + "\n".join(help_lines(options)) + "\n" + epilog
    if invoked.name != "pylock":
        text = text.replace("pylock run", invoked.name)
    sys.stdout.write(text)
    sys.stdout.flush()


def print_version() -> None:
    from .. import __version__

    sys.stdout.write(f"pylock {__version__}\n")
    sys.stdout.flush()


def _stderr(line: str) -> None:
    from .._core.display import display

    try:  # escaped: a usage error quotes the words it was given
        sys.stderr.write(display(line) + "\n")
        sys.stderr.flush()
    except OSError:
        pass


def _die_by(signum: int) -> None:
    """End as if signum had killed us, so the caller sees a signal death (128 + n)."""
    try:  # noqa: SIM105 (contextlib costs start-up time)
        sys.stdout.flush()
    except OSError:
        pass  # a closed pipe: nothing more to say
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal is blocked


if __name__ == "__main__":
    sys.exit(main())
