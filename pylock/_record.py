"""The holder record: who holds the lock, for diagnostics only.

Layout, at offset 0 of the lock file:
    b"pylock-record v1 <length> <crc32 hex>\\n" + <length> bytes of JSON
A reader accepts a record only when the header parses and the checksum
matches, so a torn write, an older longer record's tail, or garbage is
"no record", never a wrong holder.  Safety never depends on the record.
"""

from __future__ import annotations

import os
import sys
import time
import zlib

# The template is built at every first acquisition, so by every `pylock
# run`: json (which loads re) and socket are imported only when needed.
try:
    from _json import encode_basestring_ascii as _json_str  # what json.dumps uses
except ImportError:  # pragma: no cover - interpreters without the C accelerator
    from json.encoder import py_encode_basestring_ascii as _json_str

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"pylock-record v1 "
# Reads are bounded: a 10 MiB file at the lock path costs 64 KiB at most.
MAX_RECORD = 64 * 1024
MAX_INFO = 16 * 1024


def hostname() -> str:
    """This host's name, as socket.gethostname() gives it."""
    if hasattr(os, "uname"):  # gethostname(2) is the uname nodename on Linux and macOS
        return os.uname().nodename
    import socket

    return socket.gethostname()


def program_argv() -> list[str]:
    """This process's command line as the kernel shows it (as fdinfo readers see it)."""
    if hasattr(sys, "orig_argv"):
        return list(sys.orig_argv)
    try:  # Python 3.9: sys.argv lost "-c CODE" and "-m module"
        with open("/proc/self/cmdline", "rb") as f:
            return [os.fsdecode(part) for part in f.read().split(b"\0") if part]
    except OSError:
        return [sys.executable, *sys.argv]


def check_info(info: dict[str, Any] | None) -> None:
    """Refuse an info the record could not carry: not JSON, or too big."""
    if info is None:
        return
    if not isinstance(info, dict):
        raise TypeError(f"info must be a dict (it is recorded as JSON), not {type(info).__name__}")
    import json

    encoded = json.dumps(info, separators=(",", ":"), sort_keys=True)
    if len(encoded) > MAX_INFO:
        raise ValueError(f"info is {len(encoded)} bytes as JSON; at most {MAX_INFO}")


class RecordTemplate:
    """Everything of a record but the moment of acquisition, serialised once.

    The C core appends the time and "}" and writes header + payload in the
    same call that takes the lock, so acquiring costs no Python formatting.
    """

    __slots__ = ("head", "head_crc")

    def __init__(self, identity: Any, info: dict[str, Any] | None) -> None:
        argv = program_argv()
        fields: dict[str, Any] = {
            "pid": identity.pid,
            "start_time": identity.start_time,
            "boot_id": identity.boot_id,
            "pidfs_ino": identity.pidfs_ino,
            "host": hostname(),
            "program": os.path.basename(argv[0]) if argv else "",
            "argv": argv[:64],
        }
        if info is not None:
            check_info(info)
            fields["info"] = info
        body = _compact_json(fields)
        # The timestamp is the last field; the C core writes it and the "}".
        self.head = (body[:-1] + ',"acquired_at":').encode()
        self.head_crc = zlib.crc32(self.head)

    def render(self, now: float | None = None) -> bytes:
        """The record as the C core writes it (for tools and tests)."""
        stamp = b"%.6f}" % (time.time() if now is None else now)
        return encode(self.head + stamp)


def _compact_json(value: Any) -> str:
    """json.dumps(value, separators=(",", ":")), byte for byte, without json's
    import for what a record's own fields hold (ints, strings, lists of them)."""
    if isinstance(value, str):
        return _json_str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__repr__(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "[" + ",".join([_json_str(item) for item in value]) + "]"
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return (
            "{" + ",".join([f"{_json_str(k)}:{_compact_json(v)}" for k, v in value.items()]) + "}"
        )
    import json  # anything else (the caller's info): json itself

    return json.dumps(value, separators=(",", ":"))


def encode(payload: bytes) -> bytes:
    """A record around payload (JSON bytes): header with length and checksum."""
    return b"%s%d %08x\n" % (MAGIC, len(payload), zlib.crc32(payload)) + payload


def parse(raw: bytes) -> dict[str, Any] | None:
    """The record in raw, or None when there is no complete, intact one."""
    if not raw.startswith(MAGIC):
        return None
    end = raw.find(b"\n", 0, 64)
    if end < 0:
        return None
    try:
        length_text, crc_text = raw[len(MAGIC) : end].split(b" ")
        length, crc = int(length_text), int(crc_text, 16)
    except ValueError:
        return None
    payload = raw[end + 1 : end + 1 + length]
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    import json

    try:
        fields = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("pid"), int):
        return None
    return fields
