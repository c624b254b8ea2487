"""Padding and length bucketing.

A batch is padded to its own longest sequence, not to a global maximum. Sorting examples by length
inside large random buckets puts similar lengths together, so little compute goes to padding, while
the bucket shuffle keeps batches random from epoch to epoch. Everything is a deterministic function
of (seed, epoch), which the training engine needs for exact resume.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0, *, length: int | None = None) -> Tensor:
    """Right-pad id lists to the longest one, or to ``length`` (at least the longest): (batch, length) long."""
    longest = max((len(s) for s in sequences), default=0)
    out = torch.full((len(sequences), max(longest, length or 0)), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def bucketed_batches(
    lengths: Sequence[int],
    *,
    seed: int,
    epoch: int,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    bucket_factor: int = 50,
    drop_last: bool = False,
) -> list[list[int]]:
    """Example indices grouped into batches of similar length, in a random order.

    Either ``batch_size`` (examples per batch) or ``max_tokens`` (padded tokens per batch, i.e.
    ``len(batch) * longest``) bounds a batch. Examples are shuffled, cut into buckets of
    ``bucket_factor`` batches, sorted by length inside each bucket, batched, and the batches shuffled.

    Returns:
        a list of batches, each a list of example indices.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("give exactly one of batch_size and max_tokens")
    g = torch.Generator().manual_seed((seed * 100_003 + epoch) % 2**64)  # (torch takes 64 bits, of which its CPU generator reads 32)
    order = torch.randperm(len(lengths), generator=g).tolist()
    per_bucket = (batch_size or max(1, max_tokens // max(1, max(lengths, default=1)))) * bucket_factor
    batches: list[list[int]] = []
    for start in range(0, len(order), per_bucket):
        bucket = sorted(order[start : start + per_bucket], key=lambda i: lengths[i])
        current: list[int] = []
        longest = 0
        for i in bucket:
            longest_if_added = max(longest, lengths[i])
            full = (len(current) == batch_size) if batch_size else (len(current) + 1) * longest_if_added > max_tokens
            if current and full:
                batches.append(current)
                current, longest_if_added = [], lengths[i]
            current.append(i)
            longest = longest_if_added
        if current:
            batches.append(current)
    if drop_last and batch_size:
        batches = [b for b in batches if len(b) == batch_size]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]
