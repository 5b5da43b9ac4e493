"""The SIGCHLD fallback as a guest in someone else's process (issue 9, items 8-11).

Each case runs in a fresh process under the seccomp launcher (pidfd_open
refused, so the SIGCHLD fallback does the work) and prints what it saw as
JSON.  What a hostile or merely busy host does there:

- blocks SIGCHLD everywhere and takes it itself with sigtimedwait: pylock
  must not take a single one, during a watch or after it (item 8);
- installs its own SIGCHLD handler after a watch began (asyncio's
  add_signal_handler, uvloop's first subprocess): the watch must still end
  (item 9);
- has a Python SIGCHLD handler (no SA_RESTART): pylock's chained handler
  must keep its flags (item 10);
- carries a second copy of pylock under another extension name, built here,
  or a library that re-installs its chaining handler in front of pylock's:
  no handler may recurse into the other until the stack overflows (item 11).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support import env_with_repo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECCOMP = [sys.executable, "-m", "tests.support.seccomp", "--"]
HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
LOOPS = [
    "asyncio",
    pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop")),
]

PRELUDE = textwrap.dedent(
    """
    import asyncio, ctypes, json, os, signal, subprocess, sys, threading
    import pylock
    from pylock._core import process as _process

    out = {"pinning": _process.pinning_available()}

    class SigAction(ctypes.Structure):  # glibc's struct sigaction
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                    ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    SA_SIGINFO, SA_RESTORER = 4, 0x04000000

    def sigchld_action():
        sa = SigAction()
        assert libc.sigaction(signal.SIGCHLD, None, ctypes.byref(sa)) == 0
        return sa.flags & ~(SA_SIGINFO | SA_RESTORER), sa.mask[0]  # the kernel's 64 signals

    def sleeper():
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                stdin=subprocess.PIPE)

    def end(p, code=None):
        if code is None:
            p.kill()
        else:
            p.stdin.write(f"{code}".encode())
        p.stdin.close()

    def run(kind, coro):
        # asyncio.Runner is Python 3.11+; these two are the same on every version.
        if kind == "uvloop":
            import uvloop
            return uvloop.run(coro)
        return asyncio.run(coro)

    async def started(coro):
        task = asyncio.ensure_future(coro)
        await asyncio.sleep(0)
        assert not task.done()
        return task
    """
)


def _run_case(code: str, *args: str, timeout: float = 120) -> Any:
    proc = subprocess.run(
        [*SECCOMP, sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_with_repo(),
        cwd=REPO,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}"
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out.pop("pinning") is False
    return out


# -- item 8: SIGCHLD blocked everywhere, taken by the program ----------------------

BLOCKED = """
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # before any thread

if hasattr(signal, "sigtimedwait"):
    def sigchld_from(timeout):
        info = signal.sigtimedwait({signal.SIGCHLD}, timeout)
        return None if info is None else info.si_pid
else:  # PyPy: libc's (siginfo_t's si_pid at offset 16 on 64-bit Linux)
    class Timespec(ctypes.Structure):
        _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

    def sigchld_from(timeout):
        mask, info = ctypes.create_string_buffer(128), ctypes.create_string_buffer(128)
        libc.sigemptyset(mask)
        libc.sigaddset(mask, signal.SIGCHLD)
        wait = Timespec(int(timeout), 0)
        if libc.sigtimedwait(mask, info, ctypes.byref(wait)) < 0:
            return None
        return ctypes.c_int.from_buffer(info, 16).value

def own_children(n):
    # The program's own children, seen through its own sigtimedwait.
    while sigchld_from(0) is not None:
        pass  # what earlier exits left pending
    seen = 0
    for _ in range(n):
        p = subprocess.Popen(["true"])
        pid = sigchld_from(5)
        p.wait()
        if pid != p.pid:
            break
        seen += 1
    return seen

watched = sleeper()
result = {}
waiter = threading.Thread(target=lambda: result.update(
    done=pylock.wait_exit(watched.pid, timeout=60)))
waiter.start()
out["during"] = own_children(20)  # while pylock watches a child
end(watched)
waiter.join()
out["watch"] = result["done"]
out["watched_rc"] = watched.wait()

p = sleeper()
async def watch_async():
    task = await started(pylock.holder_exit(p.pid, timeout=60))
    end(p, 3)
    return await task
out["async"] = asyncio.run(watch_async())
p.wait()
out["after"] = own_children(20)  # nothing watched any more
kinds = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        kinds.add(os.readlink(f"/proc/self/fd/{fd}").split(":")[0])
    except OSError:
        pass
out["fd_kinds"] = sorted(kinds)
print(json.dumps(out))
"""


def test_a_program_that_takes_sigchld_itself_gets_every_one() -> None:
    out = _run_case(BLOCKED)
    assert out["during"] == 20, "pylock took the program's SIGCHLD while watching"
    assert out["after"] == 20, "pylock kept taking SIGCHLD after its watches ended"
    assert out["watch"] is True and out["watched_rc"] == -9
    assert out["async"] == 0  # a sleeper given "3" on stdin still exits 0: read, not reaped
    assert "anon_inode" not in out["fd_kinds"]  # no signalfd left behind


# -- item 9: a handler installed after the watch began ----------------------------

LATE_HANDLER = """
kind = sys.argv[1]
calls = []

async def main():
    loop = asyncio.get_running_loop()
    a, b = sleeper(), sleeper()
    task = await started(pylock.holder_exit(a.pid, timeout=30))
    watcher = pylock.ExitWatcher()
    future = watcher.watch(b.pid)
    if kind == "uvloop":
        # uvloop's first subprocess installs libuv's own SIGCHLD handler.
        proc = await asyncio.create_subprocess_exec("true")
        out["subprocess"] = await proc.wait()
    else:
        loop.add_signal_handler(signal.SIGCHLD, lambda: calls.append(1))
    end(a)
    end(b)
    out["holder_exit"] = await task
    out["watcher"] = await asyncio.wait_for(future, 30)
    watcher.close()
    a.wait(); b.wait()
    # Blocking form, after the takeover too.
    c = sleeper()
    threading.Thread(target=end, args=(c,)).start()
    out["wait_exit"] = pylock.wait_exit(c.pid, timeout=30)
    c.wait()

run(sys.argv[1], main())
out["handler_calls"] = len(calls)
print(json.dumps(out))
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_a_sigchld_handler_installed_after_the_watch_began(loop: str) -> None:
    out = _run_case(LATE_HANDLER, loop)
    assert out["holder_exit"] == -9
    assert out["watcher"] == -9
    assert out["wait_exit"] is True
    if loop == "uvloop":
        assert out["subprocess"] == 0
    else:
        assert out["handler_calls"] >= 1  # the program's handler runs as installed


# -- item 10: the program's handler keeps its semantics ---------------------------

FLAGS = """
calls = []
signal.signal(signal.SIGCHLD, lambda *a: calls.append(1))  # no SA_RESTART
before = sigchld_action()
p = sleeper()
async def main():
    task = await started(pylock.holder_exit(p.pid, timeout=30))
    out["during"] = sigchld_action()  # pylock's handler, in front
    end(p, 0)
    return await task
out["rc"] = asyncio.run(main())
p.wait()
out["before"] = before
out["calls"] = len(calls)
print(json.dumps(out))
"""


def test_the_programs_handler_keeps_its_flags_and_mask() -> None:
    out = _run_case(FLAGS)
    flags, mask = out["before"]
    assert flags & 0x10000000 == 0  # Python's handlers do not restart syscalls
    assert out["during"] == [flags, mask], "pylock changed the program's SIGCHLD semantics"
    assert out["rc"] == 0
    assert out["calls"] >= 1


# -- item 11: two copies of pylock in one process ---------------------------------


@pytest.fixture(scope="module")
def vendored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second copy of pylock, as a program that vendors it would carry:
    the package renamed, its C core built under another extension name."""
    root = tmp_path_factory.mktemp("vendored")
    package = root / "pylock_vendored"
    shutil.copytree(
        Path(REPO) / "pylock", package, ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    build = textwrap.dedent(
        """
        import os, sys
        sys.path.insert(0, os.path.join(sys.argv[1], "csrc"))
        import _ffi_build as b
        from cffi import FFI
        ffi = FFI()
        ffi.cdef(b._constants() + "".join(b._cdef_of(h) for h in b.HEADERS))
        csrc = os.path.join(sys.argv[1], "csrc")
        ffi.set_source("pylock_vendored._native",
                       '#include "pylock.h"\\n#include "pylock_proc.h"\\n',
                       sources=[os.path.join(csrc, s) for s in b.SOURCES],
                       include_dirs=[csrc], libraries=b._libraries,
                       extra_compile_args=b._extra, define_macros=[("_GNU_SOURCE", "1")])
        ffi.compile(tmpdir=sys.argv[2])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", build, REPO, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(package.glob("_native*.so")), "the vendored extension was not built"
    return root


TWO_COPIES = """
sys.path.insert(0, sys.argv[1])
import pylock_vendored
assert pylock_vendored._native.lib is not pylock._native.lib

async def main():
    procs = [sleeper() for _ in range(6)]
    copies = [pylock, pylock_vendored] * 3
    tasks = []
    # Interleaved: each copy's watch comes after the other's handler went in.
    for copy, p in zip(copies, procs):
        tasks.append(await started(copy.holder_exit(p.pid, timeout=30)))
    for code, p in enumerate(procs):
        end(p, code)
    results = [await t for t in tasks]
    for p in procs:
        p.wait()
    return results

out["async"] = asyncio.run(main())
p = sleeper()
threading.Thread(target=end, args=(p,)).start()
out["sync"] = pylock_vendored.wait_exit(p.pid, timeout=30)
p.wait()
print(json.dumps(out))
"""


@pytest.mark.checkout  # builds a second copy from pylock/ and csrc/
def test_two_copies_of_pylock_in_one_process(vendored: Path) -> None:
    out = _run_case(TWO_COPIES, str(vendored))
    assert out["async"] == [0] * 6  # sleepers given a code on stdin exit 0
    assert out["sync"] is True


# -- item 11: any handler that chains back -------------------------------------------

# A library that puts its SIGCHLD handler in front of whatever is installed,
# chaining to it, and does so again whenever it likes: once pylock is in
# front of it, its second install makes each handler call the other.
RELINKER_C = r"""
#include <signal.h>
#include <string.h>
static struct sigaction prev;
static volatile sig_atomic_t calls;
static void handler(int sig, siginfo_t *si, void *uc)
{
    calls++;
    if (prev.sa_flags & SA_SIGINFO)
        prev.sa_sigaction(sig, si, uc);
    else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN)
        prev.sa_handler(sig);
}
int relink(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGCHLD, &sa, &prev);
}
int calls_so_far(void) { return calls; }
"""

CHAIN_BACK = """
lib = ctypes.CDLL(sys.argv[1])
assert lib.relink() == 0  # the library first: relinker -> SIG_DFL
p = sleeper()
async def main():
    task = await started(pylock.holder_exit(p.pid, timeout=30))  # pylock -> relinker
    assert lib.relink() == 0  # relinker -> pylock -> relinker -> ...
    end(p, 0)
    return await task
out["rc"] = asyncio.run(main())
p.wait()
out["calls"] = lib.calls_so_far()
print(json.dumps(out))
"""


def test_a_handler_that_chains_back_does_not_recurse(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the chaining library")
    src = tmp_path / "relinker.c"
    src.write_text(RELINKER_C)
    lib = tmp_path / "librelinker.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    out = _run_case(CHAIN_BACK, str(lib))
    assert out["rc"] == 0
    assert 1 <= out["calls"] <= 4  # once per SIGCHLD, not until the stack overflows
