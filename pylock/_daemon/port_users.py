"""Who has a port: every socket of this network namespace whose local port it is.

A bind is refused for more than a listener: a connection whose local port it
is (an outgoing connection handed a port from the ephemeral range, a
server's accepted connections), a socket bound but neither listening nor
connected, a UDP socket bound or connected.  /proc/net/{tcp,tcp6,udp,udp6}
list the sockets of every state but one: a TCP socket that is only bound
sits in none of the tables /proc walks, and only the kernel's sock_diag
netlink dump of TCP_BOUND_INACTIVE sockets (Linux 6.8 and later) shows it.
Each socket's inode then names the processes holding it (/proc/PID/fd ->
socket:[inode]), among those this user may look at; another user's process
is named by its user.  The /proc files are read by pylock._core.procfs.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from typing import NamedTuple

from .._core.procfs import NetSocket, cmdline, port_sockets, socket_pids

_TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
}
_TCP_LISTEN, _TCP_CLOSE, _UDP_CONNECTED = 10, 7, 1
_TCP_BOUND_INACTIVE = 13  # sock_diag's pseudo state for bound-only TCP sockets (Linux 6.8)
# The order a message names them in: what a user most likely wants stopped first.
KINDS = ("listening", "bound", "connected", "closing")


class PortUser(NamedTuple):
    """A socket whose local port is the port, as the kernel lists it."""

    inode: int  # 0: no process holds it any more (a connection the kernel is closing)
    uid: int
    pids: tuple[int, ...]  # the processes with a descriptor on it that pylock may see
    kind: str = "listening"  # one of KINDS
    local: str = ""  # "127.0.0.1:8080", "[::1]:8080"
    remote: str = ""  # the peer of a connection
    state: str = ""  # the kernel's name for a TCP socket's state (ESTABLISHED, ...)

    def what(self) -> str:
        """What the socket does with the port."""
        if self.kind == "listening":
            return f"listening on {self.local}"
        if self.kind == "bound":
            extra = "neither listening nor connected" if self.state else "not connected"
            return f"bound to {self.local}, {extra}"
        if self.kind == "connected":
            state = f" ({self.state})" if self.state else ""
            return f"connected from {self.local} to {self.remote}{state}"
        return (
            f"a connection from {self.local} to {self.remote} that the kernel is "
            f"closing ({self.state})"
        )

    def who(self) -> str:
        if self.inode == 0:
            return "no process"
        user = user_name(self.uid)
        if not self.pids:
            return (
                f"a process of user {user} (uid {self.uid}; pylock may not see its "
                f"descriptors, socket inode {self.inode})"
            )
        return ", ".join(f"pid {pid} ({program(pid)}, user {user})" for pid in self.pids)

    def describe(self) -> str:
        return f"{self.who()}, {self.what()}"


def port_users(port: int, protocol: str) -> list[PortUser]:
    """Every socket whose local port is port/protocol, listeners first."""
    found = [user for row in port_sockets(port, protocol) if (user := _user(row, protocol))]
    if protocol == "tcp":
        seen = {user.inode for user in found}
        found += [user for user in _bound_tcp(port) if user.inode not in seen]
    inodes = {user.inode for user in found if user.inode}
    pids = socket_pids(inodes) if inodes else {}
    found = [user._replace(pids=tuple(sorted(pids.get(user.inode, ())))) for user in found]
    return sorted(found, key=lambda user: KINDS.index(user.kind))


def _user(row: NetSocket, protocol: str) -> PortUser | None:
    """What a /proc/net line says the socket does with its local port."""
    if protocol == "udp":
        if row.state == _UDP_CONNECTED:
            return PortUser(row.inode, row.uid, (), "connected", row.local, row.remote)
        return PortUser(row.inode, row.uid, (), "bound", row.local)
    name = _TCP_STATES.get(row.state)
    if name is None:
        return None  # a request socket (NEW_SYN_RECV): its listener is listed
    if row.state == _TCP_LISTEN:
        return PortUser(row.inode, row.uid, (), "listening", row.local, "", name)
    if row.state == _TCP_CLOSE:
        return PortUser(row.inode, row.uid, (), "bound", row.local, "", name)
    kind = "connected" if row.inode else "closing"
    return PortUser(row.inode, row.uid, (), kind, row.local, row.remote, name)


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST_DUMP = 0x301
_NLMSG_ERROR, _NLMSG_DONE = 2, 3


def _bound_tcp(port: int) -> list[PortUser]:
    """TCP sockets bound to port and neither listening nor connected, from
    sock_diag (none before Linux 6.8, which does not dump them)."""
    if not hasattr(socket, "AF_NETLINK"):
        return []
    found: list[PortUser] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            found += [user for user in _diag_dump(family) if user.local.endswith(f":{port}")]
        except (OSError, struct.error, ValueError):
            continue  # no sock_diag here (a sandbox), or an answer laid out otherwise
    return found


def _diag_dump(family: int) -> list[PortUser]:
    # struct inet_diag_req_v2: family, protocol, ext, pad, states; then the
    # socket id (ports, addresses, interface, cookie), all zero: every socket.
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_BOUND_INACTIVE)
    request += bytes(48)
    header = struct.pack(
        "=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
    )
    found: list[PortUser] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)  # the kernel answers at once; never hang on a broken one
        nl.sendto(header + request, (0, 0))
        for _ in range(10_000):  # each answer holds many sockets; bounded all the same
            data = nl.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < 16:
                    return found
                found.append(_diag_entry(data, offset + 16, family))
                offset += (length + 3) & ~3
    return found


def _diag_entry(data: bytes, at: int, family: int) -> PortUser:
    # struct inet_diag_msg: family, state, timer, retrans; id: sport, dport
    # (big-endian), src[16], dst[16], if, cookie[2]; expires, rqueue,
    # wqueue, uid, inode.
    sport = struct.unpack_from(">H", data, at + 4)[0]
    size = 4 if family == socket.AF_INET else 16
    raw = data[at + 8 : at + 8 + size]
    uid, inode = struct.unpack_from("=II", data, at + 64)
    if family == socket.AF_INET:
        local = f"{socket.inet_ntop(family, raw)}:{sport}"
    else:
        local = f"[{socket.inet_ntop(family, raw)}]:{sport}"
    return PortUser(inode, uid, (), "bound", local, "", "CLOSE")


def lists_bound_tcp() -> bool:
    """Whether this kernel shows TCP sockets that are only bound (Linux 6.8+)."""
    match = re.match(r"(\d+)\.(\d+)", os.uname().release) if hasattr(os, "uname") else None
    return match is not None and (int(match[1]), int(match[2])) >= (6, 8)


def user_name(uid: int) -> str:
    import pwd  # POSIX only, and only needed to explain a failure

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def program(pid: int) -> str:
    """pid's command line, shortened to one readable line as holders are."""
    from .._lock.holder import Holder  # dataclasses: only to explain a failure

    return Holder(pid=pid, argv=cmdline(pid)).command() or "?"
