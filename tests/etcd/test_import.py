"""pylock.etcd without its client: the import says what to install, and on
Python 3.9 (where the `etcd` extra installs nothing) that it needs 3.10."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from tests.support import env_with_repo

# As if aetcd were not installed: its import fails as a missing module's does.
WITHOUT_AETCD = textwrap.dedent(
    """
    import sys
    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "aetcd":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NotInstalled())
    """
)
# On Python 3.9 no install brings aetcd, and the message says that instead
# (test_importing_pylock_etcd_on_python_3_9_says_it_needs_3_10).
where_aetcd_exists = pytest.mark.skipif(
    sys.version_info < (3, 10), reason="on Python 3.9 pylock.etcd says it needs 3.10 instead"
)


# On Python 3.9 (CPython's or PyPy's) the extra installs nothing: the
# message says that instead (test_importing_pylock_etcd_on_python_3_9...).
OLD_PYTHON = sys.version_info < (3, 10)
NEEDS_310 = "pylock.etcd needs Python 3.10 or newer"


def run(code: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", code], env=env_with_repo(), capture_output=True, text=True, timeout=60
    )


@where_aetcd_exists
def test_importing_pylock_etcd_without_aetcd_says_what_to_install():
    done = run(
        WITHOUT_AETCD
        + "try:\n    from pylock.etcd import EtcdLock\n"
        + "except ModuleNotFoundError as exc:\n    print(exc.name, '|', exc)\n"
    )
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.partition(" | ")
    assert name == "aetcd"
    if OLD_PYTHON:
        assert message.startswith(NEEDS_310), message
    else:
        assert "pip install 'pylock-kernel[etcd]'" in message
        assert "No module named 'aetcd'" in message


@where_aetcd_exists
def test_the_command_line_without_aetcd_says_what_to_install_in_one_line():
    done = run(
        WITHOUT_AETCD
        + "from pylock._cli.main import main\n"
        + "sys.exit(main(['who', '--etcd', '127.0.0.1:1', 'job']))\n"
    )
    assert done.returncode == 69
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert (NEEDS_310 if OLD_PYTHON else "pip install 'pylock-kernel[etcd]'") in done.stderr


def test_the_etcd_extra_installs_aetcd_only_where_aetcd_runs():
    # What the installed distribution declares (pyproject.toml, as built).
    markers = pytest.importorskip("packaging.markers")  # pytest's own dependency
    requirements = pytest.importorskip("packaging.requirements")

    declared = [requirements.Requirement(text) for text in metadata.requires("pylock-kernel") or []]
    [requirement] = [r for r in declared if r.name == "aetcd"]
    marker = requirement.marker or markers.Marker("python_version >= '0'")

    def wanted(version: str, extra: str = "etcd") -> bool:
        return bool(marker.evaluate({"python_version": version, "extra": extra}))

    assert not wanted("3.9") and wanted("3.10") and wanted("3.14")
    assert not wanted("3.12", extra="")  # only with the extra


def _python39_with_cffi() -> str | None:
    """A Python 3.9 on this machine that can import pylock's core (cffi), if any."""
    home = os.path.expanduser("~")
    candidates = [shutil.which("python3.9"), *glob.glob(f"{home}/.pyenv/versions/3.9*/bin/python")]
    if sys.version_info[:2] == (3, 9):  # this one, which runs pylock already
        candidates.insert(0, sys.executable)
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", "import cffi"], capture_output=True).returncode == 0:
            return python
    return None


def test_importing_pylock_etcd_on_python_3_9_says_it_needs_3_10():
    python = _python39_with_cffi()
    if python is None:
        pytest.skip("no Python 3.9 with cffi on this machine (python3.9 on PATH, or pyenv's)")
    done = run("import pylock\nimport pylock.etcd\n", python)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: {NEEDS_310}")
    assert "this is Python 3.9" in last and "installs nothing" in last
