"""How the pylock command shows a lock's holders: one line of text each, or
one JSON object each."""

from __future__ import annotations

import time

from .._core.display import display, json_text, json_texts, stamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._lock.holder import Holder


def holder_json(holder: Holder) -> dict[str, Any]:
    """The holder as one JSON object, the same in every command (`pylock who
    --json`, `pylock list --json`, `pylock who --etcd --json`).

    Every field is always there; one pylock does not know is null (pid of a
    holder it cannot identify, a command line, a start identity, since when).
    Strings are exact; one that is not UTF-8 has its bytes beside it
    (NAME_base64, pylock._core.display.json_text).  An etcd lock's holder
    (pylock.etcd.EtcdHolder, recognised by its lease so that gRPC is not
    loaded to ask) adds its lease, TTL (and the seconds left), fencing token
    and key.
    """
    doc: dict[str, Any] = {"pid": holder.pid if holder.pid > 0 else None}
    json_text(doc, "program", holder.program or None)
    json_texts(doc, "argv", holder.argv or None)
    json_text(doc, "hostname", holder.hostname or None)
    doc.update(
        acquired_at=stamp(holder.acquired_at.timestamp()) if holder.acquired_at else None,
        held_for=_held_seconds(holder),
        info=holder.info,
        verified=holder.verified,
        shared=holder.shared,
        start_time=holder.start_time or None,
        boot_id=holder.boot_id or None,
        pidfs_ino=holder.pidfs_ino or None,
        record_private=holder.record_private,
        note=holder.note or None,
    )
    lease = getattr(holder, "lease", None)
    if isinstance(lease, int):
        doc["lease"] = f"{lease:x}"
        doc["ttl"] = getattr(holder, "ttl", 0)
        doc["ttl_left"] = getattr(holder, "ttl_left", None)
        doc["fencing_token"] = getattr(holder, "fencing_token", 0)
        doc["key"] = bytes(getattr(holder, "key", b"")).decode("utf-8", "replace")
    return doc


def path_json(path: str) -> dict[str, Any]:
    """{"path": ...} as every command writes a path (exact, bytes beside a
    name that is not UTF-8)."""
    doc: dict[str, Any] = {}
    json_text(doc, "path", path)
    return doc


def _held_seconds(holder: Holder) -> float | None:
    if holder.acquired_at is None:
        return None
    since: float = holder.acquired_at.timestamp()
    return round(max(0.0, time.time() - since), 3)


def duration(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def describe(path: str, found: list[Holder]) -> str:
    """`pylock who`'s text: one line per holder of path (and its info), or
    "free"; every string escaped (pylock._core.display)."""
    shown = display(path)
    if not found:
        return f"{shown}: free\n"
    lines = []
    for holder in found:
        kind = "shared" if holder.shared else "held"
        text = f"{shown}: {kind} by {holder.describe()}"
        held = _held_seconds(holder)
        if held is not None:
            text += f", for {duration(held)}"
        if holder.verified:
            text += " (verified by the kernel)"
        elif not holder.note:
            text += " (unverified)"
        lines.append(text)
        if holder.info:
            import json

            # ASCII JSON: every control character of the record is \u-escaped.
            lines.append(f"  info: {json.dumps(holder.info)}")
    return "\n".join(lines) + "\n"
