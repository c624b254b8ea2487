"""Finite outputs: no NaN or infinity on any input the contract allows.

Per seed, three batches. The first mixes a full-length row, a padded row and, when the contract allows
empty rows, a row made only of padding (for seq2seq: an empty source in one row, an empty target in
another); without a pad id it is full-length rows. The second holds unpadded rows of the longest
allowed length; the third is one row alone (a batch of one). Every output value counts, padding
positions included, because a NaN there still poisons a loss that is masked by multiplication. Catches a padding mask turned the wrong way (seed 004:
the real words are hidden, so a full-length row has nothing left to attend to and ``softmax`` of all
``-inf`` is 0/0) and look-ahead masks that hide a whole query row. No tolerance: a value is finite or
it is not, but for features that are ``-inf`` at every position of every row of every batch, others being
finite: logits masked by design (a decoder that never predicts the padding id), said in the summary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.checks.calling import ModelUnderTest
from attnlab.checks.contract import Contract
from attnlab.checks.inputs import generator, pad_rows, randint, random_tokens, short_width
from attnlab.checks.result import CheckResult, shown

NAME = "finite-outputs"


def _mixed(gen: torch.Generator, contract: Contract, empty: int | None) -> tuple[Tensor, list[str]]:
    """(3, width) ids: row 0 full, row 1 padded, row 2 real or (``empty == 2``) all padding; and row names."""
    width = randint(gen, 2, short_width(contract))
    lengths = [width, randint(gen, 1, width - 1), randint(gen, 1, width)]
    names = ["full-length row", "padded row", "real row"]
    if empty is not None:
        lengths[empty], names[empty] = 0, "all-padding row"
    return pad_rows([random_tokens(gen, contract, n) for n in lengths], width, contract.pad_id), names


def _cases(gen: torch.Generator, contract: Contract) -> list[tuple[str, Tensor, Tensor | None, list[str]]]:
    """(what, ids or target, source or None, a name per row) for one seed."""
    seq2seq, short, longest = contract.kind == "seq2seq", short_width(contract), contract.max_length
    empty = contract.pad_id is not None and contract.empty_rows
    if contract.pad_id is None:
        width = randint(gen, 1, short)
        first = ("full-length rows", random_tokens(gen, contract, 2, width),
                 random_tokens(gen, contract, 2, randint(gen, 1, short)) if seq2seq else None, ["full-length row"] * 2)
    elif seq2seq:  # the empty target sits in row 2 of the target, the empty source in row 1 of the source
        tgt, tgt_names = _mixed(gen, contract, 2 if empty else None)
        src, _ = _mixed(gen, contract, None)
        if empty:
            src[1] = contract.pad_id
        names = [f"target {name}" for name in tgt_names]
        names[1] += " with an all-padding source" if empty else ""
        first = ("full, padded and empty rows" if empty else "full and padded rows", tgt, src, names)
    else:
        ids, names = _mixed(gen, contract, 2 if empty else None)
        first = ("full, padded and empty rows" if empty else "full and padded rows", ids, None, names)
    last = (f"rows of the longest length ({longest})", random_tokens(gen, contract, 2, longest),
            random_tokens(gen, contract, 2, longest) if seq2seq else None, ["longest row"] * 2)
    # A statistic over the batch (a std, an unbiased variance) is 0/0 for a batch of one: generation and
    # single-sentence serving feed exactly that.
    alone = ("a batch of one row", random_tokens(gen, contract, 1, randint(gen, 1, short)),
             random_tokens(gen, contract, 1, randint(gen, 1, short)) if seq2seq else None, ["row alone"])
    return [first, last, alone]


def _nan_on_real_tokens(out: Tensor, ids: Tensor, pad_id: int | None, per_position: bool) -> bool:
    """Whether a real token's output (batch, seq, ...), or a pooled output (batch, ...) of a row that holds
    one, is NaN; NaN at padding positions alone may be a model's choice."""
    real = ids != pad_id if pad_id is not None else torch.ones_like(ids, dtype=torch.bool)  # (batch, seq)
    nan = torch.isnan(out.float())
    if per_position:
        return bool((nan.reshape(*nan.shape[:2], -1).any(-1) & real).any())
    return bool((nan.reshape(nan.shape[0], -1).any(-1) & real.any(1)).any())


def _masked_features(out: Tensor, bad: Tensor, per_position: bool) -> set[int]:
    """The last-axis features of ``out`` that are ``-inf`` everywhere, when they are all its non-finite values and
    some feature is finite (masked logits, never predicted); none otherwise, and for an output without a feature
    axis (whose last axis is its positions or its rows). An output -inf throughout is broken, not masked."""
    if out.dim() < (3 if per_position else 2):
        return set()
    flat = out.float().reshape(-1, out.shape[-1])
    masked = (flat == -torch.inf).all(0)  # (features,)
    if not masked.any() or masked.all() or bad.reshape(-1, out.shape[-1])[:, ~masked].any():
        return set()
    return {int(i) for i in torch.nonzero(masked)[:, 0]}


def check_finite_outputs(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the finite outputs check over ``seeds``; see the module docstring."""
    tol = "every value finite (features -inf everywhere in every batch, masked logits, apart)"
    seen: list[str] = []
    masked: set[int] | None = None  # the masked logits, as the first batch shows them; every batch must agree
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        for what, ids, src, names in _cases(gen, mut.contract):
            out = mut.outputs(ids, src)
            seen += [] if what in seen else [what]
            bad = ~torch.isfinite(out.float())
            features = _masked_features(out, bad, mut.per_position) if bad.any() else set()
            masked = features if masked is None else masked
            if features == masked and (features or not bad.any()):
                continue  # all finite, or -inf at every position of the same features as the other batches
            if not bad.any():  # the features -inf everywhere elsewhere are finite here: no masking by design
                return CheckResult(NAME, "fail", f"seed {seed}: feature(s) {shown(sorted(masked))} are -inf at every "
                                   f"position of some batches but finite on the {what} (row 0: {shown(ids[0])}): -inf "
                                   "there is no logit masked by design", tol, done,
                                   {"seed": seed, "case": what, "input": ids, "features": sorted(masked)})
            if mut.per_position:  # (batch, seq, ...) -> which (row, position) pairs
                where = [list(map(int, p)) for p in torch.nonzero(bad.reshape(*bad.shape[:2], -1).any(-1))]
            else:
                where = [[int(r)] for r in torch.nonzero(bad.reshape(bad.shape[0], -1).any(-1))[:, 0]]
            rows = sorted({p[0] for p in where})
            evidence = {"seed": seed, "case": what, "rows": [names[r] for r in rows], "input": ids,
                        "positions": where, "non_finite_values": int(bad.sum()), "values": int(bad.numel())}
            if src is not None:
                evidence["source"] = src
            summary = (f"seed {seed}: {int(bad.sum())} of {bad.numel()} values not finite on the "
                       f"{', '.join(evidence['rows'])} (row {rows[0]}: {shown(ids[rows[0]])}) at [row, position] "
                       f"{where[:6]}{' ...' if len(where) > 6 else ''}")
            if all("all-padding" in name for name in evidence["rows"]):
                summary += ("; only rows made of padding: if the model refuses them by design, "
                            "--no-empty-rows (Contract(empty_rows=False)) leaves them out")
            elif _nan_on_real_tokens(out, ids, mut.contract.pad_id, mut.per_position):  # its commonest cause
                summary += ("; NaN is what softmax gives a query whose every key is masked: is a padding mask of "
                            "the opposite polarity hiding the real tokens? (torch's key_padding_mask is True = "
                            "ignore, a Hugging Face attention_mask 1 = keep)")
            return CheckResult(NAME, "fail", summary, tol, done, evidence)
    apart = (f"; feature{'s' if len(masked) > 1 else ''} {shown(sorted(masked))} -inf everywhere, a masked logit"
             if masked else "")  # (masked is never None here: every check draws at least one batch)
    return CheckResult(NAME, "pass", f"all finite: {'; '.join(seen)}{apart}", tol, len(seeds))
