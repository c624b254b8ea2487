"""Click parameter types shared by the commands."""

from __future__ import annotations

import math
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
