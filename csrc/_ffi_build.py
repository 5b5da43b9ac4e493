"""cffi build script for pylock's C core (API mode, out of line).

The cdef is read from the headers themselves, between the CDEF markers, so
the declarations exist once and are the same on every platform; the
platform differences live in the C files behind #ifdef.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = ["pylock.h", "pylock_proc.h"]
# Each platform compiles its own files (each is also wrapped in its #if),
# listed once in sources.py.
sys.path.insert(0, HERE)
from sources import for_platform  # noqa: E402

SOURCES = for_platform(sys.platform)
del sys.path[0]


def _cdef_of(header: str) -> str:
    with open(os.path.join(HERE, header), encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{header}: no CDEF block")
    return match.group(1)


def _constants() -> str:
    # Every PL_ constant pylock.h defines; values come from the header at
    # compile time (API mode).
    with open(os.path.join(HERE, "pylock.h")) as header:
        names = re.findall(r"^#define (PL_[A-Z_]+) ", header.read(), re.M)
    return "".join(f"#define {name} ...\n" for name in names)


def _free_threaded() -> bool:
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


ffibuilder = FFI()
ffibuilder.cdef(_constants() + "".join(_cdef_of(h) for h in HEADERS))

if sys.platform == "win32":
    _libraries = ["kernel32"]
elif sys.platform.startswith("linux"):
    _libraries = ["rt"]  # timer_create lives in librt before glibc 2.34
else:
    _libraries = []
_extra = [] if sys.platform == "win32" else ["-std=c11", "-Wall", "-Wextra"]
if os.environ.get("PYLOCK_WERROR") == "1" and sys.platform != "win32":
    _extra.append("-Werror")
if _free_threaded() and sys.platform != "win32":
    # cffi (up to 2.1 at least) both passes -D_CFFI_NO_LIMITED_API and writes
    # "#define _CFFI_NO_LIMITED_API" into the wrapper on free-threaded builds:
    # a redefinition warning, fatal under -Werror.  Undefining the command
    # line's copy (-U is applied after -D) leaves the wrapper's own.
    _extra.append("-U_CFFI_NO_LIMITED_API")

ffibuilder.set_source(
    "pylock._native",
    '#include "pylock.h"\n#include "pylock_proc.h"\n',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    libraries=_libraries,
    extra_compile_args=_extra,
    define_macros=[("_GNU_SOURCE", "1")] if sys.platform.startswith("linux") else [],
    # The stable ABI does not exist on free-threaded builds, nor on PyPy
    # (cffi's own backend there: a pypy39-pp73 module, its wheel pp39).
    py_limited_api=not _free_threaded() and sys.implementation.name == "cpython",
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
