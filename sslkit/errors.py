"""The one exception type for a user's mistake.

Entry points catch :class:`UserError` and print its message as a single line, with no
traceback: a wrong key in a recipe or a missing dataset is the user's to fix, not a crash.
Bugs in sslkit itself still raise ordinary exceptions with full tracebacks.
"""


class UserError(Exception):
    """A mistake in a recipe, a path or a command line, explained in one line."""
