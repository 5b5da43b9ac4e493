"""The one harness for child processes: real processes that tell the test,
line by line over a pipe, when they have done something.

- `Child`: any program speaking a line protocol on stdin/stdout; `expect()`
  reads its next line, the synchronisation point (the child prints only once
  it has done what the line says).  Closing stdin is "stop".
- `Script`: a Python child (`python -c code args`) that imports pylock and
  tests.support from this checkout.
- `Sleeper`: a Script that says "ready" and runs until its stdin closes.
- `NonChild`: a program that is not the test's child (an intermediate the
  test owns is its parent), to watch and reap from outside.
- `sleep_processes`: many plain `sleep` processes, cheap to start by the hundred.
- `HolderProcess`: a Script that takes a pylock lock and holds it until its
  stdin closes or it is killed.
- `Forked`: a forked copy of the test process running a function, lines over
  pipes both ways (for tests that need the parent's state in the child),
  optionally as another user.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from tests.support import env_with_repo


def wait_unreaped(pid: int) -> None:
    """Return once the child pid has exited, left unreaped (a zombie)."""
    if hasattr(os, "waitid"):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        return
    # PyPy's os has no waitid: libc's, with Linux's constants.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    siginfo = ctypes.create_string_buffer(128)
    p_pid, wexited, wnowait = 1, 4, 0x01000000
    while libc.waitid(p_pid, pid, siginfo, wexited | wnowait) != 0:
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


def read_line(
    fd: int, pending: bytes, within: float | None, who: str, waiting_for: str
) -> tuple[str | None, bytes]:
    """The next line from a pipe, read from fd itself (never through a
    buffered stream, which could take two lines while a select on fd sees
    one), after the bytes already read (pending); and the bytes left over.
    None at the end of the stream with nothing pending; a last line without
    its newline is still a line.  within (seconds) bounds the wait, as a
    guard against a hang, never as a synchronisation by time."""
    deadline = None if within is None else time.monotonic() + within
    while b"\n" not in pending:
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise AssertionError(
                    f"{who} said nothing in {within} s (waiting for {waiting_for})"
                )
        chunk = os.read(fd, 65536)
        if not chunk:
            return (pending.decode() if pending else None), b""
        pending += chunk
    line, _, rest = pending.partition(b"\n")
    return line.decode(), rest


class Child:
    """A child process speaking a line protocol on stdin/stdout.

    Its stderr is collected by a thread for error messages; with
    capture_stderr=False it goes to the test's stderr and no thread runs
    here (for tests that count this process's threads).
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        capture_stderr: bool = True,
        **popen: Any,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture_stderr else None,
            text=True,
            env=env,
            **popen,
        )
        self.pid = self.proc.pid
        self._stderr: list[str] = []
        self._pending = b""  # read from stdout, not yet returned by expect()
        self._err_thread: threading.Thread | None = None
        if capture_stderr:
            self._err_thread = threading.Thread(target=self._drain, daemon=True)
            self._err_thread.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        """What the child wrote to stderr (complete once it and its children exited)."""
        if self.proc.poll() is not None and self._err_thread is not None:
            self._err_thread.join(1)
        return "".join(self._stderr)

    def expect(self, prefix: str = "", within: float | None = None) -> str:
        """The rest of the child's next line, which must start with prefix.

        within (seconds) bounds the wait, as a guard against a hang (a
        failure), never as a synchronisation by time (see read_line)."""
        line = self._next_line(within, prefix)
        if line is None:
            rc = self.proc.wait()
            raise AssertionError(f"child exited ({rc}) before saying {prefix!r}:\n{self.stderr}")
        if not line.startswith(prefix):
            raise AssertionError(f"expected {prefix!r}, child said {line!r}\n{self.stderr}")
        return line[len(prefix) :].strip()

    def _next_line(self, within: float | None, prefix: str) -> str | None:
        assert self.proc.stdout is not None
        line, self._pending = read_line(
            self.proc.stdout.fileno(), self._pending, within, f"child {self.pid}", repr(prefix)
        )
        return line

    def send(self, line: str = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def zombify(self) -> None:
        """Close its stdin and return once it has exited, left unreaped (a zombie)."""
        self.close_stdin()
        wait_unreaped(self.pid)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def kill(self) -> int:
        self.proc.kill()
        return self.wait()

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.close_stdin()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Script(Child):
    """A Python child (`python -c code args`) importing pylock and tests.support
    from this checkout; prefix runs it under another program (e.g. unshare)."""

    def __init__(
        self,
        code: str,
        *args: str,
        prefix: Sequence[str] = (),
        env: dict[str, str] | None = None,
        capture_stderr: bool = True,
        **popen: Any,
    ) -> None:
        argv = [*prefix, sys.executable, "-c", code, *args]
        super().__init__(argv, env_with_repo(env), capture_stderr, **popen)


SLEEPER = "import sys; print('ready', flush=True); sys.stdin.read()"


class Sleeper(Script):
    """A child of the test that runs until its stdin closes."""

    def __init__(self) -> None:
        super().__init__(SLEEPER, capture_stderr=False)  # no thread: tests count threads
        try:
            self.expect("ready")
        except BaseException:
            self.close()
            raise


def sleep_processes(n: int) -> list[subprocess.Popen[bytes]]:
    """n `sleep` processes, the test's to kill and reap (no interpreter, no
    pipes: cheap to start by the hundred)."""
    return [subprocess.Popen(["sleep", "3600"]) for _ in range(n)]


# Owns a target program, so the target is not the test's child: it prints
# the target's pid once the target said "ready", then obeys "zombie" (wait
# until the target exited, without reaping), "reap", and "tell TEXT" (pass a
# line to the target and print its answer) on stdin.
INTERMEDIATE = textwrap.dedent(
    """
    import os, subprocess, sys
    from tests.support.children import wait_unreaped
    target = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    if target.stdout.readline().strip() != "ready":
        sys.exit("target did not start")
    print(target.pid, flush=True)
    for line in sys.stdin:
        if line.strip() == "zombie":
            wait_unreaped(target.pid)
            print("zombie", flush=True)
        elif line.strip() == "reap":
            print(target.wait(), flush=True)
        elif line.startswith("tell "):
            target.stdin.write(line[5:])
            target.stdin.flush()
            print(target.stdout.readline().strip(), flush=True)
    target.stdin.close()
    if target.poll() is None:
        target.kill()
    target.wait()
    """
)


class NonChild:
    """A Python program (code, saying "ready" first) that is not the test's
    child: its parent is an intermediate the test owns."""

    def __init__(self, code: str = SLEEPER, *args: str) -> None:
        self.parent = Script(INTERMEDIATE, sys.executable, "-c", code, *args, capture_stderr=False)
        try:
            self.pid = int(self.parent.expect())
        except BaseException:
            self.parent.close()
            raise

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def tell(self, text: str) -> str:
        """Pass a line to the target; returns its one-line answer."""
        self.parent.send("tell " + text)
        return self.parent.expect()

    def zombify(self) -> None:
        """Wait until the target has exited; its parent does not reap it yet."""
        self.parent.send("zombie")
        self.parent.expect("zombie")

    def reap(self) -> int:
        self.parent.send("reap")
        return int(self.parent.expect())

    def close(self) -> None:
        """End the target and its parent (closing the parent's stdin ends both)."""
        self.parent.close_stdin()
        if self.parent.proc.poll() is None:
            self.parent.wait(timeout=30)
        self.parent.close()


# Takes a lock, prints "locked" and then holds it until its stdin closes (or
# it is killed).  Synchronisation is by pipe, never by sleep.
HOLDER_SCRIPT = textwrap.dedent(
    """
    import json, sys, pylock
    path, shared, info = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3])
    lock = pylock.Lock(path, shared=shared, info=info)
    lock.acquire()
    print("locked", flush=True)
    sys.stdin.read()
    lock.release()
    """
)


class HolderProcess(Script):
    """A real process holding a pylock lock until released or killed."""

    def __init__(self, path: os.PathLike[str] | str, shared: bool = False, info: object = None):
        super().__init__(
            HOLDER_SCRIPT,
            os.fspath(path),
            str(int(shared)),
            json.dumps(info),
            capture_stderr=False,  # no thread here: tests count this process's threads
        )
        try:
            self.expect("locked")
        except BaseException:
            self.close()
            raise

    def release(self) -> None:
        """Ask the holder to release and exit; returns once it has exited."""
        self.close_stdin()
        self.wait(timeout=30)


def _close_all_but(*keep: int) -> None:
    """In a forked child: drop every inherited descriptor (above stderr) but keep,
    so the child holds no other process's pipe open."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


class Forked:
    """A forked copy of this process running fn(chan); lines over pipes both ways."""

    def __init__(
        self, fn: Callable[[Forked.Chan], None], user: tuple[int, int] | None = None
    ) -> None:
        """user (uid, gid): the child drops to it for good before fn runs, as a
        process that user started (an interpreter under /root, mode 0700, is
        not one another user could exec, so the test forks instead)."""
        from tests.support.procs import become  # here: procs imports this module

        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                _close_all_but(down_r, up_w)
                if user is not None:
                    become(user)
                fn(Forked.Chan(down_r, up_w))
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(down_r)
        os.close(up_w)
        self.pid = pid
        self._to = down_w
        self._from = up_r
        self._buf = b""
        self.status: int | None = None

    class Chan:
        def __init__(self, r: int, w: int) -> None:
            self._r = os.fdopen(r, "rb", buffering=0)
            self._w = w

        def say(self, text: str) -> None:
            os.write(self._w, text.encode() + b"\n")

        def hear(self) -> str:
            line = b""
            while not line.endswith(b"\n"):
                chunk = self._r.read(1)
                if not chunk:
                    return ""
                line += chunk
            return line.decode().rstrip("\n")

        def until_closed(self) -> None:
            """Block until the parent closes its end (what it sends meanwhile is dropped)."""
            while self._r.read(4096):
                pass

    def line(self, timeout: float = 10.0) -> str:
        line, self._buf = read_line(self._from, self._buf, timeout, f"child {self.pid}", "a line")
        assert line is not None, f"child {self.pid} ended without a line (status {self.wait()})"
        return line

    def tell(self, text: str) -> None:
        os.write(self._to, text.encode() + b"\n")

    def close_input(self) -> None:
        """Close the child's input: its hear() answers "", until_closed() returns."""
        if self._to >= 0:
            os.close(self._to)
            self._to = -1

    def rest(self, timeout: float = 30.0) -> list[str]:
        """Every line the child still says, until it closes its end (or ends)."""
        lines = []
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self._from], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"child {self.pid} kept its output open for {timeout} s"
            chunk = os.read(self._from, 4096)
            if not chunk:
                break
            self._buf += chunk
        while self._buf:
            text, _, self._buf = self._buf.partition(b"\n")
            lines.append(text.decode())
        return lines

    def wait(self) -> int:
        if self.status is None:
            _, status = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
            self.close_input()
            os.close(self._from)
        return self.status

    def kill(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()
