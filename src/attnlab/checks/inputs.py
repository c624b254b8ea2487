"""Random inputs inside a :class:`~attnlab.checks.contract.Contract`: token rows, padding, reorderings.

Every random choice comes from a ``torch.Generator`` seeded by (check name, seed), so a failure names
a seed that reproduces it and the global RNG of the caller is never touched.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

from attnlab.checks.contract import Contract

#: Longest sequence the checks use unless they test the longest one: long enough for every pattern
#: (a cut, a reordering, some padding), short enough that twenty seeds of every check stay fast.
SHORT = 8


def generator(check: str, seed: int) -> torch.Generator:
    """A generator for one (check, seed) pair; crc32 rather than ``hash`` because that is salted per run."""
    return torch.Generator().manual_seed((zlib.crc32(check.encode()) * 1000 + seed) % 2**64)  # (torch takes 64 bits)


def short_width(contract: Contract) -> int:
    """The width of the short rows: :data:`SHORT` or less if the model accepts less."""
    return min(contract.max_length, SHORT)


def randint(gen: torch.Generator, low: int, high: int) -> int:
    """A random integer in ``[low, high]`` (both included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _real_count(contract: Contract) -> int:
    """How many ids a real token may hold: the vocabulary without the pad id."""
    return contract.vocab_size - (contract.pad_id is not None)


def _real_id(contract: Contract, index: Tensor) -> Tensor:
    """The ``index``-th real id (0-based, the pad id skipped): arithmetic, so that a vocabulary of two
    billion ids costs no table."""
    return index if contract.pad_id is None else index + (index >= contract.pad_id).long()


def _real_index(contract: Contract, ids: Tensor) -> Tensor:
    """The inverse of :func:`_real_id` on real ids."""
    return ids if contract.pad_id is None else ids - (ids > contract.pad_id).long()


#: Up to this many real ids, distinct ones come from a permutation of all of them; above, by drawing again.
PERMUTED_AT_MOST = 1 << 22


def random_tokens(gen: torch.Generator, contract: Contract, *shape: int) -> Tensor:
    """Real tokens (never the pad id) of the given shape, as a LongTensor."""
    return _real_id(contract, torch.randint(_real_count(contract), shape, generator=gen))


def distinct_tokens(gen: torch.Generator, contract: Contract, n: int) -> Tensor:
    """(n,) real tokens, all different when the vocabulary allows and never all the same, so that a
    reordering can change them."""
    count = _real_count(contract)
    if count > PERMUTED_AT_MOST:  # n is a row's length, far below count: a repeat is rare and drawn again
        picked: list[int] = []
        while len(picked) < n:
            candidate = int(torch.randint(count, (1,), generator=gen))
            picked += [] if candidate in picked else [candidate]
        return _real_id(contract, torch.tensor(picked))
    index = torch.randperm(count, generator=gen)
    # A small vocabulary is cycled (at least 3 real ids, see Contract) and the result shuffled.
    return _real_id(contract, index[torch.arange(n) % count][torch.randperm(n, generator=gen)])


def other_tokens(gen: torch.Generator, contract: Contract, old: Tensor) -> Tensor:
    """Real tokens of ``old``'s shape that differ from ``old`` at every position."""
    count = _real_count(contract)
    # A random non-zero shift among the real ids: never the same token, never the pad.
    shift = torch.randint(1, count, old.shape, generator=gen)
    return _real_id(contract, (_real_index(contract, old) + shift) % count)


def pad_rows(rows: list[Tensor], width: int, pad_id: int | None) -> Tensor:
    """Right-pad 1-D rows to ``width``: (batch, width) LongTensor.

    Raises ``ValueError`` if a row is longer than ``width`` or padding is needed without a pad id
    (both are bugs in a check, not in the model).
    """
    out = torch.full((len(rows), width), -1 if pad_id is None else pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > width or (len(row) < width and pad_id is None):
            raise ValueError(f"cannot pad a row of {len(row)} to width {width} with pad id {pad_id}")
        out[i, : len(row)] = row
    return out


def random_lengths(gen: torch.Generator, count: int, low: int, width: int, *, padded: bool) -> list[int]:
    """``count`` lengths in ``[low, width]``; with ``padded`` at least one is below ``width``."""
    lengths = [randint(gen, low, width) for _ in range(count)]
    if padded and min(lengths) == width:
        lengths[randint(gen, 0, count - 1)] = randint(gen, low, width - 1)
    return lengths


def reordering(gen: torch.Generator, tokens: Tensor) -> Tensor:
    """A permutation ``p`` of ``range(len(tokens))`` with ``tokens[p] != tokens`` somewhere.

    Raises ``ValueError`` unless ``tokens`` holds at least two different values.
    """
    n = len(tokens)
    if n < 2 or bool((tokens == tokens[0]).all()):
        raise ValueError(f"no reordering changes {tokens.tolist()}")
    while True:
        perm = torch.randperm(n, generator=gen)
        if not torch.equal(tokens[perm], tokens):
            return perm


def random_source(gen: torch.Generator, contract: Contract, batch: int) -> Tensor | None:
    """For seq2seq, (batch, n) unpadded source ids for a check that varies only the target; else None."""
    if contract.kind != "seq2seq":
        return None
    return random_tokens(gen, contract, batch, randint(gen, 1, short_width(contract)))


def padded_rows(gen: torch.Generator, contract: Contract, count: int) -> tuple[Tensor, list[int]]:
    """``count`` random rows of one random short width, right-padded to it (at least one shorter; full rows
    without a pad id): ids (count, width) and the rows' real lengths."""
    width = randint(gen, 2, short_width(contract))
    pad = contract.pad_id
    lengths = random_lengths(gen, count, 1, width, padded=True) if pad is not None else [width] * count
    return pad_rows([random_tokens(gen, contract, n) for n in lengths], width, pad), lengths


def padded_batch(gen: torch.Generator, contract: Contract) -> tuple[Tensor, list[int], Tensor | None]:
    """Three :func:`padded_rows`, their real lengths, and the seq2seq source from :func:`random_source` or None."""
    ids, lengths = padded_rows(gen, contract, 3)
    return ids, lengths, random_source(gen, contract, 3)
