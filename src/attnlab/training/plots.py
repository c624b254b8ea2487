"""The loss curve of a run, drawn from its metrics.jsonl; the file format a figure's name asks for."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.files import atomic_path
from attnlab.training.checkpoint import read_metrics


def figure_format(path: str | Path, option: str) -> str:
    """The format matplotlib writes for a figure named ``path`` (``.png``, ``.pdf``, ``.svg``, ...; no suffix:
    PNG); a suffix it cannot write is refused before any work, naming ``option``, rather than written as PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    suffix = Path(path).suffix.lower().lstrip(".")
    known = set(FigureCanvasAgg(Figure()).get_supported_filetypes()) - {"pgf"}  # pgf needs a LaTeX install
    if suffix and suffix not in known:
        raise AttnlabError(f"{option} {path}: matplotlib cannot write .{suffix} figures; use one of "
                           + ", ".join(f".{k}" for k in sorted(known)))
    return suffix or "png"


def save_figure(fig: Any, path: str | Path, *, option: str, dpi: int, metadata: dict[str, str] | None = None) -> None:
    """Write the matplotlib figure ``fig`` to ``path`` in the format its suffix names (see :func:`figure_format`),
    through a temporary name, with ``metadata`` (matplotlib's: text chunks of a PNG). It is drawn in memory first:
    given a file, matplotlib's ``.svgz`` writes that file's name into its gzip header, which would be the temporary
    one (``gunzip -N`` then restores a hidden name)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=figure_format(path, option), dpi=dpi, metadata=metadata)
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(buffer.getvalue())


def plot_loss_curve(metrics_path: str | Path, out_png: str | Path) -> None:
    """Training loss per logged step and, where present, validation loss (or score) per evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    if not metrics_path.exists():
        return
    train, valid = [], []
    valid_name = "validation"
    for record in read_metrics(metrics_path):
        if "loss" in record:
            train.append((record["step"], record["loss"]))
        if "eval" in record:
            ev = record["eval"]
            valid.append((record["step"], ev["loss"] if "loss" in ev else ev.get("score")))
            valid_name = "validation loss" if "loss" in ev else "validation score"
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="training loss", color="#4682B4")
    if valid:
        ax.plot(*zip(*valid), "o-", label=valid_name, color="#C0504D")
    ax.set_xlabel("step")
    ax.grid(linestyle="--", alpha=0.4)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out_png, option="the loss curve", dpi=100)
    plt.close(fig)
