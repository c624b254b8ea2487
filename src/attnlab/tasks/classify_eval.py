"""Scoring a trained classifier on a labelled table: accuracy, macro-F1, a per-class table, a confusion matrix.

Labels the run never saw in training cannot be predicted: their rows count as errors in the accuracy,
enter the macro-F1 as classes with F1 0, and are listed in :attr:`Evaluation.unseen`, so a test file
with a new class is reported, never a crash.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlab.tasks.classify import Classifier
from attnlab.tasks.tables import Table, one_line
from attnlab.training.plots import figure_format, save_figure


@dataclass
class Evaluation:
    """The figures of one evaluation.

    Attributes:
        accuracy: share of rows whose predicted label is the true one.
        macro_f1: unweighted mean F1 over the classes present in the truth or the predictions.
        correct, total: the accuracy's numerator and denominator.
        per_class: one dict per class (``label``, ``precision``, ``recall``, ``f1``, ``support``).
        unseen: labels absent from training -> their row count.
        truncated: texts cut to the model's position table.
        confusion_figure: where the confusion matrix was drawn (None if not drawn).
        data: the table's path.
    """

    accuracy: float
    macro_f1: float
    correct: int
    total: int
    per_class: list[dict[str, Any]]
    unseen: dict[str, int] = field(default_factory=dict)
    truncated: int = 0
    confusion_figure: str | None = None
    data: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_table(clf: Classifier, table: Table) -> tuple[Evaluation, list[str], list[str]]:
    """Predict every row of ``table`` and score the predictions.

    Returns:
        the evaluation, the true labels and the predicted labels (row order).
    """
    from sklearn.metrics import f1_score, precision_recall_fscore_support

    assert table.labels is not None, "evaluation needs a label column"
    encoded = clf.encode(table.texts)
    predicted = [clf.labels[i] for i in clf.logits(encoded.ids).argmax(1).tolist()]
    truth = table.labels
    known = set(clf.labels)
    unseen = dict(sorted(Counter(t for t in truth if t not in known).items()))
    present = set(truth) | set(predicted)
    classes = [lab for lab in clf.labels if lab in present] + sorted(unseen)
    precision, recall, f1, support = precision_recall_fscore_support(truth, predicted, labels=classes, zero_division=0)
    per_class = [{"label": lab, "precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                 for lab, p, r, f, s in zip(classes, precision, recall, f1, support)]
    correct = sum(t == p for t, p in zip(truth, predicted))
    evaluation = Evaluation(
        accuracy=correct / len(truth), correct=correct, total=len(truth),
        macro_f1=float(f1_score(truth, predicted, labels=classes, average="macro", zero_division=0)),
        per_class=per_class, unseen=unseen, truncated=encoded.truncated, data=str(table.path),
    )
    return evaluation, truth, predicted


#: The most unseen labels (true labels of the data that the run was not trained on) given a row of their own.
UNSEEN_ROWS = 30


#: The PNG text key under which a default confusion figure names, by digest, the data file it was drawn from.
DATA_KEY = "attnlab:data"


def data_digest(data: str | Path) -> str:
    """A short digest of the data file's resolved path (a figure that is shared does not carry the path itself)."""
    return hashlib.sha256(os.fsencode(Path(data).resolve())).hexdigest()[:16]


def default_confusion_path(run: Path, data: Path) -> Path:
    """``RUN/confusion-<data name>.png``, unless a file of that name holds anything but this data's figure (the
    figure of bank.csv beside bank.jsonl, of a/valid.csv beside b/valid.csv): then the first of
    ``confusion-<data name>-2.png``, ``-3``, ... that is free or holds this data's figure. Scoring a file again
    replaces its own figure, never another's."""
    digest = data_digest(data)
    names = (run / f"confusion-{data.stem}{'' if n == 1 else f'-{n}'}.png" for n in itertools.count(1))
    return next(path for path in names if not os.path.lexists(path) or _drawn_from(path) == digest)


def _drawn_from(path: Path) -> str | None:
    """The data digest a default confusion figure was saved with, or None (another file, or none readable)."""
    from PIL import Image  # (matplotlib's own dependency)

    try:
        with Image.open(path) as image:
            return getattr(image, "text", {}).get(DATA_KEY)
    except (OSError, ValueError, Image.DecompressionBombError):  # a folder, no image, a truncated or a huge one
        return None


def draw_confusion(truth: list[str], predicted: list[str], labels: list[str], path: str | Path, *,
                   data: str | Path | None = None) -> Path:
    """Confusion matrix as a PNG: rows are true labels (training labels, then unseen ones), columns predictions.

    Cells show the share of each true label's rows (so rare classes are as visible as common ones);
    with at most 20 classes the counts are written in the cells. Past :data:`UNSEEN_ROWS` unseen labels, the
    rarest share one row (a thousand of them drew a figure 100,000 pixels tall). Labels are drawn as written:
    matplotlib's mathtext is off (``$10-$20`` was drawn as a formula, or raised). A PNG is marked with the digest
    of ``data``, the file scored (see :func:`default_confusion_path`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    frequency = Counter(truth)
    unseen = sorted(set(truth) - set(labels), key=lambda lab: (-frequency[lab], lab))  # the most frequent first
    rows = labels + sorted(unseen[:UNSEEN_ROWS])
    row_of, col_of = {lab: i for i, lab in enumerate(rows)}, {lab: i for i, lab in enumerate(labels)}
    if len(unseen) > UNSEEN_ROWS:
        rest = f"({len(unseen) - UNSEEN_ROWS} other labels not seen in training)"
        row_of |= {lab: len(rows) for lab in unseen[UNSEEN_ROWS:]}
        rows.append(rest)
    counts = np.zeros((len(rows), len(labels)), dtype=np.int64)
    for t, p in zip(truth, predicted):
        counts[row_of[t], col_of[p]] += 1
    shares = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    size = min(4 + 0.18 * len(labels), 24)
    extra_height = min(size / len(labels), 0.3) * (len(rows) - len(labels))  # the unseen labels' rows, inches
    fig, ax = plt.subplots(figsize=(size + 1.5, size + extra_height + 1))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    font = 8 if len(labels) <= 30 else 5
    # (a tab or line break in a label is written \t, \n: fonts have no glyph for them)
    ax.set_xticks(range(len(labels)), [one_line(lab) for lab in labels], rotation=90, fontsize=font, parse_math=False)
    ax.set_yticks(range(len(rows)), [one_line(lab) for lab in rows], fontsize=font, parse_math=False)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if len(labels) <= 20:
        for (i, j), n in np.ndenumerate(counts):
            if n:
                ax.text(j, i, str(n), ha="center", va="center", fontsize=7,
                        color="white" if shares[i, j] > 0.5 else "black")
    fig.colorbar(image, ax=ax, fraction=0.03, label="share of the true label's rows")
    ax.set_title(f"confusion matrix ({len(truth)} rows, accuracy {np.trace(counts[:len(labels)]) / len(truth):.1%})")
    fig.tight_layout()
    path = Path(path)
    png = data is not None and figure_format(path, "--confusion") == "png"
    save_figure(fig, path, option="--confusion", dpi=110, metadata={DATA_KEY: data_digest(data)} if png else None)
    plt.close(fig)
    return path
