"""Sessions on disk: the SQLite store that owns every statement, its writer thread, the
importers for conversation and trace files, and the session operations (import, export,
replay with the stored seed, edit and re-run).
"""
