"""``attnlab probe order`` and ``attnlab probe padding``: the shuffle test and the padding-mask demonstration."""

from __future__ import annotations

import json
from pathlib import Path

import click

from attnlab.cli import SEED
from attnlab.cli.params import PathParam
from attnlab.tasks.classify import load_classifier
from attnlab.tasks.classify_probes import IDENTICAL_ATOL, order_probe, padding_probe
from attnlab.tasks.tables import TABLE_FORMATS, one_line, read_table

_run = click.argument("run", type=PathParam(path_type=Path))
_data = click.option("--data", "data", type=PathParam(path_type=Path), required=True,
                     help=f"Labelled table: {TABLE_FORMATS}.")
_text = click.option("--text-column", default=None, help="[default: the run's]")
_label = click.option("--label-column", default=None, help="[default: the run's, else 'label' or the other column]")
_json = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def _load(run: Path, data: Path, text_column: str | None, label_column: str | None):
    clf = load_classifier(run)
    table = read_table(data, text_column=text_column or clf.config.get("text_column", "text"),
                       label_column=label_column, prefer_label_column=clf.config.get("label_column"))
    known = set(clf.labels)
    unseen = [lab for lab in table.labels or [] if lab not in known]
    if unseen:  # said, as eval classify says it: an accuracy of 0 would otherwise look like the probe's finding
        kinds = sorted(set(unseen))
        click.echo(f"note: {len(unseen)} rows have labels the run never saw ({', '.join(map(one_line, kinds[:5]))}"
                   f"{', ...' if len(kinds) > 5 else ''}); they count as errors in every accuracy", err=True)
    cut = clf.encode(table.texts).note("note: the probed texts")  # (as eval classify says it)
    if cut:
        click.echo(cut, err=True)
    return clf, table


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2%}"


@click.command("order")
@_run
@_data
@_text
@_label
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the shuffles.")
@_json
def probe_order(run: Path, data: Path, text_column: str | None, label_column: str | None, seed: int,
                as_json: bool) -> None:
    """The shuffle test: accuracy in order and shuffled, with the trained positions and with them zeroed."""
    clf, table = _load(run, data, text_column, label_column)
    result = order_probe(clf, table, seed=seed)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(f"{result.texts} texts; positions: {result.positions}")  # learned, sinusoidal, rotary or none (a bag of words)
    click.echo(f"in order:                     {_pct(result.in_order)}")
    click.echo(f"shuffled:                     {_pct(result.shuffled)}  "
               f"({result.changed_by_shuffle:.1%} of the predictions change)")
    click.echo(f"positions zeroed, in order:   {_pct(result.zeroed)}")
    click.echo(f"positions zeroed, shuffled:   {_pct(result.zeroed_shuffled)}")
    if result.zeroed_identical is None:
        click.echo("check: rotary positions are not a table; nothing to zero")
    else:
        verdict = "identical" if result.zeroed_identical else "DIFFERENT"
        click.echo(f"check: without positions a text and its shuffle score {verdict} "
                   f"(largest difference {result.zeroed_max_diff:.2e}, tolerance {IDENTICAL_ATOL:g})")


@click.command("padding")
@_run
@_data
@_text
@_label
@_json
def probe_padding(run: Path, data: Path, text_column: str | None, label_column: str | None, as_json: bool) -> None:
    """Scores alone vs padded next to the longest text, with the mask, without it, and with it inverted."""
    clf, table = _load(run, data, text_column, label_column)
    result = padding_probe(clf, table)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    if not len(clf.model.encoder.layers):
        click.echo("note: this model has no attention layers (the bag of words): no mask reaches its scores, "
                   "so every line below should read the same")
    ex = result.example
    if ex.padding == 0:
        click.echo(f"note: every text is {result.longest} tokens long, so nothing gets padded and the lines below "
                   "cannot tell a working mask from a missing one; probe data with texts of different lengths")
    # (labels and text as predict writes them: a tab or line break in one would break the lines below)
    click.echo(f"shortest text ({one_line(ex.label)}, {ex.tokens} tokens, {ex.padding} padding next to the longest "
               f"of {result.longest}): {one_line(ex.text)}")
    click.echo(f"  scores of {', '.join(map(one_line, ex.top))}:")
    for condition, name in (("alone", "alone, no padding:   "), ("padded_mask", "padded, with mask:   "),
                            ("padded_no_mask", "padded, without mask:")):
        click.echo(f"  {name} {ex.scores[condition]} -> {one_line(ex.predicted[condition])}")
    click.echo(f"{result.texts} texts, each padded to {result.longest} tokens:")
    click.echo(f"accuracy alone:                {_pct(result.alone)}")
    verdict = "identical" if result.mask_identical else "DIFFERENT"
    click.echo(f"accuracy padded, with mask:    {_pct(result.padded_mask)}  "
               f"(scores {verdict} to alone: largest difference {result.mask_max_diff:.2e})")
    click.echo(f"accuracy padded, without mask: {_pct(result.padded_no_mask)}  "
               f"({result.no_mask_changed:.1%} of the predictions change)")
    n = result.inverted_all_hidden
    hidden = (f"; {n} text{'s' if n != 1 else ''} had every key hidden: NaN in torch's encoder, zero attention "
              "here" if len(clf.model.encoder.layers) else "")  # no layers: no keys to hide
    nan = result.inverted_nan
    click.echo(f"accuracy with the mask inverted: {_pct(result.inverted)}  ({nan} text{'s' if nan != 1 else ''} with "
               f"NaN scores{hidden})")
