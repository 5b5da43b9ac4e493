"""What every pylock lock offers, so code can take a Lock or an EtcdLock alike."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

_Self = TypeVar("_Self", bound="SupportsLock")


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


if TYPE_CHECKING:
    from ..etcd.lock import EtcdLock
    from .holder import Holder
    from .lock import Lock

    def _both_are_locks(lock: Lock, etcd_lock: EtcdLock) -> list[SupportsLock]:
        # mypy --strict pylock checks here that both classes satisfy the protocol.
        return [lock, etcd_lock]
