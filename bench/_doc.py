"""Markdown tables for the report: the document, number formats, latency tables."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from _targets import fmt_ns, get, p99

if TYPE_CHECKING:
    from _common import Row


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}/s"


def faster(pylock: float, other: float, floor: bool = False) -> str:
    """pylock's time against another's, in words."""
    if floor:
        return f"pylock = {pylock / other:.2f}x this"
    if other >= pylock:
        return f"pylock {other / pylock:.1f}x faster"
    return f"pylock {pylock / other:.2f}x slower"


class Doc:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(head) + " |", "|" + "---|" * len(head))
        for r in rows:
            self.add("| " + " | ".join(r) + " |")
        self.add("")

    def error_row(self, section: str, row: Row, width: int, label: str) -> list[str]:
        self.failed.append(f"{section}: {row.lib}")
        msg = (row.error or "no samples").replace("|", "\\|").replace("\n", " ")
        return [label, f"not measured: {msg}"] + [""] * (width - 2)


def latency_table(
    d: Doc,
    section: str,
    rows: dict[str, Row],
    order: list[tuple[str, str, str | None, bool]],
    with_max: bool,
) -> None:
    """order: (key, label, pylock key to compare with or None, compare as floor)."""
    head = (
        ["", "median", "p99"]
        + (["max"] if with_max else [])
        + ["trials", "pylock vs this (medians)"]
    )
    out = []
    for key, label, ref, is_floor in order:
        row = rows.get(key)
        if row is None:
            continue
        if not row.ok:
            out.append(d.error_row(section, row, len(head), label))
            continue
        m = median(row.samples)
        cells = [label, fmt_ns(m), fmt_ns(p99(row.samples))]
        if with_max:
            cells.append(fmt_ns(max(row.samples)))
        cells.append(str(len(row.samples)))
        refrow = get(rows, ref) if ref else None
        if ref is None or key == ref:
            cells.append("")
        elif refrow is None:
            cells.append("pylock not measured")
        else:
            cells.append(faster(median(refrow.samples), m, is_floor))
        out.append(cells)
    d.table(head, out)
