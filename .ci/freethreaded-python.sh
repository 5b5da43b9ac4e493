#!/usr/bin/env bash
# Builds a free-threaded CPython (--disable-gil) from Debian's source package
# and prints the path of its interpreter.  Built once per machine: the result
# is kept under $PYLOCK_FT_CACHE (default /var/cache/pylock-ft) and reused
# while it still runs with the GIL disabled.
#
# Debian 12 ships CPython 3.11 only.  cffi supports free-threading from 3.14t
# on (cffi 2.0), so python3.14 from Debian unstable's source index is tried
# first; where its files cannot be fetched (this project's Debian mirror
# serves the index but answers 404 for python3.14's files), python3.13 from
# Debian 13 is built instead (see build_cffi in .ci/freethreaded-run.sh for
# what that means for cffi).  The indexes are read through a private apt
# configuration under the cache: the machine's own apt sources are left
# untouched.  The orig tarball is CPython's release tarball; apt checks it
# against the signed Sources index.
#
# Progress goes to stderr; stdout is only the interpreter's path.
set -euo pipefail

CACHE=${PYLOCK_FT_CACHE:-/var/cache/pylock-ft}
PREFIX="$CACHE/python-ft"
log() { printf 'ft-python: %s\n' "$*" >&2; }

gil_disabled() {
    PYTHON=$(ls "$PREFIX"/bin/python3.*t 2>/dev/null | grep -E '/python3\.[0-9]+t$' | head -1)
    [ -n "$PYTHON" ] && [ -x "$PYTHON" ] &&
        "$PYTHON" -c 'import sys, sysconfig
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1
assert not sys._is_gil_enabled()' 2>/dev/null
}

# A free-threaded interpreter that is already there (GitHub's setup-python
# provides one) is used as it is.
if [ -n "${PYLOCK_FT_PYTHON:-}" ]; then
    PYTHON=$PYLOCK_FT_PYTHON
    "$PYTHON" -c 'import sys, sysconfig
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1 and not sys._is_gil_enabled()' ||
        { log "PYLOCK_FT_PYTHON=$PYTHON is not a free-threaded interpreter"; exit 1; }
    echo "$PYTHON"
    exit 0
fi

if gil_disabled; then
    log "cached: $("$PYTHON" -VV | tr '\n' ' ')"
    echo "$PYTHON"
    exit 0
fi

start=$(date +%s)
APT="$CACHE/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$CACHE/src"
cat >"$APT/sources.list" <<SOURCES
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
SOURCES
apt_private() {
    apt-get -o "Dir::Etc::SourceList=$APT/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
        -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" "$@"
}
log "reading Debian's source indexes (private apt lists in $APT)"
apt_private -qq update >&2
orig=
for package in python3.14 python3.13/trixie; do
    log "downloading the $package source package"
    rm -f "$CACHE"/src/*
    if (cd "$CACHE/src" && apt_private -qq source --download-only "$package" >&2); then
        orig=$(ls "$CACHE"/src/python3.*.orig.tar.xz)
        break
    fi
    log "$package: its source could not be fetched"
done
[ -n "$orig" ] || { log "no CPython source package could be fetched"; exit 1; }
log "source: $(basename "$orig")"

build="$CACHE/build"
rm -rf "$build"
mkdir -p "$build"
tar -xJf "$orig" -C "$build" --strip-components=1
cd "$build"
# No PGO/LTO: the interpreter runs tests, it is not benchmarked, and PGO
# would triple the build time on CI's two cores.
log "configure --disable-gil --prefix=$PREFIX"
./configure --disable-gil --prefix="$PREFIX" --with-ensurepip=install >"$CACHE/configure.log" 2>&1 ||
    { tail -30 "$CACHE/configure.log" >&2; exit 1; }
log "make -j$(nproc) (log: $CACHE/make.log)"
make -j"$(nproc)" >"$CACHE/make.log" 2>&1 || { tail -40 "$CACHE/make.log" >&2; exit 1; }
rm -rf "$PREFIX"
make install >"$CACHE/install.log" 2>&1 || { tail -40 "$CACHE/install.log" >&2; exit 1; }
cd "$CACHE"
rm -rf "$build"
gil_disabled || { log "built $PYTHON but it does not run free-threaded"; exit 1; }
log "built in $(($(date +%s) - start)) s: $("$PYTHON" -VV | tr '\n' ' ')"
echo "$PYTHON"
