"""A held Lock that is collected releases the lock with its descriptor, and
says so with a ResourceWarning (as an unclosed file does); a Lock released,
closed, forgotten by a fork, or held to interpreter exit says nothing."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import pylock
from tests.support import env_with_repo


def held_by_other_process(path: str) -> bool:
    return subprocess.run(["flock", "-n", path, "true"]).returncode == 1


def test_a_held_lock_collected_warns_and_is_released(tmp_path):
    path = str(tmp_path / "dropped.lock")
    lock = pylock.Lock(path)
    lock.acquire()
    assert held_by_other_process(path)
    with pytest.warns(ResourceWarning, match="collected while held") as caught:
        del lock
        gc.collect()
    assert path in str(caught[0].message)
    assert not held_by_other_process(path)


def test_a_dropped_singleton_warns(tmp_path):
    with pytest.warns(ResourceWarning, match="collected while held"):
        pylock.singleton(directory=str(tmp_path))
        gc.collect()
    pylock.singleton(directory=str(tmp_path)).release()  # it was released


@pytest.mark.parametrize("done", ["release", "close", "never acquired"])
def test_a_lock_not_held_is_collected_quietly(tmp_path, done):
    lock = pylock.Lock(tmp_path / "quiet.lock")
    if done != "never acquired":
        lock.acquire()
        getattr(lock, done)()
    # Recorded, not raised: __del__ would swallow the exception.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lock
        gc.collect()
    assert [str(w.message) for w in caught] == []


def test_a_forked_child_collects_its_parents_lock_quietly(tmp_path):
    path = str(tmp_path / "parent.lock")
    lock = pylock.Lock(path)
    lock.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del lock
                gc.collect()
            os.write(write, str(len(caught)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    os.waitpid(pid, 0)
    assert reported == "0"
    assert held_by_other_process(path)  # the parent's lock, still held
    lock.release()


def test_a_lock_held_until_exit_says_nothing(tmp_path):
    script = textwrap.dedent(
        """
        import sys, pylock
        lock = pylock.singleton(directory=sys.argv[1])
        """
    )
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env_with_repo(),
        check=True,
    )
    assert out.stderr == ""


def test_a_lock_whose_construction_failed_is_collected_without_an_error() -> None:
    """A Lock that refused its arguments still goes through __del__: it must
    say nothing (there is no hold) and raise nothing."""
    import gc
    import sys

    import pylock

    seen: list[object] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(pylock.LockFileError):
                pylock.Lock("")
            gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert seen == []
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
