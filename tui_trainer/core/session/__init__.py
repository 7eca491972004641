"""The session: its store (one SQLite file), reading it as it changes, exports, and where sessions live."""
