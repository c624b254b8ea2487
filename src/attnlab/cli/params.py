"""Click parameter types shared by the commands."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

from attnlab.errors import AttnlabError


class PathParam(click.Path):
    """``click.Path`` that refuses an empty name.

    ``Path("")`` is ``Path(".")``: without this, ``--out ''`` (an unset shell variable, say) would write into
    the current folder and ``--text ''`` would read it, instead of naming the mistake.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("the name is empty; give a file or folder name", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloat(click.FloatRange):
    """``click.FloatRange`` (or a plain float, without bounds) that refuses NaN and infinity.

    Click's range check compares, and every comparison with NaN is false, so ``--dropout nan`` would pass a
    ``FloatRange(0, 1)``; no option here has a use for a value that is not finite.
    """

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def _describe_range(self) -> str:
        # Without bounds click would print "x<=None" in --help; there is no range to show.
        return "" if self.min is None and self.max is None else super()._describe_range()


def default_output(path: Path, option: str) -> Path:
    """``path``, a command's default output in a run folder, refused up front when that folder cannot be written
    (a run on a read-only disk can still be scored: the message says which option puts the output elsewhere)."""
    folder = path.parent
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise AttnlabError(f"{folder} is not writable, and {path.name} goes there by default; give {option} PATH "
                           "to write it elsewhere")
    return path
