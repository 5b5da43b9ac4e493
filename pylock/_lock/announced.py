"""Whether a lock's release will reach its waiters as a hint, asked of the
kernel each time a task finds the lock held.

Every pylock unlock announces itself (csrc/hints.c), and any holder that
closes its descriptor or dies makes a hint too.  A holder that is not
pylock and unlocks with LOCK_UN, keeping its descriptor open, makes none:
a task waiting for it on hints alone would wait for ever.  So a task waits
on hints only while the kernel's lock table shows the file held by one
process that is provably pylock's holder (it holds the lock exclusively,
its record names it, start identity and all).  Any other holder (shared
holders, another program, a pid this process cannot see or name, a file
whose record is not its holder's) and the wait goes to a thread blocked
in flock, where the kernel itself wakes it; so do waits for a holder in
this very process (held_in_process).

The table is read once per turn of the loop for every task that asks in
that turn: thousands of tasks that find their locks held at once cost one
read of /proc/locks, not thousands.
"""

from __future__ import annotations

import contextlib
import os
import sys

from .._core import procfs as _procfs
from .._core.locktable import flock_holders
from .._core.process import ProcessIdentity, has_start_identity, is_alive
from . import by_file
from . import record as _record

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    import asyncio
    from typing import Any

    from .._core.hints import FileHints, LoopHints
    from .lockfile import LockFile

# What a task does next: try again now (nothing holds the file any more),
# wait for a hint, or wait in a thread.
RETRY, HINTS, THREAD = "retry", "hints", "thread"


class _Facts:
    """What is known of one watched file: the lock table's name for it and
    the process its record names, read again only when the file has changed
    (a read is a hint to every waiter on the file: reading on every hint
    would never end).  Only the identity is kept: thousands of parsed
    records would cost each waiting task more than everything else."""

    __slots__ = ("key", "named", "seen")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.seen: tuple[int, int, int] | None = None
        self.named: ProcessIdentity | None = None

    def named_by_record(self, handle: int) -> ProcessIdentity | None:
        st = os.fstat(handle)
        seen = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if seen != self.seen:
            self.seen = seen
            rec = _record.read(handle)
            if rec is None:
                self.named = None
            else:  # the boot id once, not once per file of thousands
                n = _record.identity(rec)
                self.named = ProcessIdentity(
                    n.pid, n.start_time, sys.intern(n.boot_id), n.pidfs_ino
                )
        return self.named


def held_in_process(lock: LockFile) -> bool:
    """Another Lock of this process may hold lock's file: it holds it, or an
    attempt of it is under way (a thread of its wait may hold the kernel
    lock before its task knows).  Such waits stay in threads, as before
    hints: the kernel wakes a thread blocked in flock by the release itself,
    and this process's own waits keep exactly the guarantees they were built
    and tested with (cancel, loop close, host signals)."""
    for ref in by_file._open_by_key.get(lock._key, ()):
        other = ref()
        if (
            other is not None
            and other is not lock
            and (other._owner is not None or other._lf.owner)
        ):
            return True
    return False


class _Batch:
    """The tasks of one loop that asked in one turn."""

    __slots__ = ("asked",)

    def __init__(self) -> None:
        self.asked: list[tuple[LockFile, FileHints, asyncio.Future[str]]] = []


_batches: dict[LoopHints, _Batch] = {}


def next_step(lock: LockFile, file: FileHints) -> asyncio.Future[str] | str:
    """RETRY, HINTS or THREAD for a task that found lock held: at once when
    this process holds it, else a future answered after this turn."""
    if held_in_process(lock):
        return THREAD
    hints = file.hints
    batch = _batches.get(hints)
    if batch is None:
        batch = _batches[hints] = _Batch()
        hints.loop.call_soon(_answer, hints)
    future: asyncio.Future[str] = hints.loop.create_future()
    batch.asked.append((lock, file, future))
    return future


def _answer(hints: LoopHints) -> None:
    batch = _batches.pop(hints, None)
    if batch is None:
        return
    keys = set()
    for lock, file, _ in batch.asked:
        with contextlib.suppress(OSError):  # then _step finds no facts: THREAD
            keys.add(_key_of(lock, file))
    table = flock_holders(keys)
    alive: dict[Any, bool] = {}
    for lock, file, future in batch.asked:
        step = THREAD  # whatever fails in looking: the kernel decides
        try:
            step = _step(lock, file, table, alive)
        except Exception:  # every task of the batch must get an answer
            pass
        finally:
            if not future.done():  # its task may have given up meanwhile
                future.set_result(step)


def _key_of(lock: LockFile, file: FileHints) -> Any:
    facts = file.facts
    if facts is None:
        handle = lock._handle
        facts = file.facts = _Facts(_procfs.lock_key(handle, os.fstat(handle)))
    return (facts.key.dev, facts.key.ino)


def _step(lock: LockFile, file: FileHints, table: Any, alive: dict[Any, bool]) -> str:
    if held_in_process(lock):
        return THREAD
    facts = file.facts
    if facts is None:
        return THREAD
    holders = table.get((facts.key.dev, facts.key.ino)) if table is not None else None
    if holders is None:
        return THREAD if table is None else RETRY  # unreadable, or released meanwhile
    holders = list(set(holders))  # a line read twice as the table changed under the read
    if len(holders) != 1 or holders[0].shared:
        return THREAD  # shared holders keep no record that names them
    pid = holders[0].pid
    if pid <= 0 or pid == os.getpid():
        return THREAD  # not visible from here, or this program's own flock
    ident = facts.named_by_record(lock._handle)
    if ident is None or ident.pid != pid or not has_start_identity(ident):
        return THREAD
    if ident not in alive:
        alive[ident] = is_alive(ident)
    if not alive[ident]:
        return THREAD  # the pid is another process's now
    # Another file may share the table's name for it (btrfs subvolumes,
    # overlays): then the holder's own descriptors must show this very file.
    exact = facts.key.exact
    if (
        exact is not None
        and _procfs.pid_holds(pid, facts.key.dev, facts.key.ino, exact) is not True
    ):
        return THREAD
    return HINTS
