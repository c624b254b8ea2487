"""Click parameter types shared by the commands."""

from __future__ import annotations

from typing import Any

import click


class PathParam(click.Path):
    """``click.Path`` that refuses an empty name.

    ``Path("")`` is ``Path(".")``: without this, ``--out ''`` (an unset shell variable, say) would write into
    the current folder and ``--text ''`` would read it, instead of naming the mistake.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("the name is empty; give a file or folder name", param, ctx)
        return super().convert(value, param, ctx)
