"""The pylock command: one module per subcommand, loaded only when chosen.

Imports every private package and pylock.etcd, never the other way round.
"""
