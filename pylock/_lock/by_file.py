"""The lock files open in this process, by file (device, inode): who else
in this process has a lock's file open, asked by every wait (a wait that
could only deadlock is refused by looking here; a wait whose holder may be
in this process goes to a thread), without a walk over every open Lock."""

from __future__ import annotations

from _thread import allocate_lock
from _weakref import ref

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    from typing import Any

    LockFile = Any  # pylock._lock.lockfile's, which imports this module

# Weak references in a list per file (a WeakSet per file cost 700 bytes each).
_open_by_key: dict[tuple[int, int], list[ref[LockFile]]] = {}
_index_mu = allocate_lock()
_swept = [64]  # the index's size after its last sweep


def open_on(key: tuple[int, int]) -> list[LockFile]:
    """The lock objects of this process with the file key open."""
    same = _open_by_key.get(key)
    if same is None:
        return []
    return [lock for lock in (r() for r in same) if lock is not None]


def add(lock: LockFile) -> None:
    with _index_mu:  # threads open and close lock files of one file at once
        same = [r for r in _open_by_key.get(lock._key, ()) if r() is not None]
        _open_by_key[lock._key] = [*same, ref(lock)]  # a collected Lock's is dropped
        if len(_open_by_key) > 2 * _swept[0]:  # and files whose Locks all were
            for key in [k for k, refs in _open_by_key.items() if all(r() is None for r in refs)]:
                del _open_by_key[key]
            _swept[0] = max(len(_open_by_key), 64)


def discard(lock: LockFile) -> None:
    with _index_mu:
        same = [r for r in _open_by_key.get(lock._key, ()) if r() not in (None, lock)]
        if same:
            _open_by_key[lock._key] = same
        else:
            _open_by_key.pop(lock._key, None)
