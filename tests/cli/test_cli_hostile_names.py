"""Names chosen by another user: a file named with terminal escapes in a
shared directory (a title change and a screen clear, a carriage return, a
newline, bytes that are not UTF-8) and a record whose program is one.
Every command that prints it prints it escaped (no C0 or C1 control byte
but the line ends reaches the terminal); --json keeps the exact name, with
its bytes beside it when it is not UTF-8."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pylock
from pylock._lock import record as _record
from tests.support.cli import PYLOCK, cli_env

NAMES = [
    b"e\x1b]0;PWNED\x07\x1b[2J.lock",
    b"cr\rhidden.lock",
    b"nl\nfake: free.lock",
    b"bad\xff\xfe.lock",
    b"c1\xc2\x9b31m.lock",  # U+009B, the one-character CSI
]
EVIL_PROGRAM = "prog\x1b]0;PWNED\x07"


def _controls(data: bytes) -> list[str]:
    """The control characters in data but line ends: C0, DEL, and C1 (as UTF-8)."""
    text = data.decode("utf-8", "replace")
    return [repr(c) for c in text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)]


def _run(*args: bytes | str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PYLOCK, *args], capture_output=True, env=cli_env(), stdin=subprocess.DEVNULL, timeout=60
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stale(path: bytes) -> None:
    """A record naming a process that has exited, its program a terminal escape."""
    body = {"pid": _dead_pid(), "host": "h\x1b[2J", "program": EVIL_PROGRAM, "acquired_at": 1.0}
    with open(path, "wb") as f:
        f.write(_record.encode(json.dumps(body).encode()))


@pytest.fixture
def shared_dir(tmp_path: Path, spawn_holder: Any) -> tuple[bytes, list[bytes], list[bytes]]:
    """A 1777 directory holding each hostile name twice: held, and stale."""
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)
    base = os.fsencode(str(root))
    held, stale = [], []
    for name in NAMES:
        path = base + b"/held-" + name
        spawn_holder(os.fsdecode(path), info={"note": "\x1b[2J"})
        held.append(path)
        path = base + b"/stale-" + name
        _stale(path)
        stale.append(path)
    return base, held, stale


def test_every_command_prints_hostile_names_escaped(shared_dir: Any) -> None:
    base, held, stale = shared_dir
    runs: list[tuple[str, subprocess.CompletedProcess[bytes]]] = []
    for path in held:
        for args in (
            ["run", "-n"],
            ["run", "-w", "0.01"],
            ["run", "-n", "-s"],
            ["wait", "-w", "0"],
        ):
            runs.append(
                (f"{args} {path!r}", _run(*args, path, *(["true"] if "run" in args else [])))
            )
        runs.append((f"who {path!r}", _run("who", path)))
        runs.append((f"who --all {path!r}", _run("who", "--all", path)))
        runs.append((f"run --verbose {path!r}", _run("run", "--verbose", path + b".x", path)))
        missing = path + b"/no/such/dir/x.lock"
        runs.append((f"who missing {path!r}", _run("who", missing)))
        runs.append((f"run missing {path!r}", _run("run", missing, "true")))
    runs.append(("list", _run("list", base)))
    runs.append(("list --stale", _run("list", "--stale", base)))
    runs.append(("list --clean", _run("list", "--clean", base)))
    for what, out in runs:
        assert out.stdout or out.stderr, what
        for stream in (out.stdout, out.stderr):
            assert not _controls(stream), (what, stream)
    listing = runs[-3][1].stdout
    for line in listing.splitlines():  # a newline in a name starts no line of its own
        assert line.startswith((base + b"/", b"  info: ")), line
    assert b"bad\\xff\\xfe.lock" in listing  # bytes that are not UTF-8, as bytes
    assert b"prog\\x1b]0;PWNED\\x07" in listing  # the recorded program, escaped
    assert not any(os.path.exists(path) for path in stale)  # --clean still cleaned


def test_json_keeps_exact_names_with_the_bytes_of_those_not_utf8(shared_dir: Any) -> None:
    base, held, _ = shared_dir
    out = _run("who", "--json", *held)
    assert out.returncode == 0, out.stderr
    reports = json.loads(out.stdout)
    for path, report in zip(held, reports):
        _assert_exact(report, path)
        (holder,) = report["holders"]
        assert holder["info"] == {"note": "\x1b[2J"}
    out = _run("list", "--json", base)
    entries = json.loads(out.stdout)
    assert len(entries) == 2 * len(NAMES)
    by_path = {
        base64.b64decode(e["path_base64"]) if "path_base64" in e else os.fsencode(e["path"]): e
        for e in entries
    }
    for path, entry in by_path.items():
        _assert_exact(entry, path)
        if b"/stale-" in path:
            assert entry["record"]["program"] == EVIL_PROGRAM


def _assert_exact(doc: dict[str, Any], path: bytes) -> None:
    try:
        text = path.decode("utf-8")
    except UnicodeDecodeError:
        assert base64.b64decode(doc["path_base64"]) == path
        assert doc["path"] == path.decode("utf-8", "replace")
    else:
        assert doc["path"] == text and "path_base64" not in doc


def test_lock_errors_escape_the_path_and_keep_it_exact(tmp_path: Path, spawn_holder: Any) -> None:
    path = str(tmp_path / "e\x1b]0;PWNED\x07.lock")
    spawn_holder(path)
    with pytest.raises(pylock.LockHeld) as held:
        pylock.Lock(path).acquire(blocking=False)
    assert held.value.path == path
    assert "\x1b" not in str(held.value) and "\\x1b]0;PWNED\\x07" in str(held.value)
    with pytest.raises(pylock.LockTimeout) as timed_out:
        pylock.Lock(path).acquire(timeout=0.01)
    assert "\x1b" not in str(timed_out.value)
    missing = str(tmp_path / "d\x1b[2J" / "x.lock")
    with pytest.raises(pylock.LockFileError) as bad:
        pylock.Lock(missing).acquire()
    assert bad.value.filename == missing and "\x1b" not in str(bad.value)
