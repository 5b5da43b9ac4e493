"""`pylock who --system` as text (every string from a process or a file
escaped) and as JSON (every string exact: a name whose bytes are not UTF-8
is written with U+FFFD in its place and, beside it under NAME_base64, its
exact bytes)."""

from __future__ import annotations

import os
from typing import Any

from .._core.display import display, json_text, json_texts, shell_words, stamp
from .._core.locktable import FileKey
from .._core.waitgraph import Deadlock
from .._lock.record import hostname
from .report import duration
from .system_view import FileView, HolderView, Process, Snapshot


def file_name(key: FileKey | None) -> str:
    """The kernel's name of a file: "MAJ:MIN:INODE" in /proc/locks' notation."""
    if key is None:
        return "<none>"
    return f"{key[0]:02x}:{key[1]:02x}:{key[2]}"


# -- text -------------------------------------------------------------------------


def summary(snap: Snapshot) -> str:
    locks = sum(view.lock.count for f in snap.files for view in f.locks)
    waiting = sum(len(f.waiters) for f in snap.files)
    text = (
        f"{stamp(snap.taken)}  {_plural(locks, 'lock')} on {_plural(len(snap.files), 'file')}, "
        f"{waiting} waiting, {_plural(len(snap.deadlocks), 'deadlock')}"
    )
    if snap.hidden:
        text += f"; {_plural(len(snap.hidden), 'process')} whose descriptors are hidden from pylock"
    return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


def _range(start: int, end: int | None, kind: str) -> str:
    if kind == "FLOCK":
        return ""
    return f"{start}-{'EOF' if end is None else end}"


def _who(pid: int, snap: Snapshot) -> list[str]:
    """The pid, user and command columns (escaped once per process)."""
    found: list[str] | None = snap.rendered.get(("text", pid))
    if found is None:
        proc = snap.processes.get(pid)
        if pid <= 0:
            found = ["pid ?", "", ""]
        elif proc is None:
            found = [f"pid {pid}", "", "(gone)"]
        else:
            found = [f"pid {pid}", display(proc.user), _command(proc) or "(gone)"]
        snap.rendered["text", pid] = found
    return found


_COMMAND_WIDTH = 48


def _command(proc: Process) -> str:
    """The command line, escaped, its program by name, cut to a column's width."""
    if not proc.argv:
        return display(proc.program)
    text = shell_words([os.path.basename(proc.argv[0]), *proc.argv[1:]])
    return text if len(text) <= _COMMAND_WIDTH else text[: _COMMAND_WIDTH - 3] + "..."


def _named(pid: int, processes: dict[int, Process]) -> str:
    """ "pid N (command)" for a sentence."""
    proc = processes.get(pid)
    command = _command(proc) if proc is not None else ""
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def _holder_note(holder: HolderView, now: float) -> str:
    notes = []
    if holder.since is not None:
        notes.append(f"since {stamp(holder.since)} ({duration(now - holder.since)})")
    if not holder.verified:
        notes.append(f"[unverified: {holder.note}]" if holder.pid else f"[{holder.note}]")
    if holder.info:
        import json

        notes.append(f"info {json.dumps(holder.info, sort_keys=True)}")
    return "  ".join(notes)


def _file_rows(view: FileView, snap: Snapshot) -> list[list[str]]:
    rows = []
    for lock_view in view.locks:
        lock = lock_view.lock
        mode = lock.mode if lock.count == 1 else f"{lock.mode}x{lock.count}"
        for holder in lock_view.holders:
            who = _who(holder.pid, snap)
            note = _holder_note(holder, snap.taken)
            rows.append(["  held", lock.kind, mode, _range(lock.start, lock.end, lock.kind)])
            rows[-1] += [*who, note]
    for waiter_view in view.waiters:
        want = waiter_view.waiter
        pids = waiter_view.waits_for
        note = "waits for " + (", ".join(f"pid {p}" for p in pids) or "a holder pylock cannot see")
        if want.behind is not None:
            note += f", queued behind pid {want.behind}"
        if want.pid <= 0:
            note += " (an OFD request: the kernel does not name its process)"
        elif want.pid_from_syscall:
            note += " (named by its thread blocked in fcntl: /proc/locks shows -1)"
        rows.append(["  waiting", want.kind, want.mode, _range(want.start, want.end, want.kind)])
        rows[-1] += [*_who(want.pid, snap), note]
    return rows


def text_lines(snap: Snapshot) -> list[str]:
    """The listing: each file, then its holders and waiters as aligned columns,
    then each deadlock."""
    blocks: list[tuple[str, list[list[str]]]] = []
    for view in snap.files:
        title = display(view.path) if view.path is not None else f"{file_name(view.key)}"
        if view.path is None:
            title += " (no process pylock may inspect names this file)"
        blocks.append((title, _file_rows(view, snap)))
    widths = [0] * 7
    for _, rows in blocks:
        for row in rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    lines = [summary(snap)]
    for title, rows in blocks:
        lines.append(title)
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths)]
            lines.append("  ".join([*cells, row[7]]).rstrip())
    for deadlock in snap.deadlocks:
        lines += deadlock_lines(deadlock, snap)
    return lines


def deadlock_lines(deadlock: Deadlock, snap: Snapshot) -> list[str]:
    count = len(deadlock.processes)
    if count == 1:
        head = "DEADLOCK: a process waits for a lock it holds itself (another descriptor)"
    else:
        head = f"DEADLOCK: {count} processes wait for each other"
    lines = [head]
    for edge in deadlock.cycle:
        want = edge.waiter
        where = snap.paths.get(want.file) if want.file is not None else None
        name = display(where) if where is not None else file_name(want.file)
        who = _named(want.pid, snap.processes)
        lines.append(
            f"  {who} waits for {want.kind} {want.mode} on {name}, held by pid {edge.holder}"
        )
    return lines


# -- JSON -------------------------------------------------------------------------


def _process_json(pid: int, snap: Snapshot) -> dict[str, Any]:
    """pid, program, argv, uid, user: a new dict (built once per process)."""
    found: dict[str, Any] | None = snap.rendered.get(("json", pid))
    if found is None:
        found = {"pid": pid if pid > 0 else None}
        proc = snap.processes.get(pid)
        json_text(found, "program", proc.program if proc else None)
        json_texts(found, "argv", proc.argv if proc else None)
        found["uid"] = proc.uid if proc else None
        json_text(found, "user", proc.user if proc else None)
        snap.rendered["json", pid] = found
    return dict(found)


def _range_json(kind: str, mode: str, start: int, end: int | None) -> dict[str, Any]:
    return {"kind": kind, "mode": mode, "start": start, "end": end}


def _file_json(view: FileView, snap: Snapshot) -> dict[str, Any]:
    out: dict[str, Any] = {"file": file_name(view.key)}
    json_text(out, "path", view.path)
    out["locks"] = []
    for lock_view in view.locks:
        lock = lock_view.lock
        entry = _range_json(lock.kind, lock.mode, lock.start, lock.end)
        entry.update(taker=lock.taker if lock.taker > 0 else None, count=lock.count)
        entry["holders"] = [_holder_json(h, snap) for h in lock_view.holders]
        out["locks"].append(entry)
    out["waiters"] = []
    for waiter_view in view.waiters:
        want = waiter_view.waiter
        entry = _range_json(want.kind, want.mode, want.start, want.end)
        entry.update(_process_json(want.pid, snap))
        entry["pid_from"] = "syscall" if want.pid_from_syscall else "locks"
        entry["waits_for"] = waiter_view.waits_for
        entry["queued_behind"] = want.behind
        out["waiters"].append(entry)
    return out


def _holder_json(holder: HolderView, snap: Snapshot) -> dict[str, Any]:
    out = _process_json(holder.pid, snap)
    out.update(fds=holder.fds, verified=holder.verified, note=holder.note or None)
    out["acquired_at"] = None if holder.since is None else stamp(holder.since)
    held = None if holder.since is None else round(max(0.0, snap.taken - holder.since), 3)
    out["held_for"] = held if snap.clock else None
    out.update(info=holder.info, record_private=holder.record_private)
    return out


def json_doc(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as one JSON object (the README shows its shape)."""
    deadlocks = []
    for deadlock in snap.deadlocks:
        cycle = []
        for edge in deadlock.cycle:
            want = edge.waiter
            wanted = {"file": file_name(want.file)}
            json_text(wanted, "path", snap.paths.get(want.file) if want.file else None)
            wanted.update(_range_json(want.kind, want.mode, want.start, want.end))
            cycle.append({"pid": want.pid, "waits_for": wanted, "held_by": edge.holder})
        deadlocks.append({"processes": list(deadlock.processes), "cycle": cycle})
    return {
        "host": hostname(),
        "time": stamp(snap.taken),
        "files": [_file_json(view, snap) for view in snap.files],
        "deadlocks": deadlocks,
        "hidden_pids": sorted(snap.hidden),
    }
