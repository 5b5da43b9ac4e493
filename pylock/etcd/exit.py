"""Waiting for an etcd holder to go: pylock.holder_exit and wait_exit on an EtcdHolder.

The holder was read at a known revision; watching its key from the next
revision on leaves no gap in which a deletion could be missed.
"""

from __future__ import annotations

import time
from typing import Protocol

from .._core.timeout import deadline_of
from .client import REQUEST_TIMEOUT, DeadlinePassed
from .loop import etcd_loop, run_async, run_blocking


class KeyHolder(Protocol):
    """What waiting needs of a holder (an EtcdHolder, which calls these
    functions: this module does not import it back)."""

    @property
    def name(self) -> str: ...

    @property
    def key(self) -> bytes: ...

    @property
    def fencing_token(self) -> int: ...

    @property
    def revision(self) -> int: ...

    @property
    def endpoints(self) -> tuple[str, ...]: ...

    def describe(self) -> str: ...


async def _wait_gone(holder: KeyHolder, deadline: float | None) -> None:
    cluster = etcd_loop().cluster(holder.endpoints)
    after = holder.revision
    while True:
        try:
            if await cluster.deleted(holder.key, after, deadline):
                return
        except DeadlinePassed:
            raise TimeoutError(f"{holder.describe()} still holds {holder.name!r}") from None
        # The watched revisions were compacted: look at the key itself.
        kv, after = await cluster.get(holder.key, deadline)
        if kv is None or int(kv.create_revision) != holder.fencing_token:
            return


async def wait_deleted_async(holder: KeyHolder, timeout: float | None) -> None:
    await run_async(_wait_gone(holder, deadline_of(timeout)))


def wait_deleted(holder: KeyHolder, timeout: float | None) -> bool:
    try:
        run_blocking(_wait_gone(holder, deadline_of(timeout)))
    except TimeoutError:
        return False
    return True


def key_exists(holder: KeyHolder) -> bool:
    async def look() -> bool:
        cluster = etcd_loop().cluster(holder.endpoints)
        kv, _ = await cluster.get(holder.key, time.monotonic() + REQUEST_TIMEOUT)
        return kv is not None and int(kv.create_revision) == holder.fencing_token

    return run_blocking(look())
