"""pylock/_native.pyi types every function of the C core for mypy --strict: it
must name exactly the functions the headers' cdef declares, with their
parameters, and the compiled module must have them all."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pylock._native import lib

pytestmark = pytest.mark.checkout  # reads csrc/ and pylock/ of the source tree

ROOT = Path(__file__).resolve().parents[2]

# The wheel check runs the suite against an installed wheel, from a copy of
# tests/ without the sources: there is nothing to compare with then.
pytestmark = pytest.mark.skipif(
    not (ROOT / "csrc" / "pylock.h").exists() or not (ROOT / "pylock" / "_native.pyi").exists(),
    reason="needs a checkout (csrc/ and pylock/_native.pyi)",
)


def cdef_functions() -> dict[str, int]:
    text = ""
    for header in ("pylock.h", "pylock_proc.h"):
        source = (ROOT / "csrc" / header).read_text()
        match = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", source, re.S)
        assert match, header
        text += match.group(1)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    found = {}
    for m in re.finditer(r"\b(pl_\w+)\s*\(([^)]*)\)\s*;", text):
        params = " ".join(m.group(2).split())
        found[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return found


def stub_functions() -> dict[str, int]:
    tree = ast.parse((ROOT / "pylock" / "_native.pyi").read_text())
    lib_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Lib")
    return {
        f.name: len(f.args.args) - 1  # without self
        for f in lib_class.body
        if isinstance(f, ast.FunctionDef)
    }


def test_the_stub_declares_every_c_function_with_its_parameters() -> None:
    assert stub_functions() == cdef_functions()


def test_the_compiled_core_has_every_declared_function() -> None:
    missing = [name for name in cdef_functions() if not hasattr(lib, name)]
    assert missing == []
