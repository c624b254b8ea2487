"""``attnlab attention RUN "..." --out fig.png``: where the decoder looked in the source, as a heatmap."""

from __future__ import annotations

import math
from pathlib import Path

import click

from attnlab.cli.params import PathParam, Utf8Text
from attnlab.cli.translate import decode_options, decode_settings, report_warnings

#: The largest side of the heatmap, inches (4,800 pixels at its 120 dpi): a sentence of 280 pieces, drawn at a
#: readable size per piece, made a 14,124 x 12,528-pixel image that took 5.9 GB of memory.
MAX_FIGURE_INCHES = 40.0


def _axis(count: int, inches_each: float, margin: float) -> tuple[float, float, int]:
    """Inches for ``count`` pieces along one side (at most :data:`MAX_FIGURE_INCHES`), the font size of their
    labels (9 points, less where the pieces are squeezed) and which labels to draw (every one, or every n-th where
    even a 4-point label would overlap its neighbours)."""
    inches = min(inches_each * count + margin, MAX_FIGURE_INCHES)
    points_each = (inches - margin) / max(count, 1) * 72
    font = min(9.0, 0.8 * points_each)
    return inches, max(font, 4.0), max(1, math.ceil(4.0 / font))


def plot_heatmap(src_pieces: list[str], out_pieces: list[str], weights, path: Path, title: str) -> None:
    """Draw ``weights`` (T, S) with source pieces along x and output pieces along y; write it atomically, in the
    format the name's suffix asks for (PNG without one). A long sentence is squeezed into at most
    :data:`MAX_FIGURE_INCHES` a side, with smaller labels (every n-th where they would overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.training.plots import save_figure

    width, x_font, x_every = _axis(len(src_pieces), 0.45, 2.5)
    height, y_font, y_every = _axis(len(out_pieces), 0.4, 2.0)
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, aspect="auto")
    # (drawn as written: mathtext would read "$5 to $10" as a formula, or raise on "$\\frac$")
    ax.set_xticks(range(0, len(src_pieces), x_every), labels=src_pieces[::x_every], rotation=60, ha="right",
                  fontsize=x_font, parse_math=False)
    ax.set_yticks(range(0, len(out_pieces), y_every), labels=out_pieces[::y_every], fontsize=y_font, parse_math=False)
    ax.set_xlabel("source pieces (keys)")
    ax.set_ylabel("output pieces (queries)")
    ax.set_title(title, fontsize=10, parse_math=False)
    fig.colorbar(image, ax=ax, fraction=0.04, label="attention weight")
    fig.tight_layout()
    save_figure(fig, path, option="--out", dpi=120)
    plt.close(fig)


@click.command(name="attention")
@click.argument("run", type=PathParam(path_type=Path))
@click.argument("sentence", type=Utf8Text())
@click.option("--out", "out", required=True, type=PathParam(path_type=Path, readable=False), help="Figure to write (.png, .pdf, .svg, ...).")
@click.option("--layer", type=int, default=None, help="Decoder layer, from 1 (default: the last).")
@decode_options
def attention(run: Path, sentence: str, out: Path, layer: int | None, beam: int, length_penalty: float,
              max_len_a: float, max_len_b: int, threads: int | None) -> None:
    """Translate SENTENCE with RUN and draw the cross-attention of one decoder layer, averaged over its heads."""
    from attnlab.errors import AttnlabError
    from attnlab.tasks.translator import cross_attention, load_translator
    from attnlab.training.checkpoint import refuse_overwriting
    from attnlab.training.plots import figure_format

    if not sentence.strip():
        raise AttnlabError("the sentence is empty")
    figure_format(out, "--out")  # a name matplotlib cannot write is said before the translation
    refuse_overwriting(out, "--out", run=run)
    settings = decode_settings(beam, length_penalty, max_len_a, max_len_b, threads)
    translator = load_translator(run)
    with report_warnings():
        result = cross_attention(translator, sentence, layer=layer, decode=settings)
    title = f"cross-attention, decoder layer {result.layer}/{result.layers}, mean of {result.heads} heads"
    plot_heatmap(result.src_pieces, result.out_pieces, result.weights, out, f"{title}\n{result.translation}")
    click.echo(result.translation)
    click.echo(f"wrote {out}", err=True)
