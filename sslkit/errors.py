"""The exceptions that end a run without a traceback, and the exit statuses they map to.

Entry points catch :class:`UserError` and print its message as a single line, with no
traceback: a wrong key in a recipe or a missing dataset is the user's to fix, not a crash.
:class:`Preempted` is a run that stopped on a signal after saving: not an error at all, but a
job to requeue. Bugs in sslkit itself still raise ordinary exceptions with full tracebacks.
"""

from __future__ import annotations

from pathlib import Path

# EX_TEMPFAIL in sysexits.h: "a temporary failure ... the user is invited to retry". A batch
# script requeues the job on it; any other non-zero status is a failure to look at.
REQUEUE_EXIT_STATUS = 75


def install_hint(extra: str) -> str:
    """How to add an optional part of sslkit, the same everywhere: quoted, so zsh leaves the brackets alone."""
    return f'pip install "sslkit[{extra}]"'


class UserError(Exception):
    """A mistake in a recipe, a path or a command line, explained in one line."""


class Preempted(Exception):
    """The run stopped on ``signal_name`` after step ``step`` and saved ``checkpoint`` (``train.stop_signals``)."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path) -> None:
        super().__init__(f"stopped by {signal_name} after step {step}")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
