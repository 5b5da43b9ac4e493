"""One shared schedule for the identity checks of the fallback.

Where pidfds are missing, a process that is neither our child nor a lock
holder can only be watched by checking that its pid still names it.
Checking each watched process on its own timer costs a core with 10,000
of them; this schedule checks them all together, every TICK seconds, and
asks the kernel for as little as it can:

1. A fingerprint of the whole machine (csrc: /proc/loadavg's task count
   and last pid, one small read).  If it has not changed, no task was
   created or reaped since the last tick, so no watched process was reaped
   and no pid was recycled: nothing else is read.
2. When it changed, every watched pid is asked whether it still exists
   (getpgid, a fraction of a microsecond each), and the pids handed out
   since the last tick, the only ones that can have been recycled, get an
   exact check (state and start time from /proc).
3. A zombie still exists, and its parent may leave it unreaped: each tick
   also checks EXACT_PER_TICK watches exactly, in turn.

On a quiet machine a round is step 1 and 3 only: about 0.2 ms with 10,000
watches, 0.2% of a core.  Step 2 costs 0.15-0.6 us per watch (1.5-6 ms for
10,000: the kernel's lookups of distinct processes miss its caches), and on
a busy machine (processes started and reaped all the time) the fingerprint
changes at every tick; step 2 is then held to SWEEP_BUDGET
of a core on average, through a credit of CPU time: it earns SWEEP_BUDGET
per second, up to SWEEP_BURST seconds' worth, and each sweep spends what it
cost, unless it found a watched process gone: the budget is for sweeps the
rest of the machine causes, not for the exits pylock was asked to report.
A sweep runs while the credit lasts; once it is spent, the change waits
(it is kept, not lost) until the credit is back, MAX_HOLD at most.  So a
machine that changes at every tick costs the budget, about 2% of a core
with 10,000 watches, and watched processes that keep exiting are each seen
within a tick, for at most one sweep per tick (a sweep of 10,000 distinct
processes costs 1.5-6 ms, so 1.5-6% of a core while they keep exiting).  (A
pause of cost / SWEEP_BUDGET after every sweep, as before, held exits that
came one after another 100-400 ms with 10,000 watches.)

So, once the process is reaped (as parents do at once), an exit is seen
within TICK plus one sweep (90 ms + 1.5-6 ms with 10,000 watches: within
100 ms), or, where the machine's churn has spent the credit, once it is
back (MAX_HOLD at most); a zombie left unreaped within TICK x
(watches / EXACT_PER_TICK), a tick for up to EXACT_PER_TICK watches.  The
thread runs only while there are watches.  Where there is no fingerprint
(not Linux) every tick is step 2.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .._core.native import ffi, lib
from .._core.procfs import pid_max

log = logging.getLogger("pylock")

TICK = 0.09  # with a sweep of 10,000 watches after it, an exit is seen within 100 ms
EXACT_PER_TICK = 16
SWEEP_BUDGET = 0.02  # of a core, for step 2 on a busy machine, on average
SWEEP_BURST = 1.0  # seconds of budget the credit holds at most
MAX_HOLD = 1.0  # seconds a change may wait for the budget, at most


class IdentitySchedule:
    """Watched (pid, start time) pairs; notify() is called, in the schedule's
    thread and once, when that process is gone."""

    def __init__(self, threaded: bool = True) -> None:
        self._threaded = threaded  # False: the caller runs check_now() (tests)
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[int, int, Callable[[], None]]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._emptied = threading.Event()  # ends the thread's wait early
        self._dirty = True
        self._tokens: list[int] = []
        self._pids: Any = None
        self._starts: Any = None
        self._cursor = 0
        self._fingerprint: tuple[int, int] | None = None
        self._credit = SWEEP_BUDGET * SWEEP_BURST  # seconds of CPU step 2 may spend now
        self._credit_at = time.monotonic()
        # What the rounds cost, for bench/exit_schedule.py's profile.
        self.stats = {"rounds": 0, "round_cpu_s": 0.0, "sweeps": 0, "sweep_cpu_s": 0.0, "held": 0}
        self._pid_max = pid_max()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, pid: int, start_time: int, notify: Callable[[], None]) -> int:
        with self._lock:
            self._next += 1
            token = self._next
            self._entries[token] = (pid, start_time, notify)
            self._dirty = True
            if self._thread is None and self._threaded:
                self._fingerprint = self._read_fingerprint()
                self._thread = threading.Thread(
                    target=self._run, name="pylock identity checks", daemon=True
                )
                self._thread.start()
            return token

    def remove(self, token: int | None) -> None:
        if token is not None:
            with self._lock:
                if self._entries.pop(token, None) is not None:
                    self._dirty = True
                    if not self._entries:
                        self._emptied.set()

    # the schedule's thread ---------------------------------------------------

    def _run(self) -> None:
        while True:
            self._emptied.wait(TICK)  # the schedule's period
            with self._lock:
                self._emptied.clear()
                if not self._entries:
                    self._thread = None
                    return
            self.check_now()

    def check_now(self) -> int:
        """One round of checks; notifies each process found gone, returns how many."""
        with self._lock:
            if self._dirty:
                self._rebuild()
            tokens, pids, starts = self._tokens, self._pids, self._starts
        try:
            gone = self._sweep(tokens, pids, starts)
        except OSError as exc:
            log.error("pylock: identity checks failed: %s", exc)
            return 0
        for token in gone:
            with self._lock:
                entry = self._entries.pop(token, None)
                self._dirty = True
            if entry is not None:
                try:
                    entry[2]()
                except Exception:  # one broken watch must not starve the others
                    log.exception("pylock: exit notification failed")
        return len(gone)

    def _rebuild(self) -> None:
        self._tokens = list(self._entries)
        values = [self._entries[t] for t in self._tokens]
        self._pids = ffi.new("int64_t[]", [v[0] for v in values])
        self._starts = ffi.new("uint64_t[]", [v[1] for v in values])
        self._dirty = False

    def _read_fingerprint(self) -> tuple[int, int] | None:
        tasks = ffi.new("uint64_t *")
        last = ffi.new("int64_t *")
        if lib.pl_procs_fingerprint(tasks, last) != 0:
            return None
        return int(tasks[0]), int(last[0])

    def _sweep(self, tokens: list[int], pids: Any, starts: Any) -> list[int]:
        n = len(tokens)
        if n == 0:
            return []
        round_cpu = time.thread_time()
        gone = ffi.new("uint8_t[]", n)
        before, now = self._fingerprint, self._read_fingerprint()
        changed = before is None or now is None or before != now
        if changed and self._earn_credit() > 0:
            cpu = time.thread_time()
            if before is None or now is None:
                _check(pids, starts, 0, n, _ALL, gone)  # the first round, or no fingerprint
                cost = time.thread_time() - cpu
            else:
                # Only pids handed out since the last sweep can have been recycled.
                _check(pids, starts, 0, n, self._handed_out(before[1], now[1]), gone)
                cost = time.thread_time() - cpu
                if bytes(ffi.buffer(gone, n)).find(1) < 0:  # the machine's churn, not ours
                    self._credit = max(self._credit - cost, -MAX_HOLD * SWEEP_BUDGET)
            self._fingerprint = now
            self.stats["sweeps"] += 1
            self.stats["sweep_cpu_s"] += cost
        elif changed:
            self.stats["held"] += 1
        # In turn, exactly: zombies exist for getpgid and leave no fingerprint.
        start = self._cursor % n
        count = min(n, EXACT_PER_TICK)
        first = min(count, n - start)
        _check(pids, starts, start, first, _ALL, gone)
        if count > first:
            _check(pids, starts, 0, count - first, _ALL, gone)
        self._cursor = start + count
        raw = bytes(ffi.buffer(gone, n))
        found = []
        i = raw.find(1)
        while i >= 0:
            found.append(tokens[i])
            i = raw.find(1, i + 1)
        self.stats["rounds"] += 1
        self.stats["round_cpu_s"] += time.thread_time() - round_cpu
        return found

    def _earn_credit(self) -> float:
        """The credit, with what the time since the last look earned."""
        now = time.monotonic()
        if now > self._credit_at:
            earned = (now - self._credit_at) * SWEEP_BUDGET
            self._credit = min(SWEEP_BUDGET * SWEEP_BURST, self._credit + earned)
            self._credit_at = now
        return self._credit

    def _handed_out(self, old: int, new: int) -> tuple[int, int]:
        """The pids handed out between two last-pid readings, as (after, upto]."""
        if old < new and new - old > self._pid_max // 2:
            return _ALL  # too many to tell
        return old, new  # old > new: wrapped past pid_max, or set back by hand


_ALL = (0, 2**63 - 1)


def _check(
    pids: Any, starts: Any, offset: int, count: int, exact: tuple[int, int], gone: Any
) -> None:
    if count <= 0:
        return
    rc = lib.pl_procs_gone(pids + offset, starts + offset, count, exact[0], exact[1], gone + offset)
    if rc:
        raise OSError(rc, f"cannot check watched processes: {os.strerror(rc)}")


_schedule = IdentitySchedule()


def schedule() -> IdentitySchedule:
    return _schedule


def _reset_after_fork() -> None:
    global _schedule
    _schedule = IdentitySchedule()  # the thread did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
