"""Run filelock's own tests against pylock.filelock, unchanged.

    python tests/filelock/vendored/run.py        # the modules the front passes, counted
    python tests/filelock/vendored/run.py core/test_registry.py -x   # others, pytest options

The tests are those of filelock's release RELEASE, kept in shared/vendor
beside the checkout (<checkout>/../shared/vendor/filelock-RELEASE, or the
directory PYLOCK_FILELOCK_TESTS names).  Its tests/, docs/ and tasks/ (the
tests read the docs' recipes and the tasks' capability probes) are copied
into a temporary directory and run there by pytest with shim.py as a plugin
(`filelock` is pylock.filelock; stand-ins for the filelock-private helpers
their conftest imports).  Needs pytest-asyncio, pytest-mock and
pytest-timeout; `nox -s filelock_compat` installs them and runs this.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

RELEASE = "4.3.1"
HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]

# The modules whose every test passes against pylock.filelock.  The others
# test what the front does not offer (the README, "Switching from filelock",
# says why for each) or filelock's own internals through its private names.
MODULES = [
    "core/test_lock.py",
    "core/test_threading.py",
    "core/test_singleton.py",
    "async_lock/test_lock.py",
    "async_lock/test_owners.py",
    "async_lock/test_paths.py",
]

INI = """\
[pytest]
testpaths = tests
pythonpath = . tasks
asyncio_default_fixture_loop_scope = session
timeout = 60
markers =
    requires_hard_links: needs os.link
filterwarnings =
    error
    ignore:ResourceTracker called reentrantly for resource cleanup:UserWarning
"""


def vendored() -> Path | None:
    named = os.environ.get("PYLOCK_FILELOCK_TESTS")
    source = Path(named) if named else CHECKOUT.parent / "shared" / "vendor" / f"filelock-{RELEASE}"
    return source if (source / "tests" / "conftest.py").is_file() else None


def _copy(source: Path, into: Path) -> None:
    for part in ("tests", "docs", "tasks"):
        if (source / part).is_dir():
            # Contents only: the source may be read-only (CI's copy of shared/).
            shutil.copytree(
                source / part,
                into / part,
                ignore=shutil.ignore_patterns("__pycache__"),
                copy_function=shutil.copyfile,
            )
    for folder, _, _ in os.walk(into):
        os.chmod(folder, 0o755)
    shutil.copy(HERE / "shim.py", into / "pylock_filelock_shim.py")
    (into / "pytest.ini").write_text(INI, encoding="utf-8")


def _counts(junit: Path) -> dict[str, dict[str, int]]:
    """passed / failed / skipped per test module, from pytest's junit XML."""
    outcomes: dict[tuple[str, str], set[str]] = {}
    for case in ET.parse(junit).iter("testcase"):
        # A test that also fails its teardown is listed twice.
        key = (case.get("classname", ""), case.get("name", ""))
        outcomes.setdefault(key, set()).update(child.tag for child in case)
    counts: dict[str, dict[str, int]] = {}
    for (classname, _), kinds in sorted(outcomes.items()):
        module = classname.replace(".", "/")
        module = module[len("tests/") :] if module.startswith("tests/") else module
        while module and not (junit.parent / "tests" / f"{module}.py").exists():
            module = module.rpartition("/")[0]  # a class inside the module
        tally = counts.setdefault(f"{module}.py", {"passed": 0, "failed": 0, "skipped": 0})
        if kinds & {"failure", "error"}:
            tally["failed"] += 1
        elif "skipped" in kinds:
            tally["skipped"] += 1
        else:
            tally["passed"] += 1
    return counts


def main(argv: list[str]) -> int:
    source = vendored()
    if source is None:
        print(
            f"filelock {RELEASE}'s tests are not here (shared/vendor/filelock-{RELEASE} beside "
            "the checkout, or PYLOCK_FILELOCK_TESTS): nothing to run, skipped"
        )
        return 0
    chosen = [a for a in argv if a.endswith(".py") or "::" in a]
    options = [a for a in argv if a not in chosen]
    with tempfile.TemporaryDirectory(prefix="pylock-filelock-tests-") as tmp:
        root = Path(tmp)
        _copy(source, root)
        junit = root / "junit.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "pylock_filelock_shim",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--junitxml={junit}",
            "-q",
            *options,
            *(f"tests/{m}" for m in chosen or MODULES),
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]))
        rc = subprocess.run(command, cwd=root, env=env).returncode
        if junit.exists():
            print(f"\nfilelock {RELEASE}'s tests against pylock.filelock, per module:")
            for module, tally in sorted(_counts(junit).items()):
                print(
                    f"  {module}: {tally['passed']} passed, {tally['failed']} failed, "
                    f"{tally['skipped']} skipped"
                )
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
