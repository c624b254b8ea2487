"""Mode: eval mode is deterministic; train mode with dropout is not (reported, not failed, without dropout).

Per seed, one (padded) batch is run twice in eval mode, each time after seeding torch's RNG with a
different value (inside ``torch.random.fork_rng``, so the caller's RNG state is untouched); the two
outputs must agree within the shared tolerance. Catches dropout applied with ``training=True`` hard-coded
or on a flag that eval mode never clears (seed 000 left dropout on at evaluation), and any other
randomness at inference. Then, for an ``nn.Module`` and until it first happens, the same twice in train
mode: outputs that differ mean dropout is active (pass); outputs that agree on every seed mean the model
has no dropout, which is a note, not a failure. The model's own mode, submodule by submodule, is
restored afterwards. A seed whose outputs are not finite decides nothing and is left out; with none
left the check skips (see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from attnlab.checks.calling import ModelUnderTest, mode
from attnlab.checks.compare import NOT_FINITE, TOLERANCE, Difference, Tally
from attnlab.checks.inputs import generator, padded_batch
from attnlab.checks.result import CheckResult

NAME = "mode"


def _twice(mut: ModelUnderTest, ids: Tensor, src: Tensor | None, seed: int) -> Difference:
    outs = []
    for rng_seed in (2 * seed, 2 * seed + 1):  # two random streams: dropout in train mode draws two masks
        with mut.with_random_seed(rng_seed):
            outs.append(mut.outputs(ids, src))
    return mut.compare(*outs)


def check_mode(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the mode check over ``seeds``; see the module docstring."""
    contract, tol = mut.contract, TOLERANCE.describe()
    train_moved, dropout, switchable, tally = 0.0, False, False, Tally()
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        ids, _, src = padded_batch(gen, contract)
        with mode(mut.model, training=False):
            diff = _twice(mut, ids, src, seed)
        if not tally.judge(diff):
            continue
        if not diff.same:
            evidence = {"seed": seed, "input": ids, "positions": diff.positions, "max_diff": diff.max_diff,
                        "bound": diff.bound}
            if src is not None:
                evidence["source"] = src
            summary = (f"seed {seed}: eval mode gave two different outputs for the same input (by up to "
                       f"{diff}); input {ids.tolist()}")
            return CheckResult(NAME, "fail", summary, tol, done, evidence)
        if dropout:
            continue  # train mode has shown its dropout once; the remaining seeds test eval mode only
        with mode(mut.model, training=True) as switched:
            if switched:
                switchable = True
                diff = _twice(mut, ids, src, seed)
                if diff.finite:  # NaN in train mode says nothing about dropout
                    train_moved, dropout = max(train_moved, diff.max_diff), not diff.same
    if not tally.judged:
        return CheckResult(NAME, "skip", NOT_FINITE, tol, len(seeds))
    if not switchable:
        return CheckResult(NAME, "pass", f"eval mode deterministic; train mode not checked (not an nn.Module)"
                           f"{tally.note}", tol, len(seeds))
    if dropout:
        return CheckResult(NAME, "pass", f"eval mode deterministic; train mode differs (by up to {train_moved:.2g}): "
                           f"dropout is active{tally.note}", tol, len(seeds), {"train_max_diff": train_moved})
    return CheckResult(NAME, "note", "eval mode deterministic; train mode gives the same output twice: the model "
                       f"has no dropout (reported, not failed){tally.note}", tol, len(seeds),
                       {"train_max_diff": train_moved})


def eval_randomness(mut: ModelUnderTest, seed: int) -> str | None:
    """Why comparing two calls of the model decides nothing, or None: eval mode giving one input two outputs.

    Run before the comparing checks, which would otherwise blame the noise on a mask or a position ("changing
    tokens after position 0 changed the output"). A model that raises or returns something unusable is
    left to the checks themselves, which report it with the input.
    """
    ids, _, src = padded_batch(generator(NAME, seed), mut.contract)
    try:
        with mode(mut.model, training=False):
            diff = _twice(mut, ids, src, seed)
    except Exception:  # noqa: BLE001 - reported by every check that calls the model
        return None
    if not diff.finite or diff.same:
        return None
    return (f"eval mode gave one input two different outputs (by up to {diff}), so comparing two calls decides "
            "nothing; see mode")
