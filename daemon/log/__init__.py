"""The decision log: SQLite through sqlite-utils, written by one thread, read by many.

It imports the core's records, never the server.
"""
