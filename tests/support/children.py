"""The one harness for child processes: real processes that tell the test,
line by line over a pipe, when they have done something.

- `Child`: any program speaking a line protocol on stdin/stdout; `expect()`
  reads its next line, the synchronisation point (the child prints only once
  it has done what the line says).  Closing stdin is "stop".
- `Script`: a Python child (`python -c code args`) that imports pylock and
  tests.support from this checkout.
- `HolderProcess`: a Script that takes a pylock lock and holds it until its
  stdin closes or it is killed.
- `Forked`: a forked copy of the test process running a function, lines over
  pipes both ways (for tests that need the parent's state in the child).
"""

from __future__ import annotations

import contextlib
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

    def expect(self, prefix: str = "") -> str:
        """The rest of the child's next line, which must start with prefix."""
        assert self.proc.stdout is not None
        line: str = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise AssertionError(f"child exited ({rc}) before saying {prefix!r}:\n{self.stderr}")
        line = line.rstrip("\n")
        if not line.startswith(prefix):
            raise AssertionError(f"expected {prefix!r}, child said {line!r}\n{self.stderr}")
        return line[len(prefix) :].strip()

    def send(self, line: str = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

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

    def __init__(self, fn: Callable[[Forked.Chan], None]) -> None:
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                _close_all_but(down_r, up_w)
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

    def line(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from], [], [], max(left, 0))
            assert ready, f"child {self.pid} said nothing within {timeout} s"
            chunk = os.read(self._from, 4096)
            assert chunk, f"child {self.pid} ended without a line (status {self.wait()})"
            self._buf += chunk
        text, _, self._buf = self._buf.partition(b"\n")
        return text.decode()

    def tell(self, text: str) -> None:
        os.write(self._to, text.encode() + b"\n")

    def wait(self) -> int:
        if self.status is None:
            _, status = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
            os.close(self._to)
            os.close(self._from)
        return self.status

    def kill(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()
