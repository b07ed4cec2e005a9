"""The daemon's persistent state: one SQLite file, one module per table (store.py owns the connection)."""
