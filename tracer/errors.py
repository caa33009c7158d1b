"""The one exception type of the tracer package."""


class TraceError(Exception):
    """Bad input to optrace: the message names the bad value and what was expected."""
