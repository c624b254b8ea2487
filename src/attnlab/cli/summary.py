"""``attnlab summary``: per-layer parameter counts of a preset model."""

from __future__ import annotations

import json

import click
from rich.table import Table

from attnlab.cli.console import console as stdout_console
from attnlab.presets import MODEL_PRESETS, build_preset
from attnlab.summary import summarize, total_parameters


@click.command()
@click.option("--preset", "preset", type=click.Choice(list(MODEL_PRESETS)), default="paper-base", show_default=True,
              help="Which model to build.")
@click.option("--expand", is_flag=True, help="Show attention, feed-forward and norm sub-layers inside each layer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def summary(preset: str, expand: bool, as_json: bool) -> None:
    """Print a per-layer table of parameter counts and the total for a preset model."""
    model = build_preset(preset)
    rows = summarize(model, expand=expand)
    total = total_parameters(rows)
    if as_json:
        click.echo(json.dumps({"preset": preset, "source": MODEL_PRESETS[preset].source, "total": total,
                               "rows": [r.__dict__ for r in rows]}))
        return
    table = Table(title=f"{preset}: {MODEL_PRESETS[preset].source}", title_justify="left")
    table.add_column("layer", overflow="fold")  # (folded, not cut: two names cut alike could not be told apart)
    table.add_column("type", overflow="fold")
    table.add_column("parameters", justify="right", no_wrap=True)  # (the command's figures: never cut short)
    table.add_column("note", overflow="fold")  # (it names the parameter shared: not to be cut either)
    for r in rows:
        table.add_row(r.name, r.kind, f"{r.parameters:,}", r.note)
    table.add_section()
    table.add_row("total", "", f"{total:,}", "")
    stdout_console().print(table)
