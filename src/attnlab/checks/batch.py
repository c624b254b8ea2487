"""Batch independence: an example's output does not depend on the other examples in its batch.

Per seed, a row is run among two random rows at index 0, then among three other random rows at index 2
(same width, so only its neighbours and its index change). Its real outputs must agree. Catches
statistics taken across the batch (a hand-written batch norm, or ``F.batch_norm`` called with
``training=True``: an ``nn.BatchNorm`` module is put in eval mode with the rest of the model), a (B,1,S)
mask added to (B,S) scores that pairs every sequence with every other's mask (seed 000, change 9), and
masks repeated head-major where the scores are batch-major. Rows are padded when there is a pad id.
A seed whose outputs are not finite is left out; with none left the check skips (see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.checks.calling import ModelUnderTest
from attnlab.checks.compare import TOLERANCE, Tally
from attnlab.checks.inputs import generator, pad_rows, randint, random_lengths, random_tokens, short_width
from attnlab.checks.result import CheckResult

NAME = "batch-independence"


def check_batch_independence(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the batch independence check over ``seeds``; see the module docstring."""
    contract, tol = mut.contract, TOLERANCE.describe()
    seq2seq, pad, tally = contract.kind == "seq2seq", contract.pad_id, Tally()

    def rows(gen: torch.Generator, width: int, count: int) -> list[Tensor]:
        lengths = random_lengths(gen, count, 1, width, padded=False) if pad is not None else [width] * count
        return [random_tokens(gen, contract, n) for n in lengths]

    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        tgt_width, src_width = randint(gen, 2, short_width(contract)), randint(gen, 2, short_width(contract))
        first, second = rows(gen, tgt_width, 3), rows(gen, tgt_width, 3)
        # The row under test moves from index 0 of a batch of three to index 2 of a batch of four.
        tgt_a = pad_rows(first, tgt_width, pad)
        tgt_b = pad_rows([second[0], second[1], first[0], second[2]], tgt_width, pad)
        src_a = src_b = None
        if seq2seq:
            src_first, src_second = rows(gen, src_width, 3), rows(gen, src_width, 3)
            src_a = pad_rows(src_first, src_width, pad)
            src_b = pad_rows([src_second[0], src_second[1], src_first[0], src_second[2]], src_width, pad)
        length = len(first[0])
        diff = mut.compare(mut.positions(mut.outputs(tgt_a, src_a), 0, length),
                           mut.positions(mut.outputs(tgt_b, src_b), 2, length))
        if not tally.judge(diff):
            continue
        if not diff.same:
            positions = [p[0] for p in diff.positions]
            evidence = {"seed": seed, "row": first[0], "batch": tgt_a, "other_batch": tgt_b, "positions": positions,
                        "max_diff": diff.max_diff, "bound": diff.bound}
            if seq2seq:
                evidence.update(source_batch=src_a, other_source_batch=src_b)
            where = f" at position(s) {positions}" if positions else ""
            summary = (f"seed {seed}: row {first[0].tolist()} gave another output{where} (by up to "
                       f"{diff}) next to other rows (likely causes: statistics taken across the batch, a (batch, 1, "
                       f"seq) mask meeting (batch, seq) scores, masks repeated in another order than the scores)")
            return CheckResult(NAME, "fail", summary, tol, done, evidence)
    return tally.verdict(NAME, tol, len(seeds), "a row's output ignores its neighbours")
