"""``attnlab attention RUN "..." --out fig.png``: where the decoder looked in the source, as a heatmap."""

from __future__ import annotations

from pathlib import Path

import click

from attnlab.cli.params import PathParam
from attnlab.cli.translate import decode_options, decode_settings, report_warnings


def plot_heatmap(src_pieces: list[str], out_pieces: list[str], weights, path: Path, title: str) -> None:
    """Draw ``weights`` (T, S) with source pieces along x and output pieces along y; write it atomically, in the
    format the name's suffix asks for (PNG without one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.files import atomic_path
    from attnlab.training.plots import figure_format

    fig, ax = plt.subplots(figsize=(0.45 * len(src_pieces) + 2.5, 0.4 * len(out_pieces) + 2.0))
    image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, aspect="auto")
    # (drawn as written: mathtext would read "$5 to $10" as a formula, or raise on "$\\frac$")
    ax.set_xticks(range(len(src_pieces)), labels=src_pieces, rotation=60, ha="right", fontsize=9, parse_math=False)
    ax.set_yticks(range(len(out_pieces)), labels=out_pieces, fontsize=9, parse_math=False)
    ax.set_xlabel("source pieces (keys)")
    ax.set_ylabel("output pieces (queries)")
    ax.set_title(title, fontsize=10, parse_math=False)
    fig.colorbar(image, ax=ax, fraction=0.04, label="attention weight")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=figure_format(path, "--out"), dpi=120)
    plt.close(fig)


@click.command(name="attention")
@click.argument("run", type=PathParam(path_type=Path))
@click.argument("sentence")
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
