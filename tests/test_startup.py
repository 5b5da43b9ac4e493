"""Start-up cost: what `import pylock` and a first acquisition load.

Services import pylock at start and operators run `pylock run` from shell
loops, so the modules that dominate an interpreter's start (typing,
dataclasses with inspect, logging, re, json, socket, threading, asyncio)
must not be loaded by importing pylock or by taking a first lock.  The
timings themselves are benchmarks (bench/run.py, section "startup"); these
tests pin down the imports that make them, in fresh interpreters.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pylock._core import process as _process
from pylock._lock import record as _record

HEAVY = (
    "asyncio",
    "dataclasses",
    "inspect",
    "json",
    "logging",
    "re",
    "socket",
    "threading",
    "typing",
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter has loaded after running code."""
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        f"print(' '.join(sorted(m for m in {HEAVY!r} if m in sys.modules and m not in before)))\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return set(res.stdout.split())


def test_import_pylock_loads_no_heavy_module() -> None:
    assert _loaded_after("import pylock") == set()


def test_first_acquisition_loads_no_heavy_module(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "first.lock")
    code = (
        "import pylock\n"
        f"lock = pylock.Lock({path!r})\n"
        "lock.acquire()\n"
        "lock.release()\n"
        "lock.close()\n"
    )
    assert _loaded_after(code) == set()


def test_lazy_names_resolve() -> None:
    code = (
        "import pylock\nassert pylock.Holder.__name__ == 'Holder'\nassert callable(pylock.holders)"
    )
    loaded = _loaded_after(code)
    assert "dataclasses" in loaded  # the holder lookup really was deferred to here
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        import pylock

        pylock.nonexistent  # noqa: B018


# -- the record's JSON without json ------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(), st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)


@given(_values)
def test_compact_json_is_json_dumps(value: object) -> None:
    assert _record._compact_json(value) == json.dumps(value, separators=(",", ":"))


@given(st.lists(st.text()), st.text(), st.integers(min_value=0))
def test_compact_json_of_record_fields(argv: list[str], host: str, pid: int) -> None:
    fields = {"pid": pid, "host": host, "argv": argv, "info": {"k": [1, 2.5, None, True]}}
    assert _record._compact_json(fields) == json.dumps(fields, separators=(",", ":"))


def test_hostname_is_gethostname() -> None:
    assert _record.hostname() == socket.gethostname()


# -- ProcessIdentity without dataclasses -------------------------------------


def test_process_identity_is_an_immutable_value() -> None:
    a = _process.ProcessIdentity(10, 500, "boot", 77)
    b = _process.ProcessIdentity(pid=10, start_time=500, boot_id="boot", pidfs_ino=77)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != a.replace(pid=11) and a.replace(pid=11).pid == 11
    assert a.replace(start_time=1) == _process.ProcessIdentity(10, 1, "boot", 77)
    assert _process.ProcessIdentity(1, 2, "x").pidfs_ino == 0
    assert a != (10, 500, "boot", 77)
    with pytest.raises(AttributeError):
        a.pid = 12  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del a.boot_id  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "ProcessIdentity(pid=10, start_time=500, boot_id='boot', pidfs_ino=77)"
