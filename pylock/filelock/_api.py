"""BaseFileLock: filelock's reentrant lock object on top of a backend that
takes and gives back the lock itself (pylock.Lock, or a soft marker), with
filelock's options, properties, context manager, decorator and DEBUG log
lines; the counting is _hold's."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from threading import Lock as allocate_lock
from threading import RLock
from typing import Any, Callable, ClassVar, Generic, TypeVar
from weakref import WeakValueDictionary

from ._hold import Context, Holds, ThreadContext
from ._meta import DEFAULTS, FileLockMeta
from ._options import (
    UNSET_MODE,
    Wait,
    check_blocking,
    check_mode,
    check_policies,
    resolve_poll_interval,
    seconds,
    timeout_behavior,
    wait_of,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

    from .._lock.holder import Holder

_LockT = TypeVar("_LockT", bound="BaseFileLock")
_log = logging.getLogger("filelock")
_DEBUG = logging.DEBUG


class AcquireReturnProxy(Generic[_LockT]):
    """What acquire() returns: entering gives the lock, leaving releases once."""

    def __init__(self, lock: _LockT) -> None:
        self.lock: _LockT = lock

    def __enter__(self) -> _LockT:
        return self.lock

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lock._release_in_context(exc)


class BaseFileLock(contextlib.ContextDecorator, metaclass=FileLockMeta):
    """filelock's BaseFileLock: a reentrant lock on lock_file."""

    _instances: ClassVar[WeakValueDictionary[str, BaseFileLock]] = WeakValueDictionary()
    _instances_lock: ClassVar[RLock] = RLock()
    _thread_local_default: ClassVar[bool] = True
    _own_inits: ClassVar[tuple[Callable[..., None], ...]] = ()
    _scope = "thread"  # who could deadlock itself: a thread here, a task for async locks
    # Where a relative lock_file was acquired, while any thread holds it:
    # the singleton registry finds the object there after a chdir.
    _pinned: str | None = None
    _pins = 0
    _singleton_key: str | None = None
    _singleton_shared = False  # also given out for another spelling of its path

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every class keeps its own singletons (FileLock's are not SoftFileLock's).
        super().__init_subclass__(**kwargs)
        cls._instances = WeakValueDictionary()
        cls._instances_lock = RLock()

    def __init__(
        self,
        lock_file: str | os.PathLike[str],
        timeout: float = -1,
        mode: int = UNSET_MODE,
        thread_local: bool = True,
        *,
        blocking: bool = True,
        is_singleton: bool = False,
        poll_interval: float = DEFAULTS["poll_interval"],  # type: ignore[assignment]
        lifetime: float | None = None,
        context_error_policy: str = "chain",
        close_error_policy: str = "default",
        fallback_to_soft: bool = True,
        preserve_lock_file: bool = False,
        on_acquired: Callable[[int], None] | None = None,
    ) -> None:
        path = os.fspath(lock_file)
        self._lock_file: str = os.fsdecode(path) if isinstance(path, bytes) else path
        self._relative = not os.path.isabs(self._lock_file)
        self._mode = check_mode(mode, type(self).__name__)
        self._thread_local = bool(thread_local)
        self._is_singleton = bool(is_singleton)
        check_policies(context_error_policy, close_error_policy)
        self._context_error_policy = context_error_policy
        self._close_error_policy = close_error_policy
        self._fallback_to_soft = bool(fallback_to_soft)
        self._check_backend_options(lifetime, preserve_lock_file, on_acquired)
        self._preserve_lock_file = bool(preserve_lock_file)
        context = ThreadContext if thread_local else Context
        self._context: Context = context(
            seconds("timeout", timeout),
            check_blocking(blocking),
            resolve_poll_interval(poll_interval),
        )
        self._holds = Holds(self._context, self._thread_local)
        self._mu = allocate_lock()  # the backend's own state

    # -- what a backend provides -------------------------------------------

    def _take(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
        """Take the lock itself; returns the hold release gives back."""
        raise NotImplementedError

    def _give_back(self, held: object) -> None:
        raise NotImplementedError

    def holder(self) -> Holder | None:
        """The process holding this lock now (maybe this one), or None when free."""
        raise NotImplementedError

    def _check_backend_options(
        self, lifetime: float | None, preserve_lock_file: bool, on_acquired: object
    ) -> None:
        raise NotImplementedError

    # -- acquiring and releasing ------------------------------------------

    def acquire(
        self: _LockT,
        timeout: float | None = None,
        poll_interval: float | None = None,
        *,
        poll_intervall: float | None = None,
        blocking: bool | None = None,
        cancel_check: Callable[[], bool] | None = None,
    ) -> AcquireReturnProxy[_LockT]:
        """Acquire the lock (again: a lock is reentrant) and return a context
        manager that releases it once.

        timeout: seconds to wait, any negative number or inf forever, None the
        lock's default; blocking=False makes one attempt whatever the timeout.
        The wait is pylock's (in the kernel, woken by the release or the
        holder's death); poll_interval only says how often cancel_check is
        asked.  Raises Timeout (naming the holder), or RuntimeError where
        waiting without a limit for a lock this thread holds could never end.
        """
        wait = wait_of(self._context, timeout, poll_interval, poll_intervall, blocking)
        if self._holds.join():
            return AcquireReturnProxy(self)
        if self._singleton_shared:
            self._refuse_moved_singleton()
        # In a hand-over every frame between the kernel's grant and the return
        # runs cold: the path without DEBUG lines has as few as it can.
        if _log.isEnabledFor(_DEBUG):
            held = self._take_logged(wait, cancel_check)
        else:
            held = self._take(wait, cancel_check)
        self._holds.start(held)
        return AcquireReturnProxy(self)

    def _take_logged(self, wait: Wait, cancel_check: Callable[[], bool] | None) -> object:
        debug = self._log_attempt()
        try:
            held = self._take(wait, cancel_check)
        except BaseException as exc:
            if debug:
                self._log_failure(exc, wait)
            raise
        if debug:
            self._log_acquired()
        return held

    def _pin(self, path: str) -> None:
        """Remember where a relative lock_file was acquired (until the last release)."""
        with self._mu:
            self._pins += 1
            self._pinned = path

    def _unpin(self) -> None:
        with self._mu:
            self._pins = max(self._pins - 1, 0)
            if not self._pins:
                self._pinned = None

    def _refuse_moved_singleton(self) -> None:
        """A singleton given out for two spellings of one path, one of them
        relative, must not follow a chdir to another file."""
        from ._meta import canonical, path_key

        if self._pinned is None and path_key(canonical(self._lock_file)) != self._singleton_key:
            raise RuntimeError(
                f"{self._lock_file}: the singleton lock path changed after sharing: it was "
                f"given out as {self._singleton_key}, which the relative path no longer names "
                "since the working directory changed; spell the path one way (absolute)"
            )

    # filelock's DEBUG lines, on its logger, for the programs that read them.

    def _log_attempt(self) -> bool:
        """Whether DEBUG lines are wanted; logs the attempt's when they are."""
        if not _log.isEnabledFor(_DEBUG):
            return False
        _log.debug("Attempting to acquire lock %s on %s", id(self), self._lock_file)
        return True

    def _log_acquired(self) -> None:
        _log.debug("Lock %s acquired on %s", id(self), self._lock_file)

    def _log_failure(self, exc: BaseException, wait: Wait) -> None:
        from ._errors import Timeout

        if isinstance(exc, Timeout):
            what = "Timeout on acquiring" if wait.blocking else "Failed to immediately acquire"
            _log.debug("%s lock %s on %s", what, id(self), self._lock_file)

    def release(self, force: bool = False) -> None:
        """Release one acquisition (force: all of this thread's, or with
        thread_local=False everyone's); the last gives the lock back.  A
        lock this thread does not hold is left as it is."""
        held = self._holds.end(force)
        if held is None:
            return
        if not _log.isEnabledFor(_DEBUG):
            self._give_back(held)  # the hand-over's path: no frame more than needed
            return
        _log.debug("Attempting to release lock %s on %s", id(self), self._lock_file)
        self._give_back(held)
        _log.debug("Lock %s released on %s", id(self), self._lock_file)

    def _release_in_context(self, exc: BaseException | None) -> None:
        """Leaving a with block: a failed release is chained to the body's
        error (filelock's "chain"), or raised with it in a group ("group")."""
        try:
            BaseFileLock.release(self)  # also for async locks, whose release is a coroutine
        except BaseException as failure:
            if exc is None or self._context_error_policy == "chain":
                raise
            group = _builtin_group()
            if group is None:  # Python before 3.11: chained
                raise
            raise group("the block failed and so did the release", [exc, failure]) from None

    def __enter__(self: _LockT) -> _LockT:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release_in_context(exc)

    # -- properties ---------------------------------------------------------

    @property
    def lock_file(self) -> str:
        """The path of the lock file, as given (a relative one is resolved at each acquisition)."""
        return self._lock_file

    @property
    def is_locked(self) -> bool:
        """Whether this thread (thread_local=False: anyone) holds the lock through this object."""
        return self._context.counter > 0

    @property
    def lock_counter(self) -> int:
        """How many acquisitions are not yet released."""
        return self._context.counter

    def is_thread_local(self) -> bool:
        return self._thread_local

    @property
    def is_singleton(self) -> bool:
        return self._is_singleton

    @property
    def timeout(self) -> float:
        return self._context.timeout

    @timeout.setter
    def timeout(self, value: float | str) -> None:
        if isinstance(value, (str, bytes, bytearray)):
            warnings.warn(
                "setting timeout from a string is deprecated; pass a number",
                DeprecationWarning,
                stacklevel=2,
            )
            value = float(value)
        self._context.timeout = seconds("timeout", value)

    @property
    def blocking(self) -> bool:
        return self._context.blocking

    @blocking.setter
    def blocking(self, value: bool) -> None:
        self._context.blocking = check_blocking(value)

    @property
    def poll_interval(self) -> float:
        return self._context.poll_interval

    @poll_interval.setter
    def poll_interval(self, value: float) -> None:
        self._context.poll_interval = resolve_poll_interval(value)

    @property
    def mode(self) -> int:
        """The mode asked for the lock file: 0o644 when none was (the file is then
        created with 0o666 less the umask, as filelock creates it)."""
        return 0o644 if self._mode == UNSET_MODE else self._mode

    @property
    def has_explicit_mode(self) -> bool:
        return self._mode != UNSET_MODE

    @property
    def lifetime(self) -> float | None:
        return None  # pylock never ends a live holder's lock by its age

    @property
    def context_error_policy(self) -> str:
        return self._context_error_policy

    @property
    def close_error_policy(self) -> str:
        return self._close_error_policy

    @property
    def fallback_to_soft(self) -> bool:
        return self._fallback_to_soft

    @property
    def preserve_lock_file(self) -> bool:
        return self._preserve_lock_file

    @property
    def on_acquired(self) -> None:
        return None

    # -- construction, as the metaclass asks ---------------------------------

    @classmethod
    def _option_defaults(cls) -> dict[str, object]:
        return {
            **DEFAULTS,
            "thread_local": cls._thread_local_default,
            "lifetime": None,
            "context_error_policy": "chain",
            "close_error_policy": "default",
            "fallback_to_soft": True,
            "preserve_lock_file": False,
            "on_acquired": None,
        }

    @classmethod
    def _check_options(cls, options: dict[str, Any]) -> None:
        """Refuse a combination of options before any object exists."""

    def _compare_options(self, options: dict[str, Any]) -> dict[str, tuple[object, object]]:
        """(requested, existing) per option, for a singleton asked for again."""
        given = {**self._option_defaults(), **options}
        return {
            "thread_local": (given["thread_local"], self._thread_local),
            "timeout": (timeout_behavior(given["timeout"]), timeout_behavior(self.timeout)),
            "mode": (given["mode"], self._mode),
            "blocking": (given["blocking"], self.blocking),
            "poll_interval": (given["poll_interval"], self.poll_interval),
            "context_error_policy": (given["context_error_policy"], self._context_error_policy),
            "close_error_policy": (given["close_error_policy"], self._close_error_policy),
            "fallback_to_soft": (given["fallback_to_soft"], self._fallback_to_soft),
            "preserve_lock_file": (given["preserve_lock_file"], self._preserve_lock_file),
        }

    def __repr__(self) -> str:
        state = "locked" if self.is_locked else "unlocked"
        return f"<pylock.filelock.{type(self).__name__} {self._lock_file!r} {state}>"


BaseFileLock._own_inits = (BaseFileLock.__init__,)


def _builtin_group() -> Any:
    import builtins

    return getattr(builtins, "BaseExceptionGroup", None)
