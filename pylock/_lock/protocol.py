"""What every pylock lock offers, so code can take a Lock or an EtcdLock alike,
and the counters a Lock's stats show."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from .holder import Holder

_Self = TypeVar("_Self", bound="SupportsLock")

# Histogram buckets: durations of at most 2**k - 1 ns, from about 1 us to
# 275 s.  A duration of d ns is filed under slot d.bit_length(), the b with
# 2**(b-1) <= d < 2**b (the C core does the same for holds): one integer
# operation instead of a search, and exact for these bounds.
BUCKET_POWERS = (10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38)
BUCKETS = tuple((2**k - 1) / 1e9 for k in BUCKET_POWERS)


@runtime_checkable
class SupportsLock(Protocol):
    """The interface pylock.Lock and pylock.etcd.EtcdLock share."""

    @property
    def locked(self) -> bool: ...

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool: ...

    async def acquire_async(self, timeout: float | None = None) -> bool: ...

    def release(self) -> None: ...

    def close(self) -> None: ...

    def holder(self) -> Holder | None: ...

    def __enter__(self: _Self) -> _Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def __aenter__(self: _Self) -> _Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@dataclass(frozen=True)
class LockStats:
    """A snapshot of one lock's counters (or of all of them: name is "")."""

    name: str
    acquisitions: int = 0
    conflicts: int = 0  # attempts that found the lock held
    waited: float = 0.0  # seconds spent waiting, in acquisitions and in attempts given up
    held: float = 0.0  # seconds held, over completed holds
    releases: int = 0
    wait_buckets: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    hold_buckets: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
