"""The file lock: Lock and its asyncio side, the object-ownership protocol
that Lock and EtcdLock share, the holder record and the holder lookup.

Imports _core only.
"""
