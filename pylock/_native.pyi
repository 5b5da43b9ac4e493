# The compiled C core (cffi API mode, built from csrc/ by csrc/_ffi_build.py).
# Its functions are declared in csrc/pylock.h and csrc/pylock_proc.h.
from typing import Any

ffi: Any
lib: Any
