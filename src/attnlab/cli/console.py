"""The rich console the commands print their tables on."""

from __future__ import annotations

import errno
import os
from typing import Any

from rich.console import Console


class _Console(Console):
    """A console that lets a closed pipe surface as ``BrokenPipeError``.

    rich's own handling exits with status 1, which ``attnlab check`` uses for "a check failed"; raised instead,
    the command line ends quietly with SIGPIPE's status as every command does (``attnlab.cli.main``).
    """

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def console(**kwargs: Any) -> Console:
    """A rich console on stdout (or stderr with ``stderr=True``) for a command's output.

    Console markup is off: what the commands print holds the user's own strings (labels, file names, texts and
    the samples written from them), where ``[red]`` or ``[/]`` is text, not a style (it vanished, or raised
    ``MarkupError``). Styles are given as :class:`rich.text.Text` instead. Emoji codes are off for the same reason:
    a folder named ``x:thumbs_up:y`` was printed as a path that does not exist.
    """
    return _Console(**{"markup": False, "emoji": False, **kwargs})
