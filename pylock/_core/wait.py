"""One wait primitive for pylock's kernel waits: deadlines, EINTR, waiters,
and the hand-over of a blocking C wait to an event loop.

A C wait is a callable ``wait(waiter, timeout_ns) -> rc`` that blocks in
one syscall and returns 0, ETIMEDOUT, ECANCELED, EINTR (a signal of the
program's: run its handlers and call again) or another errno.
"""

from __future__ import annotations

import errno
import time
from _thread import _local

from .errors import LockError
from .native import ffi, lib
from .timeout import ns_left

TYPE_CHECKING = False  # typing is not imported at `import pylock`
if TYPE_CHECKING:
    import asyncio
    from typing import Any, Callable

    CWait = Callable[[Any, int], int]


def passed(deadline: float | None) -> bool:
    return deadline is not None and deadline <= time.monotonic()


def new_waiter() -> Any:
    waiter = lib.pl_waiter_new()
    if waiter == ffi.NULL:
        raise MemoryError
    return waiter


def wait_blocking(wait: CWait, deadline: float | None) -> int:
    """Run wait in this thread until it ends; never returns EINTR.

    A signal of the program's ends the syscall with EINTR: returning to
    Python runs its handlers (which may raise, e.g. KeyboardInterrupt), then
    the wait goes on for the time left.
    """
    waiter = thread_waiter()
    while True:
        rc = wait(waiter, ns_left(deadline))
        if rc != errno.EINTR:
            return rc


def thread_waiter() -> Any:
    """This thread's waiter for its blocking waits (not for LoopWait's,
    which a task may cancel from another thread)."""
    waiter = _this_thread.waiter
    if waiter is None:
        # One per thread, kept: allocating and freeing it around each wait
        # cost a woken waiter a cffi round trip (about 6 µs of a hand-over).
        # Its waits run one at a time (a signal handler's own wait runs
        # between two calls of the one it interrupted), nobody cancels them.
        waiter = _this_thread.waiter = ffi.gc(new_waiter(), lib.pl_waiter_free)
    return waiter


class _ThisThread(_local):
    waiter: Any = None


_this_thread = _ThisThread()


def no_wake_signal(what: str) -> LockError:
    """The error for a timed or cancellable wait the program left pylock no signal for."""
    lost = lib.pl_wake_signal_lost()
    took = f" (it took signal {lost} from pylock)" if lost > 0 else ""
    err = LockError(
        f"{what}: pylock cannot end this wait on time: the program has installed its own "
        f"handler or SIG_IGN on every real-time signal pylock could claim{took}. "
        "Leave one real-time signal at SIG_DFL for pylock, or wait without a timeout"
    )
    err.errno = errno.ENOTSUP  # type: ignore[attr-defined]
    return err


def once(action: Callable[[], object]) -> Callable[[], None]:
    """action, run by the first caller only: a LoopWait's on_orphan and the
    loop's own clean-up may both come to free what the wait used (a loop
    that closed leaves the result to on_orphan though it never gave up)."""
    claimed: dict[str, object] = {}

    def run() -> None:
        me = object()
        if claimed.setdefault("by", me) is me:  # one C call decides
            action()

    return run


# -- one C wait in a pylock thread, handed over to an event loop ---------


class LoopWait:
    """A blocking C wait run by a pylock thread for an event loop: lock waits,
    and exit watches where the kernel offers no descriptor a loop could
    watch (a lock held by an unidentified holder, a process on Windows).

    The result reaches the loop with call_soon_threadsafe, in self.future
    (a task cancelled while awaiting it awaits ended() to learn how the wait
    ended).  A task that gives up interrupt()s the wait and awaits its end,
    which the wake signal makes prompt; when that is impossible (the program
    took the signal, the loop is closing) abandon() returns at once, never
    blocking the loop, and the thread passes the result to on_orphan, which
    must give back whatever it granted and free whatever the wait used (a
    descriptor closed while the thread still waits on its number would have
    the wait's late unlock land on the program's next file).

    Who settles the result is decided once, in decided["by"], by one C call
    (dict.setdefault): "thread" delivers it to the task, "task" (it gave up
    first) leaves it to on_orphan.  An exception from a signal handler can
    land in the task after any call returns, but never inside that one, so
    the task can always read who settles.  The wait registers itself in
    registry before its thread may start waiting, for the same reason.
    """

    __slots__ = (
        "_cancelled",
        "_gate",
        "_loop",
        "_mu",
        "_on_orphan",
        "_waiter",
        "decided",
        "future",
        "rc",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wait: CWait,
        deadline: float | None,
        on_orphan: Callable[[int], None],
        name: str,
        registry: list[LoopWait] | None = None,
    ) -> None:
        import threading

        self.future: asyncio.Future[int] = loop.create_future()
        self.rc: int | None = None  # the wait's result, once delivered
        self._loop = loop
        self._mu = threading.Lock()
        self._on_orphan = on_orphan
        self.decided: dict[str, str] = {}
        # Closed until the wait is registered (or abandoned): a thread that
        # its task cannot see yet must not take anything.
        self._gate = threading.Lock()
        self._gate.acquire()
        self._cancelled = False  # pl_waiter_cancel was called: the waiter is spent
        try:  # one call: loops in other threads take spares too
            waiter = _spare_waiters.pop()
        except IndexError:
            waiter = new_waiter()
        self._waiter = waiter

        def run() -> None:
            _block_signals()
            self._gate.acquire()
            rc = errno.ECANCELED
            try:
                if "by" not in self.decided:  # the task has not given up yet
                    rc = errno.EINTR
                    while rc == errno.EINTR:
                        rc = wait(waiter, ns_left(deadline))
            finally:
                self._finished(rc)

        thread = threading.Thread(target=run, name=name, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread: nothing uses the waiter
            lib.pl_waiter_free(waiter)
            raise
        if registry is not None:
            registry.append(self)
        self._gate.release()

    def _finished(self, rc: int) -> None:
        with self._mu:
            waiter, self._waiter = self._waiter, None
            reusable = not self._cancelled
        try:
            if self.decided.setdefault("by", "thread") == "thread":
                try:
                    # Handed over first, freed after: the loop's task is
                    # what waits for this thread.
                    self._loop.call_soon_threadsafe(_deliver, self, rc)
                    return
                except RuntimeError:  # the loop closed: the task will never hear
                    pass
            self._on_orphan(rc)
        finally:
            # Kept for the next wait rather than freed: a C call here would
            # hand the GIL to the woken loop and then wait to take it back.
            if reusable and len(_spare_waiters) < _SPARE_WAITERS:
                _spare_waiters.append(waiter)
            else:
                lib.pl_waiter_free(waiter)

    def ended(self) -> asyncio.Future[int]:
        """A future for the wait's result: self.future, or a new one when a
        cancelled task took that one with it.  Awaited without
        asyncio.shield, whose extra callback costs every hand-over a turn
        of the loop."""
        if self.future.cancelled():
            self.future = self._loop.create_future()
            if self.rc is not None:
                self.future.set_result(self.rc)
        return self.future

    def interrupt(self) -> bool:
        """Ask the C core to end the wait soon, without blocking: True when
        the result is on its way to the future (also when the wait was over
        already), False when the wait cannot be ended (the program took
        pylock's signal)."""
        with self._mu:
            if self._waiter is None:
                return True  # over: the thread delivers (nobody has given up)
            self._cancelled = True
            return lib.pl_waiter_cancel(self._waiter) == 0

    def abandon(self) -> bool:
        """The task gives up.  Unless the thread has settled first (then the
        task cleans up), on_orphan will: True when it will, False when the
        wait is over and its result goes to the future.  Never blocks."""
        orphaned = self.decided.setdefault("by", "task") == "task"
        try:  # noqa: SIM105 (contextlib is not loaded at `import pylock`)
            self._gate.release()  # registered or not, it must not wait now
        except RuntimeError:
            pass  # open already
        with self._mu:
            if self._waiter is not None:
                # Interrupts the wait, or (the program took pylock's
                # signal) lets it end with the grant, given back.
                self._cancelled = True
                lib.pl_waiter_cancel(self._waiter)
        return orphaned


# Waiters of LoopWait threads whose waits were never cancelled (a cancel
# leaves its mark on a waiter), kept for the next LoopWait.
_spare_waiters: list[Any] = []
_SPARE_WAITERS = 16


def _deliver(wait: LoopWait, rc: int) -> None:
    wait.rc = rc
    if not wait.future.done():
        wait.future.set_result(rc)


# Declared before _block_signals: PyPy 3.9 refuses an annotation after a
# function's `global` of the name ("annotated name can't be global").
_all_signals: Any = None
_blocked_by_wake: dict[int, Any] = {}


def _block_signals() -> None:
    """pylock's threads take none of the program's signals: they go to the
    program's own threads (pylock's wake signal is unblocked by the C core
    for the length of each wait).  Through _signal, once per thread: the
    signal module turns every number into an enum member, both ways, which
    cost a contended acquire_async's thread about 30 µs."""
    global _all_signals
    import _signal  # type: ignore[import-not-found]  # no stubs: the C half of signal

    if hasattr(_signal, "pthread_sigmask"):
        if _all_signals is None:
            _all_signals = _signal.valid_signals()
        # All but pylock's own wake signal, which the C core would otherwise
        # unblock for the wait and block again after it, a syscall between
        # the grant and the hand-over.  Nothing sends it to this thread once
        # its wait is over (pl_waiter_cancel signals active waits only).
        wake = lib.pl_wake_signal()
        blocked = _blocked_by_wake.get(wake)
        if blocked is None:
            blocked = _blocked_by_wake[wake] = _all_signals - {wake}
        _signal.pthread_sigmask(_signal.SIG_BLOCK, blocked)
