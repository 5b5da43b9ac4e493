"""pylock run, running the command as flock(1) does: fork, exec, wait, and nothing else.

No signal is forwarded and no handler stands between waitpid and the exit
status: Ctrl-C and SIGTERM end the wrapper as they end flock(1), and the
command (in the same process group) gets its own Ctrl-C from the terminal.
"""

from __future__ import annotations

import errno
import os
import signal

from .exits import EX_OSERR, EX_UNAVAILABLE, say

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from typing import NoReturn

    from .invocation import Invocation


def execute(call: Invocation, fd: int) -> int:
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
        say(f"fork failed: {exc.strerror}")
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
        say(f"waitpid failed: {exc.strerror}")
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
        from .._core.display import display
        from .invoked import name

        message = f"{name}: failed to execute {display(command[0])}: {exc.strerror}\n"
    try:  # noqa: SIM105 (contextlib costs start-up time)
        os.write(2, message.encode(errors="replace"))
    except OSError:
        pass  # nowhere to say it; the status still tells
    os._exit(EX_OSERR if code == errno.ENOMEM else EX_UNAVAILABLE)


def _restore_default_interrupt() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
