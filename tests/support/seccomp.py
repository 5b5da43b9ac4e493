"""Make a process tree look like a kernel older than 5.3: no pidfd syscalls.

    python -m tests.support.seccomp -- python -m pytest tests/...
    python tests/support/seccomp.py -- CMD ARGS...

installs a seccomp filter that answers pidfd_open (434), pidfd_send_signal (424)
and pidfd_getfd (438) with ENOSYS, then execs CMD. The filter is inherited by
every child and survives exec, so a whole pytest run (and every process it
starts) sees the fallback paths. Only ctypes is used, and no root is needed
(PR_SET_NO_NEW_PRIVS makes an unprivileged filter legal).

A filter installed with prctl covers the calling thread and the threads it
creates afterwards, not threads that already exist: that is why the intended
use is a fresh launcher process that installs it and then execs.
``install_filter`` is also usable as ``subprocess.Popen(preexec_fn=...)``,
where it runs in the single-threaded child between fork and exec.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
from collections.abc import Sequence

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7

# Same numbers on x86_64 and aarch64 (the "unified" syscall table since 4.x).
SYS_PIDFD_SEND_SIGNAL = 424
SYS_PIDFD_OPEN = 434
SYS_PIDFD_GETFD = 438
BLOCKED_SYSCALLS = (SYS_PIDFD_OPEN, SYS_PIDFD_SEND_SIGNAL, SYS_PIDFD_GETFD)

# classic BPF opcodes
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06

# struct seccomp_data { int nr; __u32 arch; __u64 ip; __u64 args[6]; }
_OFFSET_NR = 0
_OFFSET_ARCH = 4

SUPPORTED_MACHINES = {"x86_64", "amd64", "aarch64", "arm64"}


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _program(blocked: Sequence[int], err: int) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) tuples.

    Unknown architectures (for example the x86 compat ABI, whose numbers differ)
    are allowed through unchanged; only the native ABI's numbers are matched.
    """
    n = len(blocked)
    prog: list[tuple[int, int, int, int]] = [
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        # x86_64: skip the aarch64 test and go load nr
        (_BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        # aarch64: go load nr; anything else: jump to ALLOW
        (_BPF_JEQ_K, 0, n + 1, AUDIT_ARCH_AARCH64),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_NR),
    ]
    for i, nr in enumerate(blocked):
        # jt lands on the ERRNO return, which sits right after ALLOW.
        prog.append((_BPF_JEQ_K, n - i, 0, nr))
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | (err & 0xFFFF)))
    return prog


def filter_bytes(blocked: Sequence[int] = BLOCKED_SYSCALLS, err: int = errno.ENOSYS) -> bytes:
    """The raw BPF program (struct sock_filter[]), for inspection and tests."""
    return b"".join(struct.pack("=HBBI", *ins) for ins in _program(blocked, err))


def install_filter(blocked: Sequence[int] = BLOCKED_SYSCALLS, err: int = errno.ENOSYS) -> None:
    """Install the filter in the calling thread (and everything it later starts).

    Raises OSError if the kernel refuses, and RuntimeError on an architecture
    whose syscall numbers this filter does not know (silently filtering nothing
    would make an "old kernel" test pass for the wrong reason).
    """
    machine = platform.machine().lower()
    if machine not in SUPPORTED_MACHINES:
        raise RuntimeError(f"seccomp launcher: unsupported architecture {machine!r}")
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    if prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(e)}")

    prog = _program(blocked, err)
    insns = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), ctypes.cast(insns, ctypes.POINTER(_SockFilter)))
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER): {os.strerror(e)}")


def exec_filtered(argv: Sequence[str]) -> None:
    """Install the filter, then replace this process with argv (PATH is searched)."""
    if not argv:
        raise ValueError("exec_filtered: empty command")
    install_filter()
    os.execvp(argv[0], list(argv))


def command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """argv prefixed so that it runs under the filter (for subprocess).

    The launcher is started by file path, so the caller's working directory and
    sys.path do not matter.
    """
    return [python or sys.executable, os.path.abspath(__file__), "--", *argv]


def pidfd_blocked() -> bool:
    """True when this process runs under such a filter (pidfd_open says ENOSYS)."""
    try:
        fd = os.pidfd_open(os.getpid())
    except AttributeError:
        return True
    except OSError as e:
        return e.errno == errno.ENOSYS
    os.close(fd)
    return False


def main(args: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print(
            "usage: python -m tests.support.seccomp -- CMD [ARGS...]\n"
            "runs CMD with pidfd_open/pidfd_send_signal/pidfd_getfd failing with ENOSYS",
            file=sys.stderr,
        )
        return 2
    try:
        exec_filtered(argv)
    except (OSError, RuntimeError) as e:
        print(f"seccomp launcher: {e}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced us


if __name__ == "__main__":
    sys.exit(main())
