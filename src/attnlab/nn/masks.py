"""Attention masks, with one convention for the whole package.

**The convention.** A mask in attnlab is an *attend mask*: a ``torch.bool`` tensor that is ``True``
where a query **may attend** to a key and ``False`` where the key is hidden. Every argument that takes
one is called ``attend_mask`` (or ``self_attend_mask`` / ``memory_attend_mask`` in a decoder layer) and
is keyword-only, so a mask can never bind to the wrong parameter by position (seed 000, change 2).

The seeds and libraries use other conventions, so converters sit at the boundary. The first three
convert **values only** and keep the shape:

================================================  ==================================  ======================
convention                                        who uses it                         convert with
================================================  ==================================  ======================
bool/int/float, 1 = attend, 0 = hide              seed 000, HF ``attention_mask``     ``from_keep_mask``
bool/int/float, 1 = hide, 0 = attend              seed 003, torch *bool*              ``from_hide_mask``
                                                  ``key_padding_mask`` and *bool*
                                                  ``attn_mask`` (True = not allowed)
additive float, 0 = attend, -inf or <= -1e4 hide  torch *float* ``attn_mask`` and     ``from_additive_mask``
                                                  ``key_padding_mask``, HF's 4-D
                                                  additive masks
================================================  ==================================  ======================

Each refuses the other conventions' dtypes and values instead of guessing (a bool or integer mask is
never additive; a float mask holding ``-inf`` is never 0/1), because a mask read with the wrong
convention is silently inverted or dropped. Among torch's masks, the bool ``attn_mask`` of
``F.scaled_dot_product_attention`` is the odd one: True = attend, so it already *is* an attend mask.

The libraries' own masks are (batch, keys) or (queries, keys), ranks attention refuses (see Shapes).
These converters take them as the library hands them over, also give them the attend mask's rank, and
are exact inverses of the converters back out:

================================================  ==========================  ======================
library mask                                      in, giving                  back out
================================================  ==========================  ======================
torch ``key_padding_mask`` (batch, keys)          ``from_key_padding_mask``   ``to_key_padding_mask``
                                                  (batch, 1, 1, keys)
HF ``attention_mask`` (batch, keys)               ``from_hf_attention_mask``  ``to_hf_attention_mask``
                                                  (batch, 1, 1, keys)
torch ``attn_mask`` (queries, keys), e.g. causal  ``from_torch_attn_mask``    ``to_additive_mask(m)[0, 0]``
                                                  (1, 1, queries, keys)       (float) or ``~m[0, 0]`` (bool)
================================================  ==========================  ======================

(``from_torch_attn_mask(m, num_heads=h)`` also takes torch's per-head (batch * h, queries, keys) masks.)

**Shapes.** Masks broadcast against scores of shape (batch, heads, queries, keys) and must have the
*same rank* as the scores: a padding mask is (batch, 1, 1, keys), a causal mask (1, 1, queries, keys).
A mask of another rank is an error, because broadcasting would silently change the result's rank
(seed 000, change 9: a (3, 1, 5) mask added to (3, 5) scores gives (3, 3, 5), pairing every sequence
with every other sequence's mask). So the rule for converting in: ``from_key_padding_mask`` and
``from_hf_attention_mask`` turn a (batch, keys) padding mask into (batch, 1, 1, keys), and
``from_torch_attn_mask`` a (queries, keys) mask into (1, 1, queries, keys); ``from_keep_mask``,
``from_hide_mask`` and ``from_additive_mask`` never reshape, which suits masks already of the scores'
rank (HF's 4-D masks, seed 000's (1, 3) mask for (1, 3) scores).
"""

from __future__ import annotations

import numbers
import operator
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
    if not isinstance(ids, Tensor):
        raise AttnlabError(f"token ids must be a (batch, seq) tensor, got {type(ids).__name__}")
    if ids.dim() != 2:
        raise AttnlabError(f"token ids must be (batch, seq), got shape {tuple(ids.shape)}")
    return (ids != _as_pad_id(pad_id))[:, None, None, :]


def causal_mask(num_queries: int, num_keys: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Attend mask that hides the future (the look-ahead mask).

    Query ``i`` may attend to key ``j`` when ``j <= i + (num_keys - num_queries)``: with equal lengths
    that is the lower triangle including the diagonal; with a key/value cache holding earlier
    positions, the queries are the last ``num_queries`` positions and see everything before them.

    Returns:
        (1, 1, num_queries, num_keys) bool.
    """
    num_keys = num_queries if num_keys is None else num_keys
    whole = int | torch.SymInt  # SymInt: a shape under torch.compile's dynamic shapes
    if isinstance(num_queries, bool) or isinstance(num_keys, bool) or not (
            isinstance(num_queries, whole) and isinstance(num_keys, whole) and num_queries >= 0):
        raise AttnlabError(f"causal mask takes whole numbers of queries and keys, got {num_queries!r} and {num_keys!r}")
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
    padding = padding_mask(ids, pad_id)  # first: it checks that ids is (batch, seq)
    return causal_mask(ids.shape[1], device=ids.device) & padding


def check_attend_mask(mask: Tensor, scores_shape: Sequence[int]) -> None:
    """Raise :class:`AttnlabError` unless ``mask`` is a valid attend mask for scores of ``scores_shape``, usually
    (batch, heads, queries, keys).

    Valid means: dtype bool, the same rank as the scores, every dimension either 1 or equal to the scores'
    dimension, so that broadcasting can neither add dimensions nor pair the wrong rows, and the last one (the
    keys) equal: a mask of one key would hide or show every key at once (a padding mask built from one
    decoding step's ids while the cache holds the earlier keys, say).
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
        # The likeliest way here: a library's (batch, keys) padding mask converted values-only.
        hint = (
            "; a (batch, keys) padding mask becomes (batch, 1, 1, keys) with from_hf_attention_mask or "
            "from_key_padding_mask (or mask[:, None, None, :])"
            if mask.dim() == 2 and len(scores_shape) == 4
            else ""
        )
        raise AttnlabError(
            f"attend_mask has shape {tuple(mask.shape)} (rank {mask.dim()}) but the attention scores have "
            f"shape {scores_shape} (rank {len(scores_shape)}); broadcasting would change the rank{hint}"
        )
    for axis, (m, s) in enumerate(zip(mask.shape, scores_shape, strict=True)):
        if m not in (1, s):
            raise AttnlabError(
                f"attend_mask has shape {tuple(mask.shape)} which does not broadcast to the scores' "
                f"shape {scores_shape} (axis {axis}: {m} vs {s})"
            )
    if mask.shape[-1] != scores_shape[-1]:
        raise AttnlabError(f"attend_mask has shape {tuple(mask.shape)}: one key, for scores of shape {scores_shape} "
                           f"with {scores_shape[-1]} keys; a mask marks every key (with a cache, the cached ones too)")


def from_keep_mask(mask: Tensor) -> Tensor:
    """From "1 = attend, 0 = hide" (seed 000, Hugging Face ``attention_mask``) to an attend mask.

    Values only: the shape is kept, so a (batch, keys) padding mask stays (batch, keys); for Hugging
    Face's (batch, keys) ``attention_mask`` use :func:`from_hf_attention_mask`, which gives the
    (batch, 1, 1, keys) that attention takes.

    Args:
        mask: any shape; bool, or integer/float holding only 0 and 1.

    Returns:
        bool, the same shape, True where ``mask`` is 1.

    Raises:
        AttnlabError: for values other than 0 and 1, e.g. an additive 0/-inf mask, and for a float mask of
            zeros only (an additive mask that hides nothing, or a keep mask that hides everything: say which
            by its dtype).
    """
    return _check_zero_one(mask, "from_keep_mask", keep=True) != 0


def from_hide_mask(mask: Tensor) -> Tensor:
    """From "1/True = hide" (seed 003, torch's *bool* ``key_padding_mask`` and *bool* ``attn_mask``).

    Values only: the shape is kept. For torch's masks as torch takes them, bool or float, use
    :func:`from_key_padding_mask` or :func:`from_torch_attn_mask`, which also give the attend mask's rank.

    Args:
        mask: any shape; bool, or integer/float holding only 0 and 1.

    Returns:
        bool, the same shape, True where ``mask`` is 0.

    Raises:
        AttnlabError: for values other than 0 and 1, e.g. an additive 0/-inf mask.
    """
    return _check_zero_one(mask, "from_hide_mask") == 0


def from_additive_mask(mask: Tensor) -> Tensor:
    """From an additive float mask (0 = attend, ``-inf`` or a large negative number = hide).

    Values only: the shape is kept. This is torch's *float* ``attn_mask`` / ``key_padding_mask`` and
    Hugging Face's 4-D additive masks; torch's *bool* ``attn_mask`` (True = not allowed) goes through
    :func:`from_hide_mask` (or :func:`from_torch_attn_mask`, which takes either).

    Args:
        mask: any shape, floating point, holding only 0 and values at or below
            :data:`ADDITIVE_HIDDEN_THRESHOLD` (``-inf``, ``-1e9``, ``torch.finfo(dtype).min``).

    Returns:
        bool, the same shape, True where ``mask`` is 0.

    Raises:
        AttnlabError: for a bool or integer mask (never additive), or for other values: a 0/1 mask
            read as additive would hide nothing, and a bias such as ALiBi has no bool equivalent.
    """
    return _check_additive(mask, "from_additive_mask") > ADDITIVE_HIDDEN_THRESHOLD


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """Hugging Face's ``attention_mask`` (batch, keys), 1 = keep, as a (batch, 1, 1, keys) attend mask.

    The inverse of :func:`to_hf_attention_mask`; the result goes straight to ``attend_mask``.

    Raises:
        AttnlabError: for another rank, for values other than 0 and 1, and for a float mask of zeros only (see
            :func:`from_keep_mask`).
    """
    _check_padding_rank(attention_mask, "from_hf_attention_mask", "Hugging Face attention_mask")
    # (a (batch, keys) 0/-inf mask is torch's key_padding_mask form: its converter also gives attention's rank)
    keep = _check_zero_one(attention_mask, "from_hf_attention_mask", additive="from_key_padding_mask", keep=True)
    return (keep != 0)[:, None, None, :]


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """torch's ``key_padding_mask`` (batch, keys) as a (batch, 1, 1, keys) attend mask.

    Read as torch reads it: bool True = hide, float = added to the scores (0 = attend, ``-inf`` = hide).
    The inverse of :func:`to_key_padding_mask`; the result goes straight to ``attend_mask``.

    Raises:
        AttnlabError: for another rank, an integer mask (torch takes none), or a float mask that is
            not 0 / ``-inf`` (seed 003's float "1 = hide" goes through :func:`from_hide_mask`).
    """
    _check_padding_rank(key_padding_mask, "from_key_padding_mask", "torch key_padding_mask")
    return _from_torch_mask(key_padding_mask, "from_key_padding_mask")[:, None, None, :]


def from_torch_attn_mask(attn_mask: Tensor, *, num_heads: int | None = None) -> Tensor:
    """torch's ``attn_mask`` (``nn.MultiheadAttention``, ``nn.Transformer*``) as an attend mask.

    Read as torch reads it: bool True = **not** allowed to attend, float = added to the scores
    (``nn.Transformer.generate_square_subsequent_mask`` gives 0 / ``-inf``). Not for the bool mask of
    ``F.scaled_dot_product_attention``, which is True = attend and needs no conversion.

    Args:
        attn_mask: (queries, keys), the same for every sequence and head (e.g. a causal mask), or
            (batch * num_heads, queries, keys), torch's per-head layout (sequence-major).
        num_heads: the number of heads; needed for a 3-D mask, to split its first axis.

    Returns:
        bool (1, 1, queries, keys) or (batch, num_heads, queries, keys).

    Raises:
        AttnlabError: for another rank, a 3-D mask without a fitting ``num_heads``, an integer mask,
            or a float mask that is not 0 / ``-inf``.
    """
    _require_tensor(attn_mask, "from_torch_attn_mask")
    if attn_mask.dim() == 2:
        return _from_torch_mask(attn_mask, "from_torch_attn_mask")[None, None]
    if attn_mask.dim() == 3:
        rows = attn_mask.shape[0]
        # (True is not 1 head; numpy's integers are whole numbers, as errors.whole_number takes them)
        if (isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1
                or rows % num_heads):
            raise AttnlabError(
                f"from_torch_attn_mask: a 3-D attn_mask is (batch * num_heads, queries, keys), got shape "
                f"{tuple(attn_mask.shape)} with num_heads={num_heads}; pass the model's num_heads "
                f"(it must divide {rows})"
            )
        # torch lays the rows out as sequence 0's heads, then sequence 1's: row = b * num_heads + h.
        heads = int(num_heads)
        return _from_torch_mask(attn_mask, "from_torch_attn_mask").unflatten(0, (rows // heads, heads))
    raise AttnlabError(
        f"from_torch_attn_mask takes a (queries, keys) or (batch * num_heads, queries, keys) attn_mask, got "
        f"shape {tuple(attn_mask.shape)}; a (batch, keys) key_padding_mask goes through from_key_padding_mask"
    )


def to_key_padding_mask(attend_mask: Tensor) -> Tensor:
    """A (batch, 1, 1, keys) padding attend mask as torch's ``key_padding_mask``: (batch, keys), True = hide."""
    return ~_keys_only(attend_mask, "to_key_padding_mask")


def to_hf_attention_mask(attend_mask: Tensor) -> Tensor:
    """A (batch, 1, 1, keys) padding attend mask as Hugging Face's ``attention_mask``: (batch, keys), 1 = keep."""
    return _keys_only(attend_mask, "to_hf_attention_mask").long()


def to_additive_mask(attend_mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """An attend mask as an additive float mask: 0 where attending, ``-inf`` where hidden; same shape."""
    _check_bool(attend_mask, "to_additive_mask")
    if not dtype.is_floating_point:  # a bool or integer mask cannot hold -inf: it would come out inverted or fail
        raise AttnlabError(f"to_additive_mask needs a floating dtype (it holds -inf), got {dtype}")
    zeros = torch.zeros(attend_mask.shape, dtype=dtype, device=attend_mask.device)
    return zeros.masked_fill(~attend_mask, float("-inf"))


def _check_bool(attend_mask: Tensor, name: str) -> None:
    # ``~`` on an integer tensor is a bitwise not (1 -> -2), so a 0/1 int mask would come out garbled.
    if not isinstance(attend_mask, Tensor) or attend_mask.dtype != torch.bool:
        got = attend_mask.dtype if isinstance(attend_mask, Tensor) else type(attend_mask).__name__
        raise AttnlabError(
            f"{name} takes an attend mask (torch.bool, True = may attend), got {got}; convert it first with "
            "from_keep_mask, from_hide_mask or from_additive_mask"
        )


def _keys_only(attend_mask: Tensor, name: str) -> Tensor:
    _check_bool(attend_mask, name)
    if attend_mask.dim() != 4 or attend_mask.shape[1] != 1 or attend_mask.shape[2] != 1:
        raise AttnlabError(
            f"{name}: expected a padding attend mask of shape (batch, 1, 1, keys), got {tuple(attend_mask.shape)}"
        )
    return attend_mask[:, 0, 0, :]


def _require_tensor(mask: Tensor, name: str) -> None:
    if not isinstance(mask, Tensor):
        raise AttnlabError(f"{name} takes a torch.Tensor, got {type(mask).__name__}")


def _check_padding_rank(mask: Tensor, name: str, what: str) -> None:
    _require_tensor(mask, name)
    if mask.dim() != 2:
        raise AttnlabError(
            f"{name} takes a {what} of shape (batch, keys), got shape {tuple(mask.shape)}; a mask that already "
            "has the scores' rank converts with from_keep_mask, from_hide_mask or from_additive_mask"
        )


def _from_torch_mask(mask: Tensor, name: str) -> Tensor:
    """torch's rule for ``attn_mask`` and ``key_padding_mask``: bool True = hide, float = additive."""
    if mask.dtype == torch.bool:
        return ~mask
    if not mask.is_floating_point():
        raise AttnlabError(
            f"{name}: torch takes bool (True = hide) or float (added to the scores) masks, got {mask.dtype}; "
            "a 0/1 integer mask converts with from_keep_mask (1 = attend) or from_hide_mask (1 = hide)"
        )
    return _check_additive(mask, name) > ADDITIVE_HIDDEN_THRESHOLD


def _as_pad_id(value: object) -> int:
    """``value`` as an int if it is a Python, numpy or 0-d tensor integer (not a bool), else an AttnlabError: None
    compared with a tensor of ids is one False, not a mask."""
    refused = AttnlabError(f"pad_id must be a whole number (the id that marks padding), got {value!r}")
    if isinstance(value, bool) or isinstance(value, Tensor) and (
            value.dim() or value.is_meta or value.dtype == torch.bool or value.is_floating_point()):
        raise refused
    try:
        return operator.index(value)
    except TypeError:
        raise refused from None


def values_unreadable(t: Tensor) -> bool:
    """Whether checks must leave the values of ``t`` (ids, a mask) unread: under ``torch.compile`` reading them
    would break the graph in two (and fail ``fullgraph=True``), and a ``meta`` tensor (shape inference) has none."""
    return t.is_meta or torch.compiler.is_compiling()


def _check_zero_one(mask: Tensor, name: str, *, additive: str = "from_additive_mask", keep: bool = False) -> Tensor:
    """``mask`` itself, after checking it holds only 0 and 1 (any bool does); an additive one is pointed to the
    converter ``additive``. ``keep``: 1 = attend, where a float mask of zeros only is refused as well: it is also
    what an additive mask that hides nothing looks like (torch's float ``key_padding_mask`` of a batch without
    padding), and read as 0/1 it would hide every key, an output that says nothing (fully hidden rows are 0)."""
    _require_tensor(mask, name)
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise AttnlabError(f"{name} takes a bool, integer or float mask, got {mask.dtype}")
    if values_unreadable(mask):
        return mask
    # One pass over the mask at the library boundary (a host sync on GPU), the price of never reading
    # an additive mask as 0/1: 0/-inf read as "1 = keep" is exactly the inverse of what was meant.
    odd = mask[(mask != 0) & (mask != 1)]
    if odd.numel():
        if mask.is_floating_point() and bool((odd <= ADDITIVE_HIDDEN_THRESHOLD).any()):
            raise AttnlabError(
                f"{name} takes a 0/1 mask, but this {mask.dtype} mask holds {odd.min().item()}: it looks like "
                f"an additive mask (0 = attend, -inf = hide); convert it with {additive}"
            )
        raise AttnlabError(
            f"{name} takes a mask of 0s and 1s, got {mask.dtype} values such as {odd.flatten()[0].item()}"
        )
    if keep and mask.is_floating_point() and mask.numel() and not bool(mask.any()):
        raise AttnlabError(
            f"{name} takes a 0/1 mask (1 = attend), but this {mask.dtype} mask is all 0, which would hide every "
            f"key; an additive mask (0 = attend) converts with {additive}, and a mask that really hides "
            "everything can be passed as bool or integer"
        )
    return mask


def _check_additive(mask: Tensor, name: str) -> Tensor:
    """``mask`` itself, after checking it is floating point and holds only 0 and hiding values."""
    _require_tensor(mask, name)
    if not mask.is_floating_point():
        # A bool mask compared with a negative threshold is all True: the mask would vanish.
        hint = (
            "torch's bool attn_mask / key_padding_mask (True = not allowed) converts with from_hide_mask, "
            "a True = attend mask (F.scaled_dot_product_attention's) is an attend mask already"
            if mask.dtype == torch.bool
            else "a 0/1 mask converts with from_keep_mask (1 = attend) or from_hide_mask (1 = hide)"
        )
        raise AttnlabError(
            f"{name} takes a floating-point additive mask (0 = attend, -inf = hide), got {mask.dtype}; {hint}"
        )
    if values_unreadable(mask):
        return mask
    odd = mask[(mask != 0) & ~(mask <= ADDITIVE_HIDDEN_THRESHOLD)]  # ~(<=) also catches NaN
    if odd.numel():
        value = odd.flatten()[0].item()
        hint = (
            "it looks like a 0/1 mask: convert it with from_keep_mask (1 = attend) or from_hide_mask (1 = hide)"
            if bool((odd == 1).all())
            else "a soft bias (e.g. ALiBi) has no bool equivalent"
        )
        raise AttnlabError(
            f"{name} takes an additive mask of 0 (attend) and -inf or values <= {ADDITIVE_HIDDEN_THRESHOLD:g} "
            f"(hide), got {mask.dtype} values such as {value}; {hint}"
        )
    return mask
