#!/usr/bin/env bash
# pylock on free-threaded CPython: builds (once per machine, see
# .ci/freethreaded-python.sh) or reuses the interpreter, installs cffi and
# pylock (editable, in a copy of the files git would ship) on it in a fresh
# virtual environment, checks that importing pylock leaves the GIL disabled,
# then runs the test suite (-m "not slow") and the 16-thread stress
# (tests/stress/test_threads.py).
#
# Arguments are passed to pytest instead of the default selection.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${PYLOCK_FT_CACHE:-/var/cache/pylock-ft}
say() { printf '\n== free-threaded: %s\n' "$*"; }
# pip warns about every package missing from a configured local index.
quiet_pip() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

say "interpreter"
t0=$(date +%s)
FT=$(bash "$ROOT/.ci/freethreaded-python.sh")
echo "interpreter ready in $(($(date +%s) - t0)) s: $FT"
"$FT" -VV
minor=$("$FT" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

WORK=$(mktemp -d /tmp/pylock-ft.XXXXXX)
chmod 755 "$WORK" # some tests run the installed package as another user
trap 'rm -rf "$WORK"' EXIT
"$FT" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
# hypothesis: the newest releases carry a native part without 3.13t wheels.
quiet_pip "$VPY" -m pip install --quiet --upgrade --only-binary hypothesis pip setuptools pytest hypothesis

say "cffi"
if [ "$minor" != 3.13 ]; then
    # cffi 2.0 supports free-threaded CPython from 3.14t on.
    quiet_pip "$VPY" -m pip install --quiet "cffi>=2.0"
else
    # cffi 2.x refuses to build for 3.13t in its setup.py ("Upgrade to
    # free-threaded 3.14"): its free-threading code (PyMutex, critical
    # sections) compiles on 3.13t, but upstream only tests 3.14t.  This
    # machine cannot fetch a 3.14 source (see freethreaded-python.sh), so
    # the newest cffi is built with that one version check lowered to 3.13,
    # once per machine; everything else is cffi's release as published.
    mkdir -p "$CACHE/wheels"
    wheel=$(ls "$CACHE"/wheels/cffi-*-cp313-cp313t-*.whl 2>/dev/null | tail -1 || true)
    if [ -z "$wheel" ]; then
        src="$WORK/cffi-src"
        mkdir -p "$src"
        # Downloaded by a GIL build's pip: preparing cffi's metadata on 3.13t
        # would run the very check lowered below.
        quiet_pip "${PYLOCK_HOST_PYTHON:-python3}" -m pip download --quiet --no-deps \
            --no-binary :all: "cffi>=2.0" -d "$src"
        tar -xzf "$src"/cffi-*.tar.gz -C "$src"
        setup=$(ls "$src"/cffi-*/setup.py)
        grep -q 'FREE_THREADED_BUILD and sys.version_info < (3, 14)' "$setup" ||
            { echo "cffi's setup.py no longer has the 3.14 check this script lowers" >&2; exit 1; }
        sed -i 's/FREE_THREADED_BUILD and sys.version_info < (3, 14)/FREE_THREADED_BUILD and sys.version_info < (3, 13)/' "$setup"
        quiet_pip "$VPY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$CACHE/wheels" "$(dirname "$setup")"
        wheel=$(ls "$CACHE"/wheels/cffi-*-cp313-cp313t-*.whl | tail -1)
    fi
    quiet_pip "$VPY" -m pip install --quiet "$wheel"
fi
"$VPY" -c 'import cffi, sys; print("cffi", cffi.__version__, "on", sys.version.split()[0])'

say "pylock (warnings as errors), from the files git would ship"
SRC="$WORK/src"
mkdir -p "$SRC"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        xargs -0 cp --parents -t "$SRC")
else
    cp -r "$ROOT/." "$SRC"
fi
# Editable, as the README installs it: the suite also checks the source
# tree (the stub against the headers, the examples, a second copy of pylock).
PYLOCK_WERROR=1 quiet_pip "$VPY" -m pip install --quiet --no-build-isolation --no-deps -e "$SRC"
# Importing pylock (and so its cffi extension) must leave the GIL off:
# an extension that does not declare free-threading support turns it on.
(cd "$WORK" && "$VPY" -c '
import sys, sysconfig
assert sysconfig.get_config_var("Py_GIL_DISABLED"), "not a free-threaded build"
import pylock
from pylock import _native
assert pylock.__file__.startswith(sys.argv[1]), pylock.__file__
assert not sys._is_gil_enabled(), "importing pylock enabled the GIL"
print("pylock", pylock.__version__, "imported from", pylock.__file__, "; the GIL stays disabled")' "$SRC")

say "the suite and the 16-thread stress on $("$FT" -c 'import sys; print(sys.version.split()[0])')t"
RUN="$SRC"
run_pytest() {
    set +e
    (cd "$RUN" && env -u PYTHONPATH timeout -k 30 "${PYLOCK_FT_SUITE_TIMEOUT:-1800}" \
        "$VPY" -m pytest -p no:cacheprovider -rfEsxX "$@")
    local rc=$?
    set -e
    case $rc in
        0) ;;
        124 | 137) echo "free-threaded: pytest $* hung: stopped after ${PYLOCK_FT_SUITE_TIMEOUT:-1800} s" >&2; exit 1 ;;
        *) echo "free-threaded: pytest $* failed (exit $rc)" >&2; exit 1 ;;
    esac
}
if [ $# -gt 0 ]; then
    run_pytest "$@"
else
    t0=$(date +%s)
    run_pytest tests -m "not slow"
    echo "free-threaded: suite (not slow) in $(($(date +%s) - t0)) s"
    t0=$(date +%s)
    run_pytest tests/stress/test_threads.py
    echo "free-threaded: thread stress in $(($(date +%s) - t0)) s"
fi
echo "free-threaded: passed"
