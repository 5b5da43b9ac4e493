"""What every other part of pylock stands on: the one door to the C core
(native), errors, timeouts, the kernel wait primitive, /proc readers,
filesystem facts, process identity and safe display.

Imports nothing of pylock outside _core (and the compiled module, through native).
"""
