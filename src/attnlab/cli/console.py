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
    """A rich console on stdout (or stderr with ``stderr=True``) for a command's output."""
    return _Console(**kwargs)
