"""Padding checks: padding must change nothing real.

* **padding invariance**: each row alone (batch of one, no padding) and the same row padded inside a
  batch of two give the same outputs on its real positions (or the same pooled output); so does one shorter
  row padded in a batch of its own (one request served padded). For seq2seq
  both sides are padded, so padding on the source must not change the decoder's outputs. Catches a
  missing padding mask (seed 004), one turned the wrong way, put on the query axis, paired with the
  wrong batch rows, a cross-attention mask built from the target (seed 000, change 8) and pooling that
  averages the padding in.
* **padding content**: what sits under the padding changes nothing real. In an ids-only contract a pad
  position holds the pad id, so what may change is how much padding there is (extra pad columns, on
  each side for seq2seq) and, on a causal side, the ids under the padding (a causal model cannot see
  them, so the contract lets them hold anything). Catches masks that are built but not applied.

Both need a pad id and are skipped without one. Widths 2..8, rows of length 1 or more, right padding;
padding invariance also pads to the longest length the contract allows, with the first seed.
A comparison with a non-finite output is left out; with none left the check skips (see finite-outputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.checks.calling import ModelUnderTest, unpassed_mask_parameters
from attnlab.checks.compare import TOLERANCE, Difference, Tally
from attnlab.checks.contract import Contract
from attnlab.checks.inputs import (
    generator,
    pad_rows,
    randint,
    random_lengths,
    random_tokens,
    short_width,
)
from attnlab.checks.result import CheckResult, shown

INVARIANCE, CONTENT = "padding-invariance", "padding-content"
UNDER_PAD = "random ids under the (causal) padding"
ROWS = 2  # a padded row next to a longer one is all padding needs


def _rows(gen: torch.Generator, contract: Contract, width: int, *, padded: bool) -> list[Tensor]:
    """:data:`ROWS` unpadded rows of lengths 1..width (with ``padded``, at least one shorter than width)."""
    return [random_tokens(gen, contract, n) for n in random_lengths(gen, ROWS, 1, width, padded=padded)]


#: What each kind of failure most often means, for the summary (the evidence says what was changed).
ALONE_CAUSES = ("no padding mask, one turned the wrong way or put on the queries instead of the keys, a "
                "cross-attention mask built from the target, or pooling that averages the padding in")
WIDTH_CAUSES = ("a padding mask built but not applied (in some layer, or in the pooling), or positions or pooling "
                "that depend on the padded width")
#: (The ids under the padding are the row's later tokens now, and the padding mask of their row changes with them.)
UNDER_CAUSAL_PAD_CAUSES = ("real positions reading what comes after them, a look-ahead leak (causal fails too then), "
                           "or a row reading another row's mask, as a per-row mask laid out head-major where torch "
                           "expects batch-major does (batch-independence fails too then)")


def _fail(mut: ModelUnderTest, name: str, seed: int, done: int, what: str, row: int, diff: Difference, inputs: dict,
          causes: str) -> CheckResult:
    """A failed padding check; ``what`` says what was changed, in words, with the row's tokens; ``causes``
    what that most often means."""
    positions = [p[0] for p in diff.positions]
    evidence = {"seed": seed, "row": row, **inputs, "positions": positions, "max_diff": diff.max_diff,
                "bound": diff.bound}
    where = f" at position(s) {shown(positions)}" if positions else ""
    summary = f"seed {seed}: {what}: output{where} differs by up to {diff} (likely causes: {causes})"
    unpassed = unpassed_mask_parameters(mut.model, seq2seq=mut.contract.kind == "seq2seq")
    if unpassed:  # the most likely cause of all: the mask is the caller's job and the checks never give it
        summary += (f"; note: the model takes {', '.join(unpassed)}, which the checks never pass (they call "
                    "model(ids)): check a function that builds the mask from the ids and passes it (HFAdapter does "
                    "so for a Hugging Face model)")
    return CheckResult(name, "fail", summary, TOLERANCE.describe(), done, evidence)


def _evidence(row: Tensor, padded: Tensor, src_row: Tensor | None, padded_src: Tensor | None) -> dict:
    """The inputs of one alone-vs-padded comparison, the source's too for seq2seq."""
    given = {"alone": row, "padded_batch": padded}
    return given | ({"source_alone": src_row, "padded_source_batch": padded_src} if src_row is not None else {})


def _alone_trial(mut: ModelUnderTest, gen: torch.Generator, seed: int, done: int, tgt_width: int, src_width: int,
                 tally: Tally) -> CheckResult | None:
    """Each of :data:`ROWS` rows alone, then padded to ``tgt_width`` in one batch; a failure, or None."""
    contract = mut.contract
    seq2seq = contract.kind == "seq2seq"
    tgt_rows = _rows(gen, contract, tgt_width, padded=True)
    src_rows = _rows(gen, contract, src_width, padded=True) if seq2seq else []
    tgt = pad_rows(tgt_rows, tgt_width, contract.pad_id)
    src = pad_rows(src_rows, src_width, contract.pad_id) if seq2seq else None
    batch = mut.outputs(tgt, src)
    padded_alone = False  # one shorter row also padded in a batch of its own: serving one request padded
    for i, row in enumerate(tgt_rows):
        src_row = src_rows[i] if seq2seq else None
        alone = mut.outputs(row[None], None if src_row is None else src_row[None])
        named = f"row {shown(row)}" + (f" (source {shown(src_row)})" if src_row is not None else "")
        # (what, outputs, row of them, evidence, likely causes)
        trials = [(f"{named} alone vs padded in a batch of {ROWS}", batch, i, _evidence(row, tgt, src_row, src),
                   ALONE_CAUSES)]
        if not padded_alone and (len(row) < tgt_width or seq2seq and len(src_row) < src_width):
            padded_alone = True
            one_tgt = pad_rows([row], tgt_width, contract.pad_id)
            one_src = pad_rows([src_row], src_width, contract.pad_id) if seq2seq else None
            trials.append((f"{named} alone vs the same row padded alone (a batch of one)",
                           mut.outputs(one_tgt, one_src), 0, _evidence(row, one_tgt, src_row, one_src),
                           ALONE_CAUSES + ", or a padding mask applied only to batches of more than one row"))
        for what, out, at, evidence, causes in trials:
            diff = mut.compare(mut.positions(alone, 0, len(row)), mut.positions(out, at, len(row)))
            if tally.judge(diff) and not diff.same:
                return _fail(mut, INVARIANCE, seed, done, what, i, diff, evidence, causes)
    return None


def check_padding_invariance(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the padding invariance check over ``seeds``; see the module docstring."""
    contract, tol = mut.contract, TOLERANCE.describe()
    if contract.pad_id is None:
        return CheckResult(INVARIANCE, "skip", "no pad id: the model takes no padding", tol)
    tally, short, longest = Tally(), short_width(contract), contract.max_length
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(INVARIANCE, seed)
        tgt_width, src_width = randint(gen, 2, short), randint(gen, 2, short)
        failed = _alone_trial(mut, gen, seed, done, tgt_width, src_width, tally)
        if failed is None and done == 1 and longest > short:  # and, with the first seed, to the longest length
            failed = _alone_trial(mut, gen, seed, done, longest, longest, tally)
        if failed is not None:
            return failed
    return tally.verdict(INVARIANCE, tol, len(seeds), "alone and padded in a batch agree")


def check_padding_content(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the padding content check over ``seeds``; see the module docstring."""
    contract, tol = mut.contract, TOLERANCE.describe()
    if contract.pad_id is None:
        return CheckResult(CONTENT, "skip", "no pad id: the model takes no padding", tol)
    seq2seq, pad, tally = contract.kind == "seq2seq", contract.pad_id, Tally()
    # Room for at least one extra pad column within the longest sequence the model accepts.
    widest = min(short_width(contract), contract.max_length - 1)
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(CONTENT, seed)
        tgt_width, src_width = randint(gen, 2, widest), randint(gen, 2, widest)
        tgt_rows = _rows(gen, contract, tgt_width, padded=False)
        src_rows = _rows(gen, contract, src_width, padded=False) if seq2seq else []
        tgt = pad_rows(tgt_rows, tgt_width, pad)
        src = pad_rows(src_rows, src_width, pad) if seq2seq else None
        base = mut.outputs(tgt, src)
        extra_tgt = randint(gen, 1, min(4, contract.max_length - tgt_width))
        more_tgt = pad_rows(tgt_rows, tgt_width + extra_tgt, pad)
        variants: dict[str, tuple[Tensor, Tensor | None]]
        if seq2seq:
            extra_src = randint(gen, 1, min(4, contract.max_length - src_width))
            variants = {f"{extra_tgt} more target pad column(s)": (more_tgt, src),
                        f"{extra_src} more source pad column(s)": (tgt, pad_rows(src_rows, src_width + extra_src, pad))}
        else:
            variants = {f"{extra_tgt} more pad column(s)": (more_tgt, None)}
        if contract.causal and mut.per_position:
            filled = tgt.clone()
            hidden = filled == pad
            filled[hidden] = random_tokens(gen, contract, int(hidden.sum()))
            variants[UNDER_PAD] = (filled, src)
        for what, (new_tgt, new_src) in variants.items():
            out = mut.outputs(new_tgt, new_src)
            for i, row in enumerate(tgt_rows):
                diff = mut.compare(mut.positions(base, i, len(row)), mut.positions(out, i, len(row)))
                if not tally.judge(diff):
                    continue
                if not diff.same:
                    inputs = {"input": tgt, "changed_input": new_tgt}
                    if seq2seq:
                        inputs.update(source=src, changed_source=new_src)
                    causes = UNDER_CAUSAL_PAD_CAUSES if what == UNDER_PAD else WIDTH_CAUSES
                    return _fail(mut, CONTENT, seed, done, f"{what}, row {i} {shown(row)}", i, diff, inputs, causes)
    return tally.verdict(CONTENT, tol, len(seeds), "what sits under the padding changes nothing real")
