"""``attnlab eval classify RUN --data D.csv``: accuracy, macro-F1, per-class table and confusion matrix."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table as RichTable

from attnlab.cli.console import console as stdout_console
from attnlab.cli.params import PathParam, default_output
from attnlab.tasks.classify import load_classifier
from attnlab.tasks.classify_eval import default_confusion_path, draw_confusion, evaluate_table
from attnlab.tasks.tables import TABLE_FORMATS, one_line, read_table
from attnlab.training.checkpoint import read_run_config, refuse_overwriting
from attnlab.training.plots import figure_format


@click.command("classify")
@click.argument("run", type=PathParam(path_type=Path))
@click.option("--data", "data", type=PathParam(path_type=Path), required=True, help=f"Labelled table: {TABLE_FORMATS}.")
@click.option("--text-column", default=None, help="[default: the run's]")
@click.option("--label-column", default=None, help="[default: the run's, else 'label' or the one other column]")
@click.option("--confusion", type=PathParam(path_type=Path, readable=False), default=None,
              help="Where to draw the confusion matrix. [default: RUN/confusion-<data name>.png, or -2, -3... when "
                   "that holds the figure of another file]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def eval_classify(run: Path, data: Path, text_column: str | None, label_column: str | None, confusion: Path | None,
                  as_json: bool) -> None:
    """Score the run RUN on the labelled table --data."""
    read_run_config(run, "classify")  # first: a RUN that is no run would be blamed on the --confusion put in it
    if confusion is not None:
        figure_format(confusion, "--confusion")  # a name matplotlib cannot write is said before the scoring
    png = confusion or default_output(default_confusion_path(Path(run), Path(data)), "--confusion")
    refuse_overwriting(png, "--confusion", run=run, reads=(("--data", data),))
    clf = load_classifier(run)
    table = read_table(data, text_column=text_column or clf.config.get("text_column", "text"),
                       label_column=label_column, prefer_label_column=clf.config.get("label_column"))
    evaluation, truth, predicted = evaluate_table(clf, table)
    evaluation.confusion_figure = str(draw_confusion(truth, predicted, clf.labels, png, data=data))
    if as_json:
        click.echo(json.dumps(evaluation.as_dict()))
        return
    console = stdout_console()
    per_class = RichTable(title=f"{data}: per class", title_justify="left")
    for name, justify in (("label", "left"), ("precision", "right"), ("recall", "right"), ("f1", "right"),
                          ("support", "right")):
        per_class.add_column(name, justify=justify, overflow="fold")  # (a label cut short could be another's)
    for row in evaluation.per_class:
        per_class.add_row(one_line(row["label"]), f"{row['precision']:.3f}", f"{row['recall']:.3f}", f"{row['f1']:.3f}",
                          str(row["support"]))
    console.print(per_class)
    if evaluation.unseen:
        listed = ", ".join(f"{one_line(lab)} ({n})" for lab, n in evaluation.unseen.items())
        click.echo(f"labels not seen in training, counted as errors: {listed}")
    if evaluation.truncated:
        click.echo(f"{evaluation.truncated} texts were cut to the model's {clf.max_len} positions")
    click.echo(f"confusion matrix: {evaluation.confusion_figure}")
    click.echo(f"accuracy {evaluation.accuracy:.2%} ({evaluation.correct}/{evaluation.total}) | "
               f"macro-F1 {evaluation.macro_f1:.4f}")

