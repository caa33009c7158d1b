"""The one exception type of the reports package."""


class ReportError(Exception):
    """A trace that cannot be read or a bad argument: the message names the file or value and what was expected."""
