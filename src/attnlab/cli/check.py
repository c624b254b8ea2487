"""``attnlab check SPEC --kind KIND``: behavioural checks on any model a factory builds."""

from __future__ import annotations

import json

import click

from attnlab.checks.contract import KINDS, Contract
from attnlab.checks.loading import load_model
from attnlab.checks.runner import run_checks


def _pad_id(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an integer or 'none'") from None


@click.command()
@click.argument("spec")
@click.option("--kind", type=click.Choice(KINDS), required=True,
              help="encoder/decoder: model(ids); seq2seq: model(src, tgt).")
@click.option("--pad-id", default="0", show_default=True, callback=_pad_id,
              help="Padding id (right padding), or 'none' for a model without padding.")
@click.option("--vocab-size", type=int, default=32, show_default=True,
              help="Ids are drawn below this (for seq2seq: the smaller vocabulary).")
@click.option("--max-length", type=int, default=16, show_default=True, help="Longest sequence the model accepts.")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True, help="Random seeds per check.")
@click.option("--no-empty-rows", is_flag=True, help="The model does not accept a row made only of padding.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def check(spec: str, kind: str, pad_id: int | None, vocab_size: int, max_length: int, seeds: int,
          no_empty_rows: bool, as_json: bool) -> None:
    """Run behavioural checks on the model that SPEC's factory builds.

    SPEC is path/to/file.py:factory or package.module:factory; the factory takes no arguments. Exit
    status 1 when a check fails, 0 otherwise, 2 when the model cannot be loaded.
    """
    contract = Contract(kind, pad_id=pad_id, vocab_size=vocab_size, max_length=max_length,  # type: ignore[arg-type]
                        empty_rows=not no_empty_rows)
    model = load_model(spec)
    report = run_checks(model, contract, seeds=seeds, spec=spec)
    if as_json:
        click.echo(json.dumps(report.as_dict(), allow_nan=False))
    else:
        report.print()
    if report.failed:
        click.get_current_context().exit(1)
