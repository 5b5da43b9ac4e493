"""Who waits for whom among the kernel's locks, and the cycles in it: deadlocks.

A blocked request waits for every granted lock on its file that it
conflicts with (the kernel lists it under one of them): the same family
(flock locks never meet POSIX or OFD record locks on Linux; those two meet
each other), overlapping byte ranges, at least one of the two exclusive,
and not the waiter's own POSIX lock.  A process waits for every process
holding such a lock, so a cycle of processes each waiting for the next is a
deadlock: flock(2) detects none, and the kernel's fcntl check sees only
chains of POSIX locks.  A process in a cycle may still have another thread
that will release (as the kernel's own check, this looks at processes).
"""

from __future__ import annotations

from dataclasses import dataclass

from .locktable import Lock, LockTable, Waiter

_FAMILY = {"FLOCK": "flock", "POSIX": "record", "OFDLCK": "record"}


def _overlap(a: Waiter, b: Lock) -> bool:
    return (a.end is None or a.end >= b.start) and (b.end is None or b.end >= a.start)


def conflicts(want: Waiter, lock: Lock) -> bool:
    """Whether the granted lock stands in the way of the blocked request."""
    family = _FAMILY.get(want.kind)
    if family is None or family != _FAMILY.get(lock.kind) or want.file != lock.file:
        return False
    if want.mode != "WRITE" and lock.mode != "WRITE":
        return False
    if want.kind == lock.kind == "POSIX" and want.pid == lock.taker:
        return False  # a process's own POSIX locks are merged, never in its way
    return _overlap(want, lock)


@dataclass(frozen=True)
class Edge:
    """waiter's process waits for holder, which holds lock."""

    waiter: Waiter
    lock: Lock
    holder: int


@dataclass(frozen=True)
class Deadlock:
    """A set of processes each waiting for another in the set.

    cycle: one closed walk through them, each edge's holder the next edge's
    waiter; processes: every process of the set, in pid order."""

    cycle: tuple[Edge, ...]
    processes: tuple[int, ...]


def edges(table: LockTable) -> list[Edge]:
    """What every blocked request waits for: one Edge per process holding a
    lock in its way (none for a lock whose holders pylock cannot see)."""
    by_file: dict[object, list[Lock]] = {}
    for lock in table.locks:
        by_file.setdefault(lock.file, []).append(lock)
    out: list[Edge] = []
    for want in table.waiters:
        locks = [want.blocker] + [
            lock
            for lock in by_file.get(want.file, [])
            if lock is not want.blocker and conflicts(want, lock)
        ]
        for lock in locks:
            out += [Edge(want, lock, holder) for holder in table.holding_pids(lock)]
    return out


def graph(found: list[Edge]) -> dict[int, list[Edge]]:
    """The wait-for graph: each waiting process and its edges (a request
    whose process the kernel does not name is no node)."""
    out: dict[int, list[Edge]] = {}
    for edge in found:
        if edge.waiter.pid > 0:
            out.setdefault(edge.waiter.pid, []).append(edge)
    return out


def deadlocks(graph: dict[int, list[Edge]]) -> list[Deadlock]:
    """One Deadlock per strongly connected set of waiting processes that
    contains a cycle (a process waiting for itself counts), in pid order."""
    found = []
    for members in _components(graph):
        inside = set(members)
        cycle = _shortest_cycle(graph, members[0], inside)
        if cycle:
            found.append(Deadlock(tuple(cycle), tuple(members)))
    return found


def _components(graph: dict[int, list[Edge]]) -> list[list[int]]:
    """Tarjan's strongly connected components, without recursion (a chain of
    thousands of waiters must not hit Python's recursion limit)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    result: list[list[int]] = []
    targets = {node: [edge.holder for edge in out] for node, out in graph.items()}
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, position = work.pop()
            if position == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            after = targets.get(node, [])
            if position < len(after):
                work.append((node, position + 1))
                nxt = after[position]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == node:
                        break
                result.append(sorted(members))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(result)


def _shortest_cycle(graph: dict[int, list[Edge]], start: int, inside: set[int]) -> list[Edge]:
    """The shortest walk from start back to start within the component (breadth first)."""
    came: dict[int, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph.get(node, ()):
                if edge.holder == start:
                    path = [edge]
                    while path[0].waiter.pid != start:
                        path.insert(0, came[path[0].waiter.pid])
                    return path
                if edge.holder in inside and edge.holder not in came:
                    came[edge.holder] = edge
                    following.append(edge.holder)
        frontier = following
    return []
