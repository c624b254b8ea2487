"""Entry point of the ``attnlab`` command.

Every command is a click command in its own module under ``attnlab.cli``; :data:`COMMANDS` lists them
(``name: "module:function"``) and they are imported only when called, so ``attnlab --help`` is quick.
Bad input raised as :class:`~attnlab.errors.AttnlabError` (or an unreadable file) becomes one line on
stderr, ``error: ...``, and exit status 2; never a stack trace.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from attnlab import __version__
from attnlab.errors import AttnlabError

#: command name -> "module:attribute" of its click command, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "summary": "attnlab.cli.summary:summary",
}


class _LazyGroup(click.Group):
    """A group that imports a command's module only when that command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name].split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AttnlabError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(2)
        except OSError as err:  # a path that does not exist, a folder we may not write...
            where = f": {err.filename}" if getattr(err, "filename", None) else ""
            click.echo(f"error: {err.strerror or err}{where}", err=True)
            ctx.exit(2)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="attnlab")
def cli() -> None:
    """Build, train and interrogate transformers."""


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="attnlab")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
