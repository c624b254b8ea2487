"""Inference path: outputs under ``torch.no_grad()`` equal those with gradients on, as training computes them.

Every other check calls the model with gradients on (the path training takes). Without gradients, PyTorch's
``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` switch to a fused fast path that reads masks
its own way: a float 0/1 mask meant as "1 = hidden" is *added* to the scores in training (hiding nothing,
so the model learns from the future) but taken as a bool mask by the fast path, which hides the future.
Such a model passes every check run under ``no_grad`` and leaks in training. Per seed, one padded batch is
run both ways in eval mode; every row's real positions must agree, and be finite on both paths or on
neither. A comparison with non-finite outputs on both paths is left out; with none left the check skips
(see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.checks.calling import ModelUnderTest
from attnlab.checks.compare import TOLERANCE, Tally
from attnlab.checks.inputs import generator, padded_batch
from attnlab.checks.result import CheckResult

NAME = "inference-path"


def check_inference_path(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the inference path check over ``seeds``; see the module docstring."""
    contract, tol, tally = mut.contract, TOLERANCE.describe(), Tally()
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        ids, lengths, src = padded_batch(gen, contract)
        training = mut.outputs(ids, src)
        with mut.without_grad():
            inference = mut.outputs(ids, src)
        for row, length in enumerate(lengths):
            a, b = mut.positions(training, row, length), mut.positions(inference, row, length)
            diff = mut.compare(a, b)
            finite_a, finite_b = torch.isfinite(a).all().item(), torch.isfinite(b).all().item()
            if finite_a != finite_b:  # NaN on one path only is itself the finding, not a comparison to skip
                paths = ("under torch.no_grad()", "with gradients on") if finite_a else ("with gradients on",
                                                                                        "under torch.no_grad()")
                summary = (f"seed {seed}: row {row}'s output is not finite {paths[0]} but finite {paths[1]}: "
                           f"the model computes something else for inference than for training (PyTorch's fused "
                           f"fast path, taken without gradients, reads masks its own way); input {ids.tolist()}")
                evidence = {"seed": seed, "input": ids, "row": row, "finite_with_grad": finite_a,
                            "finite_without_grad": finite_b}
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
            summary = (f"seed {seed}: under torch.no_grad() row {row}'s output{where} differs by up to {diff} from "
                       f"the same call with gradients on, the path training takes (PyTorch's fused inference "
                       f"fast path reads a float 0/1 mask as a bool one: is a mask added to the scores that "
                       f"should hide?); input {ids.tolist()}")
            return CheckResult(NAME, "fail", summary, tol, done, evidence)
    return tally.verdict(NAME, tol, len(seeds), "outputs under torch.no_grad() equal those with gradients on")
