"""What the commands share in reading their command line."""

from __future__ import annotations


def reject_unknown_option(command_line: list[str], options) -> bool:
    """Print one line and return True for a ``--option`` the command does not take (see
    :func:`sslkit.config.check_command_line`: it names the ``key=value`` override probably meant).

    The check itself imports nothing heavy (:func:`sslkit.schema.unknown_option`): only a command line with such
    an option pays for the library's import, and ``--help`` answers at once.
    """
    from sslkit.schema import unknown_option

    if unknown_option(command_line, options) is None:
        return False
    from sslkit.config import check_command_line
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    try:
        check_command_line(command_line, options)
    except UserError as error:
        print_user_error(error)
        return True
    return False
