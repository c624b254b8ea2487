"""Position information: the sinusoidal encoding, a learned table, and rotary embeddings.

Attention alone is blind to order: permute the tokens and the outputs are permuted the same way (seed
004's shuffle test). Each class here puts the position back in a different way:

* :class:`SinusoidalPositions` adds a fixed table, ``PE[pos, 2i] = sin(pos / 10000^(2i/d))`` and
  ``PE[pos, 2i+1] = cos(...)`` (Vaswani et al., 2017; seed 000);
* :class:`LearnedPositions` adds a trained ``nn.Embedding(max_positions, d)`` row (seed 004's router);
* :class:`RotaryEmbedding` rotates queries and keys instead of adding anything (RoPE, Su et al.).

Every table has a fixed number of rows. Asking for a position past the last row is an
:class:`~attnlab.errors.AttnlabError` that names both numbers, never a silent wrap-around or an index
error from deep inside torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError, check_count, check_positive, whole_number


def sinusoidal_angles(num_positions: int, d: int) -> Tensor:
    """The angle matrix ``pos / 10000^(2i/d)`` with ``i = k // 2`` for dimension ``k``.

    Dimensions ``2i`` and ``2i + 1`` share an angle: one takes its sine, the other its cosine.
    Computed in float64 so that the float32 encoding built from it is correctly rounded.

    Returns:
        (num_positions, d) float64.
    """
    num_positions, d = whole_number("num_positions", num_positions, 0), whole_number("d", d, 1)
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    i = torch.arange(d, dtype=torch.float64)[None, :] // 2  # (1, d): 0, 0, 1, 1, 2, 2, ...
    return pos / torch.pow(10000.0, 2.0 * i / d)


def sinusoidal_encoding(num_positions: int, d: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The sine/cosine positional encoding: sine on even columns, cosine on odd ones.

    Any ``d`` works. For even ``d`` every row has norm ``sqrt(d / 2)``; for odd ``d`` the last column
    is an unpaired sine and the norm varies with the position.

    Returns:
        (num_positions, d) in ``dtype``.
    """
    angles = sinusoidal_angles(num_positions, d)
    table = torch.empty_like(angles)
    table[:, 0::2] = torch.sin(angles[:, 0::2])
    table[:, 1::2] = torch.cos(angles[:, 1::2])
    return table.to(dtype)


def _check_span(length: int, offset: int, max_positions: int, what: str) -> tuple[int, int]:
    """``(length, offset)`` as Python ints (a SymInt, a shape under torch.compile's dynamic shapes, as it is), once
    they are whole numbers that fit the table: numpy's integers too, whose sums would wrap around."""
    checked = []
    for name, value in (("length", length), ("offset", offset)):
        # not a flag, and not ``pe(x)`` (a tensor where the length goes)
        if isinstance(value, bool) or not isinstance(value, int | torch.SymInt | np.integer):
            given = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
            raise AttnlabError(f"the {what} takes a length and an offset (whole numbers) and returns the rows to "
                               f"add; got {given} as the {name}")
        checked.append(int(value) if isinstance(value, np.integer) else value)
    length, offset = checked  # (the range below is checked on these ints)
    if offset < 0 or length < 0:
        raise AttnlabError(f"positions must be >= 0, got offset {offset} and length {length}")
    if offset + length > max_positions:
        raise AttnlabError(
            f"sequence reaches position {offset + length - 1} but the {what} has only "
            f"{max_positions} rows (max_positions={max_positions}); truncate the input or build "
            f"the model with a longer table"
        )
    return length, offset


class ComputedTable(nn.Module):
    """A module whose buffers are computed from its arguments (not saved): when ``.double()`` or ``.to(dtype)``
    changes their dtype, they are computed again in it, so that a float64 model holds float64-exact tables and
    not float32 values widened. Subclasses define ``reset_parameters`` to compute them in the buffers' dtype."""

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]  # (torch's signature)
        before = [buffer.dtype for buffer in self.buffers(recurse=False)]
        super()._apply(fn, recurse)
        after = list(self.buffers(recurse=False))
        if [buffer.dtype for buffer in after] != before and not any(buffer.is_meta for buffer in after):
            self.reset_parameters()  # type: ignore[operator]
        return self

    def materialize(self, device: torch.device) -> None:
        """Compute the tables on ``device`` if they are still on ``meta``, in their dtype. A model built on the
        ``meta`` device and loaded with ``load_state_dict(..., assign=True)`` gets real parameters but no tables,
        since checkpoints do not carry them; the models' load hook calls this."""
        meta = [name for name, buffer in self.named_buffers(recurse=False) if buffer.is_meta]
        for name in meta:
            self._buffers[name] = torch.empty_like(self._buffers[name], device=device)  # type: ignore[arg-type]
        if meta:
            self.reset_parameters()  # type: ignore[operator]


class SinusoidalPositions(ComputedTable):
    """A precomputed sinusoidal table, sliced to the sequence length. Holds no parameters.

    Args:
        max_positions: rows of the table, the longest sequence this module accepts.
        d: width of each encoding vector (the model width).
    """

    def __init__(self, max_positions: int, d: int) -> None:
        super().__init__()
        self.max_positions, self.d = check_count("max_positions", max_positions), check_count("d", d)
        # Not persistent: it is a pure function of (max_positions, d), so checkpoints need not carry it.
        self.register_buffer("table", sinusoidal_encoding(max_positions, d), persistent=False)

    def reset_parameters(self) -> None:
        """Compute the table again, in place (torch's convention for a model built on the ``meta`` device:
        ``to_empty`` leaves every buffer uninitialised, and loading weights does not restore this one)."""
        with torch.no_grad():
            self.table.copy_(sinusoidal_encoding(self.max_positions, self.d, self.table.dtype))

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions ``offset .. offset + length - 1``: (length, d)."""
        length, offset = _check_span(length, offset, self.max_positions, "sinusoidal position table")
        return self.table[offset : offset + length]


class LearnedPositions(nn.Module):
    """A trained position table, one row per position (seed 004's ``nn.Embedding(120, 64)``).

    Args:
        max_positions: rows of the table.
        d: width of each row.
    """

    def __init__(self, max_positions: int, d: int) -> None:
        super().__init__()
        self.max_positions = check_count("max_positions", max_positions)
        self.table = nn.Embedding(max_positions, check_count("d", d))

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Rows ``offset .. offset + length - 1``: (length, d)."""
        length, offset = _check_span(length, offset, self.max_positions, "learned position table")
        return self.table.weight[offset : offset + length]


class RotaryEmbedding(ComputedTable):
    """Rotary position embedding, applied to queries and keys inside attention.

    Each pair of dimensions ``(2j, 2j + 1)`` of a head is rotated by the angle ``pos * base^(-2j/h)``.
    The dot product of a rotated query and key then depends on their positions only through the
    difference, so attention sees relative distance. Nothing is added to the token vectors.

    Args:
        head_dim: width of one attention head; must be even.
        max_positions: rows of the precomputed cos/sin tables.
        base: the frequency base (10000 as in RoFormer and the sinusoidal encoding).
    """

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        check_count("head_dim", head_dim)
        check_count("max_positions", max_positions)
        if head_dim % 2:
            raise AttnlabError(f"rotary embedding needs an even head width, got {head_dim}")
        # base <= 0 would fill the tables with NaN and infinities
        self.head_dim, self.max_positions, self.base = head_dim, max_positions, check_positive("base", base)
        cos, sin = self._tables(torch.float32)
        self.register_buffer("cos", cos, persistent=False)  # (P, head_dim/2)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The (max_positions, head_dim/2) cosines and sines in ``dtype``, computed in float64."""
        inv_freq = self.base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles = torch.arange(self.max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)

    def reset_parameters(self) -> None:
        """Compute the tables again, in place (see :meth:`SinusoidalPositions.reset_parameters`)."""
        cos, sin = self._tables(self.cos.dtype)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``x`` of shape (batch, heads, seq, head_dim) as if it starts at position ``offset``."""
        if x.dim() < 2 or x.shape[-1] != self.head_dim:  # a narrower x would broadcast against the tables
            raise AttnlabError(f"the rotary embedding rotates (..., seq, {self.head_dim}) queries and keys, got shape "
                               f"{tuple(x.shape)}")
        length = x.shape[-2]
        length, offset = _check_span(length, offset, self.max_positions, "rotary table")
        cos = self.cos[offset : offset + length].to(x.dtype)  # (seq, head_dim/2)
        sin = self.sin[offset : offset + length].to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2)


def embedding_scale(d: int) -> float:
    """The ``sqrt(d)`` factor the paper multiplies token embeddings by before adding positions.

    Seed 000 measures what it does: it sets the semantic-to-positional weight to sqrt(d) : 1.
    """
    return math.sqrt(d)
