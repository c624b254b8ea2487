"""Matplotlib figures for the lab report, rendered off-screen (Agg) to base64 PNG strings.

PNG rather than SVG: the heatmaps hold thousands of cells, which as vector paths would weigh megabytes
(seed 000 rasterises them for the same reason); a PNG of each is a few tens of kilobytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # no display here, and none needed: every figure goes into the page

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402

DPI = 100
#: One colour per semantic group of the engineered sentences (seed 000), so clusters read at a glance.
GROUP_COLOURS = {"people": "#1f77b4", "animals": "#d62728", "sports": "#2ca02c", "colours": "#9467bd"}


def to_png(fig: Figure) -> str:
    """Render ``fig`` as a base64-encoded PNG and close it."""
    buf = io.BytesIO()
    # No bbox_inches="tight": it draws the figure twice; the constrained layout already fits it.
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def heatmap(values: np.ndarray, *, title: str, xlabel: str, ylabel: str, value_label: str,
            size: tuple[float, float] = (9, 4)) -> str:
    """One heatmap of a (rows, cols) array, row 0 at the top; ``value_label`` names the colour bar."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    # More columns than pixels: let matplotlib antialias instead of dropping columns (which draws stripes).
    image = ax.imshow(values, cmap="RdBu", aspect="auto", interpolation="antialiased")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=12, color="dimgray")
    fig.colorbar(image, ax=ax, label=value_label)
    return to_png(fig)


def heatmap_pair(left: np.ndarray, right: np.ndarray, titles: tuple[str, str], label: str,
                 value_labels: tuple[str, str]) -> str:
    """Two square heatmaps side by side (the Gram and distance matrices); ``value_labels`` name the colour bars."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    for ax, data, title, value_label in zip(axes, (left, right), titles, value_labels):
        # A sequential map: neither matrix is centred on 0, so a diverging map's white midpoint would mean nothing.
        image = ax.imshow(data, cmap="viridis", interpolation="nearest")
        ax.set_xlabel(label)
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=12, color="dimgray")
        fig.colorbar(image, ax=ax, shrink=0.9, label=value_label)
    return to_png(fig)


def property_curves(norms: dict[str, np.ndarray], gaps: dict[str, np.ndarray], k: int) -> str:
    """How far the norm and the gap-k distance drift from their value at position 0, on a log scale.

    A flat property shows up as rounding noise (about 1e-15); a weakened one rises orders of magnitude
    above it, however small it is in absolute terms.

    Args:
        norms, gaps: label -> (P,) norms and (P - k,) gap distances, one entry per encoding width.
        k: the gap.
    """
    floor = 1e-17  # log scale: exact zeros are drawn at this floor (said in the axis label)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
    for ax, curves, title in ((left, norms, "Norm: |norm(PE[pos]) - norm(PE[0])|"),
                              (right, gaps, f"Gap {k}: |dist(pos) - dist(0)|")):
        for label, values in curves.items():
            ax.plot(np.arange(len(values)), np.maximum(np.abs(values - values[0]), floor), label=label)
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, None)
        ax.set_xlabel("position")
        ax.set_ylabel(f"drift (exact 0 drawn at {floor:g})")
        ax.set_title(title, fontsize=12, color="dimgray")
        ax.grid(linestyle="--", alpha=0.4)
        ax.legend(fontsize=9)
    return to_png(fig)


#: Where a word's label may go, tried in this order: (offset of its lower corner from its point, in points; the side
#: it extends to). The four corners first, then a row further up or down, for clusters of more than four.
LABEL_SPOTS = [((4, 2), "left"), ((4, -13), "left"), ((-4, 2), "right"), ((-4, -13), "right"),
               ((4, 16), "left"), ((4, -27), "left"), ((-4, 16), "right"), ((-4, -27), "right")]


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """Area shared by two boxes (x0, y0, x1, y1)."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _word_panel(ax: Axes, points: np.ndarray, groups: Sequence[str], title: str) -> None:
    """The points of one panel, its grid, axis labels and title: everything but the words."""
    ax.scatter(points[:, 0], points[:, 1], color=[GROUP_COLOURS[g] for g in groups], zorder=3)
    ax.margins(0.15)
    ax.grid(linestyle="--", alpha=0.4)
    ax.set_xlabel("PC1 (this panel's own PCA)")
    ax.set_ylabel("PC2")
    ax.set_title(title, fontsize=11, color="dimgray")


def _label_points(ax: Axes, points: np.ndarray, words: Sequence[str], groups: Sequence[str]) -> None:
    """Write ``word@position`` beside each point of a panel whose layout is final.

    Each label goes to the first spot around its point where it covers no label placed before it and no point,
    and stays inside the frame; failing that, to the spot that covers the least label area (plus its area outside
    the frame, where it would run over the frame's line or off the panel), then the least point area: words that
    land close together in a layout must stay readable. Boxes are in pixels, the label's width as the renderer
    measures it.
    """
    pixel = ax.figure.dpi / 72  # pixels per point
    renderer = ax.figure.canvas.get_renderer()
    font = FontProperties(size=11, weight="bold")
    at = ax.transData.transform(points)  # (n, 2) pixels
    frame = tuple(ax.bbox.extents)  # (x0, y0, x1, y1) pixels
    dots = [(x - 5 * pixel, y - 5 * pixel, x + 5 * pixel, y + 5 * pixel) for x, y in at]
    placed: list[tuple[float, ...]] = []
    for i, ((x, y), word, group) in enumerate(zip(at, words, groups)):
        # The word's position in its sentence rides along, so an arrangement by position can be checked.
        label = f"{word}@{i}"
        width = renderer.get_text_width_height_descent(label, font, ismath=False)[0]
        height = 11 * pixel
        choices = []
        for (dx, dy), side in LABEL_SPOTS:
            left = x + dx * pixel - (width if side == "right" else 0.0)
            box = (left, y + dy * pixel, left + width, y + dy * pixel + height)
            outside = width * height - _overlap(box, frame)
            covered = (sum(_overlap(box, other) for other in placed) + outside,
                       sum(_overlap(box, other) for other in dots[:i] + dots[i + 1:]))
            choices.append((covered, (dx, dy), side, box))
            if covered == (0, 0):
                break
        _, offset, side, box = min(choices, key=lambda c: c[0])
        placed.append(box)
        ax.annotate(label, points[i], fontsize=11, fontweight="bold", xytext=offset, textcoords="offset points",
                    ha=side, va="bottom", color=GROUP_COLOURS[group])


def word_panels(layouts: Sequence[np.ndarray], words: Sequence[Sequence[str]], groups: Sequence[Sequence[str]],
                titles: Sequence[str]) -> str:
    """PCA layouts of words side by side, each point labelled ``word@position`` and coloured by its group.

    Every panel is its own PCA, so axes and scales differ between panels: compare positions within a panel.

    Args:
        layouts: per panel, (n_words, 2) coordinates.
        words, groups: per panel, the word and its group for every row of the layout.
        titles: one per panel.
    """
    n = len(layouts)
    rows = 2 if n == 4 else 1  # four panels read better as a 2 x 2 grid than as a thin strip
    cols = n // rows
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.8 * rows), squeeze=False, layout="constrained")
    for ax, points, g, title in zip(axes.flat, layouts, groups, titles):
        _word_panel(ax, points, g, title)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=c, label=name) for name, c in GROUP_COLOURS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    # The words go on last, where the layout has put the panels (labels kept inside their frames do not move it):
    # placed before it, they were placed against frames that the layout then moved and stretched.
    fig.draw_without_rendering()
    for ax, points, w, g in zip(axes.flat, layouts, words, groups):
        _label_points(ax, points, w, g)
    return to_png(fig)


def attention_maps(maps: Sequence[np.ndarray], titles: Sequence[str], xlabels: Sequence[str],
                   ylabel: str) -> str:
    """Attention weight matrices side by side, values written in the cells, one shared 0-1 colour bar."""
    fig, axes = plt.subplots(1, len(maps), figsize=(4.2 * len(maps), 3.6), squeeze=False, layout="constrained")
    for ax, weights, title, xlabel in zip(axes[0], maps, titles, xlabels):
        image = ax.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0)
        for (i, j), w in np.ndenumerate(weights):
            ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if w > 0.6 else "black")
        ax.set_title(title, fontsize=11, color="dimgray")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(weights.shape[1]))
        ax.set_yticks(range(weights.shape[0]))
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9, label="attention weight")
    return to_png(fig)
