"""Inference path: outputs with PyTorch's inference fast path equal those without it, as training computes them.

Every other check calls the model with torch's fast path switched off (the path training takes). Under
``torch.no_grad()``, or with every parameter frozen, PyTorch's ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` otherwise switch to a fused fast path that reads masks its own way: a float 0/1
mask meant as "1 = hidden" is *added* to the scores in training (hiding nothing, so the model learns from
the future) but taken as a bool mask by the fast path, which hides the future. Such a model passes every
check run on the fast path and leaks in training. Per seed, one padded batch is run both ways in eval
mode; every row's real positions must agree, and be finite on both paths or on neither. A comparison with
non-finite outputs on both paths is left out; with none left the check skips (see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.checks.calling import FAST_PATH_SWITCH, ModelUnderTest
from attnlab.checks.compare import EPS_FACTOR, TOLERANCE, Tally
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
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        ids, lengths, src = padded_batch(gen, contract)
        training = mut.outputs(ids, src)
        with mut.with_fast_path():
            inference = mut.outputs(ids, src)
        for row, length in enumerate(lengths):
            a, b = mut.positions(training, row, length), mut.positions(inference, row, length)
            diff = mut.compare(a, b, TOLERANCE.for_kernels(a.dtype))
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
    return tally.verdict(NAME, tol, len(seeds), "allowing torch's inference fast path changes no output")
