"""Strings from records and from other processes, made safe to print.

A lock file's record is written by whoever can write the file, and a
process chooses its own command line: either may carry terminal escape
sequences (ESC, OSC, a carriage return that hides text, bidi overrides).
Messages and human output show every such character escaped; JSON output
keeps the exact string.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

_MAX_WORD = 40
_MAX_LINE = 80


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def display(text: str) -> str:
    """text with every non-printable character (controls, format characters
    such as bidi overrides, line and paragraph separators, lone surrogates)
    escaped as \\xNN, \\uNNNN or \\UNNNNNNNN: nothing can reach the terminal
    as a control."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def shell_words(words: Sequence[str]) -> str:
    """A command line for one line of a message: escaped, each word at most
    40 characters, quoted when it holds spaces, the whole at most 80."""
    shown = []
    for word in words:
        text = display(word)
        if len(text) > _MAX_WORD:
            text = text[: _MAX_WORD - 3] + "..."
        shown.append(shlex.quote(text) if text != word or " " in text or not text else text)
    line = " ".join(shown)
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."
