"""Waiting for a process to exit: holder_exit, wait_exit and ExitWatcher,
the plan of a watch, and one module per strategy.

Imports _core and _lock.
"""
