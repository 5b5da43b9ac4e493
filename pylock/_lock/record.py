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
except ImportError:  # pragma: no cover - PyPy: its accelerator leaves out the quotes
    from _pypyjson import raw_encode_basestring_ascii as _raw  # type: ignore[import-not-found]

    def _quoted(s: str) -> str:
        return f'"{_raw(s)}"'

    _json_str = _quoted

from .._core.native import ffi, lib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._core.process import ProcessIdentity

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
    from .._core.procfs import cmdline  # Python 3.9: sys.argv lost "-c CODE" and "-m module"

    return list(cmdline("self") or (sys.executable, *sys.argv))


def program_fields() -> dict[str, Any]:
    """host, program and argv of this process, as a record carries them."""
    argv = program_argv()
    return {
        "host": hostname(),
        "program": os.path.basename(argv[0])[:_MAX_TEXT] if argv else "",
        # Within the reader's bounds, or readers would drop the whole argv.
        "argv": [arg[:_MAX_TEXT] for arg in argv[:_MAX_ARGV]],
    }


def check_info(info: dict[str, Any] | None) -> None:
    """Refuse an info the record could not carry: not JSON, or too big."""
    if info is None:
        return
    if not isinstance(info, dict):
        raise TypeError(f"info must be a dict (it is recorded as JSON), not {type(info).__name__}")
    key = _key_not_a_string(info)
    if key is not _ALL_STRINGS:
        # json.dumps would write {1: 2} as {"1": 2}: the holder's info would not
        # be what was given.
        raise TypeError(
            f"info keys must be strings, as JSON's are: {key!r} is {type(key).__name__}"
        )
    import json

    try:
        # allow_nan=False: NaN and Infinity are not JSON, and no reader takes them.
        encoded = json.dumps(info, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except RecursionError:
        raise ValueError("info nests too deeply to be recorded") from None
    except TypeError as exc:
        raise TypeError(f"info must be JSON-able (it is recorded as JSON): {exc}") from None
    except ValueError as exc:
        raise ValueError(f"info must be JSON (it is recorded as JSON): {exc}") from None
    if len(encoded) > MAX_INFO:
        raise ValueError(f"info is {len(encoded)} bytes as JSON; at most {MAX_INFO}")
    if _depth(info) > _MAX_INFO_DEPTH:
        raise ValueError(f"info nests deeper than {_MAX_INFO_DEPTH} levels; readers would drop it")


class RecordTemplate:
    """Everything of a record but the moment of acquisition, serialised once.

    The C core appends the time and "}" and writes header + payload in the
    same call that takes the lock, so acquiring costs no Python formatting.
    """

    __slots__ = ("head", "head_crc")

    def __init__(self, identity: Any, info: dict[str, Any] | None) -> None:
        fields: dict[str, Any] = {
            "pid": identity.pid,
            "start_time": identity.start_time,
            "boot_id": identity.boot_id,
            "pidfs_ino": identity.pidfs_ino,
            **program_fields(),
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


# Bounds of what a record may say; anything else is not believed.
_MAX_PID = 2**31 - 1
_MAX_U64 = 2**64 - 1
_LATEST = 253402300799.0  # 9999-12-31T23:59:59Z: later cannot be a datetime
_MAX_TEXT = 4096
_MAX_ARGV = 64
_MAX_INFO_DEPTH = 32
_HEX = frozenset(b"0123456789abcdef")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse(raw: bytes) -> dict[str, Any] | None:
    """The record in raw, or None when there is no complete, intact one.

    Any bytes at all give a record or None, never an exception: the file may
    be written by anyone who can write it.  A returned record has only the
    known fields, each of its documented type and within bounds (a field
    that is not is left out); only pid is required.
    """
    if not isinstance(raw, bytes) or not raw.startswith(MAGIC):
        return None
    end = raw.find(b"\n", 0, 64)
    if end < 0:
        return None
    parts = raw[len(MAGIC) : end].split(b" ")
    if len(parts) != 2:
        return None
    length_text, crc_text = parts
    # Strictly as the writer formats them: int() would also take "+1", "1_0", " 1".
    if not (0 < len(length_text) <= 6 and length_text.isdigit()):
        return None
    if len(crc_text) != 8 or not _HEX.issuperset(crc_text):
        return None
    length, crc = int(length_text), int(crc_text, 16)
    payload = raw[end + 1 : end + 1 + length]
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return parse_payload(payload)


def parse_payload(payload: bytes) -> dict[str, Any] | None:
    """The record in a JSON payload (a lock file's, past its header; an etcd
    lock key's value), or None: any bytes at all give a record or None, never
    an exception.  At most MAX_RECORD bytes are parsed, nesting deeper than
    Python's recursion limit is refused, and only the known fields of their
    documented type and within bounds are kept (pid is required)."""
    if not isinstance(payload, bytes) or len(payload) > MAX_RECORD:
        return None
    import json

    try:
        fields = json.loads(payload, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # also invalid UTF-8, and nesting deeper than Python
        return None
    if not isinstance(fields, dict):
        return None
    return _checked(fields)


def read(handle: int) -> dict[str, Any] | None:
    """The record at the start of handle's file (at most MAX_RECORD bytes read), or None."""
    buf = ffi.new("char[]", MAX_RECORD)
    length = ffi.new("size_t *")
    if lib.pl_read_record(handle, buf, MAX_RECORD, length) != 0:
        return None
    return parse(bytes(ffi.buffer(buf, length[0])))


def identity(rec: dict[str, Any]) -> ProcessIdentity:
    """The process a parsed record names (its start identity 0 or "" where it has none)."""
    from .._core.process import ProcessIdentity

    return ProcessIdentity(
        rec["pid"], rec.get("start_time", 0), rec.get("boot_id", ""), rec.get("pidfs_ino", 0)
    )


def _checked(fields: dict[str, Any]) -> dict[str, Any] | None:
    pid = fields.get("pid")
    if not _is_int(pid, 1, _MAX_PID):
        return None
    out: dict[str, Any] = {"pid": pid}
    for name in ("start_time", "pidfs_ino"):
        if _is_int(fields.get(name), 0, _MAX_U64):
            out[name] = fields[name]
    for name in ("boot_id", "host", "program"):
        value = fields.get(name)
        if isinstance(value, str) and len(value) <= _MAX_TEXT:
            out[name] = value
    argv = fields.get("argv")
    if (
        isinstance(argv, list)
        and len(argv) <= _MAX_ARGV
        and all(isinstance(a, str) and len(a) <= _MAX_TEXT for a in argv)
    ):
        out["argv"] = argv
    at = fields.get("acquired_at")
    if isinstance(at, (int, float)) and not isinstance(at, bool) and 0 <= at <= _LATEST:
        out["acquired_at"] = at  # NaN fails both comparisons
    info = fields.get("info")
    if isinstance(info, dict) and _depth(info) <= _MAX_INFO_DEPTH:
        out["info"] = info
    return out


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


_ALL_STRINGS = object()


def _key_not_a_string(value: Any) -> Any:
    """The first dict key in value, at any depth, that is not a str, else
    _ALL_STRINGS; without recursion, and each container looked at once (a
    dict that contains itself is json.dumps' to refuse)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if not isinstance(item, (dict, list, tuple)) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return key
            stack.extend(item.values())
        else:
            stack.extend(item)
    return _ALL_STRINGS


def _depth(value: Any) -> int:
    """How deeply value nests lists and dicts, counted without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > _MAX_INFO_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
