"""Who owns a Lock object, and hand-overs between threads, tasks and loops that
the host program creates, ends and closes as it likes."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import resource
import sys
import threading
from typing import Any, Callable

import pytest

import pylock
from tests.support.kernel_locks import free_from_elsewhere

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def wait_sleeping(thread: threading.Thread) -> None:
    """Until the thread sleeps in the kernel (or has ended)."""
    while thread.is_alive():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    return
        except FileNotFoundError:
            return
        os.sched_yield()


@pytest.fixture(params=["Lock", "EtcdLock"])
def new_lock(request: pytest.FixtureRequest, lock_path: str) -> Callable[[], Any]:
    """Makes lock objects on one lock: a lock file, or a name in a real etcd.
    Both keep which attempt uses an object the same way."""
    if request.param == "Lock":
        return lambda: pylock.Lock(lock_path)
    cluster = request.getfixturevalue("etcd")
    from pylock.etcd import EtcdLock

    name = f"{request.node.name}-{os.getpid()}"
    return lambda: EtcdLock(name, endpoints=cluster.endpoint_list, ttl=2)


def pylock_wait_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pylock wait")]


def test_a_new_thread_with_a_reused_id_is_not_the_old_owner(new_lock: Callable[[], Any]) -> None:
    """Thread ids are reused as soon as a thread ends: a thread whose id equals
    that of an ended holder must be told the lock is held, not that it
    holds it already."""
    lock = new_lock()
    first = threading.Thread(target=lock.acquire)  # ends holding the lock
    first.start()
    first.join()
    outcomes = []
    for _ in range(50):
        result: list[object] = []

        def again(result: list[object] = result) -> None:
            try:
                lock.acquire(blocking=False)
                result.append("acquired")
            except pylock.LockError as exc:
                result.append(type(exc).__name__)

        t = threading.Thread(target=again)
        t.start()
        t.join()
        outcomes.append((t.ident == first.ident, result[0]))
    lock.release()
    if not any(same for same, _ in outcomes):
        pytest.skip("no new thread got the ended holder's id here: nothing to tell apart")
    assert {what for _, what in outcomes} == {"LockHeld"}


def _keep_every_task(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
    """Every task the loop creates from now on, kept alive: no later task
    can get the id of an earlier one."""
    every_task: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        every_task.append(task)
        return task

    loop.set_task_factory(factory)
    return every_task


async def _outcome_within(seconds: float, coro: Any) -> object:
    """What coro returns or raises, or "still waiting" once seconds pass
    (then it is cancelled): a lost wake-up fails the test, never hangs it."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait([task], timeout=seconds)
    if not done:
        task.cancel()
        await asyncio.wait([task])
        return "still waiting"
    exc = task.exception()
    return type(exc).__name__ if exc is not None else task.result()


async def _forget_ended_tasks() -> None:
    """Lets go of the tasks that ended: the loop's callback that woke us
    refers to the one we awaited until this step yields."""
    await asyncio.sleep(0)
    gc.collect()


async def _one_after_another(make: Any, count: int) -> list[tuple[int, object]]:
    """count tasks, each created after the one before has ended and been
    let go of: (id, result) of each."""
    ended = []
    for _ in range(count):
        task = asyncio.ensure_future(make())
        ended.append((id(task), await task))
        del task
        await _forget_ended_tasks()
    return ended


def test_a_new_task_with_a_reused_id_is_not_the_old_owner(new_lock: Callable[[], Any]) -> None:
    """A task that ended holding the lock still owns it: a later task, even
    one at the ended task's address (one started after it, or one of many
    started at once, which reuses freed addresses far more often), must be
    told the lock is held."""
    lock = new_lock()

    async def nothing() -> None:
        pass

    async def acquire_now() -> str:
        try:
            await lock.acquire_async(timeout=0)
            return "acquired"
        except pylock.LockError as exc:
            return type(exc).__name__

    async def hold() -> None:  # a task of its own that ends holding the lock
        await lock.acquire_async()

    async def main() -> tuple[bool, set[object]]:
        await _one_after_another(nothing, 5)  # the allocator settles
        # The control: here an ended task's id goes to a later task (one
        # started after it, or one of many started at once), so an owner
        # known by its id would be mistaken for that task.
        (first_id, _), *later = await _one_after_another(nothing, 50)
        ids_reused = any(task_id == first_id for task_id, _ in later)
        ((ended_id, _),) = await _one_after_another(nothing, 1)
        crowd = [asyncio.ensure_future(nothing()) for _ in range(200)]
        ids_reused = ids_reused or any(id(task) == ended_id for task in crowd)
        await asyncio.gather(*crowd)
        del crowd
        await _forget_ended_tasks()
        await _one_after_another(hold, 1)
        assert lock.locked
        at_once = [asyncio.ensure_future(acquire_now()) for _ in range(200)]
        outcomes = set(await asyncio.gather(*at_once))
        del at_once
        await _forget_ended_tasks()
        return ids_reused, outcomes | {o for _, o in await _one_after_another(acquire_now, 50)}

    ids_reused, outcomes = asyncio.run(main())
    lock.release()
    if not ids_reused:
        pytest.skip("no task got the id of one that ended before it here: nothing to tell apart")
    assert outcomes == {"LockTimeout"}


def _acquired_twice_in_one_task(acquire: Callable[[], Any], lock: Any) -> object:
    """How a task fares acquiring twice through acquire(), which wraps the
    acquire in another task or awaitable.  Every task is kept alive, so the
    second cannot pass for the first by getting its id."""

    async def twice() -> str:
        await acquire()
        try:
            await acquire()
        finally:
            lock.release()
        return "acquired twice"

    async def main() -> object:
        every_task = _keep_every_task(asyncio.get_running_loop())
        outcome = await _outcome_within(2, twice())
        assert len({id(task) for task in every_task}) == len(every_task)
        return outcome

    return asyncio.run(main())


def test_wait_for_then_acquire_again_from_the_same_task_is_reentrant(
    new_lock: Callable[[], Any],
) -> None:
    """asyncio.wait_for on Python 3.11 runs the acquire in an inner task: the
    lock is still the outer task's, so acquiring again must raise at once,
    not wait until the timeout.  Every inner task is kept alive, so the
    second cannot pass for the first by getting its id."""
    lock = new_lock()
    assert _acquired_twice_in_one_task(lambda: asyncio.wait_for(lock.acquire_async(), 5), lock) == (
        "ReentrantAcquire"
    )


def test_a_task_awaiting_a_created_acquire_task_holds_the_lock(
    new_lock: Callable[[], Any],
) -> None:
    """`await asyncio.create_task(lock.acquire_async())` acquires for the task
    that awaits it: acquiring again from that task raises at once, and it may
    release the lock."""
    lock = new_lock()

    def acquire() -> Any:
        return asyncio.create_task(lock.acquire_async())

    assert _acquired_twice_in_one_task(acquire, lock) == "ReentrantAcquire"
    assert not lock.locked


def test_wait_for_cancelled_before_its_acquire_ran_still_gives_the_lock_to_its_caller(
    lock_path: str,
) -> None:
    """A caller cancelled right after it entered asyncio.wait_for(lock.acquire_async())
    (Python 3.9-3.11 run the acquire in an inner task, which takes the lock and
    wait_for then returns True, swallowing the cancel): the lock is the
    caller's, so acquiring again from it raises at once instead of waiting."""
    lock = pylock.Lock(lock_path)

    async def main() -> object:
        me = asyncio.current_task()
        assert me is not None

        async def cancel_me() -> None:
            me.cancel()

        canceller = asyncio.create_task(cancel_me())  # runs once main awaits
        try:
            got = await asyncio.wait_for(lock.acquire_async(), 5)
        except asyncio.CancelledError:
            return "cancelled"
        # From 3.12, wait_for runs the acquire in this task, which takes a
        # free lock without waiting: the canceller has not run, nor ever will.
        canceller.cancel()
        assert got is True
        try:
            await asyncio.wait_for(lock.acquire_async(), 2)  # this task's again
        except (pylock.ReentrantAcquire, asyncio.TimeoutError) as exc:
            return type(exc).__name__
        finally:
            lock.release()
        return "acquired twice"

    assert asyncio.run(main()) in {"ReentrantAcquire", "cancelled"}
    assert not lock.locked and free_from_elsewhere(lock_path)


def test_many_created_acquire_tasks_find_their_owner_without_walking_every_task(
    lock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job runner's thousands of create_task(lock.acquire_async()) each ask
    who awaits them: the answer comes from the task's own callbacks, never from
    a walk over every task of the loop (quadratic in tasks)."""
    walks = []
    all_tasks = asyncio.all_tasks

    def counted(loop: Any = None) -> Any:
        walks.append(loop)
        return all_tasks(loop)

    monkeypatch.setattr(asyncio, "all_tasks", counted)
    locks = [pylock.Lock(f"{lock_path}.{i}") for i in range(200)]

    async def main() -> None:
        await asyncio.gather(*(asyncio.create_task(lock.acquire_async()) for lock in locks))
        assert all(lock.locked for lock in locks)
        for lock in locks:
            lock.release()

    asyncio.run(main())
    assert walks == []


class _HookedLoop(asyncio.SelectorEventLoop):
    """Runs a hook, once, when the next future is created: the first step an
    acquire_async takes after finding this Lock object busy, before it
    queues for its release."""

    hook: Any = None

    def create_future(self) -> asyncio.Future[Any]:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().create_future()


def test_a_release_between_the_busy_check_and_the_queueing_hands_over(
    new_lock: Callable[[], Any],
) -> None:
    """Another thread releases the object after acquire_async found it busy
    and before it queued for the release: the release sees nobody to wake,
    so acquire_async must notice by itself that the object is free.  The
    stress storm meets this interleaving about once in 10,000 hand-overs;
    here the loop's hook makes it every time."""
    lock = new_lock()
    held, release_now, released = threading.Event(), threading.Event(), threading.Event()

    def holder() -> None:
        lock.acquire()
        held.set()
        release_now.wait()
        lock.release()
        released.set()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    in_the_window: list[tuple[bool, int]] = []

    def release_in_the_window() -> None:
        in_the_window.append((lock._lf.owner != 0, len(lock._object_waiters)))
        release_now.set()
        assert released.wait(10)

    async def acquire_and_release() -> str:
        loop.hook = release_in_the_window  # armed inside the task: no future in between
        await lock.acquire_async()
        lock.release()
        return "acquired"

    loop = _HookedLoop()
    try:
        outcome = loop.run_until_complete(_outcome_within(5, acquire_and_release()))
    finally:
        release_now.set()
        thread.join()
        loop.close()
    assert in_the_window == [(True, 0)], "the release missed the window"
    assert outcome == "acquired", "the hand-over was lost: the task waits on a free Lock object"


def _spin_until(loop: asyncio.AbstractEventLoop, done: object) -> None:
    while not done():  # type: ignore[operator]
        loop.run_until_complete(asyncio.sleep(0))


def test_a_closed_loops_waiter_does_not_swallow_the_next_hand_over(lock_path: str) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    dead = asyncio.new_event_loop()
    dead.create_task(lock.acquire_async())  # noqa: RUF006 - left pending on purpose
    _spin_until(dead, lambda: len(lock._object_waiters) == 1)
    dead.close()  # closed with the task pending, never cancelled

    got: list[object] = []
    queued = threading.Event()

    def live() -> None:
        async def main() -> None:
            task = asyncio.ensure_future(lock.acquire_async(timeout=10))
            while len(lock._object_waiters) < 2:
                await asyncio.sleep(0.001)
            queued.set()
            try:
                got.append(await task)
            except pylock.LockError as exc:
                got.append(exc)
            lock.release()

        asyncio.run(main())

    t = threading.Thread(target=live)
    t.start()
    assert queued.wait(10)
    lock.release()
    t.join()
    assert got == [True]


def test_a_kernel_wait_whose_loop_closed_gives_the_lock_back(lock_path: str) -> None:
    holder = pylock.Lock(lock_path)
    held = threading.Thread(target=holder.acquire)
    held.start()
    held.join()
    waiter = pylock.Lock(lock_path)
    loop = asyncio.new_event_loop()
    loop.create_task(waiter.acquire_async())  # noqa: RUF006 - left pending on purpose
    _spin_until(loop, lambda: bool(pylock_wait_threads()))
    loop.close()
    gc.disable()  # the lock must come back without the garbage collector's help
    try:
        threads = pylock_wait_threads()
        holder.release()
        for t in threads:
            t.join()
        assert not waiter.locked
        assert free_from_elsewhere(lock_path)
    finally:
        gc.enable()


@pytest.mark.parametrize("timeout", [math.inf, 1e12, 1e300, -1, None])
def test_huge_and_endless_timeouts_wait_for_another_threads_hold_of_the_object(
    lock_path: str, timeout: float | None
) -> None:
    lock = pylock.Lock(lock_path)
    lock.acquire()
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(lock.acquire(timeout=timeout))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    wait_sleeping(t)  # blocked on this object, with that timeout
    lock.release()
    t.join()
    assert outcome == [True]
    lock.release()


# threading's locks on Windows wait at most this long (a DWORD of milliseconds,
# 49.7 days) and raise OverflowError for a longer timeout; elsewhere the limit
# (292 years) is beyond every timeout pylock passes on.
WINDOWS_TIMEOUT_MAX = 4294967.0


class _BellWithWindowsLimit:
    """A lock object's bell that refuses a timeout above Windows's limit, as
    Windows refuses it, on any platform."""

    def __init__(self, bell: Any) -> None:
        self._bell = bell

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if timeout > WINDOWS_TIMEOUT_MAX:
            raise OverflowError("timeout value is too large")
        return bool(self._bell.acquire(blocking, timeout))

    def release(self) -> None:
        self._bell.release()


def test_a_timeout_beyond_the_platforms_thread_wait_limit_waits_for_another_threads_hold(
    new_lock: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 60-day timeout, while another thread holds the object, waits for
    that thread's release where threading's locks wait at most 49.7 days
    (Windows): the wait on the object is cut to the platform's limit, for
    Lock and EtcdLock alike, instead of raising OverflowError."""
    from pylock._lock import ownership

    monkeypatch.setattr(ownership, "TIMEOUT_MAX", WINDOWS_TIMEOUT_MAX)
    lock = new_lock()
    lock._bell = _BellWithWindowsLimit(lock._bell)
    lock.acquire()
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(lock.acquire(timeout=60 * 86400.0))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    wait_sleeping(t)  # blocked on this object (or failed at once)
    lock.release()
    t.join()
    assert outcome == [True]
    lock.release()


@pytest.mark.parametrize("timeout", [math.nan, -0.5, -2, -math.inf])
def test_nan_and_negative_timeouts_are_refused_everywhere(lock_path: str, timeout: float) -> None:
    lock = pylock.Lock(lock_path)
    with pytest.raises(ValueError):
        lock.acquire(timeout=timeout)
    with pytest.raises(ValueError):
        asyncio.run(lock.acquire_async(timeout=timeout))
    assert not lock.locked


def test_out_of_descriptors_a_held_lock_is_still_reported_held(
    lock_path: str, spawn_holder
) -> None:
    """Naming the holder needs descriptors; the answer (LockHeld) must not."""
    holder = spawn_holder(lock_path)
    lock = pylock.Lock(lock_path)
    with pytest.raises(pylock.LockHeld):
        lock.acquire(blocking=False)  # opens the lock file while descriptors remain
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        with pytest.raises(pylock.LockHeld) as info:
            lock.acquire(blocking=False)
        assert info.value.holder is None or info.value.holder.pid == holder.pid
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    lock.close()
