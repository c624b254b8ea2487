"""Attention masks, with one convention for the whole package.

**The convention.** A mask in attnlab is an *attend mask*: a ``torch.bool`` tensor that is ``True``
where a query **may attend** to a key and ``False`` where the key is hidden. Every argument that takes
one is called ``attend_mask`` (or ``self_attend_mask`` / ``memory_attend_mask`` in a decoder layer) and
is keyword-only, so a mask can never bind to the wrong parameter by position (seed 000, change 2).

The seeds and libraries use other conventions, so converters sit at the boundary:

============================================  ==========================  =======================
convention                                    who uses it                 convert with
============================================  ==========================  =======================
float, 1 = attend, 0 = hide                   seed 000, HF attention_mask ``from_keep_mask``
float/bool, 1 = hide                          seed 003, torch key_padding ``from_hide_mask``
additive float, 0 = attend, -inf/-1e9 = hide  torch ``attn_mask`` floats  ``from_additive_mask``
============================================  ==========================  =======================

and back out: :func:`to_key_padding_mask`, :func:`to_hf_attention_mask`, :func:`to_additive_mask`.

**Shapes.** Masks broadcast against scores of shape (batch, heads, queries, keys) and must have the
*same rank* as the scores: a padding mask is (batch, 1, 1, keys), a causal mask (1, 1, queries, keys).
A mask of another rank is an error, because broadcasting would silently change the result's rank
(seed 000, change 9: a (3, 1, 5) mask added to (3, 5) scores gives (3, 3, 5), pairing every sequence
with every other sequence's mask).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.errors import AttnlabError

#: Additive-mask values at or below this count as hidden in :func:`from_additive_mask`.
ADDITIVE_HIDDEN_THRESHOLD = -1.0e4


def padding_mask(ids: Tensor, pad_id: int = 0) -> Tensor:
    """Attend mask that hides padding keys.

    Args:
        ids: (batch, seq) token ids.
        pad_id: the id that marks padding.

    Returns:
        (batch, 1, 1, seq) bool, True on real tokens.
    """
    if ids.dim() != 2:
        raise AttnlabError(f"token ids must be (batch, seq), got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]


def causal_mask(num_queries: int, num_keys: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Attend mask that hides the future (the look-ahead mask).

    Query ``i`` may attend to key ``j`` when ``j <= i + (num_keys - num_queries)``: with equal lengths
    that is the lower triangle including the diagonal; with a key/value cache holding earlier
    positions, the queries are the last ``num_queries`` positions and see everything before them.

    Returns:
        (1, 1, num_queries, num_keys) bool.
    """
    num_keys = num_queries if num_keys is None else num_keys
    if num_keys < num_queries:
        raise AttnlabError(f"causal mask needs at least as many keys as queries, got {num_keys} < {num_queries}")
    ones = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=num_keys - num_queries)[None, None]


def cached_causal_mask(num_new: int, num_seen: int, device: torch.device | str | None = None) -> Tensor | None:
    """Look-ahead mask for ``num_new`` positions that follow ``num_seen`` cached ones, or None.

    One new position (every step of incremental decoding) may see all keys, so no mask is needed, and
    the unmasked fused kernel is the fastest path; otherwise :func:`causal_mask` of the new positions
    against all keys, (1, 1, num_new, num_seen + num_new).
    """
    return None if num_new == 1 else causal_mask(num_new, num_seen + num_new, device=device)


def decoder_self_mask(ids: Tensor, pad_id: int = 0) -> Tensor:
    """Causal and padding mask for a decoder's self-attention, both from the *target* ids.

    Returns:
        (batch, 1, seq, seq) bool.
    """
    return causal_mask(ids.shape[1], device=ids.device) & padding_mask(ids, pad_id)


def check_attend_mask(mask: Tensor, scores_shape: Sequence[int]) -> None:
    """Raise :class:`AttnlabError` unless ``mask`` is a valid attend mask for these scores.

    Valid means: dtype bool, the same rank as the scores, and every dimension either 1 or equal to the
    scores' dimension, so that broadcasting can neither add dimensions nor pair the wrong rows.
    """
    if not isinstance(mask, Tensor):
        raise AttnlabError(f"attend_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise AttnlabError(
            f"attend_mask must be torch.bool (True = may attend), got {mask.dtype}; convert with "
            "from_keep_mask (1 = attend), from_hide_mask (1 = hide) or from_additive_mask"
        )
    scores_shape = tuple(scores_shape)
    if mask.dim() != len(scores_shape):
        raise AttnlabError(
            f"attend_mask has shape {tuple(mask.shape)} (rank {mask.dim()}) but the attention scores have "
            f"shape {scores_shape} (rank {len(scores_shape)}); broadcasting would change the rank"
        )
    for axis, (m, s) in enumerate(zip(mask.shape, scores_shape, strict=True)):
        if m not in (1, s):
            raise AttnlabError(
                f"attend_mask has shape {tuple(mask.shape)} which does not broadcast to the scores' "
                f"shape {scores_shape} (axis {axis}: {m} vs {s})"
            )


def from_keep_mask(mask: Tensor) -> Tensor:
    """From "1 = attend, 0 = hide" (seed 000, Hugging Face ``attention_mask``) to an attend mask."""
    return mask != 0


def from_hide_mask(mask: Tensor) -> Tensor:
    """From "1/True = hide" (seed 003, torch ``key_padding_mask``) to an attend mask."""
    return mask == 0


def from_additive_mask(mask: Tensor) -> Tensor:
    """From an additive float mask (0 = attend, ``-inf`` or a large negative number = hide)."""
    return mask > ADDITIVE_HIDDEN_THRESHOLD


def to_key_padding_mask(attend_mask: Tensor) -> Tensor:
    """A (batch, 1, 1, keys) padding attend mask as torch's ``key_padding_mask``: (batch, keys), True = hide."""
    return ~_keys_only(attend_mask)


def to_hf_attention_mask(attend_mask: Tensor) -> Tensor:
    """A (batch, 1, 1, keys) padding attend mask as Hugging Face's ``attention_mask``: (batch, keys), 1 = keep."""
    return _keys_only(attend_mask).long()


def to_additive_mask(attend_mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """An attend mask as an additive float mask: 0 where attending, ``-inf`` where hidden."""
    zeros = torch.zeros(attend_mask.shape, dtype=dtype, device=attend_mask.device)
    return zeros.masked_fill(~attend_mask, float("-inf"))


def _keys_only(attend_mask: Tensor) -> Tensor:
    if attend_mask.dim() != 4 or attend_mask.shape[1] != 1 or attend_mask.shape[2] != 1:
        raise AttnlabError(
            f"expected a padding attend mask of shape (batch, 1, 1, keys), got {tuple(attend_mask.shape)}"
        )
    return attend_mask[:, 0, 0, :]
