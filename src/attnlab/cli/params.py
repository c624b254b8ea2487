"""Click parameter types and options shared by the commands."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
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


class WholeNumber(click.IntRange):
    """``click.IntRange`` under the name "integer". Click calls its range type "integer range", which made
    ``--steps abc`` say "'abc' is not a valid integer range" (the value is not an integer; the range is the
    option's) and --help show ``INTEGER RANGE`` before the range itself."""

    name = "integer"


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


def own_cpus() -> set[int]:
    """The CPUs this process may run on (a cpuset or ``taskset`` leaves out the rest)."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def utf8_text(text: str) -> str:
    """A command-line text read as the UTF-8 its bytes are, whatever the locale decoded them as (under
    ``LC_ALL=C`` 'café' came as surrogates); UnicodeError when the bytes are not UTF-8."""
    return os.fsencode(text).decode("utf-8")


class Utf8Text(click.ParamType):
    """A text argument or option (a prompt, a sentence), refused in one line when its bytes are not UTF-8: the
    tokenizers raised a TypeError on the surrogates Python reads such bytes as, or named a character '\\udcff'."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return utf8_text(value)
        except UnicodeError:
            self.fail("the text is not UTF-8", param, ctx)


#: The most torch threads an option takes: more CPUs than the largest machines have. Past it torch's own
#: conversion overflowed with a traceback (2**31), and OpenMP failed to start its threads (30,000) or crashed
#: the process (40,000 and up, a segmentation fault) instead of an error line.
MAX_THREADS = 4096


class Threads(WholeNumber):
    """A torch thread count, 0 for torch's own choice, at most :data:`MAX_THREADS`; more threads than the CPUs
    the process may use is taken, with a note: the extra threads only wait for each other (1,000 on 2 cores
    made a run 17 times slower)."""

    def __init__(self) -> None:
        super().__init__(min=0, max=MAX_THREADS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        cpus = len(own_cpus())
        if number > cpus:
            click.echo(f"note: --threads {number} is more than the {cpus} CPUs this process may use; the extra threads "
                       "only wait for each other", err=True)
        return number


def default_output(path: Path, option: str) -> Path:
    """``path``, a command's default output in a run folder, refused up front when that folder cannot be written
    (a run on a read-only disk can still be scored: the message says which option puts the output elsewhere)."""
    folder = path.parent
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise AttnlabError(f"{folder} is not writable, and {path.name} goes there by default; give {option} PATH "
                           "to write it elsewhere")
    return path


#: A BPE vocabulary size. The bound is far past any real vocabulary (GPT-2's 50,257; the largest of today's models
#: about 256,000): Hugging Face's trainer allocates for the size asked before it reads a word, and a size of ten
#: billion aborted the process with a Rust backtrace instead of an error.
BPE_VOCAB = WholeNumber(min=1, max=2**20)


def progress_option(*, default: bool = True, what: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--progress/--no-progress`` option of the commands that show a bar (``what``: when, if not always)."""
    return click.option("--progress/--no-progress", default=default, show_default=True,
                        help=f"A progress bar{what} on stderr, when stderr is a terminal.")
