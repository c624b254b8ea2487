"""Sections 1 and 2: the sinusoidal angles and encodings, then the two properties that make them useful.

Everything is computed by the core (:func:`attnlab.nn.sinusoidal_angles`, :func:`attnlab.nn.sinusoidal_encoding`)
and measured here with vectorised torch operations: norms with ``torch.linalg.vector_norm``, the Gram
matrix with one matmul and the distance matrix with ``torch.cdist``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnlab.lab import figures
from attnlab.lab.html import Section, check, code, figure, fmt, heading, matrix, para, table
from attnlab.nn import sinusoidal_angles, sinusoidal_encoding

#: Seed 000's demonstration sizes: a 4 x 8 angle matrix and a 50-position, 512-wide encoding.
ANGLE_POSITIONS, ANGLE_D = 4, 8
TABLE_POSITIONS, TABLE_D = 50, 512
#: Positions the seed measures norms and gap distances at (kept only where they fit the length).
NORM_POSITIONS = (0, 34, 99)
GAP_POSITIONS = (0, 10, 40, 70, 90)
GAP_K = 2


def angles_section() -> Section:
    """Section 1: the 4 x 8 angle matrix, the (50, 512) encoding's shape, first rows and heatmap."""
    angles = sinusoidal_angles(ANGLE_POSITIONS, ANGLE_D)  # (4, 8) float64
    pe = sinusoidal_encoding(TABLE_POSITIONS, TABLE_D)  # (50, 512) float32, as a model would hold it
    row0 = pe[0, :8].tolist()
    row1 = [round(v, 4) for v in pe[1, :8].tolist()]
    paired = bool(torch.equal(angles[:, 0::2], angles[:, 1::2]))

    body = para(
        "Each pair of dimensions (2i, 2i + 1) shares one angle, pos / 10000<sup>2i/d</sup>: the even one",
        "takes its sine, the odd one its cosine. For d = 8 the angle shrinks tenfold each time i grows,",
        "because 10000<sup>2i/8</sup> = 10<sup>i</sup>.",
    )
    body += matrix(angles.numpy(), 3, row_labels=[f"pos {p}" for p in range(ANGLE_POSITIONS)],
                   col_labels=[f"k={k}" for k in range(ANGLE_D)], caption="sinusoidal_angles(4, 8)")
    body += check(paired, "columns 0 and 1, 2 and 3, 4 and 5, 6 and 7 are equal: each angle is read twice")
    body += heading("The encoding table")
    body += code(
        f"sinusoidal_encoding({TABLE_POSITIONS}, {TABLE_D}).shape = {tuple(pe.shape)}\n"
        f"position 0, first 8 dimensions: [{', '.join(fmt(v, 4) for v in row0)}]\n"
        f"position 1, first 8 dimensions: [{', '.join(fmt(v, 4) for v in row1)}]"
    )
    body += para(
        "Position 0 is not the zero vector: every angle is 0, so the row alternates sin 0 = 0 and cos 0 = 1.",
        "The core returns (positions, d) without the seed's leading batch axis; broadcasting adds it.",
    )
    png = figures.heatmap(pe.numpy(), title=f"Positional encoding, {TABLE_POSITIONS} positions x {TABLE_D} dimensions",
                          xlabel="dimension k", ylabel="position", value_label="PE[position, k]")
    body += figure(png, "heatmap of the 50 by 512 positional encoding",
                   "Low dimensions (left) oscillate fast down the positions, high ones (right) barely move: "
                   "fast columns tell neighbours apart, slow ones tell the start of a long text from its end.")
    numbers = {
        "angles": angles.tolist(),
        "angle_pairs_equal": paired,
        "table_shape": list(pe.shape),
        "row0_first8": row0,
        "row1_first8": row1,
    }
    return Section("angles", "Angles and encodings", numbers, body)


def _norms_and_gaps(num_positions: int, d: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Norm of every encoding row and the distance across every gap of ``k`` (float64, vectorised).

    Returns:
        the (P, d) encoding, norms (P,) and gap distances (P - k,).
    """
    pe = sinusoidal_encoding(num_positions, d, dtype=torch.float64)
    norms = torch.linalg.vector_norm(pe, dim=1)
    gaps = torch.linalg.vector_norm(pe[:-k] - pe[k:], dim=1)
    return pe, norms, gaps


def _at(values: torch.Tensor, positions: list[int]) -> dict[str, float]:
    return {str(p): float(values[p]) for p in positions}


def _spread(values: torch.Tensor) -> float:
    return float(values.max() - values.min())


#: The width seed 000 works at, and its GloVe file.
SEED_WIDTH, SEED_GLOVE = 100, "glove.6B.100d.txt"


def seed_gap() -> float:
    """The gap-``GAP_K`` distance at the seed's width (the same at every position, to rounding)."""
    pe = sinusoidal_encoding(GAP_K + 1, SEED_WIDTH, dtype=torch.float64)
    return float(torch.linalg.vector_norm(pe[0] - pe[GAP_K]))


@dataclass
class _Width:
    """The two properties measured at one encoding width over every position (float64).

    Attributes:
        d: the width.
        norms: (P,) the norm of every row.
        gaps: (P - GAP_K,) the distance from every row to the row ``GAP_K`` positions on.
    """

    d: int
    norms: torch.Tensor
    gaps: torch.Tensor

    @classmethod
    def measure(cls, max_length: int, d: int) -> _Width:
        _, norms, gaps = _norms_and_gaps(max_length, d, GAP_K)
        return cls(d, norms, gaps)


def properties_section(d: int, max_length: int) -> Section:
    """Section 2: constant norm sqrt(d/2), gap distances that depend on the gap only, and an odd width.

    Args:
        d: encoding width (the word vectors' width, so that section 3 can add the two).
        max_length: number of positions (the padded sentence length of section 3).
    """
    norm_at = sorted({p for p in NORM_POSITIONS if p < max_length} | {max_length - 1})
    gap_at = [p for p in GAP_POSITIONS if p + GAP_K < max_length]
    # The two properties are exact at an even width and drift at an odd one, whose last dimension is a sine
    # with no cosine partner: measure the loaded width and its neighbour of the other parity.
    even, odd = (_Width.measure(max_length, w) for w in ((d, d + 1) if d % 2 == 0 else (d - 1, d)))
    reference = math.sqrt(even.d / 2)
    body = _exact_facts(d, max_length, even, odd, norm_at, gap_at)
    odd_body, peak_position = _odd_width(max_length, even, odd)
    pairs_body, pairs_numbers = _every_pair(d, max_length)
    body += odd_body + pairs_body

    numbers = {
        "d": d,
        "even_d": even.d,
        "positions": max_length,
        "sqrt_half_d": reference,
        "seed_width": {"d": SEED_WIDTH, "sqrt_half_d": math.sqrt(SEED_WIDTH / 2), "gap_distance": seed_gap()},
        "norms": _at(even.norms, norm_at),
        "norm_spread": _spread(even.norms),
        "gap_distances": {"k": GAP_K, "values": _at(even.gaps, gap_at), "spread": _spread(even.gaps)},
        "odd": {
            "d": odd.d,
            "norms": _at(odd.norms, norm_at),
            "norm_min": float(odd.norms.min()),
            "norm_max": float(odd.norms.max()),
            "norm_spread": _spread(odd.norms),
            "gap_distances": {"k": GAP_K, "values": _at(odd.gaps, gap_at), "spread": _spread(odd.gaps)},
            "norm_limit": math.sqrt(odd.d // 2 + 1),
            "norm_limit_position": peak_position,
        },
        **pairs_numbers,
    }
    highlights = [
        (f"norm of PE rows (d={even.d})", f"{fmt(even.norms[0], 6)} = sqrt(d/2), spread {_spread(even.norms):.1e}"),
        (f"gap-{GAP_K} distance (d={even.d})", f"{fmt(even.gaps[0], 6)}, spread {_spread(even.gaps):.1e}"),
        (f"odd d={odd.d}", f"norm spread {_spread(odd.norms):.1e}, gap spread {_spread(odd.gaps):.1e}"),
    ]
    return Section("encoding", "Properties of the encoding", numbers, body, highlights)


def _exact_facts(d: int, max_length: int, even: _Width, odd: _Width, norm_at: list[int], gap_at: list[int]) -> str:
    """The norm and the gap distance at the seed's positions, at the even width and the odd one beside it."""
    body = para(
        f"From here the encoding width follows the word vectors of section 3: <b>d = {d}</b>, over",
        f"<b>{max_length}</b> positions (the padded sentence length). Each sine/cosine pair contributes",
        "sin&sup2; + cos&sup2; = 1 to the squared norm, so at an even width every row should have norm",
        f"sqrt(d/2) = {fmt(math.sqrt(even.d / 2), 6)}" + (f" (at d = {even.d})." if even.d != d else "."),
    )
    if even.d != d:
        body += para(f"d = {d} is odd, so the exact facts are measured at d = {even.d} beside it, and the loaded",
                     "width is the odd case below.")
    if d != SEED_WIDTH:  # the seed's figures come from its 100-wide GloVe; say so rather than let them clash
        body += para(
            f"Seed 000 measures this at d = {SEED_WIDTH}, the width of its GloVe file: norm sqrt({SEED_WIDTH // 2}) =",
            f"{fmt(math.sqrt(SEED_WIDTH / 2), 6)} and a gap-{GAP_K} distance of {fmt(seed_gap(), 6)} (both computed",
            f"here). This page works at the loaded vectors' width, d = {d} (the default vectors are 50 wide, so",
            "that nothing has to be downloaded); <code>attnlab lab --glove glove.6B.100d.txt</code> gives the",
            "seed's width in this section and the next.",
        )
    body += table(["position", f"||PE[pos]||, d = {even.d}", f"||PE[pos]||, d = {odd.d}"],
                  [(p, fmt(even.norms[p], 6), fmt(odd.norms[p], 6)) for p in norm_at])
    body += para(
        f"The distance across a fixed gap of k = {GAP_K} should not depend on where the gap sits:",
    )
    body += table(["pos", f"||PE[pos] - PE[pos+{GAP_K}]||, d = {even.d}", f"same, d = {odd.d}"],
                  [(p, fmt(even.gaps[p], 6), fmt(odd.gaps[p], 6)) for p in gap_at])
    return body


def _odd_width(max_length: int, even: _Width, odd: _Width) -> tuple[str, float]:
    """How far both properties drift at the odd width, against the even one; also the position of the norm's peak."""
    body = heading(f"An odd width weakens both facts (d = {odd.d})")
    # The unpaired last column is sin(pos / 10000^((d_odd - 1) / d_odd)), the slowest of all: its sine
    # first reaches 1, and the norm its largest value, at this position.
    slowest = 10000.0 ** ((odd.d - 1) / odd.d)
    peak_position = math.pi / 2 * slowest
    # How far these positions take the drift: the unpaired sine's square at the last one, or 1 past the peak.
    last = max_length - 1
    passes_peak = last >= peak_position
    reach = 1.0 if passes_peak else math.sin(last / slowest) ** 2
    if passes_peak:  # small widths at long lengths: the slowest column is not slow enough to stay near 0
        extent = (f"Over {max_length} positions the norm reaches that peak and falls back as the sine turns: the "
                  "whole of the drift.")
    elif reach < 0.1:
        extent = f"That column is the slowest one, so over {max_length} positions the drift is small."
    else:
        extent = f"Over {max_length} positions the drift grows with the position, short of its peak."
    body += para(
        f"With d = {odd.d} the last dimension is a sine with no cosine partner, so the squared norm is",
        f"{odd.d // 2} + sin&sup2;(pos / {slowest:,.0f}): it drifts from sqrt({odd.d // 2}) = {fmt(math.sqrt(odd.d // 2), 4)}",
        f"up to sqrt({odd.d // 2 + 1}) = {fmt(math.sqrt(odd.d // 2 + 1), 4)}, reached near position {peak_position:,.0f}.",
        "The gap distance picks up a position-dependent term the same way.", extent, "Measured at every position:",
    )
    body += table(
        ["width", "norm: min", "norm: max", "norm spread", f"gap-{GAP_K} distance spread"],
        [(f"d = {w.d}", fmt(w.norms.min(), 6), fmt(w.norms.max(), 6), f"{_spread(w.norms):.2e}", f"{_spread(w.gaps):.2e}")
         for w in (even, odd)],
    )
    body += figure(
        figures.property_curves({f"d = {w.d}": w.norms.numpy() for w in (even, odd)},
                                {f"d = {w.d}": w.gaps.numpy() for w in (even, odd)}, GAP_K),
        "log-scale drift of the norm and of the gap distance with position, for an even and an odd width",
        "How far each property drifts from its value at position 0 (log scale). Even width: rounding noise "
        "only, the properties are exact. Odd width: both drift, orders of magnitude above the noise, "
        + (f"rising to a peak near position {peak_position:,.0f} and falling back." if passes_peak else
           "growing with the position."),
    )
    return body, peak_position


def _every_pair(d: int, max_length: int) -> tuple[str, dict[str, dict]]:
    """The Gram and distance matrices of the loaded width's encoding, their two checks and figure."""
    pe = sinusoidal_encoding(max_length, d, dtype=torch.float64)  # (P, d): the width section 3 adds
    gram = pe @ pe.T  # (P, P): every encoding's dot product with every other, one matmul
    # The exact (non-matmul) cdist path keeps the diagonal at exactly 0.
    dist = torch.cdist(pe[None], pe[None], compute_mode="donot_use_mm_for_euclid_dist")[0]  # (P, P)
    body = heading(f"Every position against every other (d = {d})")
    if d % 2 == 0:
        body += para(
            "PE PE<sup>T</sup> is a Gram matrix (dot products), a fixed multiple d/2 of the cosine similarities",
            "because every norm is the same; it is not a Pearson correlation. Both matrices below are computed",
            "in one vectorised call each: a matmul and <code>torch.cdist</code>.",
        )
        diagonal = f"(= d/2 = {d / 2:g})"
    else:
        body += para(
            "PE PE<sup>T</sup> is a Gram matrix (dot products); at this odd width the norms drift (above), so it is",
            "only nearly a multiple of the cosine similarities. It is not a Pearson correlation. Both matrices",
            "below are computed in one vectorised call each: a matmul and <code>torch.cdist</code>.",
        )
        diagonal = f"({fmt(gram.diagonal().min(), 4)} to {fmt(gram.diagonal().max(), 4)}: the squared norms)"
    symmetric = bool(torch.allclose(gram, gram.T) and torch.allclose(dist, dist.T))
    diag_max = bool(torch.all(gram.diagonal() >= gram.max(dim=1).values - 1e-9))
    body += check(symmetric, "both matrices are symmetric")
    body += check(diag_max and float(dist.diagonal().abs().max()) == 0.0,
                  f"the dot product is largest on the diagonal {diagonal}; the distance there is exactly 0")
    body += figure(figures.heatmap_pair(gram.numpy(), dist.numpy(), ("Dot product", "Euclidean distance"), "position",
                                        ("PE[i] . PE[j]", "||PE[i] - PE[j]||")),
                   "heatmaps of the dot-product and Euclidean-distance matrices between all positions",
                   ("Left: the dot products peak (yellow) on the diagonal, where a vector meets itself. " if diag_max
                    else "Left: the dot products, here not largest on the diagonal in every row: at this odd width "
                         "the norms drift, and a longer, nearly parallel neighbour outscores a vector's own square "
                         "(the check above). ")
                   + "Right: the "
                   "distances are 0 on the diagonal and grow away from it. Neither is "
                   "monotone far from the diagonal, where individual components drift back into phase.")
    numbers = {
        "gram": {"shape": list(gram.shape), "diagonal": float(gram[0, 0]), "symmetric": symmetric},
        "distance": {"shape": list(dist.shape), "max": float(dist.max()), "diagonal_max": float(dist.diagonal().max())},
    }
    return body, numbers

