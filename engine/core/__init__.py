"""The prefix-cache engine itself: block hashing, the block pool and its LRU free queue,
the manager that looks up, allocates, stores and evicts, the event stream it emits, the
projection that rebuilds a pool from events, and trace replay. Plain Python: no torch, no
Qt, no SQLite.
"""
