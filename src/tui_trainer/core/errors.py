"""Errors that the CLI and the dashboard report as bad input (exit status 2)."""


class CheckpointError(Exception):
    """A checkpoint file that cannot be used; the message says which file and why."""
