"""``attnlab experiment NAME``: experiments that demonstrate a point, each printing a table and writing a plot."""

from __future__ import annotations

from pathlib import Path

import click

from attnlab.cli.lazy import LazyGroup
from attnlab.cli.params import PathParam, WholeNumber, progress_option

#: experiment name -> "module:attribute" of its click command.
EXPERIMENT_COMMANDS: dict[str, str] = {
    "teacher-forcing": "attnlab.cli.teacher_forcing:teacher_forcing",
    "leak": "attnlab.cli.experiment:leak",
}


@click.group(cls=LazyGroup, lazy_commands=EXPERIMENT_COMMANDS)
def experiment() -> None:
    """Run an experiment."""


@click.command("leak")
@click.option("--text", "text", type=PathParam(path_type=Path), required=True, help="A UTF-8 text file.")
@click.option("--out", "out", type=PathParam(path_type=Path), default=Path("leak"), show_default=True,
              help="Folder for the two runs, leak.png, leak.json and check_models.py; one that already holds "
                   "any of them is refused.")
@click.option("--steps", type=WholeNumber(min=1), default=None,
              help="Training steps of each model (>= 1). [default: 300]")
@click.option("--sample-tokens", type=WholeNumber(min=1), default=200, show_default=True,
              help="Free-running tokens per model (>= 1).")
@progress_option(default=False, what=" while training")
def leak(text: Path, out: Path, steps: int | None, sample_tokens: int, progress: bool) -> None:
    """Train a causal and an unmasked ("leaky") tiny LM for the same budget, and show how only generation
    and the causal check expose the leak (seed 000, review question 4).

    The settings, the text and --out are checked before anything is written: a refused run leaves no folder."""
    from rich.table import Table
    from rich.text import Text

    from attnlab.cli import omp_wait  # noqa: F401  (before torch is imported)
    from attnlab.cli.console import console as stdout_console
    from attnlab.tasks.leak import LEAK_SETTINGS, LOSS_MARGIN, run_leak_experiment, summary

    settings = LEAK_SETTINGS.with_overrides(steps=steps)
    # No --warmup here: a budget shorter than ten warmups warms up for a tenth of it.
    settings = settings.with_overrides(warmup=min(settings.warmup, settings.steps // 10))
    console = stdout_console()

    def banner(_data: object) -> None:  # only once every check has passed
        console.print(f"training two models ({settings.layers} layers, width {settings.width}, context "
                      f"{settings.context}, {settings.steps} step{'s' if settings.steps != 1 else ''} each, same seed and batches) on {text} ...", soft_wrap=True)

    result = run_leak_experiment(text, out, settings, sample_tokens=sample_tokens, progress=progress,
                                 on_start=banner)
    verdict = summary(result)
    # The story in the title only when this run showed all of it; a short or odd run is titled by what it measured.
    title = ("The leaking decoder: teacher-forced loss says it is better; writing and the causal check say it is "
             "broken (nats per token)" if all(verdict.values()) else
             "The leaking decoder (nats per token); this run did not show every expected difference (see the verdict)")
    table = Table(title=title, title_justify="left")
    for column in ("model", "val loss,\nteacher-\nforced", "same windows,\nteacher-\nforced",
                   "same windows,\nfuture absent\n(as writing)", "causal\ncheck", "free-running sample"):
        table.add_column(column, overflow="fold")
    for row in result.rows:
        style = "bold red" if row.check_status == "fail" else "green"
        table.add_row(row.name, f"{row.val_loss:.3f}", f"{row.same_windows_teacher_forced:.3f}",
                      f"{row.future_absent:.3f}", Text(row.check_status.upper(), style=style), repr(row.sample[:24]) + "...")
    console.print(table)
    console.print(f"prompt: {result.prompt!r}; each model's first {sample_tokens} free-running tokens (seed 0, no cache):",
                  soft_wrap=True)
    for row in result.rows:
        console.print(Text.assemble((row.name, "bold"), f": {row.sample!r}"), soft_wrap=True)
    for row in result.rows:
        console.print(Text.assemble("check of the ", (row.name, "bold"), f" model: {row.check_summary}"), soft_wrap=True)
        console.print(f"  reproduce: {result.commands[row.name]}", soft_wrap=True)
    console.print(f"verdict (losses apart by more than {LOSS_MARGIN:g} nats): "
                  + ", ".join(f"{k.replace('_', ' ')}: {'yes' if v else 'NO'}" for k, v in verdict.items()),
                  soft_wrap=True)
    console.print(f"plot: {result.out / 'leak.png'} | numbers: {result.out / 'leak.json'}", soft_wrap=True)
