"""Which filesystems can hold a lock file: a decision from statfs, and the one refusal."""

from __future__ import annotations

from .errors import PSEUDO_FS, LockFileError, UnsafeFilesystem
from .native import check, ffi, lib

# statfs f_type values of network and FUSE filesystems (Linux magic.h and
# the filesystems' own sources).  flock there is emulated with byte-range
# locks, local to one client, or up to a userspace server: not an exclusion
# pylock can promise.
NETWORK_MAGIC = {
    0x6969: "NFS",
    0x517B: "SMB",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2/3",
    0x65735546: "a FUSE filesystem",
    0x00C36400: "CephFS",
    0x5346414F: "AFS",
    0x6B414653: "kAFS",
    0x01021997: "9P",
    0x0BD00BD0: "Lustre",
    0x7461636F: "OCFS2",
    0x01161970: "GFS2",
    0x47504653: "GPFS",
    0x19830326: "BeeGFS",
    0xAAD7AAEA: "PanFS",
    0x73757245: "Coda",
    0x564C: "NCP",
}

# statfs f_type values of the kernel's pseudo-filesystems: their "files" are
# kernel state (a read may change it, a write sets it), never a lock file.
PSEUDO_MAGIC = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0xCAFE4A11: "bpf",
    0x62656570: "configfs",
    0xDE5E81E4: "efivarfs",
    0x6165676C: "pstore",
    0xF97CFF8C: "selinuxfs",
    0x43415D53: "smackfs",
    0x65735543: "fusectl",
    0x42494E4D: "binfmt_misc",
}
PSEUDO_NAMES = {"devfs", "procfs", "fdesc"}


def pseudo_filesystem(magic: int, name: str) -> str | None:
    """The name of the kernel pseudo-filesystem the file is on, or None."""
    if magic in PSEUDO_MAGIC:
        return PSEUDO_MAGIC[magic]
    return name if name.lower() in PSEUDO_NAMES else None


# macOS names network filesystems; MNT_LOCAL already says "remote", this
# adds FUSE mounts that claim to be local.
NETWORK_NAMES = {"nfs", "smbfs", "afpfs", "webdav", "cifs", "macfuse", "osxfuse", "fusefs"}


def network_filesystem(magic: int, remote: int, name: str) -> str | None:
    """A readable name of the network filesystem, or None when it is local."""
    if magic in NETWORK_MAGIC:
        return NETWORK_MAGIC[magic]
    lowered = name.lower()
    if remote == 1 or lowered in NETWORK_NAMES or lowered.startswith("fuse"):
        return name or "a network filesystem"
    return None


def refuse_unfit_filesystem(
    handle: int, path: str, *, pseudo: bool = True, network: bool = True, strict: bool = False
) -> None:
    """Refuse the lock file open at handle where no lock on it can be promised:
    on a kernel pseudo-filesystem (pseudo: LockFileError with PSEUDO_FS, its
    files are kernel state) or on a network or FUSE filesystem (network:
    UnsafeFilesystem, flock there is emulated or local to one client).  A
    file whose filesystem statfs cannot describe passes, unless strict (then
    that error is raised)."""
    fs = ffi.new("pl_fs_info *")
    rc = lib.pl_fs_stat(handle, fs)
    if rc != 0:
        if strict:
            check(rc, path)
        return
    fs_name = ffi.string(fs.name).decode()
    name = pseudo_filesystem(fs.magic, fs_name) if pseudo else None
    if name is not None:
        raise LockFileError(
            PSEUDO_FS,
            path,
            f"it is on {name}, which holds kernel state, not files: put the lock "
            "file on a real filesystem (for example under /run or /tmp)",
        )
    name = network_filesystem(fs.magic, fs.remote, fs_name) if network else None
    if name is not None:
        raise UnsafeFilesystem(path, name)
