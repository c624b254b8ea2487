"""Order sensitivity: reordering the real tokens changes the output.

Attention alone is blind to order (seed 004's shuffle test): without positions an encoder's outputs
are only permuted along with its inputs, and a pooled output does not move at all. Per seed, on one
unpadded row of 3..8 tokens, all different where the vocabulary allows:

* encoder, per-position outputs: fail when ``out(x[p]) == out(x)[p]`` (outputs only permuted) or when
  ``out(x[p]) == out(x)`` (outputs unchanged: positions alone make them, the tokens are never read);
* encoder, pooled output: fail when ``out(x[p]) == out(x)``;
* decoder: the last position sees every token; reorder the ones before it and fail when the last
  output does not move (one causal layer without positions sees only the set of earlier tokens there;
  from two layers on, the causal mask itself tells positions apart, since position t averages over t + 1
  tokens, so a decoder without positions can pass, as it can also learn word order);
* seq2seq: fail when reordering the source leaves every target output unchanged, or when reordering
  the target before its last position leaves the last output unchanged.

"Changed" means a difference beyond the shared tolerance (:mod:`attnlab.checks.compare`). A trial whose
comparison decides nothing (an entry not finite on one side only: see the module named) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.checks.calling import ModelUnderTest
from attnlab.checks.compare import NOT_FINITE, TOLERANCE
from attnlab.checks.inputs import distinct_tokens, generator, randint, reordering, short_width
from attnlab.checks.result import CheckResult

NAME = "order-sensitivity"


def _last(mut: ModelUnderTest, out: Tensor) -> Tensor:
    """The first row's last position, (1, ...) (a position axis kept: its features are compared as features), or
    its pooled output."""
    return out[0, -1:] if mut.per_position else out[0]


def _prefix_reordered(gen: torch.Generator, x: Tensor) -> Tensor:
    """``x`` with the tokens before its last position reordered."""
    perm = reordering(gen, x[:-1])
    return torch.cat((x[:-1][perm], x[-1:]))


def check_order_sensitivity(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the order sensitivity check over ``seeds``; see the module docstring."""
    contract = mut.contract
    tol = f"changed when some entry's difference exceeds its bound, {TOLERANCE.describe()}"
    smallest, judged = float("inf"), 0
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        x = distinct_tokens(gen, contract, randint(gen, 3, short_width(contract)))
        # (what a failure means, input, reordered input, output to compare, output of the reordered, extra evidence)
        trials: list[tuple[str, Tensor, Tensor, Tensor, Tensor, dict[str, Tensor]]] = []
        if contract.kind == "encoder":
            perm = reordering(gen, x)
            out, out_p = mut(x[None]), mut(x[perm][None])
            if mut.per_position:
                # Compare with the permuted outputs: equal means the model only carried them along, unless
                # every position gave the same output, which reads the tokens no better.
                constant = mut.compare(out[0], out[0][:1].expand_as(out[0])).same
                what = ("the output is the same at every position and did not change" if constant
                        else "outputs were only permuted with the tokens")
                trials.append((what, x, x[perm], out[0][perm], out_p[0], {}))
                trials.append(("the outputs did not change at all (are the tokens read? the position embedding "
                               "replacing the token embedding instead of being added to it?)", x, x[perm], out[0],
                               out_p[0], {}))
            else:
                trials.append(("the pooled output did not change", x, x[perm], out[0], out_p[0], {}))
        elif contract.kind == "decoder":
            y = _prefix_reordered(gen, x)
            trials.append(("the last position's output did not change when the tokens before it were reordered",
                           x, y, _last(mut, mut(x[None])), _last(mut, mut(y[None])), {}))
        else:
            tgt = distinct_tokens(gen, contract, randint(gen, 3, short_width(contract)))
            src_p, tgt_p = x[reordering(gen, x)], _prefix_reordered(gen, tgt)
            out = mut(x[None], tgt[None])
            trials.append(("reordering the source changed no target output", x, src_p, out[0],
                           mut(src_p[None], tgt[None])[0], {"target": tgt}))
            trials.append(("the last target output did not change when the target before it was reordered",
                           tgt, tgt_p, _last(mut, out), _last(mut, mut(x[None], tgt_p[None])), {"source": x}))
        for what, before, after, expected, got, extra in trials:
            diff = mut.compare(expected, got)
            if not diff.finite:
                continue  # NaN cannot tell order from no order; the finite check reports it
            judged += 1
            if diff.same:
                evidence = {"seed": seed, "input": before, "reordered": after, **extra, "max_diff": diff.max_diff,
                            "bound": diff.bound}
                summary = (f"seed {seed}: {what} (difference {diff.max_diff:.2g}): {before.tolist()} -> "
                           f"{after.tolist()}")
                return CheckResult(NAME, "fail", summary, tol, done, evidence)
            smallest = min(smallest, diff.max_diff)
    if not judged:
        return CheckResult(NAME, "skip", NOT_FINITE, tol, len(seeds))
    return CheckResult(NAME, "pass", f"every reordering changed the output (smallest change {smallest:.2g})", tol,
                       len(seeds), {"min_diff": smallest})
