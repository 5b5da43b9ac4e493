"""The holders of one file as Linux's lock tables show them: /proc/locks
says whether the file is locked and who took each lock, the processes' own
fdinfo verifies who holds it.  One answer for every caller: the API's
holder() and holders(), and every pylock command, whatever the file is
(a lock file, a directory, a device) and whoever asks.
"""

from __future__ import annotations

from .._core import procfs as _procfs
from .._core.locktable import flocks_on
from .._core.process import identity_of
from .holder import Holder, described_by_kernel

TYPE_CHECKING = False  # typing is not imported at run time (start-up: bench/README.md)
if TYPE_CHECKING:
    from typing import Protocol

    from .._core.process import ProcessIdentity

    class Describe(Protocol):
        def __call__(
            self, pid: int, ident: ProcessIdentity, shared: bool, verified: bool, note: str = ""
        ) -> Holder: ...


def _described(
    pid: int, ident: ProcessIdentity, shared: bool, verified: bool, note: str = ""
) -> Holder:
    return described_by_kernel(pid, ident, shared, verified, note)


class KernelView:
    """One file's holders by its LockKey; describe makes each Holder (a lock
    file's Inspection adds what its record says)."""

    def __init__(self, key: _procfs.LockKey, describe: Describe = _described) -> None:
        self.key = key
        self._describe = describe

    def holders(self, every: bool) -> tuple[list[Holder], bool | None]:
        """The holders, verified first, and whether /proc/locks lists a lock
        on the file (None: unreadable).

        every=False: one holder per lock (its taker while it still holds it,
        else one process holding it); every=True: every process whose
        descriptor holds one (inherited descriptors too).  Never empty while
        the kernel lists a lock that may be on this file.
        """
        table = flocks_on(self.key.dev, self.key.ino)
        if table is not None and not table:
            return [], False  # the kernel lists no lock on this file
        takers: list[Holder] = []
        unnamed: list[int] = []  # takers that no longer hold their lock themselves
        for entry in table or ():
            holder, elsewhere = self._taker(entry)
            if holder is not None:
                takers.append(holder)
            elif not elsewhere:  # not a lock its taker holds on another file of this name
                unnamed.append(entry.pid)
        takers.sort(key=lambda h: not h.verified)
        if table is not None and not every and not unnamed:
            return takers, bool(takers)
        found = self._scan(every, unnamed, table is None)
        seen = {h.pid for h in found}
        found += [h for h in takers if h.pid not in seen]
        found.sort(key=lambda h: not h.verified)
        if table is None:
            return found, None
        if not found and unnamed:
            # Listed, yet no process shows it: an inherited descriptor in a
            # process this user cannot see, or a taker in another namespace.
            found.append(Holder(pid=0, note=self._unknown_note(unnamed[0])))
        return found, bool(found)

    def _scan(self, every: bool, unnamed: list[int], all_of_them: bool) -> list[Holder]:
        """Holders from every process's fdinfo: all of them (every, or no
        table to go by), else one per lock whose taker no longer holds it."""
        found: dict[int, Holder] = {}
        wanted = set(unnamed)
        for lock in _procfs.holders_of(*self.key):
            if lock.pid in found and (found[lock.pid].shared <= lock.shared):
                continue  # one entry per process; exclusive over shared
            if not (every or all_of_them) and lock.taker not in wanted:
                continue
            ident = identity_of(lock.pid)
            if ident is None:
                continue  # exited meanwhile
            found[lock.pid] = self._describe(lock.pid, ident, lock.shared, True)
            if not (every or all_of_them):
                wanted.discard(lock.taker)
        return list(found.values())

    def _taker(self, entry: _procfs.TableLock) -> tuple[Holder | None, bool]:
        """The process /proc/locks names, if it still holds the lock: verified
        when its fdinfo shows it, unverified when we may not look; and
        whether it holds one on another file of the same name instead."""
        if entry.pid <= 0:
            return None, False
        ident = identity_of(entry.pid)
        if ident is None:
            return None, False  # gone: its descriptor lives on in another process
        found = _procfs.pid_locks(entry.pid, *self.key)
        if found is None:
            note = self._hidden_note(entry.pid)
            return self._describe(entry.pid, ident, entry.shared, False, note), False
        mode, elsewhere = found
        if mode:
            return self._describe(entry.pid, ident, mode == "shared", True), False
        return None, elsewhere

    def _hidden_note(self, pid: int) -> str:
        note = f"unverified: the kernel's lock table names pid {pid}, but pylock may not "
        if self.key.exact is None:
            return note + "inspect that process's descriptors"
        return note + (
            "inspect that process's descriptors to tell whether its lock is on this file or "
            "on another with the same inode number on this filesystem (a btrfs subvolume, "
            "an overlayfs layer)"
        )

    def _unknown_note(self, pid: int) -> str:
        if pid <= 0:
            return "held by a process outside this pid namespace"
        return f"the kernel's lock table names pid {pid}, which no longer holds it itself"


def kernel_holders(key: _procfs.LockKey, every: bool = True) -> list[Holder]:
    """The holders the kernel shows of the file key names, described by the
    kernel alone: for files that hold no record (directories, devices,
    other programs' files)."""
    return KernelView(key).holders(every)[0]
