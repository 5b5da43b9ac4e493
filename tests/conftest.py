"""Shared fixtures (lock paths, real holder processes, a public directory) and
the suite's gating: on probes of this machine and on declared markers.

- `portable`: the test runs on Linux, macOS and Windows.  Every other test
  uses Linux facilities (/proc, flock(1), mounts, pid namespaces, seccomp) and
  is skipped elsewhere; elsewhere a module is not even imported unless it
  declares ``pytestmark = pytest.mark.portable`` (read from its source), as
  Linux-only modules may import what other platforms lack.
- `root`: the test needs root (mounts, other users, chosen pids); skipped
  for anyone else.
- `slow`: a stress scenario (every test under tests/stress); deselect with
  ``-m "not slow"``.
- `checkout`: the test reads the source tree (csrc/, examples/); skipped when
  the tests run against an installed wheel from a directory of their own.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Before anything imports pylock: the checkout's root goes last on sys.path
# (`python -m pytest` put the working directory first), so `import pylock`
# finds the installed package (editable or not) and `import tests.support`
# still finds this checkout's.
_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _ROOT]
sys.path.append(_ROOT)

from tests.support import CHECKOUT, IS_ROOT, LINUX  # noqa: E402  (after the path fix above)
from tests.support.children import Forked, HolderProcess, NonChild, Sleeper  # noqa: E402  (after the path fix above)
from tests.support.kernel_locks import open_fds  # noqa: E402  (after the path fix above)

__all__ = ["HolderProcess", "open_fds"]

_STRESS_DIR = Path(__file__).parent / "stress"


def _declares_portable(module: Path) -> bool:
    """Whether a test module marks itself portable at module level."""
    tree = ast.parse(module.read_text(encoding="utf-8"), str(module))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "portable" in ast.unparse(node.value)
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if LINUX or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return not _declares_portable(collection_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_linux = pytest.mark.skip(reason="needs Linux (/proc, flock(1), mounts, namespaces)")
    needs_root = pytest.mark.skip(reason="needs root (mounts, other users, chosen pids)")
    needs_checkout = pytest.mark.skip(reason="reads the source tree; these tests run without it")
    for item in items:
        if _STRESS_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
        if not LINUX and item.get_closest_marker("portable") is None:
            item.add_marker(needs_linux)
        if not IS_ROOT and item.get_closest_marker("root") is not None:
            item.add_marker(needs_root)
        if not CHECKOUT and item.get_closest_marker("checkout") is not None:
            item.add_marker(needs_checkout)


def pytest_configure(config: pytest.Config) -> None:
    # A background job of a non-interactive shell (`cmd &`, nohup, some CI
    # runners) starts with SIGINT and SIGQUIT ignored, and every child the
    # tests start would inherit that: the tests that press Ctrl-C on a child
    # would wait for an interrupt that never comes.  The suite's children
    # start from the dispositions a terminal gives; the tests about ignored
    # signals ignore them themselves.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sigquit = getattr(signal, "SIGQUIT", None)
    if sigquit is not None and signal.getsignal(sigquit) is signal.SIG_IGN:
        signal.signal(sigquit, signal.SIG_DFL)


def pytest_report_header() -> str:
    who = "root" if IS_ROOT else "not root: tests marked root are skipped"
    if LINUX:
        return f"pylock: the whole suite (Linux, {who})"
    return f"pylock: {sys.platform}: the tests marked portable only ({who})"


@pytest.fixture
def lock_path(tmp_path: Path) -> str:
    return str(tmp_path / "test.lock")


@pytest.fixture
def spawn_holder() -> Iterator[type[HolderProcess]]:
    started: list[HolderProcess] = []

    class Tracked(HolderProcess):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    yield Tracked
    for holder in started:
        holder.close()


@pytest.fixture(scope="module")
def etcd() -> Iterator[Any]:
    """One etcd for a module (its tests use distinct lock names): started here,
    or the running cluster PYLOCK_ETCD_ENDPOINTS names (.ci/run sets it).
    Afterwards the etcd thread the module's in-process locks started is ended:
    the rest of the suite checks that pylock leaves no threads of its own."""
    from tests.support.etcd_locks import end_etcd_thread, etcd_for_tests

    try:
        with etcd_for_tests() as cluster:
            yield cluster
    finally:
        end_etcd_thread()


@pytest.fixture
def lock_name(request: pytest.FixtureRequest) -> str:
    """A name no other test (nor another run of this one) uses."""
    return f"{request.node.name}-{os.getpid()}"


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    """A child process that runs until its stdin closes (or it is killed)."""
    child = Sleeper()
    yield child
    child.close()


@pytest.fixture
def non_child() -> Iterator[type[NonChild]]:
    """Starts processes that are not this process's children (each ended at the
    end of the test)."""
    made: list[NonChild] = []

    class Tracked(NonChild):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            made.append(self)

    yield Tracked
    for nc in made:
        nc.close()


@pytest.fixture
def forked() -> Iterator[Callable[[Callable[[Forked.Chan], None]], Forked]]:
    """Starts forked copies of this process (each killed at the end of the test)."""
    started: list[Forked] = []

    def start(fn: Callable[[Forked.Chan], None]) -> Forked:
        started.append(Forked(fn))
        return started[-1]

    yield start
    for child in started:
        child.kill()


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory under /tmp every user may traverse (pytest's tmp_path is
    private to its owner), for checks run as another user."""
    d = Path(tempfile.mkdtemp(prefix="pylock-public-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def char_device() -> Iterator[str]:
    """A character device no other process knows of: the slave of a fresh
    pseudo-terminal.  A shared device such as /dev/null may be flocked by any
    process of the host, which would turn a test of locking a device into a
    wait for a stranger."""
    try:
        master, slave = os.openpty()
    except OSError as exc:  # a container without /dev/pts
        pytest.skip(f"no pseudo-terminal to lock as a device: {exc}")
    try:
        yield os.ttyname(slave)
    finally:
        os.close(slave)
        os.close(master)
