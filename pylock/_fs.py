"""Which filesystems flock can be trusted on: a decision from statfs."""

from __future__ import annotations

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
