"""Fork and exec: a forked child never keeps or releases its parent's lock,
and exec'd or subprocess children never inherit the descriptor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

import pylock
from tests.support.kernel_locks import wait_blocked
from tests.support.procs import Script, alive, fds_on
from tests.support.sizes import Figures

# The holder takes the lock, then starts children of every kind that outlive
# it: a plain fork (sleeping), a fork that execs sleep(1), subprocess.Popen
# with close_fds=False, and os.posix_spawn (where os has it: not on PyPy).
# It prints their pids and waits.
HOLDER_WITH_CHILDREN = r"""
import os, signal, subprocess, sys, json, pylock
path = sys.argv[1]
lock = pylock.Lock(path)
lock.acquire()
kids = {}
pid = os.fork()
if pid == 0:
    while True:
        signal.pause()
kids["fork"] = pid
pid = os.fork()
if pid == 0:
    os.execv("/bin/sleep", ["sleep", "1000"])
kids["fork_exec"] = pid
kids["popen_close_fds_false"] = subprocess.Popen(["sleep", "1000"], close_fds=False).pid
if hasattr(os, "posix_spawn"):
    kids["posix_spawn"] = os.posix_spawn("/bin/sleep", ["sleep", "1000"], dict(os.environ))
print("kids", json.dumps(kids), flush=True)
sys.stdin.readline()
if sys.argv[2] == "exit":
    os._exit(0)          # dies holding, without release
signal.pause()
"""


@pytest.mark.parametrize("death", ["sigkill", "exit"])
def test_holder_dies_lock_is_free_at_once_while_children_live(
    tmp_path: Path, death: str, figures: Figures
) -> None:
    path = str(tmp_path / "fork.lock")
    holder = Script(HOLDER_WITH_CHILDREN, path, death)
    waiter = None
    kids: dict[str, int] = {}
    try:
        kids = json.loads(holder.expect("kids"))
        # The kernel shows the holder alone holding it; no child has the file open.
        assert [h.pid for h in pylock.holders(path)] == [holder.pid]
        for kind, pid in kids.items():
            assert fds_on(pid, path) == [], f"{kind} child {pid} has the lock file open"
        # A second process blocks on the lock.
        waiter = Script(
            "import sys, time, pylock\n"
            "lock = pylock.Lock(sys.argv[1])\n"
            "print('waiting', flush=True)\n"
            "lock.acquire()\n"
            "print('got', time.monotonic_ns(), flush=True)\n"
            "sys.stdin.readline()\n",
            path,
        )
        waiter.expect("waiting")
        wait_blocked(path, waiter.pid)

        t_death = time.monotonic_ns()
        if death == "sigkill":
            holder.kill()
        else:
            holder.send("die")
            holder.wait()
        got = int(waiter.expect("got"))
        handover_ms = (got - t_death) / 1e6
        for kind, pid in kids.items():
            assert alive(pid), f"{kind} child died with the holder"
        assert [h.pid for h in pylock.holders(path)] == [waiter.pid]
        figures(death=death, children_alive=sorted(kids), handover_ms=round(handover_ms, 3))
        assert handover_ms < 1000
    finally:
        for pid in kids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        holder.close()
        if waiter is not None:
            waiter.close()


# The holder forks a child that tries, in one way, to touch the parent's lock
# and then exits (normally, so finalizers run, unless the action says _exit).
CHILD_ACTION = r"""
import gc, os, sys, pylock
path, action = sys.argv[1], sys.argv[2]
lock = pylock.Lock(path)
lock.acquire()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    outcome = "ok"
    try:
        if action == "release":
            lock.release()
        elif action == "release_unlink":
            lock.release(unlink=True)
        elif action == "close":
            lock.close()
        elif action == "del":
            del lock
            gc.collect()
        elif action == "acquire":
            lock.acquire(blocking=False)
        elif action == "exit_with_block":
            lock.__exit__(None, None, None)
        elif action == "new_lock_acquire":
            pylock.Lock(path).acquire(blocking=False)
    except pylock.LockHeld as e:
        outcome = f"LockHeld:{e.holder.pid if e.holder else 0}"
    except pylock.LockError as e:
        outcome = type(e).__name__
    os.write(w, (f"{outcome} {int(os.path.exists(path))}\n").encode())
    if action == "os_exit":
        os._exit(0)
    sys.exit(0)
os.close(w)
with os.fdopen(r) as f:
    child_said = f.read().strip()
_, status = os.waitpid(pid, 0)
print("child", child_said, os.waitstatus_to_exitcode(status), lock.locked, flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
"""

ACTIONS = [
    "release",
    "release_unlink",
    "close",
    "del",
    "acquire",
    "exit_with_block",
    "new_lock_acquire",
    "sys_exit",
    "os_exit",
]


@pytest.mark.parametrize("action", ACTIONS)
def test_forked_child_never_releases_the_parents_lock(
    tmp_path: Path, action: str, figures: Figures
) -> None:
    path = str(tmp_path / "fork.lock")
    holder = Script(CHILD_ACTION, path, action)
    try:
        outcome, exists, child_rc, parent_locked = holder.expect("child").split()
        # The child has exited; the parent still holds, as the kernel shows.
        assert parent_locked == "True"
        assert exists == "1", "a forked child unlinked the parent's lock file"
        assert int(child_rc) == 0
        assert [h.pid for h in pylock.holders(path)] == [holder.pid]
        with pytest.raises(pylock.LockHeld) as info:
            pylock.Lock(path).acquire(blocking=False)
        assert info.value.holder is not None
        assert info.value.holder.pid == holder.pid
        assert info.value.holder.verified
        if action in ("acquire", "new_lock_acquire"):
            # Refused, and the refusal names the parent.
            assert outcome == f"LockHeld:{holder.pid}"
        elif action in ("release", "release_unlink", "exit_with_block"):
            assert outcome == "NotHeld"
        else:
            assert outcome == "ok"
        figures(action=action, child_saw=outcome, parent_still_holds=True)
        holder.send()
        holder.expect("released")
        assert pylock.holders(path) == []
    finally:
        holder.close()


def test_subprocess_and_exec_children_do_not_inherit_the_descriptor(tmp_path: Path) -> None:
    path = str(tmp_path / "inherit.lock")
    code = r"""
import json, os, subprocess, sys, pylock
path = sys.argv[1]
lock = pylock.Lock(path)
lock.acquire()
st = os.stat(path)
probe = (
    "import json, os, sys\n"
    "st = os.stat(sys.argv[1])\n"
    "found = []\n"
    "for fd in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        s = os.fstat(int(fd))\n"
    "    except OSError:\n"
    "        continue\n"
    "    if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):\n"
    "        found.append(int(fd))\n"
    "print(json.dumps(found))\n"
)
out = {}
for name, kw in [("close_fds_true", {}), ("close_fds_false", {"close_fds": False})]:
    res = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True, **kw)
    out[name] = json.loads(res.stdout)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.dup2(w, 1)
    os.execv(sys.executable, [sys.executable, "-c", probe, path])
os.close(w)
with os.fdopen(r) as f:
    out["fork_exec"] = json.loads(f.read())
os.waitpid(pid, 0)
import shlex
cmd = f"{sys.executable} -c {shlex.quote(probe)} {shlex.quote(path)} > {shlex.quote(path)}.sys"
assert os.system(cmd) == 0
with open(path + ".sys") as f:
    out["system"] = json.loads(f.read())
print(json.dumps(out), flush=True)
"""
    holder = Script(code, path)
    try:
        seen = json.loads(holder.expect())
        assert seen == {"close_fds_true": [], "close_fds_false": [], "fork_exec": [], "system": []}
        holder.wait()
    finally:
        holder.close()
