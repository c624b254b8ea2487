"""A click group whose commands are imported only when they run, so ``--help`` stays quick."""

from __future__ import annotations

import importlib
from typing import Any

import click


class LazyGroup(click.Group):
    """Group over ``{name: "module:attribute"}``; each command's module is imported on first use."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy_commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy_commands:
            return None
        module, attr = self.lazy_commands[cmd_name].split(":")
        return getattr(importlib.import_module(module), attr)
