"""When two outputs count as the same: one tolerance for every check.

Two outputs ``a`` and ``b`` agree when ``max |a - b| <= atol + rtol * scale`` with ``scale`` the largest
finite magnitude in either. The bound is relative because logits and hidden states come at any scale;
it is loose enough for what float32 kernels do differently on a batch of another size or width (about
1e-7 relative) and some hundred times tighter than the smallest effect of any bug the mutation suite
plants (in float32; a half-precision model's comparisons are as strict, so check it in float32). Only
``inference-path``, which compares two kernels, widens the relative term to four machine epsilons of a
bfloat16 or float16 output (:meth:`Tolerance.for_kernels`). Non-finite values agree only with the same non-finite value (NaN with NaN, ``inf`` with
``inf``), as in ``torch.testing.assert_close(equal_nan=True)``; against anything else they are a
difference of ``inf``. A comparison with a non-finite value on either side decides nothing (two NaN
agreeing says nothing about masks or positions), so the checks leave it out
(:attr:`Difference.finite`), and skip when nothing is left: a model that gives NaN is reported by the
finite check, and the other checks judge only their own property.
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
    """``atol + rtol * scale``: see the module docstring."""

    atol: float = 1e-5
    rtol: float = 1e-4

    def bound(self, a: Tensor, b: Tensor) -> float:
        """The largest difference between ``a`` and ``b`` that still counts as none."""
        return self.atol + self.rtol * max(_finite_max(a), _finite_max(b))

    def describe(self) -> str:
        return f"|difference| <= {self.atol:g} + {self.rtol:g} x max|output|"

    def for_kernels(self, dtype: torch.dtype) -> Tolerance:
        """This tolerance for comparing two *kernels* on outputs of ``dtype``: in bfloat16 (eps 2^-7) or float16
        (2^-10) they differ by a few units in the last place, far above 1e-4, so ``rtol`` becomes at least
        ``EPS_FACTOR`` epsilons (float32 and float64 keep it). Only ``inference-path`` compares kernels; the
        other checks compare one kernel on varied inputs and keep their tight bound."""
        eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
        return Tolerance(self.atol, max(self.rtol, EPS_FACTOR * eps))


TOLERANCE = Tolerance()


@dataclass(frozen=True)
class Difference:
    """How far apart two outputs are.

    Attributes:
        max_diff: largest absolute difference (``inf`` where either side is not finite).
        bound: the tolerance bound it was judged against.
        positions: indices (into the compared tensors' leading axes) where the difference exceeds the bound.
        finite: whether every value on both sides is finite; when not, the comparison decides nothing.
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
        position_dims: how many leading axes name a position in ``positions`` (0: none).
    """
    if a.shape != b.shape:
        raise ValueError(f"outputs of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    a, b = a.detach().double(), b.detach().double()
    finite = torch.isfinite(a) & torch.isfinite(b)
    same_non_finite = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(finite, (a - b).abs(), torch.where(same_non_finite, 0.0, float("inf")))
    bound = tolerance.bound(a, b)
    max_diff = float(diff.max()) if diff.numel() else 0.0
    positions: list[list[int]] = []
    if position_dims and diff.dim() >= position_dims:
        worst = diff.flatten(position_dims).amax(-1) if diff.dim() > position_dims else diff
        positions = [list(map(int, p)) for p in torch.nonzero(worst > bound)]
    return Difference(max_diff, bound, positions, finite=bool(finite.all()))


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


def _finite_max(x: Tensor) -> float:
    finite = x.detach()[torch.isfinite(x.detach())]
    return float(finite.abs().max()) if finite.numel() else 0.0
