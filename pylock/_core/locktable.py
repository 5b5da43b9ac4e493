"""The kernel's lock table, as /proc/locks lists it (Linux).

Every granted lock (FLOCK, POSIX, OFDLCK, leases) and, under each, the
requests blocked on it ("->" lines, deeper when a request is queued behind
another blocked request).  Its pid column names whoever took the lock
(POSIX: its owner; FLOCK: the taker, though every process sharing that open
file description holds it; OFD: -1, the kernel does not say).  Reading it
takes no lock and opens nothing but /proc/locks.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .procfs import PROC, TableLock

FileKey = tuple[int, int, int]  # (major, minor, inode) as /proc/locks prints it


class LockLine(NamedTuple):
    """One line of /proc/locks, or a "lock:" line of an fdinfo file."""

    kind: str  # FLOCK, POSIX, OFDLCK, LEASE, DELEG...
    mode: str  # READ, WRITE (UNLCK for a lease being broken)
    pid: int  # taker or waiter; -1 for OFD locks; 0 outside this pid namespace
    file: FileKey | None  # None: "<none>", a lock on no inode
    start: int
    end: int | None  # None: to the end of the file (EOF)
    level: int = 0  # 0 granted; n: blocked, n deep in the kernel's blocker tree
    id: int = 0  # the line's number; a blocked request shares its blocker's
    words: tuple[bytes, ...] = ()  # kind to end as printed: what fdinfo's line repeats


_WORDS: dict[bytes, str] = {}  # b"FLOCK" -> "FLOCK": a handful of words, decoded once


def _word(raw: bytes) -> str:
    text = _WORDS.get(raw)
    if text is None:
        text = _WORDS[raw] = raw.decode("ascii")
    return text


def parse_line(text: bytes) -> LockLine | None:
    """A LockLine from "3:  -> FLOCK  ADVISORY  READ 16095 fe:00:2155778 0 EOF"."""
    words = text.split()
    if len(words) < 8 or not words[0].endswith(b":"):
        return None
    level = 0
    if words[1] == b"->":
        # The kernel right-aligns "-> " in a field one wider per level.
        colon = text.index(b":")
        level = text.index(b"->", colon) - colon - 1
        del words[1]
        if len(words) < 8:
            return None
    try:
        return LockLine(
            kind=_word(words[1]),
            mode=_word(words[3]),
            pid=int(words[4]),
            file=file_key(words[5]),
            start=int(words[6]),
            end=None if words[7] == b"EOF" else int(words[7]),
            level=level,
            id=int(words[0][:-1]),
            words=tuple(words[1:8]),
        )
    except (ValueError, UnicodeDecodeError):
        return None


def file_key(word: bytes) -> FileKey | None:
    parts = word.split(b":")
    if parts[0] == b"<none>":
        return None
    if len(parts) != 3:
        raise ValueError(word)
    return int(parts[0], 16), int(parts[1], 16), int(parts[2])


# How much the first read() of each reading of the table asks for; the
# others ask for more than the kernel's page.  The kernel walks its list
# again where its page ran out, so a small first read moves every later cut:
# an error at a cut falls on other records in each reading.
_FIRST_READS = (1 << 20, 700, 1500, 2300, 3100)


def read_proc_locks() -> list[LockLine]:
    """Every line of /proc/locks, as readings of it agree (raises OSError
    when it cannot be read).

    The kernel hands the table out a page at a time and walks its list from
    the start again for each page: a lock taken or dropped elsewhere between
    two pages shifts the rest, so a page repeats records of the page before
    or skips some.  On a host where one process keeps locking and unlocking,
    most plain readings are wrong somewhere.  Within a reading, a run of
    records at the start of a fresh page that repeats the records just
    before it is dropped (the read that finds the end walks the list again
    too, and so repeats the last records in every reading).  Two readings
    cut at different records that agree are the table; otherwise, of five
    readings, each record (a granted lock and the requests blocked under it)
    counts as many times as the median reading has it, taken whole from the
    first reading that has it.  Bursts of locks that come and go faster than
    a page is read can still fool it (one look in a hundred, with 50 locks
    taken and dropped in a loop).
    """
    return [line for line in map(parse_line, _agreed_lines()) if line is not None]


def _agreed_lines() -> list[bytes]:
    """The lines of /proc/locks as read_proc_locks settles them, unparsed."""
    records = [_records(size) for size in _FIRST_READS[:2]]
    counts = [Counter(key for key, _ in found) for found in records]
    if counts[0] != counts[1]:
        records += [_records(size) for size in _FIRST_READS[2:]]
        counts += [Counter(key for key, _ in found) for found in records[2:]]
    middle = len(records) // 2
    wanted = {key: sorted(c[key] for c in counts)[middle] for key in set().union(*counts)}
    taken: Counter[bytes] = Counter()
    lines = []
    for found in records:
        for key, record in found:
            if taken[key] < wanted[key]:
                taken[key] += 1
                lines += record
    return lines


Record = tuple[bytes, list[bytes]]  # the granted line after its number, and the record's lines


def _records(first: int) -> list[Record]:
    """One reading of /proc/locks, the first read() asking for first bytes.

    Each later read() gets the rest of the kernel's last page (the tail of
    one record), then a page the kernel filled after walking its list again:
    a run of records at the start of that page that repeats the records just
    before it was shifted by locks taken elsewhere meanwhile."""
    fd = os.open(f"{PROC}/locks", os.O_RDONLY | os.O_CLOEXEC)
    found: list[Record] = []
    rest = b""
    size = first
    try:
        while True:
            chunk = os.read(fd, size)
            size = 1 << 20
            if not chunk:
                return found
            old_page = bool(rest)  # the chunk begins with the end of the last page
            *lines, rest = (rest + chunk).split(b"\n")
            fresh: list[Record] = []
            for index, line in enumerate(lines):
                waiter = b"-> " in line  # a granted line has no arrow
                if old_page and (waiter or index == 0):
                    if not waiter:
                        found.append((line.partition(b":")[2], [line]))
                    elif found:
                        found[-1][1].append(line)
                    continue
                old_page = False
                if not waiter:
                    fresh.append((line.partition(b":")[2], [line]))
                elif fresh or found:
                    (fresh or found)[-1][1].append(line)
            found += fresh[_repeated(found, fresh) :]
    finally:
        os.close(fd)


def _repeated(before: list[Record], fresh: list[Record]) -> int:
    """How many records at the start of fresh repeat the last ones of before
    (lines compared without their numbers)."""

    def same(a: Record, b: Record) -> bool:
        return [x.partition(b":")[2] for x in a[1]] == [y.partition(b":")[2] for y in b[1]]

    if not fresh:
        return 0
    for run in range(min(len(before), len(fresh), 256), 0, -1):
        if before[-run][0] == fresh[0][0] and all(
            same(a, b) for a, b in zip(before[-run:], fresh[:run])
        ):
            return run
    return 0


class Descriptor(NamedTuple):
    pid: int
    fd: int
    mount: int = 0  # the mount id its fdinfo names


@dataclass
class Lock:
    """A granted lock: one /proc/locks line (count: how many identical lines,
    such as shared flocks of one taker on several open files)."""

    kind: str
    mode: str
    taker: int
    file: FileKey | None
    start: int
    end: int | None
    count: int = 1
    holders: list[Descriptor] = field(default_factory=list)  # from fdinfo
    waiters: list[Waiter] = field(default_factory=list)
    words: tuple[bytes, ...] = ()  # its line as printed, from the kind to the end


@dataclass
class Waiter:
    """A request the kernel shows blocked under a granted lock."""

    kind: str
    mode: str
    pid: int  # -1 for an OFD request: the kernel does not name its process
    file: FileKey | None
    start: int
    end: int | None
    blocker: Lock  # the granted lock the kernel lists it under
    behind: int | None = None  # pid of the blocked request it is queued behind
    pid_from_syscall: bool = False  # an OFD request named by its blocked thread


@dataclass
class LockTable:
    """The kernel's locks, their holders, their waiters and their files' paths."""

    locks: list[Lock]
    waiters: list[Waiter]
    paths: dict[FileKey, str]  # os.fsdecode of the kernel's bytes
    hidden: set[int]  # processes whose descriptors pylock may not inspect

    def holding_pids(self, lock: Lock) -> list[int]:
        """The processes holding lock: those whose descriptors show it; else its
        taker when that is its owner (POSIX) or a process pylock may not
        inspect; else none pylock can name (a descriptor of a process in
        another namespace, a mapping, a descriptor in flight)."""
        pids = sorted({where.pid for where in lock.holders})
        if pids:
            return pids
        if lock.taker > 0 and (lock.kind == "POSIX" or lock.taker in self.hidden):
            return [lock.taker]
        return []


def group(lines: list[LockLine]) -> tuple[list[Lock], list[Waiter]]:
    """Granted locks (identical lines merged) and the waiters under each."""
    locks: dict[tuple[bytes, ...], Lock] = {}
    waiters: list[Waiter] = []
    top: Lock | None = None
    chain: list[int] = []  # the pid at each level above the current line
    for line in lines:
        if line.level == 0:
            top = locks.get(line.words)
            if top is None:
                top = Lock(line.kind, line.mode, line.pid, line.file, line.start, line.end)
                top.words = line.words
                locks[line.words] = top
            else:
                top.count += 1
            chain = [line.pid]
            continue
        if top is None:
            continue
        del chain[line.level :]
        behind = chain[line.level - 1] if line.level > 1 and len(chain) >= line.level else None
        chain.append(line.pid)
        waiter = Waiter(
            line.kind, line.mode, line.pid, line.file, line.start, line.end, top, behind
        )
        top.waiters.append(waiter)
        waiters.append(waiter)
    return list(locks.values()), waiters


def flock_holders(keys: set[tuple[int, int]]) -> dict[tuple[int, int], list[TableLock]] | None:
    """The granted flocks on each (dev, ino) of keys that has any, in one
    reading of /proc/locks; None when it cannot be read.

    One reading can leave out or repeat a lock where the kernel's pages were
    cut while locks came and went: for callers that only take a hint from it
    and let the kernel decide (a task choosing how to wait).  Answers given
    to a person or a program (who holds it, is it free) use agreed_flocks."""
    words = _words(keys)
    try:
        with open(f"{PROC}/locks", "rb") as f:
            return _flock_lines(f, words)
    except OSError:
        return None


def flocks_on(dev: int, ino: int) -> list[TableLock] | None:
    """The granted flocks on one file as readings of the table agree
    (agreed_flocks); None when /proc/locks cannot be read."""
    found = agreed_flocks({(dev, ino)})
    return None if found is None else found.get((dev, ino), [])


def agreed_flocks(keys: set[tuple[int, int]]) -> dict[tuple[int, int], list[TableLock]] | None:
    """flock_holders as readings of the table agree; None when /proc/locks
    cannot be read.

    Two readings cut at different records (read_proc_locks) that agree on
    these files are the answer; else the whole table as read_proc_locks
    settles it.  So a lock the kernel's paging left out of one reading is
    never reported free, nor one it repeated listed twice."""
    words = _words(keys)
    try:
        first, second = (_flock_lines(_granted(size), words) for size in _FIRST_READS[:2])
        return first if _same_answer(first, second) else _flock_lines(_agreed_lines(), words)
    except OSError:
        return None


def _words(keys: set[tuple[int, int]]) -> dict[bytes, tuple[int, int]]:
    """/proc/locks' MAJ:MIN:INODE word for each (dev, ino)."""
    return {f"{os.major(d):02x}:{os.minor(d):02x}:{i}".encode(): (d, i) for d, i in keys}


def _same_answer(
    a: dict[tuple[int, int], list[TableLock]], b: dict[tuple[int, int], list[TableLock]]
) -> bool:
    return a.keys() == b.keys() and all(sorted(a[key]) == sorted(b[key]) for key in a)


def _granted(first: int) -> list[bytes]:
    """The granted lines of one reading (_records: a page's repeats of the
    records before it dropped, the last page's included)."""
    return [lines[0] for _, lines in _records(first)]


def _flock_lines(
    lines: Iterable[bytes], words: dict[bytes, tuple[int, int]]
) -> dict[tuple[int, int], list[TableLock]]:
    """The granted flocks of lines on the files words names."""
    # Line by line: the whole table of thousands of lines, at once, would
    # grow the heap of a process whose waits are meant to be small.
    found: dict[tuple[int, int], list[TableLock]] = {}
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"; a waiter's line
        # has "->" second and so never FLOCK there.
        fields = line.split(None, 6)
        if len(fields) < 6 or fields[1] != b"FLOCK":
            continue
        key = words.get(fields[5])
        if key is None:
            continue
        try:
            pid = int(fields[4])
        except ValueError:
            continue
        found.setdefault(key, []).append(TableLock(max(pid, 0), fields[3] == b"READ"))
    return found
