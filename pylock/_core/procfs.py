"""Every reader of Linux's /proc in pylock but /proc/locks itself (locktable.py
reads that, more than once where one reading can be cut wrong): who holds a
lock (fdinfo), a process's command line and status (thread group, uids,
umask), pid_max, the sockets on a port (in every state) and the ephemeral
port range.  Reading takes no lock, so looking never disturbs anyone; a file
that cannot be read (another user's process, one that has gone, no /proc at
all) is an answer, never an error.

An fdinfo file carries a "lock:" line for each lock owned by that open file
description, so it names the real holders: the processes sharing an
inherited descriptor, shared holders, holders inside pid namespaces.  Only
the owner of a process (or root) may read its fdinfo.  /proc/locks is
readable by everyone and lists every lock, but its pid column names whoever
took the lock, which goes wrong after fork: it answers "is anyone holding
it" and names holders whose fdinfo this user may not read, never verified.

Both tables name a file by its superblock's device and inode number, which
is not always what stat says: a btrfs subvolume and an overlayfs layer have
a device number of their own, and files in two subvolumes can share an inode
number.  A LockKey is the tables' name for a file, found from the mount of
a descriptor on it (fdinfo's mnt_id, /proc/self/mountinfo's device), and,
where that name may also fit another file, the file's own (st_dev, st_ino),
checked on the holder's descriptor itself (/proc/PID/fd/N).
"""

from __future__ import annotations

import os
import sys
from collections import namedtuple

PROC = "/proc"
# PyPy's os has no O_PATH: Linux's value then, one on every architecture
# PyPy runs on (asm-generic/fcntl.h; only alpha, parisc and sparc differ).
O_PATH: int = getattr(os, "O_PATH", 0o10000000 if sys.platform.startswith("linux") else 0)

# Loaded by `pylock run` and the first acquisition's helpers: typing (for
# NamedTuple) would cost start-up time, so the tuples are collections'.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import NamedTuple

    class FdLock(NamedTuple):
        """A descriptor of pid whose open file description owns a flock."""

        pid: int
        fd: int
        shared: bool
        taker: int  # the pid the lock line names (who took it), 0 outside our namespace

    class TableLock(NamedTuple):
        """A line of /proc/locks: pid 0 when the taker is outside our pid namespace."""

        pid: int
        shared: bool

    class LockKey(NamedTuple):
        """A file as the lock tables name it: its superblock's device and its
        inode number, and exact, its own (st_dev, st_ino), when that name may
        also fit another file (btrfs subvolumes, overlayfs layers)."""

        dev: int
        ino: int
        exact: tuple[int, int] | None = None

else:
    FdLock = namedtuple("FdLock", "pid fd shared taker")
    TableLock = namedtuple("TableLock", "pid shared")
    LockKey = namedtuple("LockKey", "dev ino exact", defaults=(None,))

_MAX_READ = 8192  # a status, cmdline or fdinfo file: what pylock reads of it at most


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_READ)
    except OSError:
        return b""


# -- locks: fdinfo ----------------------------------------------------------------


def _lock_key(dev: int, ino: int) -> str:
    # Spaces on both sides: a major of 0x103 must not match one of 0x03.
    return f" {os.major(dev):02x}:{os.minor(dev):02x}:{ino} "


def _fd_lock(
    pid: int, fd_name: str, key: str, exact: tuple[int, int] | None
) -> tuple[bool, int, bool] | None:
    """(shared, taker, ours) when this descriptor holds a flock on a file the
    tables name key; ours is False when that is another file of the same name
    (exact differs).  None when it holds none, or has gone."""
    text = _read(f"{PROC}/{pid}/fdinfo/{fd_name}")
    if b"lock:" not in text:
        return None
    for line in text.decode("ascii", "replace").splitlines():
        if line.startswith("lock:") and "FLOCK" in line and key in line:
            # "lock:\t1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"
            words = line.split()
            try:
                taker = max(int(words[5]), 0)
            except (IndexError, ValueError):
                taker = 0
            ours = True
            if exact is not None:
                try:
                    st = os.stat(f"{PROC}/{pid}/fd/{fd_name}")
                except OSError:
                    return None  # closed meanwhile
                ours = (st.st_dev, st.st_ino) == exact
            return " READ " in line, taker, ours
    return None


def pid_locks(
    pid: int, dev: int, ino: int, exact: tuple[int, int] | None = None
) -> tuple[str, bool] | None:
    """How pid holds flocks named (dev, ino): (mode, elsewhere), mode
    "exclusive", "shared" or "" for the file exact names (or the only one),
    elsewhere True when it holds one on another file of that name.  None
    when we may not look (another user's process without ptrace rights) or
    it has gone."""
    key = _lock_key(dev, ino)
    try:
        fds = os.listdir(f"{PROC}/{pid}/fdinfo")
    except OSError:
        return None
    modes = set()
    elsewhere = False
    for fd in fds:
        found = _fd_lock(pid, fd, key, exact)
        if found is not None:
            if found[2]:
                modes.add(found[0])
            else:
                elsewhere = True
    mode = "exclusive" if False in modes else "shared" if True in modes else ""
    return mode, elsewhere


def pid_lock_mode(pid: int, dev: int, ino: int, exact: tuple[int, int] | None = None) -> str | None:
    """How pid holds a flock on the file (dev, ino) names (exact: which one):
    "exclusive", "shared" or "" (not at all), as the kernel shows it; None
    when we may not look (another user's process without ptrace rights) or
    it has gone.
    """
    found = pid_locks(pid, dev, ino, exact)
    return None if found is None else found[0]


def pid_holds(pid: int, dev: int, ino: int, exact: tuple[int, int] | None = None) -> bool | None:
    """Whether pid has a descriptor that owns a flock on the file (dev, ino)
    names; None when we may not look."""
    mode = pid_lock_mode(pid, dev, ino, exact)
    return None if mode is None else mode != ""


def _pids() -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(PROC) if name.isdigit())
    except OSError:
        return []


def holders_of(dev: int, ino: int, exact: tuple[int, int] | None = None) -> Iterator[FdLock]:
    """Every (pid, fd) whose open file description owns a flock on the file
    (dev, ino) names (exact: which one), with the pid the lock line names as
    its taker."""
    key = _lock_key(dev, ino)
    for pid in _pids():
        try:
            fds = os.listdir(f"{PROC}/{pid}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            found = _fd_lock(pid, fd, key, exact)
            if found is not None and found[2]:
                yield FdLock(pid, int(fd), found[0], found[1])


# Filesystems on which two files can share the lock tables' name for them:
# btrfs and bcachefs subvolumes number their inodes each on their own, and an
# overlay's files keep their layer's inode numbers (unless xino maps them).
_SHARED_NAMES = {"btrfs", "bcachefs", "overlay"}


def mount_of(mount_id: int) -> tuple[int, str] | None:
    """The device of the superblock mounted as mount_id in this process's
    mount namespace (/proc/self/mountinfo), as the lock tables print it, and
    its filesystem type."""
    prefix = b"%d " % mount_id
    try:
        with open(f"{PROC}/self/mountinfo", "rb") as f:
            for line in f:
                if line.startswith(prefix):
                    words = line.split()
                    major, _, minor = words[2].partition(b":")
                    kind = words[words.index(b"-") + 1].decode("ascii", "replace")
                    return os.makedev(int(major), int(minor)), kind
    except (OSError, ValueError, IndexError):
        pass
    return None


def lock_key(fd: int, st: os.stat_result) -> LockKey:
    """The lock tables' name for the file this process's descriptor fd (any
    kind, O_PATH too) is on; st is fd's fstat."""
    mount_id = ino = None
    for line in _read(f"{PROC}/self/fdinfo/{fd}").splitlines():
        try:
            if line.startswith(b"mnt_id:"):
                mount_id = int(line.split()[1])
            elif line.startswith(b"ino:"):
                ino = int(line.split()[1])
        except (IndexError, ValueError):
            continue
    mount = None if mount_id is None else mount_of(mount_id)
    own = (st.st_dev, st.st_ino)
    named = (st.st_dev if mount is None else mount[0], st.st_ino if ino is None else ino)
    shared = named != own or (mount is not None and mount[1] in _SHARED_NAMES)
    return LockKey(named[0], named[1], own if shared else None)


# -- a process: command line and status ------------------------------------------


def cmdline(pid: int | str) -> tuple[str, ...]:
    """pid's argv as the kernel shows it ("self": this process's); empty for
    a kernel thread, a zombie, or a process that has gone."""
    raw = _read(f"{PROC}/{pid}/cmdline")
    return tuple(os.fsdecode(part) for part in raw.split(b"\0") if part)


def command_of(pid: int) -> tuple[str, tuple[str, ...]]:
    """(program, argv) of a process as the kernel shows them: argv from
    cmdline, the program its first word's name, or comm when cmdline is empty
    (a kernel thread, a zombie)."""
    argv = cmdline(pid)
    if argv:
        return os.path.basename(argv[0]), argv
    return os.fsdecode(_read(f"{PROC}/{pid}/comm").rstrip(b"\n")), ()


def _status_field(pid: int | str, label: bytes) -> list[bytes]:
    """The words after label (b"Uid:") in pid's status; [] when unreadable."""
    for line in _read(f"{PROC}/{pid}/status").splitlines():
        if line.startswith(label):
            return line.split()[1:]
    return []


def _int_field(pid: int | str, label: bytes, index: int, base: int = 10) -> int | None:
    words = _status_field(pid, label)
    try:
        return int(words[index], base)
    except (IndexError, ValueError):
        return None


def thread_group(pid: int) -> int | None:
    """The process (thread group) the Linux task id pid belongs to; None
    when it has gone or cannot be read."""
    return _int_field(pid, b"Tgid:", 0)


def uids(pid: int) -> tuple[int, int] | None:
    """pid's real and effective uid; None when it has gone or cannot be read."""
    words = _status_field(pid, b"Uid:")
    try:
        return int(words[0]), int(words[1])
    except (IndexError, ValueError):
        return None


def own_umask() -> int | None:
    """This process's umask, read without setting it (Linux 4.7+); None elsewhere."""
    return _int_field("self", b"Umask:", 0, 8)


def pid_max() -> int:
    """The largest pid this system hands out (2**31 - 1 where /proc does not say)."""
    try:
        with open(f"{PROC}/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2**31 - 1


def fd_path(fd: int) -> str | None:
    """What this process's descriptor fd names, as /proc shows it; None when it cannot say."""
    try:
        return os.readlink(f"{PROC}/self/fd/{fd}")
    except OSError:
        return None


# -- sockets: /proc/net and the processes' descriptors ------------------------------

if TYPE_CHECKING:

    class NetSocket(NamedTuple):
        """A line of /proc/net/{tcp,udp}[6]: the socket's state (the kernel's
        number: TCP_LISTEN is 10; UDP 7 bound, 1 connected), its addresses as
        "ip:port" ("[ip6]:port"), its owner, and its inode (0: no process holds
        it any more, as a connection in TIME_WAIT)."""

        state: int
        local: str
        remote: str
        uid: int
        inode: int

else:
    NetSocket = namedtuple("NetSocket", "state local remote uid inode")


def port_sockets(port: int, protocol: str) -> list[NetSocket]:
    """Every socket of this network namespace whose local port is port, in
    every state, IPv4 and IPv6 (protocol "tcp" or "udp")."""
    found: list[NetSocket] = []
    for table in (protocol, protocol + "6"):
        try:
            with open(f"{PROC}/net/{table}", encoding="ascii", errors="replace") as f:
                next(f, None)  # the header
                for line in f:
                    row = _net_socket(line.split(), port)
                    if row is not None:
                        found.append(row)
        except OSError:
            continue  # no IPv6, or no /proc
    return found


def _net_socket(fields: list[str], port: int) -> NetSocket | None:
    try:
        local_addr, local_port = fields[1].rsplit(":", 1)
        if int(local_port, 16) != port:
            return None
        remote_addr, remote_port = fields[2].rsplit(":", 1)
        return NetSocket(
            int(fields[3], 16),
            _net_address(local_addr, port),
            _net_address(remote_addr, int(remote_port, 16)),
            int(fields[7]),
            int(fields[9]),
        )
    except (IndexError, ValueError, OSError):
        return None  # a line this kernel lays out otherwise


def _net_address(hex_addr: str, port: int) -> str:
    """/proc/net's address: the kernel's 32-bit words, each printed in host order."""
    import socket
    import struct

    raw = b"".join(
        struct.pack("=I", int(hex_addr[i : i + 8], 16)) for i in range(0, len(hex_addr), 8)
    )
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw)}:{port}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{port}"


def local_port_range() -> range | None:
    """The ports Linux hands to outgoing connections (net.ipv4.ip_local_port_range)."""
    words = _read(f"{PROC}/sys/net/ipv4/ip_local_port_range").split()
    try:
        low, high = (int(word) for word in words)
    except ValueError:
        return None
    return range(low, high + 1)


def socket_pids(inodes: set[int]) -> dict[int, list[int]]:
    """inode -> the pids holding a descriptor on that socket (those we may look at)."""
    targets = {f"socket:[{inode}]": inode for inode in inodes}
    found: dict[int, list[int]] = {inode: [] for inode in inodes}
    for pid in _pids():
        fd_dir = f"{PROC}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # another user's process, or gone
        credited: set[int] = set()  # a process often holds several: a listener, its connections
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            inode = targets.get(link)
            if inode is not None and inode not in credited:
                credited.add(inode)
                found[inode].append(pid)
    return found
