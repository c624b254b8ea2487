"""Deliberately broken models for the mutation suite of ``attnlab check``.

One small hand-written transformer (:class:`Tiny`, encoder or decoder, per-position or pooled output)
and one seq2seq model (:class:`TinySeq2Seq`), each with a ``bug=`` switch that plants exactly one
real bug at the line that would hold it. ``bug=None`` is the correct model: it must pass every check,
or the mutants would prove nothing. Written the way tutorials write them: masks filled with ``-1e9``
(so a fully hidden row attends uniformly instead of giving NaN), except where ``fill=-inf`` is the
point of the bug.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VOCAB, WIDTH, HEADS, MAX_LEN, PAD = 32, 16, 2, 16, 0

#: Bugs of :class:`Tiny`.
TINY_BUGS = (
    "diag_excluded",          # look-ahead mask tril(-1): row 0 fully hidden, -inf fill gives NaN
    "diag_excluded_1e9",      # the same with a -1e9 fill: row 0 attends uniformly, to the future too
    "sees_next",              # look-ahead mask tril(1): every position also reads the one after it
    "mask_multiply",          # scores * mask instead of a -inf/-1e9 fill: hidden keys score 0, still attended
    "softmax_wrong_axis",     # softmax over the queries: each weight normalised with later rows
    "mask_query_axis",        # padding mask (B,1,S,1): hides padded queries instead of padded keys
    "mask_head_batch_order",  # mask repeated head-major (repeat) for batch-major (B*H) scores
    "broadcast_trap",         # (B,1,S) mask + (B,S) pooling scores -> (B,B,S), averaged back
    "padding_inverted",       # keep = ids == pad: real tokens hidden, full rows all -inf -> NaN (seed 004)
    "no_padding_mask",        # padding attended (seed 004)
    "no_positions",           # no position embedding: order-blind (seeds 000, 004)
    "causal_dropped",         # mask passed positionally into the `training` slot and ignored (seed 000)
    "dropout_in_eval",        # F.dropout(training=True): random at eval (seed 000)
    "batch_stats",            # normalisation with statistics over the batch, at eval too
    "pool_includes_padding",  # mean pooling over every position, padding included
    "causal_at_eval_only",    # look-ahead mask under `if not self.training`: training reads the future
    "unmasked_batch_of_one",  # look-ahead mask built for batches only: a batch of one (generation) reads ahead
    "leak_past_short",        # one long-range leak: position 11 also reads position 12
    "padding_mask_batches_only",    # padding mask skipped for a batch of one: one request served padded reads it
    "look_ahead_dropped_with_padding",  # `mask = padding if the batch holds any else look-ahead`: training leaks
    "positions_from_end",     # position ids counted from the row's end: every output knows how many tokens follow
    "positions_only",         # `x = positions(...)` for `x += positions(...)`: the tokens are never read
)

#: Bugs of :class:`TinySeq2Seq`.
SEQ2SEQ_BUGS = (
    "cross_mask_from_target",  # cross-attention padding mask built from the target ids (seed 000, change 8)
    "cross_mask_missing",      # cross-attention attends to the source padding
    "cross_mask_batches_only",  # no cross-attention mask for a batch of one
)


class Attention(nn.Module):
    """Multi-head attention over (batch * heads, queries, keys) scores, batch-major like torch's MHA.

    ``forward(x, training, mask, memory)`` keeps the Keras-style parameter order in which a mask
    passed positionally lands on ``training`` (seed 000, change 2).
    """

    def __init__(self, bug: str | None, fill: float) -> None:
        super().__init__()
        self.bug, self.fill = bug, fill
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def _heads(self, x: Tensor) -> Tensor:
        """(B, S, WIDTH) -> (B * HEADS, S, WIDTH // HEADS), row b * HEADS + h."""
        b, s, _ = x.shape
        return x.view(b, s, HEADS, -1).transpose(1, 2).reshape(b * HEADS, s, -1)

    def forward(self, x: Tensor, training: bool | None = None, mask: Tensor | None = None,
                memory: Tensor | None = None) -> Tensor:
        """x (B, Q, WIDTH), mask bool (B, 1, Q or 1, K) True = attend, memory (B, K, WIDTH) -> (B, Q, WIDTH)."""
        b, q_len, _ = x.shape
        source = x if memory is None else memory
        q, k, v = self._heads(self.q(x)), self._heads(self.k(source)), self._heads(self.v(source))
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # (B*H, Q, K)
        if mask is not None:
            m = mask.expand(b, 1, q_len, source.shape[1]).reshape(b, q_len, -1)
            m = m.repeat(HEADS, 1, 1) if self.bug == "mask_head_batch_order" else m.repeat_interleave(HEADS, 0)
            scores = scores * m if self.bug == "mask_multiply" else scores.masked_fill(~m, self.fill)
        weights = torch.softmax(scores, dim=-2 if self.bug == "softmax_wrong_axis" else -1)
        weights = F.dropout(weights, 0.1, training=True if self.bug == "dropout_in_eval" else self.training)
        out = (weights @ v).view(b, HEADS, q_len, -1).transpose(1, 2).reshape(b, q_len, WIDTH)
        return self.o(out)


class Block(nn.Module):
    """Post-norm transformer layer: self-attention, optional cross-attention, feed-forward."""

    def __init__(self, bug: str | None, fill: float, cross: bool = False) -> None:
        super().__init__()
        self.bug = bug
        self.self_attn = Attention(bug, fill)
        self.cross_attn = Attention(bug, fill) if cross else None
        self.ff = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.ReLU(), nn.Linear(2 * WIDTH, WIDTH))
        self.norms = nn.ModuleList(nn.LayerNorm(WIDTH) for _ in range(3))

    def forward(self, x: Tensor, mask: Tensor, memory: Tensor | None = None, memory_mask: Tensor | None = None) -> Tensor:
        if self.bug == "causal_dropped":
            attended = self.self_attn(x, mask)  # the bug: mask lands on `training`
        else:
            attended = self.self_attn(x, mask=mask)
        x = self.norms[0](x + attended)
        if self.cross_attn is not None:
            x = self.norms[1](x + self.cross_attn(x, mask=memory_mask, memory=memory))
        return self.norms[2](x + self.ff(x))


class Embed(nn.Module):
    def __init__(self, bug: str | None) -> None:
        super().__init__()
        self.bug = bug
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(MAX_LEN, WIDTH)

    def forward(self, ids: Tensor) -> Tensor:
        """(B, S) -> (B, S, WIDTH)."""
        x = self.tokens(ids)
        where = torch.arange(ids.shape[1])
        if self.bug == "positions_from_end":
            where = where.flip(0)
        if self.bug == "positions_only":
            x = self.positions(where).expand_as(x)
        elif self.bug != "no_positions":
            x = x + self.positions(where)
        if self.bug == "batch_stats":  # batch-norm-like: statistics over every row and position
            x = (x - x.mean(dim=(0, 1), keepdim=True)) / (x.std(dim=(0, 1), keepdim=True) + 1e-5)
        return x


def key_mask(ids: Tensor, bug: str | None) -> Tensor:
    """(B, S) ids -> (B, 1, 1, S) bool, True = real key (with the padding bugs planted)."""
    keep = ids == PAD if bug == "padding_inverted" else ids != PAD
    if bug == "no_padding_mask" or bug == "padding_mask_batches_only" and ids.shape[0] == 1:
        keep = torch.ones_like(keep)
    return keep[:, None, :, None] if bug == "mask_query_axis" else keep[:, None, None, :]


def look_ahead(length: int, bug: str | None) -> Tensor:
    """(1, 1, S, S) bool lower triangle; the off-by-one bugs drop the diagonal or keep the one above it."""
    diagonal = -1 if bug in ("diag_excluded", "diag_excluded_1e9") else 1 if bug == "sees_next" else 0
    mask = torch.ones(length, length, dtype=torch.bool).tril(diagonal)
    if bug == "leak_past_short" and length > 12:
        mask[11, 12] = True
    return mask[None, None]


class Tiny(nn.Module):
    """One-layer transformer on ids (B, S) with a planted bug.

    Args:
        causal: a decoder (look-ahead mask) rather than an encoder.
        bug: one of :data:`TINY_BUGS`, or None for the correct model.
        pool: None for per-position logits (B, S, VOCAB); ``"mean"`` or ``"attention"`` for pooled
            outputs (B, 4) of an encoder classifier.
    """

    def __init__(self, *, causal: bool = False, bug: str | None = None, pool: str | None = None, seed: int = 0) -> None:
        super().__init__()
        if bug is not None and bug not in TINY_BUGS:
            raise ValueError(f"unknown bug {bug!r}")
        torch.manual_seed(seed)
        fill = float("-inf") if bug in ("diag_excluded", "padding_inverted") else -1e9
        self.causal, self.bug, self.pool, self.fill = causal, bug, pool, fill
        self.embed = Embed(bug)
        self.block = Block(bug, fill)
        self.score = nn.Linear(WIDTH, 1)  # attention pooling
        self.head = nn.Linear(WIDTH, 4 if pool else VOCAB)

    def _pool(self, x: Tensor, keep: Tensor) -> Tensor:
        """(B, S, WIDTH) states, (B, S) keep -> (B, WIDTH)."""
        if self.pool == "mean":
            if self.bug == "pool_includes_padding":
                return x.mean(1)
            k = keep[..., None].float()
            return (x * k).sum(1) / k.sum(1).clamp(min=1.0)
        scores = self.score(x).squeeze(-1)  # (B, S)
        if self.bug == "broadcast_trap":
            additive = torch.where(keep, 0.0, self.fill)[:, None, :]  # (B, 1, S), as in seed 000
            weights = torch.softmax(scores + additive, dim=-1).mean(1)  # (B, B, S) "fixed" back to (B, S)
        else:
            weights = torch.softmax(scores.masked_fill(~keep, self.fill), dim=-1)
        return (weights[..., None] * x).sum(1)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        mask = key_mask(ids, self.bug)
        skip_look_ahead = (self.bug == "causal_at_eval_only" and self.training) or (
            self.bug == "unmasked_batch_of_one" and ids.shape[0] == 1)
        skip_look_ahead |= self.bug == "look_ahead_dropped_with_padding" and bool((ids == PAD).any())
        if self.causal and not skip_look_ahead:
            mask = mask & look_ahead(ids.shape[1], self.bug)
        x = self.block(x, mask)
        return self.head(self._pool(x, ids != PAD) if self.pool else x)


class TinySeq2Seq(nn.Module):
    """One encoder layer and one decoder layer on (src, tgt) ids -> (B, T, VOCAB), with a planted bug."""

    def __init__(self, *, bug: str | None = None, seed: int = 0) -> None:
        super().__init__()
        if bug is not None and bug not in SEQ2SEQ_BUGS:
            raise ValueError(f"unknown bug {bug!r}")
        torch.manual_seed(seed)
        self.bug = bug
        self.src_embed, self.tgt_embed = Embed(None), Embed(None)
        self.encoder, self.decoder = Block(None, -1e9), Block(None, -1e9, cross=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_mask = key_mask(src, None)
        memory = self.encoder(self.src_embed(src), src_mask)
        memory_mask = {"cross_mask_from_target": key_mask(tgt, None),
                       "cross_mask_missing": None}.get(self.bug, src_mask)  # type: ignore[arg-type]
        if self.bug == "cross_mask_batches_only" and src.shape[0] == 1:
            memory_mask = None
        x = self.decoder(self.tgt_embed(tgt), key_mask(tgt, None) & look_ahead(tgt.shape[1], None), memory,
                         memory_mask)
        return self.head(x)
