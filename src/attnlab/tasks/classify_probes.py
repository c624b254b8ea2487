"""Seed 004's probes on a trained classifier and the user's own data.

**Order** (the shuffle test): accuracy with every text in order and with its tokens shuffled; then the same
two with the position table set to zero. Without positions, attention only permutes its outputs when the
input is permuted, and mean pooling forgets the permutation, so a text and its shuffle must get the same
scores up to float rounding: the probe measures the largest difference and says whether it holds.

**Padding** (the T-64715 demonstration): every text scored alone (no padding at all) and padded in a batch
next to the longest text, with the padding mask, without any mask, and with the mask inverted (True on
the padding, seed 004's "common mistake"). With the mask the scores must equal the scores alone; without
it the padding is read like words and answers change; inverted, the real tokens are hidden and a text
without padding has no key left to attend to. torch's ``nn.TransformerEncoder`` turns such a row into NaN
(the seed's 23 tickets); attnlab's attention gives it zero weights instead, so the probe reports both the
NaN count and the number of texts whose every key was hidden.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.data import pad_batch
from attnlab.nn.masks import padding_mask
from attnlab.nn.positions import LearnedPositions, SinusoidalPositions
from attnlab.tasks.classify import Classifier
from attnlab.tasks.tables import Table

#: Scores closer than this count as identical (float32 sums in another order differ by ~1e-6).
IDENTICAL_ATOL = 1e-4


@contextmanager
def positions_zeroed(model: nn.Module) -> Iterator[str]:
    """Set the position table to zero for the duration; yields its kind (``learned``, ``sinusoidal``, ``none``).

    Rotary positions live inside attention and are not a table: the kind ``rotary`` is yielded and nothing
    changes. The table is put back afterwards even if the body raises.
    """
    embed = model.encoder.embed
    table = embed.positions
    if isinstance(table, LearnedPositions):
        tensor, kind = table.table.weight, "learned"
    elif isinstance(table, SinusoidalPositions):
        tensor, kind = table.table, "sinusoidal"
    else:
        rotary = any(getattr(layer.self_attn, "rotary", None) is not None for layer in model.encoder.layers)
        yield "rotary" if rotary else "none"
        return
    saved = tensor.detach().clone()
    with torch.no_grad():
        tensor.zero_()
    try:
        yield kind
    finally:
        with torch.no_grad():
            tensor.copy_(saved)


def shuffle_each(ids: Sequence[Sequence[int]], seed: int) -> list[list[int]]:
    """Every id list with its tokens in a random order (seeded; seed 004 used ``random.sample``)."""
    rng = random.Random(seed)
    return [rng.sample(list(x), len(x)) for x in ids]


def _share(hits: Tensor) -> float:
    """The share of True in the (rows,) bool ``hits``, counted exactly (a float32 mean gave 0.8333333134651184
    for 25 of 30, where ``eval classify`` reports 0.8333333333333334 for the same rows)."""
    return int(hits.sum()) / hits.numel()


def _accuracy(logits: Tensor, gold: Tensor) -> float:
    return _share(logits.argmax(1) == gold)


def _gold(clf: Classifier, table: Table) -> Tensor:
    """Class index of each row; rows with a label unseen in training get -1 (always wrong)."""
    index = {lab: i for i, lab in enumerate(clf.labels)}
    return torch.tensor([index.get(lab, -1) for lab in table.labels or []], dtype=torch.long)


@dataclass
class OrderResult:
    """Accuracies of the shuffle test (fractions) and the zero-position check.

    Attributes:
        in_order, shuffled: with the trained positions.
        zeroed, zeroed_shuffled: with the position table set to zero (None for rotary positions).
        changed_by_shuffle: share of texts whose predicted label changes when shuffled.
        zeroed_max_diff: largest |score(text) - score(shuffle)| with positions zeroed.
        zeroed_identical: whether that difference is float rounding only (<= ``IDENTICAL_ATOL``).
        positions: the model's position kind.
        texts: rows probed.
    """

    in_order: float
    shuffled: float
    zeroed: float | None
    zeroed_shuffled: float | None
    changed_by_shuffle: float
    zeroed_max_diff: float | None
    zeroed_identical: bool | None
    positions: str
    texts: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def order_probe(clf: Classifier, table: Table, seed: int = 0) -> OrderResult:
    """The shuffle test on ``table`` (see the module docstring)."""
    ids = clf.encode(table.texts).ids
    mixed = shuffle_each(ids, seed)
    gold = _gold(clf, table)
    plain, shuffled = clf.logits(ids), clf.logits(mixed)
    with positions_zeroed(clf.model) as kind:
        zeroed = zeroed_mixed = None
        if kind != "rotary":
            zeroed, zeroed_mixed = clf.logits(ids), clf.logits(mixed)
    diff = None if zeroed is None else (zeroed - zeroed_mixed).abs().max().item()
    return OrderResult(
        in_order=_accuracy(plain, gold), shuffled=_accuracy(shuffled, gold),
        zeroed=None if zeroed is None else _accuracy(zeroed, gold),
        zeroed_shuffled=None if zeroed_mixed is None else _accuracy(zeroed_mixed, gold),
        changed_by_shuffle=_share(plain.argmax(1) != shuffled.argmax(1)),
        zeroed_max_diff=diff, zeroed_identical=None if diff is None else diff <= IDENTICAL_ATOL,
        positions=kind, texts=len(ids),
    )


@dataclass
class PaddingExample:
    """Seed 004's T-64715 table for one short text: its top scores in each condition.

    Attributes:
        text, label: the text and its true label.
        tokens, padding: its length and the padding it gets next to the longest text.
        top: the labels shown (its best ones when alone).
        scores: condition -> the scores of those labels (``alone``, ``padded_mask``, ``padded_no_mask``).
        predicted: condition -> the predicted label.
    """

    text: str
    label: str
    tokens: int
    padding: int
    top: list[str]
    scores: dict[str, list[float]]
    predicted: dict[str, str]


@dataclass
class PaddingResult:
    """The padding probe's figures.

    Attributes:
        texts: rows probed; longest: the longest text's token count (every row is padded to it).
        alone, padded_mask, padded_no_mask, inverted: accuracies in each condition.
        mask_max_diff: largest |score alone - score padded with the mask| (float rounding only when correct).
        mask_identical: whether that is within ``IDENTICAL_ATOL``.
        no_mask_changed: share of texts whose predicted label changes when padded without a mask.
        no_mask_max_diff: largest score change without a mask.
        inverted_nan: texts with a NaN score under the inverted mask.
        inverted_all_hidden: texts whose every key the inverted mask hides (no padding of their own); torch's
            encoder gives them NaN, attnlab's attention zero weights.
        example: the demonstration on the shortest text.
    """

    texts: int
    longest: int
    alone: float
    padded_mask: float
    padded_no_mask: float
    inverted: float
    mask_max_diff: float
    mask_identical: bool
    no_mask_changed: float
    no_mask_max_diff: float
    inverted_nan: int
    inverted_all_hidden: int
    example: PaddingExample

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def _alone(model: nn.Module, ids: list[list[int]]) -> Tensor:
    """Scores with no padding anywhere: texts of equal length share a batch, nothing else does."""
    by_length: dict[int, list[int]] = {}
    for i, x in enumerate(ids):
        by_length.setdefault(len(x), []).append(i)
    out: Tensor | None = None
    for rows in by_length.values():
        for start in range(0, len(rows), 256):
            chunk = rows[start : start + 256]
            logits = model(torch.tensor([ids[i] for i in chunk], dtype=torch.long)).float()
            out = torch.empty(len(ids), logits.shape[1]) if out is None else out
            out[chunk] = logits
    assert out is not None
    return out


@torch.no_grad()
def _padded(model: nn.Module, ids: list[list[int]], longest: list[int], mask: str) -> Tensor:
    """Scores of each text in a batch with the longest text (so padded to its length), under ``mask``.

    ``mask``: ``"mask"`` (the model's own padding mask), ``"none"`` (no mask) or ``"inverted"`` (True on padding).
    """
    pad_id = model.pad_id
    out = []
    for start in range(0, len(ids), 255):
        batch = pad_batch([*ids[start : start + 255], longest], pad_id)  # the longest text rides along
        if mask == "mask":
            logits = model(batch)
        else:
            attend = None if mask == "none" else ~padding_mask(batch, pad_id)
            logits = model.logits_with_mask(batch, attend_mask=attend)
        out.append(logits[:-1].float())
    return torch.cat(out)


def padding_probe(clf: Classifier, table: Table, top: int = 3) -> PaddingResult:
    """The padding test on ``table`` (see the module docstring)."""
    model = clf.model
    ids = clf.encode(table.texts).ids
    gold = _gold(clf, table)
    longest = max(ids, key=len)
    alone = _alone(model, ids)
    masked = _padded(model, ids, longest, "mask")
    unmasked = _padded(model, ids, longest, "none")
    inverted = _padded(model, ids, longest, "inverted")
    finite = torch.nan_to_num(inverted, nan=0.0)
    short = min(range(len(ids)), key=lambda i: len(ids[i]))
    best = alone[short].topk(min(top, alone.shape[1])).indices.tolist()
    conditions = {"alone": alone, "padded_mask": masked, "padded_no_mask": unmasked}
    example = PaddingExample(
        text=table.texts[short], label=(table.labels or ["?"] * len(ids))[short], tokens=len(ids[short]),
        padding=len(longest) - len(ids[short]), top=[clf.labels[i] for i in best],
        scores={k: [round(float(v[short, i]), 3) for i in best] for k, v in conditions.items()},
        predicted={k: clf.labels[int(v[short].argmax())] for k, v in conditions.items()},
    )
    mask_diff = (alone - masked).abs().max().item()
    return PaddingResult(
        texts=len(ids), longest=len(longest), alone=_accuracy(alone, gold), padded_mask=_accuracy(masked, gold),
        padded_no_mask=_accuracy(unmasked, gold), inverted=_accuracy(finite, gold), mask_max_diff=mask_diff,
        mask_identical=mask_diff <= IDENTICAL_ATOL,
        no_mask_changed=_share(alone.argmax(1) != unmasked.argmax(1)),
        no_mask_max_diff=(alone - unmasked).abs().max().item(),
        inverted_nan=int(torch.isnan(inverted).any(1).sum()),
        inverted_all_hidden=sum(len(x) == len(longest) for x in ids),
        example=example,
    )
