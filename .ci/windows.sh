#!/usr/bin/env bash
# Windows C core: cross-compile the Windows sources (csrc/sources.py) with mingw-w64
# (warnings are errors) together with csrc/tests/test_win.c, and run the
# test program under Wine in a fresh prefix.  Also compile-checks the core
# for x86_64 and ARM64 Windows with zig's clang when the ziglang package is
# installed.  Exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CSRC="$ROOT/csrc"
CC=x86_64-w64-mingw32-gcc
# A Python for the ziglang checks: $PY as .ci/run passes it, else the
# README's .venv, else python3.
PY="${PY:-${PYTHON:-}}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
CFLAGS=(-O2 -Wall -Wextra -Werror -I"$CSRC")
WIN_SOURCES=$(python3 "$CSRC/sources.py" win32)

if ! command -v "$CC" >/dev/null || ! command -v wine >/dev/null; then
    echo "windows: installing mingw-w64 and wine"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends gcc-mingw-w64-x86-64 wine64 wine >/dev/null
fi

WORK="$(mktemp -d)"
export WINEPREFIX="$WORK/prefix"
export WINEDEBUG=-all
cleanup() {
    wineserver -k >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "windows: compiling the core (mingw-w64, C11 and GNU C, -Werror)"
for std in -std=c11 -std=gnu11; do
    for src in $WIN_SOURCES; do
        "$CC" "$std" "${CFLAGS[@]}" -c "$CSRC/$src" -o "$WORK/${src%.c}.o"
    done
done
"$CC" -municode "${CFLAGS[@]}" -o "$WORK/test_win.exe" \
    "$CSRC/tests/test_win.c" $(for s in $WIN_SOURCES; do printf '%s ' "$CSRC/$s"; done)

# Every function of the cffi cdef must be defined by the Windows objects
# (their bodies sit under #ifdef _WIN32, so an empty file would compile).
want=$(sed -n '/CDEF-BEGIN/,/CDEF-END/p' "$CSRC/pylock.h" "$CSRC/pylock_proc.h" |
    grep -oE '\bpl_[a-z_]+\(' | tr -d '(' | sort -u)
have=$(for src in $WIN_SOURCES; do echo "$WORK/${src%.c}.o"; done |
    xargs x86_64-w64-mingw32-nm -g --defined-only | awk '$2 == "T" {print $3}' | sort -u)
missing=$(comm -23 <(echo "$want") <(echo "$have"))
if [ -n "$missing" ]; then
    echo "windows: the Windows core does not define: $missing" >&2
    exit 1
fi
echo "windows: all $(echo "$want" | wc -l) API functions defined"

zig_ok=1
if ! "$PY" -m ziglang version >/dev/null 2>&1; then
    # Only ever into a virtual environment, never a system Python.
    if "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
        echo "windows: installing ziglang into $("$PY" -c 'import sys; print(sys.prefix)')"
        "$PY" -m pip install --quiet ziglang
    else
        zig_ok=0
        echo "windows: SKIP the zig x86_64/ARM64 compile checks: $PY has no ziglang and is" \
            "not a virtual environment (run .ci/run, or set PY to a venv's python)"
    fi
fi
# zig's -fsyntax-only insists on renaming an object it never wrote, so
# compile for real; a private cache keeps concurrent runs apart.
export ZIG_GLOBAL_CACHE_DIR="$WORK/zig" ZIG_LOCAL_CACHE_DIR="$WORK/zig"
if [ "$zig_ok" = 1 ]; then
    for target in x86_64-windows-gnu aarch64-windows-gnu; do
        echo "windows: compiling the core for $target (zig $("$PY" -m ziglang version), -Werror)"
        for std in -std=c11 -std=gnu11; do
            for src in $WIN_SOURCES; do
                "$PY" -m ziglang cc -target "$target" "$std" "${CFLAGS[@]}" -c "$CSRC/$src" \
                    -o "$WORK/$target-${src%.c}.o"
            done
        done
    done
fi

echo "windows: preparing a fresh Wine prefix"
wineboot --init >/dev/null 2>&1 || true

echo "windows: running test_win.exe under $(wine --version 2>/dev/null)"
status=0
(cd "$WORK" && timeout 600 wine test_win.exe) | tee "$WORK/test.log" || status=$?
last="$(tail -n 1 "$WORK/test.log" | tr -d '\r')"
if [ "$status" -ne 0 ] || ! [[ "$last" =~ ^[0-9]+\ passed,\ 0\ failed$ ]]; then
    echo "windows: FAILED (exit status $status)" >&2
    exit 1
fi
echo "windows: ok"
