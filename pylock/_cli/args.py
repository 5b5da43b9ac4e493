"""The pylock command's option parsing: getopt_long as util-linux uses it.

Each subcommand declares a table of Option entries; parse() reads options
until the first operand (or "--"), as getopt_long with a leading "+" does, so
"pylock run FILE cmd -x" passes "-x" to cmd.  Short options cluster ("-nx",
"-w5"), long ones take "--name=value" or "--name value" and may be shortened
to any unambiguous prefix.  Every mistake is a UsageError: one line, exit 64.

Adding an option to a subcommand is one more Option in its table (with a
converter for its argument); parse() and the help text pick it up.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays unloaded: `pylock run` starts in shell loops
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any


class UsageError(Exception):
    """A command line pylock cannot run: reported in one line, exit 64."""


class Option:
    """One option: its spellings, where its value goes, and its help line.

    short: one-letter spellings ("xe" for -x and -e); long: long spellings.
    convert: None for a flag (which stores const); otherwise a function from
    the argument's text to its value, raising UsageError when it is invalid.
    """

    __slots__ = ("const", "convert", "dest", "help", "long", "metavar", "short")

    def __init__(
        self,
        short: str,
        long: tuple[str, ...],
        dest: str,
        help: str,
        convert: Callable[[str], Any] | None = None,
        const: Any = True,
        metavar: str = "",
    ) -> None:
        self.short = short
        self.long = long
        self.dest = dest
        self.help = help
        self.convert = convert
        self.const = const
        self.metavar = metavar


def parse(
    options: Sequence[Option], argv: Sequence[str], defaults: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The values of the options at the front of argv, and the operands after them."""
    values = dict(defaults)
    shorts = {letter: opt for opt in options for letter in opt.short}
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        index += 1
        if word.startswith("--"):
            name, eq, inline = word[2:].partition("=")
            opt = _long_option(options, name)
            if opt.convert is None:
                if eq:
                    raise UsageError(f"option '--{opt.long[0]}' doesn't allow an argument")
                values[opt.dest] = opt.const
                continue
            if not eq:
                if index >= len(argv):
                    raise UsageError(f"option '--{opt.long[0]}' requires an argument")
                inline = argv[index]
                index += 1
            values[opt.dest] = opt.convert(inline)
            continue
        pos = 1
        while pos < len(word):
            letter = word[pos]
            pos += 1
            opt_or_none = shorts.get(letter)
            if opt_or_none is None:
                raise UsageError(f"invalid option -- '{letter}'")
            opt = opt_or_none
            if opt.convert is None:
                values[opt.dest] = opt.const
                continue
            if pos < len(word):
                text = word[pos:]
            elif index < len(argv):
                text = argv[index]
                index += 1
            else:
                raise UsageError(f"option requires an argument -- '{letter}'")
            values[opt.dest] = opt.convert(text)
            break
    return values, list(argv[index:])


def _long_option(options: Sequence[Option], name: str) -> Option:
    exact = [opt for opt in options if name in opt.long]
    if exact:
        return exact[0]
    matches: dict[str, Option] = {}
    spellings = []
    for opt in options:
        for spelling in opt.long:
            if spelling.startswith(name) and name:
                matches.setdefault(opt.dest + repr(opt.const), opt)
                spellings.append(f"'--{spelling}'")
    if len(matches) == 1:
        return next(iter(matches.values()))
    if matches:
        raise UsageError(f"option '--{name}' is ambiguous; possibilities: {' '.join(spellings)}")
    raise UsageError(f"unrecognized option '--{name}'")


def help_lines(options: Sequence[Option]) -> list[str]:
    """The options part of a help text, one line per option."""
    rows = []
    for opt in options:
        names = [f"-{letter}" for letter in opt.short] + [f"--{name}" for name in opt.long]
        left = ", ".join(names)
        if opt.convert is not None:
            left += f" {opt.metavar or 'VALUE'}"
        if not opt.short:
            left = "    " + left
        rows.append((left, opt.help))
    width = min(max(len(left) for left, _ in rows), 26) + 2
    lines = []
    for left, text in rows:
        if len(left) >= width:  # too wide: the text goes on a line of its own
            lines.append(f" {left}")
            left = ""
        lines.append(f" {left.ljust(width)}{text}")
    return lines


HELP = Option("h", ("help",), "help", "show this help and exit")  # every subcommand has it


# -- argument converters --------------------------------------------------------


def seconds(text: str) -> float:
    """A timeout in seconds: 0, fractions and exponents; never negative or infinite."""
    value = _float(text)
    if value is None or value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise UsageError(f"invalid timeout value: '{text}' (seconds, 0 or more)")
    return value


def _float(text: str) -> float | None:
    stripped = text.strip()
    if not stripped or "_" in stripped:
        return None
    try:
        return float(stripped)
    except ValueError:
        pass
    if not stripped.lstrip("+-").lower().startswith("0x"):
        return None
    try:
        return float.fromhex(stripped)  # strtod reads "0x10" too, as flock(1) does
    except ValueError:
        return None


def decimal(text: str, what: str) -> int:
    """A decimal integer as strtol reads it (leading blanks and sign allowed)."""
    stripped = text.lstrip()
    if not stripped or "_" in stripped or stripped != stripped.rstrip():
        raise UsageError(f"{what}: '{text}'")
    try:
        return int(stripped, 10)
    except ValueError:
        raise UsageError(f"{what}: '{text}'") from None


def exit_code(text: str) -> int:
    value = decimal(text, "invalid exit code")
    if not 0 <= value <= 255:
        raise UsageError("exit code out of range (expected 0 to 255)")
    return value


def descriptor(text: str) -> int:
    value = decimal(text, "bad file descriptor")
    if not 0 <= value < 2**31:
        raise UsageError(f"bad file descriptor: '{text}'")
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (loaded only when used), that
    a holder record can carry: no NaN or infinity (1e999 is one), at most
    16 KiB, as pylock.Lock(info=...) checks it."""
    import json

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number pylock records")

    def finite(number: str) -> float:
        value = float(number)
        if value in (float("inf"), float("-inf")):
            raise ValueError(f"{number} is too large for a JSON number (it would be infinity)")
        return value

    try:
        value = json.loads(text, parse_constant=refuse, parse_float=finite)
    except RecursionError:
        raise UsageError("--info nests too deeply to be recorded") from None
    except ValueError as exc:
        raise UsageError(f"--info is not JSON pylock can record: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--info needs a JSON object, not {type(value).__name__}")
    from .._lock.record import check_info

    try:
        check_info(value)
    except ValueError as exc:
        raise UsageError(f"--info: {exc}") from None
    return value
