"""Inference path: outputs with PyTorch's inference fast path equal those without it, as training computes them.

Every other check calls the model with torch's fast path switched off (the path training takes). Under
``torch.no_grad()``, or with every parameter frozen, PyTorch's ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` otherwise switch to a fused fast path that reads masks its own way: a float 0/1
mask meant as "1 = hidden" is *added* to the scores in training (hiding nothing, so the model learns from
the future) but taken as a bool mask by the fast path, which hides the future. Such a model passes every
check run on the fast path and leaks in training. Per seed, one padded batch is run both ways in eval
mode; every row's real positions must agree, and be finite on both paths or on neither. A comparison with
non-finite outputs on both paths is left out; with none left the check skips (see finite-outputs).

A model that pads every batch to a fixed length itself and returns all of those positions, (batch, L, ...),
does not follow the input's length, so its output counts as pooled and is compared whole, padding included.
That padding is the one place where the two paths legitimately part: given a ``src_key_padding_mask``, the
fast path of ``nn.TransformerEncoder`` packs the batch into a nested tensor without the padded positions and
unpacks it with zeros there, so they come out as whatever the layers after it make of zeros, while training
computes them as queries over the real keys (and for a padded query that the model hides from every key, the
fused kernel gives NaN where training's softmax gives zero weights). A row of such an output, (L, ...) with one
L for every input length and at least the longest input's, whose two paths first part exactly at its first
padded position (its real ones agree) is therefore judged on its real positions alone, and the summary says how
many rows were. A pooled output, (features,), does not part at each row's own length, and is judged whole. A mask the paths read differently changes the real
positions too, so it still fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.checks.calling import FAST_PATH_SWITCH, ModelUnderTest
from attnlab.checks.compare import EPS_FACTOR, TOLERANCE, Difference, Tally, Tolerance, difference
from attnlab.checks.inputs import generator, padded_batch
from attnlab.checks.result import CheckResult

NAME = "inference-path"


def check_inference_path(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the inference path check over ``seeds``; see the module docstring."""
    contract, tally = mut.contract, Tally()
    tol = f"{TOLERANCE.describe()}, rtol at least {EPS_FACTOR} machine epsilons of a bfloat16 or float16 output"
    if not FAST_PATH_SWITCH:
        return CheckResult(NAME, "skip", "this torch has no torch.backends.mha switch: the paths cannot be told apart",
                           tol, 0)
    padding_left_out = 0  # rows of a fixed-length output judged on their real positions only
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        ids, lengths, src = padded_batch(gen, contract)
        training = mut.outputs(ids, src)
        with mut.with_fast_path():
            inference = mut.outputs(ids, src)
        for row, length in enumerate(lengths):
            a, b = mut.positions(training, row, length), mut.positions(inference, row, length)
            tolerance = TOLERANCE.for_kernels(a.dtype)
            diff = mut.compare(a, b, tolerance)
            if not diff.same and not mut.per_position:
                real = _real_positions(a, b, length, _fixed_length(mut), tolerance)
                if real is not None:
                    a, b, diff = real
                    padding_left_out += 1
            finite_a, finite_b = torch.isfinite(a).all().item(), torch.isfinite(b).all().item()
            if finite_a != finite_b:  # NaN on one path only is itself the finding, not a comparison to skip
                paths = ("on torch's inference fast path", "on the training path") if finite_a else (
                    "on the training path", "on torch's inference fast path")
                summary = (f"seed {seed}: row {row}'s output is not finite {paths[0]} but finite {paths[1]}: the "
                           f"model computes something else for inference than for training (one likely cause: a "
                           f"mask that the fused fast path, taken under no_grad, reads its own way); input "
                           f"{ids.tolist()}")
                evidence = {"seed": seed, "input": ids, "row": row, "finite_training_path": finite_a,
                            "finite_fast_path": finite_b}
                if src is not None:
                    evidence["source"] = src
                return CheckResult(NAME, "fail", summary, tol, done, evidence)
            if not tally.judge(diff) or diff.same:
                continue
            positions = [p[0] for p in diff.positions]
            evidence = {"seed": seed, "input": ids, "row": row, "positions": positions, "max_diff": diff.max_diff,
                        "bound": diff.bound}
            if src is not None:
                evidence["source"] = src
            where = f" at position(s) {positions}" if positions else ""
            summary = (f"seed {seed}: on torch's inference fast path (taken under no_grad) row {row}'s output{where} "
                       f"differs by up to {diff} from the path training takes (one likely cause: a float 0/1 mask "
                       f"meant to hide, which training adds to the scores and the fast path reads as bool); "
                       f"input {ids.tolist()}")
            return CheckResult(NAME, "fail", summary, tol, done, evidence)
    if not padding_left_out:
        return tally.verdict(NAME, tol, len(seeds), "allowing torch's inference fast path changes no output")
    result = tally.verdict(NAME, tol, len(seeds), (
        f"allowing torch's inference fast path changes no real position's output; {padding_left_out} row(s) of "
        f"the fixed-length output differed only past their length, on the model's own padding, which the fast "
        f"path fills its own way"))
    if result.status == "pass":
        result.evidence["rows_judged_on_real_positions"] = padding_left_out
    return result


def _fixed_length(mut: ModelUnderTest) -> int | None:
    """The position axis of a model that may pad every batch to one length L itself, or None.

    Its outputs, (batch, L, ...), keep that L whatever the input's length (the two calls that decided the
    layout, :attr:`ModelUnderTest.layout_shapes`), and L holds the longest input the model accepts. A pooled
    output, (batch, features), can look the same: :func:`_real_positions` tells them apart by where a row
    differs.
    """
    shapes = mut.layout_shapes
    if len(shapes) < 2 or len(set(shapes)) != 1 or len(shapes[0]) < 2:
        return None
    return shapes[0][1] if shapes[0][1] >= mut.contract.max_length else None


def _real_positions(a: Tensor, b: Tensor, length: int, fixed: int | None,
                    tolerance: Tolerance) -> tuple[Tensor, Tensor, Difference] | None:
    """One row of a fixed-length output cut to its real positions, when the two paths part exactly at its padding.

    Args:
        a, b: the row's output on the training path and on the fast path, (L, ...).
        length: the row's real length; fixed: the model's fixed length L (:func:`_fixed_length`), or None.

    Returns ``(a[:length], b[:length], their difference)`` when the model may have a fixed-length position axis
    and the first entry along it where the paths differ is the row's first padded position, ``length``; else
    None, and the row is judged whole. Padding the model added itself moves from that position on (see the
    module docstring), whatever the row's length; a pooled output that a mask read differently moves does not
    start differing at each row's own length (its features do not know the row's length).
    """
    if fixed is None or a.dim() < 1 or a.shape[0] != fixed:
        return None
    whole = difference(a, b, tolerance=tolerance)
    if not whole.positions or min(p[0] for p in whole.positions) != length:
        return None
    return a[:length], b[:length], difference(a[:length], b[:length], tolerance=tolerance)
