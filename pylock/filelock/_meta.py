"""Constructing a front lock as filelock does: options checked before
__init__ runs, `is_singleton=True` handing back the one live object for a
path (its __init__ not run again), and a subclass's __init__ given only the
options it takes."""

from __future__ import annotations

import os
import sys
from typing import Any
from weakref import WeakKeyDictionary

from ._options import (
    DEFAULT_POLL_INTERVAL,
    UNSET_MODE,
    check_blocking,
    check_mode,
    resolve_poll_interval,
    seconds,
)

# Windows' realpath opens each directory, which can stall a concurrent release.
_resolve_dir = os.path.abspath if sys.platform == "win32" else os.path.realpath

# What each option is when the caller leaves it out (thread_local: the class says).
DEFAULTS: dict[str, object] = {
    "timeout": -1,
    "mode": UNSET_MODE,
    "blocking": True,
    "is_singleton": False,
    "poll_interval": DEFAULT_POLL_INTERVAL,
}


def canonical(path: str | os.PathLike[str]) -> str:
    """filelock's identity of a lock path: the directory resolved, the last
    component kept (a symlink there is its own lock, never followed)."""
    parent, name = os.path.split(os.fsdecode(os.fspath(path)))
    return os.path.join(_resolve_dir(parent or os.curdir), name)


def path_key(path: str) -> str:
    drive, tail = os.path.splitdrive(path)
    return drive.lower() + tail


class FileLockMeta(type):
    # Returns Any, so that type checkers keep each class's own __init__.
    def __call__(
        cls,
        lock_file: str | os.PathLike[str],
        timeout: float = -1,
        mode: int = UNSET_MODE,
        thread_local: bool | None = None,
        *,
        blocking: bool = True,
        is_singleton: bool = False,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        **extras: Any,
    ) -> Any:
        lock_class: Any = cls  # a BaseFileLock subclass
        options: dict[str, Any] = {
            "timeout": seconds("timeout", timeout),
            "mode": check_mode(mode, cls.__name__),
            "thread_local": lock_class._thread_local_default
            if thread_local is None
            else thread_local,
            "blocking": check_blocking(blocking),
            "is_singleton": is_singleton,
            "poll_interval": resolve_poll_interval(poll_interval),
            **extras,
        }
        lock_class._check_options(options)
        params = _accepted_by_init(lock_class, options)
        if not is_singleton:
            return type.__call__(cls, lock_file, **params)
        key = path_key(canonical(lock_file))
        with lock_class._instances_lock:
            # A chdir or a replaced directory can move a cached relative path.
            instance = lock_class._instances.get(key)
            where = None if instance is None else instance._pinned or instance.lock_file
            if where is None or path_key(canonical(where)) != key:
                instance = type.__call__(cls, lock_file, **params)
                instance._singleton_key = key
                lock_class._instances[key] = instance
                return instance
        _refuse_different_options(instance, options)
        if os.fspath(lock_file) != instance.lock_file:
            instance._singleton_shared = True
        return instance


def _refuse_different_options(instance: Any, options: dict[str, Any]) -> None:
    mismatches = [
        f"\n\t{name} (existing lock has {existing} but {requested} was passed)"
        for name, (requested, existing) in instance._compare_options(options).items()
        if requested != existing
    ]
    if mismatches:
        raise ValueError(
            "Singleton lock instances cannot be initialized with differing arguments\n"
            "Non-matching arguments: " + "".join(mismatches)
        )


# Per class: the names its __init__ takes, and whether it takes **kwargs.
_SIGNATURES: WeakKeyDictionary[type, tuple[frozenset[str], bool]] = WeakKeyDictionary()


def _accepted_by_init(cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The options cls.__init__ takes: a subclass's own __init__ may take
    fewer; leaving out one it does not take is fine unless it was given."""
    if cls.__init__ in cls._own_inits:
        return options
    names, takes_any = _signature(cls)
    if takes_any:
        return options
    refused = [
        name
        for name, value in options.items()
        if name not in names and (name not in cls._option_defaults() or _given(cls, name, value))
    ]
    if refused:
        raise TypeError(f"{cls.__name__}.__init__() takes no option {', '.join(sorted(refused))}")
    return {name: value for name, value in options.items() if name in names}


def _given(cls: Any, name: str, value: object) -> bool:
    default = cls._option_defaults()[name]
    return bool(value is not default and value != default)


def _signature(cls: type) -> tuple[frozenset[str], bool]:
    known = _SIGNATURES.get(cls)
    if known is None:
        import inspect  # only for subclasses with an __init__ of their own

        parameters = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
        known = (
            frozenset(p.name for p in parameters if p.kind is not p.VAR_KEYWORD),
            any(p.kind is p.VAR_KEYWORD for p in parameters),
        )
        _SIGNATURES[cls] = known
    return known
