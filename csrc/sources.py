"""The C sources of pylock's core, per platform: the one list that the build
(_ffi_build.py), the CI scripts and the workflows all read.

    python csrc/sources.py linux|darwin|win32   # prints the files, one line
"""

from __future__ import annotations

import sys

SOURCES = {
    "linux": [
        "claim.c",
        "owner.c",
        "holds.c",
        "lock_posix.c",
        "hints.c",
        "unix_at.c",
        "wait_posix.c",
        "proc_linux.c",
        "fallback_linux.c",
        "proc_posix.c",
        "sigchld_posix.c",
    ],
    "darwin": [
        "claim.c",
        "owner.c",
        "holds.c",
        "lock_posix.c",
        "hints.c",
        "unix_at.c",
        "wait_posix.c",
        "proc_macos.c",
        "proc_posix.c",
        "sigchld_posix.c",
    ],
    "win32": [
        "claim.c",
        "owner.c",
        "holds.c",
        "win_errors.c",
        "win_paths.c",
        "win_lock.c",
        "hints.c",
        "unix_at.c",
        "win_wait.c",
        "win_proc.c",
    ],
}


def for_platform(platform: str) -> list[str]:
    if platform.startswith("linux"):
        return SOURCES["linux"]
    return SOURCES[platform]


if __name__ == "__main__":
    print(" ".join(for_platform(sys.argv[1] if len(sys.argv) > 1 else sys.platform)))
