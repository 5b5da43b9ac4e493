"""escaped_exactly: one escaped form per string (so a label names one path),
always valid UTF-8, and readable text left as it is."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from pylock._core.display import escaped_exactly


def _unescape(text: str) -> str:
    """The inverse: what makes the escape lossless."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "\\":
            out.append(text[i])
            i += 1
            continue
        kind = text[i + 1]
        if kind == "\\":
            out.append("\\")
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}[kind]
        code = int(text[i + 2 : i + 2 + width], 16)
        if kind == "x" and code >= 0x80:  # a byte of a name that is not UTF-8
            code += 0xDC00
        out.append(chr(code))
        i += 2 + width
    return "".join(out)


@given(st.binary(max_size=40))
def test_every_name_of_bytes_escapes_to_utf8_and_back(name):
    text = os.fsdecode(name)
    escaped = escaped_exactly(text)
    escaped.encode("utf-8")  # never raises
    assert escaped.isprintable()
    assert os.fsencode(_unescape(escaped)) == name


def test_readable_text_is_kept():
    assert escaped_exactly("/var/lock/ünïcode job.lock") == "/var/lock/ünïcode job.lock"
    assert escaped_exactly("a\\xff") == "a\\\\xff"
    assert escaped_exactly(os.fsdecode(b"a\xff")) == "a\\xff"
    assert escaped_exactly("a\x85") == "a\\u0085"  # U+0085, not the byte 0x85
