"""Causal check: changing the tokens after position t never changes the outputs at positions <= t.

Catches every way the future leaks into the past: a look-ahead mask that is never built, built but
dropped (seed 000, change 2: passed positionally into the wrong parameter), multiplied into the scores
instead of added, or an off-by-one that leaves a query row fully hidden (a ``-1e9`` fill then makes it
attend to everything). Runs on decoders and on the target side of seq2seq models.

Inputs per seed: a batch of ``T - 1`` unpadded rows of width ``T`` (2..8); row ``r`` is changed at every
position after ``r`` and its outputs at positions ``0..r`` are compared, so each seed tests every cut,
the cut after position 0 included. With the first seed, when the contract allows longer rows, also three
rows of the longest length, cut before the last position and at two random places: a mask that is built only for
short inputs (or a cache or window that takes over past some length) must not pass. A comparison with a
non-finite output decides nothing and is left out; with none left the check skips (see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.checks.calling import ModelUnderTest
from attnlab.checks.compare import TOLERANCE, Tally
from attnlab.checks.inputs import generator, other_tokens, randint, random_source, random_tokens, short_width
from attnlab.checks.result import CheckResult, shown

NAME = "causal"


def _cut_trial(mut: ModelUnderTest, gen: torch.Generator, seed: int, done: int, width: int, cuts: list[int],
               tally: Tally) -> CheckResult | None:
    """Rows of ``width``, row ``i`` changed after position ``cuts[i]``; a failure, or None."""
    contract = mut.contract
    ids = random_tokens(gen, contract, len(cuts), width)
    changed = ids.clone()
    for i, r in enumerate(cuts):
        changed[i, r + 1:] = other_tokens(gen, contract, ids[i, r + 1:])
    src = random_source(gen, contract, len(cuts))
    before, after = mut.outputs(ids, src), mut.outputs(changed, src)
    for i, r in enumerate(cuts):
        diff = mut.compare(before[i, : r + 1], after[i, : r + 1])
        if not tally.judge(diff) or diff.same:
            continue
        side = "target " if src is not None else ""
        evidence = {
            "seed": seed, "cut": r, "input": ids[i], "changed_input": changed[i],
            "positions": [p[0] for p in diff.positions], "max_diff": diff.max_diff, "bound": diff.bound,
        }
        if src is not None:
            evidence["source"] = src[i]
        summary = (
            f"seed {seed}: changing {side}tokens after position {r} changed the output at position(s) "
            f"{shown(evidence['positions'])} by up to {diff}; input {shown(ids[i])} -> {shown(changed[i])}"
        )
        return CheckResult(NAME, "fail", summary, TOLERANCE.describe(), done, evidence)
    return None


def check_causal(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the causal check over ``seeds``; see the module docstring."""
    contract, tol = mut.contract, TOLERANCE.describe()
    if not contract.causal:
        return CheckResult(NAME, "skip", "an encoder may look at every position", tol)
    if not mut.per_position:
        return CheckResult(NAME, "skip", "pooled output: no positions to compare", tol)
    tally, longest = Tally(), contract.max_length
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        width = randint(gen, 2, short_width(contract))
        failed = _cut_trial(mut, gen, seed, done, width, list(range(width - 1)), tally)  # every cut of a short row
        if failed is None and done == 1 and longest > short_width(contract):
            cuts = sorted({longest - 2, randint(gen, 0, longest - 2), randint(gen, 0, longest - 2)})
            failed = _cut_trial(mut, gen, seed, done, longest, cuts, tally)
        if failed is not None:
            return failed
    return tally.verdict(NAME, tol, len(seeds), "no output moved when later tokens changed")
