"""Hostile records: anyone who can write a lock file can put any bytes in it
(the README suggests mode=0o666 for locks shared between users).  Any bytes
are "no record" or a record of the documented types, never an exception, in
the reader and everywhere a record is used: holder(), holders(), the errors,
`pylock who`.

The fuzz starts from real records and mutates them: wrong types for every
field, huge and negative numbers, NaN and infinities, deep nesting, invalid
UTF-8, control characters, truncation, oversized and malformed lengths.  The
payload mutations are re-sealed with a correct length and checksum so they
reach the JSON reader instead of stopping at the header.  A quick sample runs
here; tests/stress/test_record_fuzz.py runs the large one.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylock
from pylock import LockHeld
from pylock._core.process import identity_of, self_identity
from pylock._lock import holder as _holder
from pylock._lock import record as _record
from tests.support import REPO_ROOT, env_with_repo

FIELDS = (
    "pid",
    "start_time",
    "boot_id",
    "pidfs_ino",
    "host",
    "program",
    "argv",
    "info",
    "acquired_at",
)


def real_fields(info: Any = None) -> dict[str, Any]:
    # A fixed time: generation must not depend on the clock.
    raw = _record.RecordTemplate(self_identity(), info).render(now=1795975229.123456)
    parsed = _record.parse(raw)
    assert parsed is not None
    return parsed


def seal(payload: bytes) -> bytes:
    return b"pylock-record v1 %d %08x\n" % (len(payload), zlib.crc32(payload)) + payload


# -- strategies ------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.sampled_from([0, -1, 2**31, 2**63, 2**64, -(2**63), 10**4000 // 10**3990, True, False]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e20, -1e20, 1e308, 5e-324, 253402300800.0, -62135596801.0]),
)
TEXT = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=64
) | st.sampled_from(["\x1b]0;x\x07", "\ud800", "\x00", "\u202e", "x" * 5000])
SCALARS = st.none() | NUMBERS | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def field_mutations(draw: st.DrawFn) -> bytes:
    """A real record whose fields are replaced, removed or added, re-sealed."""
    info = draw(st.none() | st.dictionaries(TEXT, JSON_VALUES, max_size=3))
    try:
        fields = real_fields(info)
    except ValueError:  # NaN or too big: pylock refuses to record it; others may not
        fields = {**real_fields(), "info": info}
    for name in draw(st.lists(st.sampled_from((*FIELDS, "extra")), max_size=4)):
        action = draw(st.sampled_from(["replace", "remove"]))
        if action == "remove":
            fields.pop(name, None)
        else:
            fields[name] = draw(JSON_VALUES)
    payload = json.dumps(fields, allow_nan=True).encode()
    return seal(payload)


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(min_value=1, max_value=20000))
    open_, close = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    field = draw(st.sampled_from(FIELDS))
    value = open_ * depth + "1" + close * depth
    fields = real_fields()
    text = json.dumps(fields)
    text = text[:-1] + f', "{field}": {value}' + "}"
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]  # unbalanced
    return seal(text.encode())


@st.composite
def byte_mutations(draw: st.DrawFn) -> bytes:
    """Bytes of a real payload flipped, inserted (invalid UTF-8 among them),
    deleted or cut, then re-sealed, or the header itself damaged."""
    payload = bytearray(json.dumps(real_fields({"k": [1, 2]})).encode())
    for _ in range(draw(st.integers(1, 6))):
        where = draw(st.integers(0, len(payload)))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if kind == "flip" and where < len(payload):
            payload[where] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            payload[where:where] = draw(
                st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\ud800", b"NaN"])
                | st.binary(max_size=8)
            )
        elif kind == "delete":
            del payload[where : where + draw(st.integers(1, 8))]
        else:
            del payload[where:]
    raw = seal(bytes(payload))
    header_end = raw.index(b"\n")
    header = draw(
        st.sampled_from(
            [
                None,
                b"pylock-record v1 999999999 00000000",
                b"pylock-record v1 -5 00000000",
                b"pylock-record v1 +%d %08x" % (len(payload), zlib.crc32(payload)),
                b"pylock-record v1 %d 0x%06x" % (len(payload), zlib.crc32(payload) & 0xFFFFFF),
                b"pylock-record v1 1_0 00000000",
                b"pylock-record v1 " + b"9" * 40,
                b"pylock-record v1",
            ]
        )
    )
    if header is not None:
        raw = header + raw[header_end:]
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


RAW_RECORDS = st.one_of(
    field_mutations(), deep_nesting(), byte_mutations(), st.binary(max_size=256)
)


# -- the property ------------------------------------------------------------------------

cases_checked = [0]


def check_record(raw: bytes) -> None:
    """raw is no record or a record of the documented types, and every use of
    a record (the Holder, its message, the command line's JSON) works."""
    cases_checked[0] += 1
    rec = _record.parse(raw)
    if rec is None:
        return
    assert set(rec) <= set(FIELDS)
    assert type(rec["pid"]) is int and 1 <= rec["pid"] < 2**31
    for name in ("start_time", "pidfs_ino"):
        assert name not in rec or (type(rec[name]) is int and 0 <= rec[name] < 2**64)
    for name in ("boot_id", "host", "program"):
        assert name not in rec or type(rec[name]) is str
    assert "argv" not in rec or all(type(a) is str for a in rec["argv"])
    assert "info" not in rec or type(rec["info"]) is dict
    at = rec.get("acquired_at")
    assert at is None or (type(at) in (int, float) and math.isfinite(at))
    holder = _holder.from_record(rec)
    assert holder.acquired_at is None or holder.acquired_at.tzinfo is dt.timezone.utc
    text = str(LockHeld("/x.lock", holder))
    assert text.isprintable(), text
    json.dumps(
        {"info": holder.info, "argv": list(holder.argv), "host": holder.hostname}, allow_nan=False
    )


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(RAW_RECORDS)
def test_any_bytes_are_no_record_or_a_record(raw: bytes) -> None:
    check_record(raw)


# -- the reported crashes, through every reader of a real lock file ---------------------------

HOLD = (
    "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\nsys.stdin.read()"
)


@pytest.fixture
def raw_holder_of(lock_path: str) -> Iterator[subprocess.Popen[str]]:
    """A bare flock holder (no record of its own) of lock_path."""
    open(lock_path, "w").close()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, lock_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    yield proc
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def hostile(pid: int, **fields: Any) -> dict[str, Any]:
    ident = identity_of(pid)
    assert ident is not None
    base = {
        "pid": pid,
        "start_time": ident.start_time,
        "boot_id": ident.boot_id,
        "pidfs_ino": ident.pidfs_ino,
        "host": "h",
        "program": "p",
        "argv": ["p"],
        "acquired_at": 1.0,
    }
    return {**base, **fields}


def every_reader_answers(path: str, holder_pid: int) -> None:
    found = pylock.Lock(path).holder()
    assert found is not None and found.pid == holder_pid
    assert [h.pid for h in pylock.holders(path)] == [holder_pid]
    with pytest.raises(LockHeld) as held:
        pylock.Lock(path).acquire(blocking=False)
    assert f"pid {holder_pid}" in str(held.value)
    with pytest.raises(pylock.LockTimeout):
        pylock.Lock(path).acquire(timeout=0.01)
    for args in (["who", path], ["who", "--all", path], ["who", "--json", path]):
        out = subprocess.run(
            [sys.executable, "-m", "pylock", *args],
            env=env_with_repo(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0 and f"{holder_pid}" in out.stdout, (args, out.stderr)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(
            lambda pid: json.dumps(hostile(pid))[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}",
            id="5000 deep",
        ),
        pytest.param(
            lambda pid: (
                json.dumps(hostile(pid, info={"a": 1}))[:-1].replace(
                    '"info": {"a": 1}', '"info": ' + '{"a":' * 5000 + "1" + "}" * 5000
                )
                + "}"
            ),
            id="5000 deep info",
        ),
        pytest.param(lambda pid: json.dumps(hostile(pid, acquired_at=1e20)), id="acquired_at 1e20"),
        pytest.param(
            lambda pid: json.dumps(hostile(pid, acquired_at=-1e20)), id="acquired_at -1e20"
        ),
        pytest.param(
            lambda pid: json.dumps(hostile(pid)).replace(
                '"acquired_at": 1.0', '"acquired_at": NaN'
            ),
            id="NaN",
        ),
        pytest.param(
            lambda pid: json.dumps(hostile(pid, start_time=2**70, pidfs_ino=-1)), id="huge identity"
        ),
        pytest.param(
            lambda pid: json.dumps(hostile(pid, argv="not a list", host=["x"], info=[1])),
            id="wrong types",
        ),
        pytest.param(lambda pid: json.dumps({**hostile(pid), "pid": str(pid)}), id="pid as text"),
    ],
)
def test_hostile_record_in_a_held_lock_file(lock_path: str, raw_holder_of, payload) -> None:
    with open(lock_path, "r+b") as f:
        f.write(seal(payload(raw_holder_of.pid).encode()))
    every_reader_answers(lock_path, raw_holder_of.pid)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=RAW_RECORDS)
def test_fuzzed_records_in_a_held_lock_file(
    raw: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A sample of the fuzz through the real readers of a held lock file."""
    path = str(tmp_path_factory.mktemp("fuzz") / "x.lock")
    with open(path, "wb") as f:
        f.write(raw)
    rec = _record.parse(raw)
    assert rec is None or isinstance(rec, dict)
    found = pylock.Lock(path).holder()
    assert found is None
    with pylock.Lock(path) as lock:
        me = lock.holder()
        assert me is not None and me.pid == os.getpid() and me.verified
    if not raw.startswith(_record.MAGIC) and raw:
        with open(path, "rb") as f:
            assert f.read() == raw  # not pylock's: left as it was
