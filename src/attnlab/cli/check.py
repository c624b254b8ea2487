"""``attnlab check SPEC --kind KIND``: behavioural checks on any model a factory builds.

Python warnings raised while the model is built and checked (torch's "nested tensors are a prototype"
from ``nn.TransformerEncoder`` with a padding mask, deprecations in the user's file) would otherwise
break into the table, once per call. They are collected instead and each distinct one is printed once,
as a ``warning: ...`` line on stderr after the report, so stdout stays the table (or the JSON) alone; what
the factory or the model prints goes to stderr for the same reason.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections.abc import Iterable

import click

from attnlab.checks.contract import KINDS, MAX_VOCAB_SIZE, MIN_MAX_LENGTH, MIN_VOCAB_SIZE, Contract
from attnlab.checks.loading import load_model
from attnlab.checks.runner import run_checks


def _pad_id(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an integer or 'none'") from None


def warning_lines(caught: Iterable[warnings.WarningMessage]) -> list[str]:
    """Each distinct warning once, in the order first seen: ``Category: first line of the message``."""
    lines: dict[str, None] = {}  # a dict keeps the order and drops repeats
    for w in caught:
        text = str(w.message).strip()
        lines[f"{w.category.__name__}: {text.splitlines()[0]}" if text else w.category.__name__] = None
    return list(lines)


@click.command()
@click.argument("spec")
@click.option("--kind", type=click.Choice(KINDS), required=True,
              help="encoder/decoder: model(ids); seq2seq: model(src, tgt).")
@click.option("--pad-id", default="0", show_default=True, callback=_pad_id,
              help="Padding id (right padding), or 'none' for a model without padding.")
@click.option("--vocab-size", type=click.IntRange(min=MIN_VOCAB_SIZE, max=MAX_VOCAB_SIZE), default=32, show_default=True,
              help="Ids are drawn below this (for seq2seq: the smaller vocabulary).")
@click.option("--max-length", type=click.IntRange(min=MIN_MAX_LENGTH), default=16, show_default=True,
              help="Longest sequence the model accepts.")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True, help="Random seeds per check.")
@click.option("--no-empty-rows", is_flag=True, help="The model does not accept a row made only of padding.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def check(spec: str, kind: str, pad_id: int | None, vocab_size: int, max_length: int, seeds: int,
          no_empty_rows: bool, as_json: bool) -> None:
    """Run behavioural checks on the model that SPEC's factory builds.

    SPEC is path/to/file.py:factory or package.module:factory (looked up from the current directory
    too); the factory takes no arguments. Exit status 1 when a check fails, 0 otherwise, 2 when the
    model cannot be loaded. Python warnings come once each, as 'warning:' lines on stderr after the report.
    """
    if pad_id is not None and not 0 <= pad_id < vocab_size:
        raise click.BadParameter(f"{pad_id} is outside the vocabulary 0..{vocab_size - 1} (--vocab-size {vocab_size})",
                                 param_hint="'--pad-id'")
    contract = Contract(kind, pad_id=pad_id, vocab_size=vocab_size, max_length=max_length,  # type: ignore[arg-type]
                        empty_rows=not no_empty_rows)
    with warnings.catch_warnings(record=True) as caught:
        # "always": the filters would otherwise show a warning raised on every call only the first time
        # per place, and we want to know each one was seen; the user's own filters still come first.
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(sys.stderr):  # the model's own prints must not mix into the report
            model = load_model(spec)
            report = run_checks(model, contract, seeds=seeds, spec=spec)
    if as_json:
        click.echo(json.dumps(report.as_dict(), allow_nan=False))
    else:
        report.print()
    for line in warning_lines(caught):
        click.echo(f"warning: {line}", err=True)
    if report.failed:
        click.get_current_context().exit(1)
