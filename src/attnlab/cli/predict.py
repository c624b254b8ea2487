"""``attnlab predict RUN "text" ...``: the label and scores of each text (or of each stdin line)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from attnlab.cli.params import PathParam, WholeNumber, utf8_text
from attnlab.errors import AttnlabError
from attnlab.files import read_lines
from attnlab.tasks.classify import load_classifier
from attnlab.tasks.tables import one_line


@click.command("predict")
@click.argument("run", type=PathParam(path_type=Path))
@click.argument("texts", nargs=-1)
@click.option("--top", "top", type=WholeNumber(min=1), default=3, show_default=True, help="Scores shown per text (best first).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per text (JSON lines).")
def predict(run: Path, texts: tuple[str, ...], top: int, as_json: bool) -> None:
    """Predict the label of each TEXT with the classifier in RUN; with no TEXT, read one text a line from stdin.

    Plain output is one tab-separated line per text: label, its probability, the next best labels with
    theirs, and the text. Probabilities are the softmax of the model's scores.
    """
    clf = load_classifier(run)
    arguments = []
    for number, text in enumerate(texts, 1):  # read as stdin's bytes are, whatever the locale decoded them as
        try:
            arguments.append(utf8_text(text))
        except UnicodeError:
            raise AttnlabError(f"text {number} of {len(texts)} is not UTF-8 text") from None
    items = arguments if texts else read_lines("-")
    if not items:
        raise AttnlabError("no text to classify: give texts as arguments or one a line on stdin")
    empty = [i for i, t in enumerate(items, 1) if not t.strip()]
    if empty:  # dropping them would shift every later output line against its input line
        where = "line" if not texts else "text"
        raise AttnlabError(f"{where} {', '.join(map(str, empty[:5]))}{', ...' if len(empty) > 5 else ''} of "
                           f"{len(items)} {'is' if len(empty) == 1 else 'are'} empty; predict prints one line a text, "
                           "so remove empty ones first")
    encoded = clf.encode(items)
    logits = clf.logits(encoded.ids)
    probabilities = torch.softmax(logits, dim=1)
    k = max(1, min(top, len(clf.labels)))
    best_p, best_i = probabilities.topk(k, dim=1)
    for text, ids, row_logits, ps, idx in zip(items, encoded.ids, logits, best_p.tolist(), best_i.tolist()):
        labels = [clf.labels[i] for i in idx]
        if as_json:
            click.echo(json.dumps({
                "text": text, "label": labels[0], "probability": ps[0],
                "top": [{"label": lab, "probability": p, "score": float(row_logits[i])}
                        for lab, p, i in zip(labels, ps, idx)],
                "truncated": len(ids) >= clf.max_len and len(clf.tokenizer.encode(text)) > clf.max_len,
            }))
        else:
            others = " ".join(f"{one_line(lab)}:{p:.3f}" for lab, p in zip(labels[1:], ps[1:]))
            click.echo(f"{one_line(labels[0])}\t{ps[0]:.3f}\t{others}\t{one_line(text)}")
    if encoded.truncated and not as_json:
        click.echo(f"note: {encoded.truncated} text(s) were cut to the model's {clf.max_len} positions", err=True)
