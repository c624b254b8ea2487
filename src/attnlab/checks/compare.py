"""When two outputs count as the same: one tolerance for every check.

Two outputs ``a`` and ``b`` agree when every entry's difference is within its bound,
``|a - b| <= atol + rtol * scale``. The bound is relative because logits and hidden states come at any
scale, and its scale is the entry's **feature's**: the largest finite magnitude that feature (an entry of the
axes after the positions: a vocabulary logit, a hidden unit; an output of one value per position is one
feature) takes at any position on either side, and at least the median over the features of how far each one's
values spread (a scale that logits masked over most of a vocabulary, -1e9 or -1e4 + logit, cannot inflate). An
outlying feature therefore widens only its own bound: a pad logit masked to -1e4 or -1e9, or a hidden
unit of massive activations, would otherwise make every other difference look like rounding (a leaking
decoder passed). The absolute floor ``atol`` stays: an output near 0 still carries the rounding of the
larger terms it was computed from (a pooled score of -3e-4 moved by 8e-8). Outputs below it everywhere
(probabilities over a vocabulary of 100,000) are judged by it alone: check their logits instead.

The bound is loose enough for what float32 kernels do differently on a batch of another size or width
(about 1e-7 relative) and some hundred times tighter than the smallest effect of any bug the mutation suite
plants (in float32; a half-precision model's comparisons are as strict, so check it in float32). Only
``inference-path``, which compares two kernels, widens the relative term to four machine epsilons of a
bfloat16 or float16 output (:meth:`Tolerance.for_kernels`).

Non-finite values agree only with the same non-finite value (NaN with NaN, ``inf`` with ``inf``), as in
``torch.testing.assert_close(equal_nan=True)``; against anything else they are a difference of ``inf``.
Entries non-finite alike on both sides (a pad logit of ``-inf``, NaN at padding positions) are left out and
the finite rest is judged. A comparison with an entry non-finite on one side only, or with no entry finite
on both, decides nothing (:attr:`Difference.finite`): the checks leave it out, and skip when nothing is
left, since a model that gives NaN is reported by the finite check and the other checks judge only their
own property.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.checks.result import CheckResult

#: In a coarse dtype the relative tolerance is at least this many machine epsilons (see Tolerance.for_kernels).
EPS_FACTOR = 4


@dataclass(frozen=True)
class Tolerance:
    """``atol + rtol * scale`` per entry: see the module docstring."""

    atol: float = 1e-5
    rtol: float = 1e-4

    def bounds(self, a: Tensor, b: Tensor, judged: Tensor, *, position_dims: int = 1) -> Tensor:
        """Each entry's largest difference that still counts as none.

        Args:
            a, b: outputs of equal shape (float64), ``position_dims`` leading axes of positions, then features.
            judged: where both are finite (the magnitudes of the other entries count as 0).
        """
        if a.numel() == 0:
            return torch.zeros_like(a)
        size = a.shape[:position_dims].numel() if position_dims else 1
        magnitude = torch.where(judged, torch.maximum(a.abs(), b.abs()), 0.0).reshape(size, -1)  # (positions, features)
        feature = magnitude.amax(0)  # (features,)
        scale = torch.maximum(feature, _typical(torch.cat((a.reshape(size, -1), b.reshape(size, -1)))))
        return (self.atol + self.rtol * scale).expand_as(magnitude).reshape(a.shape)

    def bound(self, a: Tensor, b: Tensor, *, position_dims: int = 1) -> float:
        """The largest of the entries' bounds for ``a`` against ``b`` (see :meth:`bounds`)."""
        a, b = a.detach().double(), b.detach().double()
        judged = torch.isfinite(a) & torch.isfinite(b)
        return float(self.bounds(a, b, judged, position_dims=position_dims).max()) if a.numel() else self.atol

    def describe(self) -> str:
        return (f"|difference| <= {self.atol:g} + {self.rtol:g} x max|that output feature| (at least the median "
                "feature's spread)")

    def for_kernels(self, dtype: torch.dtype) -> Tolerance:
        """This tolerance for comparing two *kernels* on outputs of ``dtype``: in bfloat16 (eps 2^-7) or float16
        (2^-10) they differ by a few units in the last place, far above 1e-4, so ``rtol`` becomes at least
        ``EPS_FACTOR`` epsilons (float32 and float64 keep it). Only ``inference-path`` compares kernels; the
        other checks compare one kernel on varied inputs and keep their tight bound."""
        eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
        return Tolerance(self.atol, max(self.rtol, EPS_FACTOR * eps))


TOLERANCE = Tolerance()


def _typical(values: Tensor) -> Tensor:
    """The median over the features of how far each one's values spread, ``values`` (positions, features) of
    both outputs: a scale of what the output varies by that logits masked over most of a vocabulary cannot
    inflate, whether they hold one fill value (-1e9: no spread) or a fill added to the logits (-1e4 + logit:
    the logit's spread), as the median of the features' largest magnitudes was (a leaking decoder passed)."""
    finite = torch.isfinite(values)
    low = torch.where(finite, values, torch.inf).amin(0)
    high = torch.where(finite, values, -torch.inf).amax(0)
    return torch.where(high >= low, high - low, 0.0).median()


@dataclass(frozen=True)
class Difference:
    """How far apart two outputs are.

    Attributes:
        max_diff: the largest difference beyond its entry's bound if any, else the largest difference (``inf``
            where one side is not finite and the other is not the same value).
        bound: that entry's bound.
        positions: indices (into the compared tensors' leading axes) where a difference exceeds its bound.
        finite: whether the comparison decides anything: False when an entry is non-finite on one side only (or
            NaN against infinity), or when no entry is finite on both sides.
    """

    max_diff: float
    bound: float
    positions: list[list[int]]
    finite: bool = True

    @property
    def same(self) -> bool:
        return self.max_diff <= self.bound

    def __str__(self) -> str:
        return f"{self.max_diff:.3g}" if math.isfinite(self.max_diff) else "inf (a value is NaN or infinite)"


def difference(a: Tensor, b: Tensor, *, position_dims: int = 1, tolerance: Tolerance = TOLERANCE) -> Difference:
    """Compare two outputs of the same shape.

    Args:
        a, b: outputs of equal shape, e.g. (seq, ...) for one row's positions or (...) for a pooled one.
        position_dims: how many leading axes name a position in ``positions`` (0: none); the axes after them
            hold the features whose scales the bound follows.

    Returns:
        the largest difference beyond its bound, with that bound, when there is one; else the largest
        difference and its bound.
    """
    if a.shape != b.shape:
        raise ValueError(f"outputs of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    if a.numel() == 0:
        return Difference(0.0, 0.0, [], finite=False)
    a, b = a.detach().double(), b.detach().double()
    judged = torch.isfinite(a) & torch.isfinite(b)
    alike = (a == b) | (torch.isnan(a) & torch.isnan(b))  # non-finite alike on both sides: left out
    diff = torch.where(judged, (a - b).abs(), torch.where(alike, 0.0, float("inf")))
    bound = tolerance.bounds(a, b, judged, position_dims=position_dims)
    over = diff > bound
    worst = int(torch.where(over, diff, -1.0).argmax()) if over.any() else int(diff.argmax())
    positions: list[list[int]] = []
    if position_dims and diff.dim() >= position_dims:
        flagged = over.flatten(position_dims).any(-1) if diff.dim() > position_dims else over
        positions = [list(map(int, p)) for p in torch.nonzero(flagged)]
    finite = bool((judged | alike).all()) and bool(judged.any())
    return Difference(float(diff.flatten()[worst]), float(bound.flatten()[worst]), positions, finite=finite)


#: The summary of a comparing check that skips because every comparison had a non-finite output.
NOT_FINITE = "the outputs were not finite (NaN or infinite): nothing to compare (see finite-outputs)"


@dataclass
class Tally:
    """A comparing check's record: the comparisons judged, the largest difference, those left out."""

    judged: int = 0
    worst: float = 0.0
    left_out: int = 0

    def judge(self, diff: Difference) -> bool:
        """Count ``diff``; False (left out) when a side is not finite, since NaN agreeing with NaN proves nothing."""
        if not diff.finite:
            self.left_out += 1
            return False
        self.judged, self.worst = self.judged + 1, max(self.worst, diff.max_diff)
        return True

    @property
    def note(self) -> str:
        """The end of a passing summary: how many comparisons were left out, if any."""
        return f"; {self.left_out} comparison(s) with non-finite outputs left out" if self.left_out else ""

    def verdict(self, name: str, tolerance: str, seeds: int, passed: str) -> CheckResult:
        """The result of a check that found no failure: a skip when nothing could be judged, else a pass
        whose summary is ``passed`` with the largest difference seen and the note."""
        if not self.judged:
            return CheckResult(name, "skip", NOT_FINITE, tolerance, seeds)
        return CheckResult(name, "pass", f"{passed} (largest difference {self.worst:.2g}){self.note}", tolerance, seeds,
                           {"max_diff": self.worst})

