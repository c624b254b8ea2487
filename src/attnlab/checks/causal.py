"""Causal check: changing the tokens after position t never changes the outputs at positions <= t.

Catches every way the future leaks into the past: a look-ahead mask that is never built, built but
dropped (seed 000, change 2: passed positionally into the wrong parameter), multiplied into the scores
instead of added, or an off-by-one that leaves a query row fully hidden (a ``-1e9`` fill then makes it
attend to everything). Runs on decoders and on the target side of seq2seq models.

Inputs per seed, each row changed at every position after its cut and compared on the positions up to it:

* a batch of ``T - 1`` unpadded rows of width ``T`` (2..8), row ``r`` cut after ``r``: every cut of a short
  row, the cut after position 0 included;
* one row alone (a batch of one), cut at random: a mask built for batches only must not pass;
* one row against its first tokens alone, cut at random (the future absent, as when generating): outputs at
  positions <= t that depend on how many tokens follow (positions counted from the end, a scale by the length)
  must not pass, though changing the later tokens never moves them;
* with a pad id, the short rows again in a right-padded batch (row ``r`` real up to position ``r + 1``, the
  one changed, and padded after it): a model that uses its padding mask instead of, not with, the look-ahead
  mask when a batch holds padding must not pass;
* when the contract allows rows longer than 8, rows of the longest length: with the first seed every cut
  (the longest length at most :data:`ALL_CUTS_UP_TO`, else a random :data:`LONG_CUTS` of them), with the
  others the cut before the last position, the cuts around position 8 and random ones: a mask built
  only for short inputs, or a cache or window that takes over past some length, must not pass;
* when there are widths between, rows of a random one of them, cut around position 8, before the last
  position and at random: attention in chunks whose last chunk is partial must not pass;
* the short rows again in **train mode**, both calls starting torch's random streams from one seed, so
  that dropout draws the same masks: a branch taken only in training (dropout on, the causal mask
  forgotten there) must not pass. Skipped for a plain function, and for a model whose train mode is not
  repeatable from torch's seed (it draws from another generator): checked once beforehand, and again before
  any train-mode difference is called a leak.

The outputs after each cut, which see the changed tokens, must move beyond the tolerance somewhere: a model
whose outputs hardly react to any token (weights near zero: a bidirectional model with 0.002 initialisation
moved by 3e-6 at most) would pass without the check having seen anything; that is a note, not a pass.

A decoder whose outputs do not follow the input's length (one per sequence, or a fixed number of
positions) leaves nothing to compare position by position: that fails, since it cannot be checked, rather than
passing unseen. A comparison with a non-finite output decides nothing and is left out; with none left the
check skips (see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnlab.checks.calling import ModelUnderTest, mode
from attnlab.checks.compare import TOLERANCE, Difference, Tally
from attnlab.checks.inputs import SHORT, generator, other_tokens, randint, random_source, random_tokens, short_width
from attnlab.checks.result import CheckResult, shown

NAME = "causal"
#: With the first seed, every cut of the longest rows up to this length (a batch of length - 1 rows).
ALL_CUTS_UP_TO = 64
#: Otherwise this many random cuts with the first seed, and a few with each other seed.
LONG_CUTS, LONG_CUTS_PER_SEED = 32, 4


class _Unrepeatable(Exception):
    """Train mode gave one input two outputs under one seed: its randomness does not all come from torch."""


@dataclass
class _Reaction:
    """Whether the outputs after a cut, which see the changed tokens, ever moved beyond their bound, and the
    largest such move (with its bound) when none did."""

    moved: bool = False
    largest: float = 0.0
    bound: float = 0.0

    def record(self, diff: Difference) -> None:
        if diff.finite and not self.moved:
            self.moved = not diff.same
            if diff.max_diff >= self.largest:
                self.largest, self.bound = diff.max_diff, diff.bound


def _cut_trial(mut: ModelUnderTest, gen: torch.Generator, seed: int, done: int, width: int, cuts: list[int],
               tally: Tally, where: str = "", *, padded: bool = False,
               reaction: _Reaction | None = None) -> CheckResult | None:
    """Rows of ``width``, row ``i`` changed after position ``cuts[i]``; a failure, or None. ``padded``: row ``i``
    holds real tokens up to position ``cuts[i] + 1`` and the pad id after it. ``reaction`` records how the
    outputs after the cuts moved.

    In train mode (``where`` set) a difference is first checked against the model's own noise: both inputs are
    run twice more, and if either does not repeat its output, :class:`_Unrepeatable` is raised instead.
    """
    contract = mut.contract
    ids = random_tokens(gen, contract, len(cuts), width)
    changed = ids.clone()
    for i, r in enumerate(cuts):
        changed[i, r + 1:] = other_tokens(gen, contract, ids[i, r + 1:])
        if padded:
            ids[i, r + 2:] = changed[i, r + 2:] = contract.pad_id
    src = random_source(gen, contract, len(cuts))
    before, after = mut.outputs(ids, src), mut.outputs(changed, src)
    for i, r in enumerate(cuts):
        if reaction is not None:
            reaction.record(mut.compare(before[i, r + 1:], after[i, r + 1:]))
        diff = mut.compare(before[i, : r + 1], after[i, : r + 1])
        if not tally.judge(diff) or diff.same:
            continue
        if where and not all(torch.equal(before, mut.outputs(ids, src)) and torch.equal(after, mut.outputs(changed, src))
                             for _ in range(2)):
            raise _Unrepeatable
        side = "target " if src is not None else ""
        evidence = {
            "seed": seed, "cut": r, "input": ids[i], "changed_input": changed[i], "batch": len(cuts),
            "train_mode": bool(where), "padded": padded, "positions": [p[0] for p in diff.positions], "max_diff": diff.max_diff,
            "bound": diff.bound,
        }
        if src is not None:
            evidence["source"] = src[i]
        summary = (
            f"seed {seed}{where}: changing {side}tokens after position {r} changed the output at position(s) "
            f"{shown(evidence['positions'])} by up to {diff}; input {shown(ids[i])} -> {shown(changed[i])}"
            + (" (a batch of one)" if len(cuts) == 1 else "")
            + (" (a right-padded batch: is the look-ahead mask dropped when a padding mask is used?)" if padded else "")
        )
        return CheckResult(NAME, "fail", summary, TOLERANCE.describe(), done, evidence)
    return None


def _alone_trial(mut: ModelUnderTest, gen: torch.Generator, seed: int, done: int, width: int,
                 tally: Tally) -> CheckResult | None:
    """One row of ``width`` against its tokens up to a random cut run alone; a failure, or None."""
    ids, src = random_tokens(gen, mut.contract, 1, width), random_source(gen, mut.contract, 1)
    r = randint(gen, 0, width - 2)
    whole, alone = mut.outputs(ids, src), mut.outputs(ids[:, : r + 1], src)
    diff = mut.compare(whole[0, : r + 1], alone[0])
    if not tally.judge(diff) or diff.same:
        return None
    side = "target " if src is not None else ""
    evidence = {"seed": seed, "cut": r, "input": ids[0], "alone": True, "positions": [p[0] for p in diff.positions],
                "max_diff": diff.max_diff, "bound": diff.bound}
    if src is not None:
        evidence["source"] = src[0]
    summary = (f"seed {seed}: the {side}row {shown(ids[0])} and its first {r + 1} token(s) alone gave different "
               f"outputs at position(s) {shown(evidence['positions'])} by up to {diff}: the outputs depend on how "
               "many tokens follow (positions counted from the end? a scale by the length?), which they cannot "
               "when generating, as the later tokens do not exist yet")
    return CheckResult(NAME, "fail", summary, TOLERANCE.describe(), done, evidence)


def _long_cuts(gen: torch.Generator, longest: int, first: bool) -> list[int]:
    """The cuts of the longest rows for one seed (see the module docstring)."""
    if first and longest <= ALL_CUTS_UP_TO:
        return list(range(longest - 1))
    count = LONG_CUTS if first else LONG_CUTS_PER_SEED
    around_short = {SHORT - 1, SHORT} if longest - 2 >= SHORT else set()
    return sorted({longest - 2, *around_short, *(randint(gen, 0, longest - 2) for _ in range(count))})


def _train_mode_repeatable(mut: ModelUnderTest, gen: torch.Generator, seed: int) -> bool:
    """Whether two train-mode calls on one input, both from ``seed``, agree (dropout from torch's streams)."""
    width = short_width(mut.contract)
    ids, src = random_tokens(gen, mut.contract, 2, width), random_source(gen, mut.contract, 2)
    with mut.with_random_seed(seed):
        first, again = mut.outputs(ids, src), mut.outputs(ids, src)
    return all(mut.compare(first[i], again[i]).same for i in range(2))


def check_causal(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the causal check over ``seeds``; see the module docstring."""
    contract, tol = mut.contract, TOLERANCE.describe()
    if not contract.causal:
        return CheckResult(NAME, "skip", "an encoder may look at every position", tol)
    if not mut.per_position:
        shapes = " and ".join(str(s) for s in mut.layout_shapes)
        return CheckResult(NAME, "fail", f"the outputs do not follow the input's length (lengths 2 and 3 gave "
                           f"outputs of shape {shapes}), so no position can be compared with the tokens before it: "
                           "a causal model must return one output per input position, (batch, seq, ...)", tol, 0,
                           {"output_shapes": mut.layout_shapes})
    tally, longest, reaction = Tally(), contract.max_length, _Reaction()
    train_mode: bool | None = None  # decided with the first seed: whether train-mode calls can be compared
    untrained = ""  # why train mode was left out, for the summary
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        width = randint(gen, 2, short_width(contract))
        failed = _cut_trial(mut, gen, seed, done, width, list(range(width - 1)), tally,  # every cut of a short row
                            reaction=reaction)
        if failed is None:
            failed = _cut_trial(mut, gen, seed, done, width, [randint(gen, 0, width - 2)], tally, reaction=reaction)
        if failed is None:  # on a stream of its own, as the padded rows' below
            failed = _alone_trial(mut, generator(NAME + " alone", seed), seed, done, width, tally)
        if failed is None and contract.pad_id is not None:  # on a stream of its own: the other trials draw as before
            failed = _cut_trial(mut, generator(NAME + " padded", seed), seed, done, width, list(range(width - 1)),
                                tally, padded=True)
        if failed is None and longest > short_width(contract):
            failed = _cut_trial(mut, gen, seed, done, longest, _long_cuts(gen, longest, done == 1), tally,
                                reaction=reaction)
        if failed is None and longest > short_width(contract) + 1:  # (a stream of its own, as the padded rows')
            between = generator(NAME + " between", seed)
            width_between = randint(between, short_width(contract) + 1, longest - 1)
            failed = _cut_trial(mut, between, seed, done, width_between,
                                _long_cuts(between, width_between, first=False), tally)
        if failed is None:
            with mode(mut.model, training=True) as switched:
                if train_mode is None:
                    train_mode = switched and _train_mode_repeatable(mut, gen, seed)
                    untrained = ("" if train_mode else " (eval mode only: a plain function has no train mode)"
                                 if not switched else " (eval mode only: train mode is not repeatable from torch's seed)")
                if train_mode:
                    try:
                        with mut.with_random_seed(seed):
                            failed = _cut_trial(mut, gen, seed, done, width, list(range(width - 1)), tally,
                                                " (train mode)")
                    except _Unrepeatable:
                        train_mode, untrained = False, " (eval mode only: train mode is not repeatable from torch's seed)"
        if failed is not None:
            return failed
    verdict = tally.verdict(NAME, tol, len(seeds),
                            "no output moved when later tokens changed or were left out" + untrained)
    if verdict.status == "pass" and not reaction.moved:
        return CheckResult(NAME, "note", f"inconclusive: the outputs hardly react to any token (after the changed "
                           f"tokens too: by up to {reaction.largest:.2g}, within the bound {reaction.bound:.2g}), so a "
                           "leak of the future would not show either; are the weights near zero (a fresh "
                           "initialisation)?", tol, len(seeds), {"max_diff": tally.worst,
                                                                 "largest_reaction": reaction.largest})
    return verdict
