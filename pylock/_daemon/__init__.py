"""The daemon kit: singletons, runtime and port directories, port locks and
unix socket claims.

Imports _core, _lock and _exit.
"""
