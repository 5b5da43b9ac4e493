"""Strings from records and from other processes, made safe to print.

A lock file's record is written by whoever can write the file, and a
process chooses its own command line: either may carry terminal escape
sequences (ESC, OSC, a carriage return that hides text, bidi overrides).
So can a file name in a directory others can write.  Messages and human
output show every such character escaped, paths included; JSON output keeps
the exact string, and gives a name that is not UTF-8 its exact bytes too.
"""

from __future__ import annotations

from collections.abc import Sequence

TYPE_CHECKING = False  # typing is not imported at run time (start-up: bench/README.md)
if TYPE_CHECKING:
    from typing import Any

_MAX_WORD = 40
_MAX_LINE = 80


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a name that is not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def display(text: str) -> str:
    """text with every non-printable character (controls, format characters
    such as bidi overrides, line and paragraph separators, lone surrogates)
    escaped as \\xNN, \\uNNNN or \\UNNNNNNNN (a byte of a name that is not
    UTF-8, decoded with surrogate escapes, as the \\xNN of that byte):
    nothing can reach the terminal as a control."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def escaped_exactly(text: str) -> str:
    """display(text) that can be undone: a backslash is doubled too, and \\xNN
    is a byte (of a name that is not UTF-8, from 80 up), a character from
    U+0080 up \\uNNNN or \\UNNNNNNNN, so each string has one escaped form
    and the form names it.  Always valid UTF-8 (label values, for one)."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        "\\\\" if c == "\\" else c if c.isprintable() else _escape_exactly(c) for c in text
    )


def _escape_exactly(char: str) -> str:
    code = ord(char)
    if 0x80 <= code <= 0xFF:  # not \\xNN: that is the byte of a name not UTF-8
        return f"\\u{code:04x}"
    return _escape(char)


def shell_words(words: Sequence[str]) -> str:
    """A command line for one line of a message: escaped, each word at most
    40 characters, quoted when it holds spaces, the whole at most 80."""
    import shlex  # here, not at the top: it imports re, which `import pylock` must not

    shown = []
    for word in words:
        text = display(word)
        if len(text) > _MAX_WORD:
            text = text[: _MAX_WORD - 3] + "..."
        shown.append(shlex.quote(text) if text != word or " " in text or not text else text)
    line = " ".join(shown)
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."


def stamp(seconds: float) -> str:
    """A moment as every pylock command shows it, in text and in JSON:
    UTC, to the second, "2026-11-29T17:02:11Z"."""
    import datetime as dt

    moment = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- JSON: exact strings, and the bytes of names that are not UTF-8 ---------------


def _exact_bytes(value: str) -> bytes | None:
    """value's bytes if it is not valid UTF-8 text (a name decoded with
    surrogate escapes, or a lone surrogate from a record), else None."""
    try:
        value.encode("utf-8")
        return None
    except UnicodeEncodeError:
        pass
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def json_text(out: dict[str, Any], name: str, value: str | None) -> None:
    """out[name] = value, exactly; when value is not UTF-8 (a file name's
    bytes), out[name] has U+FFFD in place of each bad byte and, beside it,
    out[name + "_base64"] holds the exact bytes (as `pylock who --system`
    writes them)."""
    if value is None:
        out[name] = None
        return
    raw = _exact_bytes(value)
    if raw is None:
        out[name] = value
        return
    import base64

    out[name] = raw.decode("utf-8", "replace")
    out[name + "_base64"] = base64.b64encode(raw).decode("ascii")


def json_texts(out: dict[str, Any], name: str, values: Sequence[str] | None) -> None:
    """json_text for a list (argv): when any item is not UTF-8, out[name +
    "_base64"] lists every item's exact bytes."""
    if values is None:
        out[name] = None
        return
    raws = [_exact_bytes(value) for value in values]
    if all(raw is None for raw in raws):
        out[name] = list(values)
        return
    import base64

    exact = [value.encode() if raw is None else raw for value, raw in zip(values, raws)]
    out[name] = [raw.decode("utf-8", "replace") for raw in exact]
    out[name + "_base64"] = [base64.b64encode(raw).decode("ascii") for raw in exact]
