#!/usr/bin/env bash
# Compile-checks pylock's C core for the platforms this machine cannot run:
# macOS (arm64, x86_64) and the Linux wheel targets other than the host's
# (musl, aarch64), with the C compiler shipped in the `ziglang` package.
# Every csrc/*.c is compiled at -O2 to a throwaway object (which also
# catches the warnings only optimisation reports) with warnings as errors.
# The cffi wrapper module is not compiled here: it needs the target's
# Python headers.
set -euo pipefail

PY=${PY:-python}
# An absolute path (a venv's bin/python is kept as is, not resolved: the
# symlink is what makes it the venv's).
case "$PY" in
    */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
    *) PY=$(command -v "$PY") ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

if ! "$PY" -m ziglang version >/dev/null 2>&1; then
    echo "macos-check: installing ziglang into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install --quiet ziglang
fi
echo "macos-check: zig $("$PY" -m ziglang version)"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

TARGETS=${PYLOCK_CHECK_TARGETS:-"aarch64-macos x86_64-macos x86_64-linux-musl aarch64-linux-musl aarch64-linux-gnu"}
shopt -s nullglob
SOURCES=(csrc/*.c)
if [ ${#SOURCES[@]} -eq 0 ]; then
    echo "macos-check: no C sources in csrc/" >&2
    exit 1
fi

failed=0
checked=0
for target in $TARGETS; do
    defs=()
    case "$target" in
        *-linux-*) defs=(-D_GNU_SOURCE=1) ;; # as csrc/_ffi_build.py does on Linux
    esac
    for src in "${SOURCES[@]}"; do
        obj="$OUT/$target-$(basename "$src" .c).o"
        if "$PY" -m ziglang cc -target "$target" -std=c11 -O2 -Wall -Wextra -Werror \
            "${defs[@]}" -Icsrc -c -o "$obj" "$src"; then
            checked=$((checked + 1))
        else
            echo "macos-check: FAILED $src for $target" >&2
            failed=$((failed + 1))
        fi
    done
    echo "macos-check: $target: ${#SOURCES[@]} files compiled"
done

# The macOS C test programs must link against the macOS core, built from
# the same files csrc/_ffi_build.py compiles there (every symbol resolves in
# libSystem, none is defined twice); they run on a Mac in
# .github/workflows/test.yml.
read -r -a MACOS_CORE <<< "$(python3 csrc/sources.py darwin | sed 's#[^ ]*#csrc/&#g')"
for target in $TARGETS; do
    case "$target" in *-macos) ;; *) continue ;; esac
    for test in csrc/tests/test_proc_macos.c csrc/tests/test_lock_posix.c; do
        [ -f "$test" ] || continue
        if "$PY" -m ziglang cc -target "$target" -std=c11 -O2 -Wall -Wextra -Werror -Icsrc \
            "${MACOS_CORE[@]}" "$test" -o "$OUT/$(basename "$test" .c)-$target"; then
            echo "macos-check: $target: $test linked with the macOS core"
            checked=$((checked + 1))
        else
            echo "macos-check: FAILED linking $test for $target" >&2
            failed=$((failed + 1))
        fi
    done
done

# The per-platform files wrap their whole body in #if guards, so a file can
# compile while containing nothing.  Make sure the macOS build really has
# the process API in it.
sym_objs=("$OUT"/aarch64-macos-*.o)
if [[ " $TARGETS " == *" aarch64-macos "* ]] && [ -f "${sym_objs[0]}" ]; then
    for sym in pl_identity_of pl_proc_open pl_proc_wait pl_proc_returncode pl_sigchld_open \
               pl_sigchld_drain pl_child_poll pl_procs_gone pl_procs_fingerprint \
               pl_lock_wait pl_waiter_cancel pl_wake_signal; do
        # Mach-O symbol names carry a leading underscore.
        if ! LC_ALL=C grep -a -q "_$sym" "${sym_objs[@]}"; then
            echo "macos-check: $sym missing from the macOS object" >&2
            failed=$((failed + 1))
        fi
    done
fi

if [ "$failed" -ne 0 ]; then
    echo "macos-check: $failed failures" >&2
    exit 1
fi
echo "macos-check: $checked compilations passed"
