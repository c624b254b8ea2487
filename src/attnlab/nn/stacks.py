"""From token ids to contextual vectors: the embedder, the encoder stack and the decoder stack.

The embedder does what every stack starts with: look up token vectors, scale them by ``sqrt(d)``
(seed 000 shows this sets how loud position is next to meaning), add the position, apply dropout.
The stacks then run their layers in turn.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError, check_count, check_flag, check_positive, check_probability
from attnlab.nn.attention import KVCache, head_width, restored_on_error
from attnlab.nn.layers import DecoderLayer, EncoderLayer
from attnlab.nn.masks import values_unreadable
from attnlab.nn.positions import LearnedPositions, RotaryEmbedding, SinusoidalPositions, embedding_scale

PositionKind = Literal["sinusoidal", "learned", "rotary", "none"]


def check_token_ids(ids: Tensor, vocab_size: int) -> None:
    """Raise :class:`AttnlabError` unless ``ids``, (batch, seq), is an integer tensor of ids in ``[0, vocab_size)``."""
    # nn.Embedding takes int64 and int32 only; smaller integer types would pass here and fail inside torch.
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32):
        kind = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise AttnlabError(f"token ids must be an integer tensor (torch.long), got {kind}")
    if ids.numel() == 0 or values_unreadable(ids):  # (nn.Embedding still refuses an id out of range, less readably)
        return
    low, high = (int(value) for value in torch.aminmax(ids))  # (one pass over the ids, not two)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise AttnlabError(f"token id {bad} is outside the vocabulary of size {vocab_size} (valid ids: 0..{vocab_size - 1})")


def check_id_batch(ids: Tensor) -> None:
    """Raise :class:`AttnlabError` unless ``ids`` is a (batch, seq) tensor (one sequence is ``ids[None]``)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise AttnlabError(f"token ids must be (batch, seq), got shape {shape}")


def _check_distinct(caches: list[KVCache]) -> None:
    """Refuse one cache object given twice ([KVCache()] * layers: every layer would append to the one)."""
    if len({id(cache) for cache in caches}) != len(caches):
        raise AttnlabError("one cache object serves several layers (or both attentions of one); each needs its "
                           "own: use model.new_caches()")


def check_cache_list(caches: object, *, pairs: bool) -> None:
    """Refuse ``caches`` that is not what ``model.new_caches()`` makes: a list of :class:`KVCache`, one a layer,
    or with ``pairs`` (the encoder-decoder) of (self-attention, cross-attention) pairs of them, the second may be
    None. Another model's caches would otherwise fail deep inside with a Python error, or be read as an offset."""
    def fits(item: object) -> bool:
        if not pairs:
            return isinstance(item, KVCache)
        return (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], KVCache)
                and (item[1] is None or isinstance(item[1], KVCache)))

    if not isinstance(caches, list | tuple):
        got = f"got a {type(caches).__name__}"
    else:
        bad = next((i for i, item in enumerate(caches) if not fits(item)), None)
        if bad is None:
            return
        got = f"got one whose entry {bad} is {_describe(caches[bad])}"
    want = "(self-attention, cross-attention) pairs of KVCache" if pairs else "KVCache objects"
    raise AttnlabError(f"caches must be a list of {want}, one a layer, as this model's new_caches() makes; {got}")


def _describe(item: object) -> str:
    """What a cache entry is, in a few words: its type, and for a tuple or list its length and entries' types."""
    if not isinstance(item, list | tuple):
        return f"a {type(item).__name__}"
    inside = ", ".join(type(part).__name__ for part in item)
    return f"a {type(item).__name__} of {len(item)} ({inside})" if item else f"an empty {type(item).__name__}"


def _check_caches(caches: list[KVCache] | None, layers: int, ids: Tensor) -> None:
    """One (self-attention) cache per layer, holding the batch that ``ids`` continues."""
    if caches is None:
        return
    check_cache_list(caches, pairs=False)
    if layers == 0:  # the caches are what count the positions already seen; with no layer, nothing would
        raise AttnlabError("a stack without layers keeps no caches, so it cannot decode incrementally; call it "
                           "on the whole sequence instead")
    if len(caches) != layers:
        raise AttnlabError(f"caches has {len(caches)} entries, the stack has {layers} layers (use model.new_caches())")
    _check_distinct(caches)
    held = caches[0].k
    if held is not None and ids.dim() == 2 and held.shape[0] != ids.shape[0]:
        raise AttnlabError(f"the caches hold a batch of {held.shape[0]}, but the ids have a batch of {ids.shape[0]}")
    lengths = [len(cache) for cache in caches]
    if len(set(lengths)) > 1:  # the positions continue from the first one's length: the others would be off
        raise AttnlabError(f"the layers' caches hold different numbers of positions ({lengths}); one sequence's "
                           "caches grow together: start again from model.new_caches()")


class Embedder(nn.Module):
    """Token ids -> token embedding x scale + position, then dropout.

    Args:
        vocab_size: rows of the token embedding.
        d_model: vector width.
        max_positions: longest sequence accepted (rows of the position table; the context without one).
        positions: ``"sinusoidal"`` (paper, seed 000), ``"learned"`` (seed 004, GPT-2), ``"rotary"``
            (added inside attention, so nothing here) or ``"none"`` (order-blind, for experiments).
        scale: multiply token vectors by ``sqrt(d_model)`` (the paper) before adding positions.
        dropout: dropout on the sum.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        max_positions: int,
        positions: PositionKind = "sinusoidal",
        scale: bool = True,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        check_count("vocab_size", vocab_size)
        check_count("d_model", d_model)
        check_count("max_positions", max_positions)  # 0 would refuse every input, at the first forward
        self.vocab_size, self.max_positions, self.kind = vocab_size, max_positions, positions
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions: nn.Module | None
        if positions == "sinusoidal":
            self.positions = SinusoidalPositions(max_positions, d_model)
        elif positions == "learned":
            self.positions = LearnedPositions(max_positions, d_model)
        elif positions in ("rotary", "none"):
            self.positions = None
        else:
            raise AttnlabError(f"unknown position kind {positions!r}; use sinusoidal, learned, rotary or none")
        self.scale = embedding_scale(d_model) if check_flag("scale", scale) else 1.0
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """(batch, seq) ids -> (batch, seq, d_model); ``offset`` is the position of the first id."""
        check_token_ids(ids, self.vocab_size)
        check_id_batch(ids)
        x = self.tokens(ids)
        if self.scale != 1.0:  # (a pass over x, and another backward, that would change nothing)
            x = x * self.scale
        if self.positions is not None:  # rotary positions are applied (and checked) inside attention
            x = x + self.positions(ids.shape[1], offset)
        elif offset + ids.shape[1] > self.max_positions:  # no table to refuse it (rotary: also with no layers)
            raise AttnlabError(f"sequence reaches position {offset + ids.shape[1] - 1} but the model's context is "
                               f"{self.max_positions} positions (max_positions={self.max_positions}); truncate the "
                               "input or build the model with a longer context")
        return self.dropout(x) if self.training else x  # (identity outside training: no module call)


class _Stack(nn.Module):
    """What both stacks are built of: an :class:`Embedder`, ``num_layers`` layers of ``layer_class``, and a
    final norm when the layers are pre-norm (post-norm layers end normalised already).

    Args:
        vocab_size, d_model, max_positions, positions, scale_embedding: the embedder's.
        num_layers, num_heads, d_ff, dropout, head_dim, norm_first, eps, activation, bias: each layer's, as in
            :class:`~attnlab.nn.layers.EncoderLayer` (``bias`` also for the final norm).
    """

    layer_class: type[EncoderLayer] | type[DecoderLayer]

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        *,
        max_positions: int,
        dropout: float = 0.1,
        head_dim: int | None = None,
        norm_first: bool = False,
        eps: float = 1e-6,
        activation: str = "relu",
        positions: PositionKind = "sinusoidal",
        scale_embedding: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if positions == "rotary" and self.layer_class is not EncoderLayer:
            raise AttnlabError("the encoder-decoder decoder supports sinusoidal, learned or no positions")
        check_flag("scale_embedding", scale_embedding)  # (by the name the models and their configs give it)
        self.embed = Embedder(
            vocab_size, d_model, max_positions=max_positions, positions=positions, scale=scale_embedding, dropout=dropout
        )
        layer = dict(dropout=dropout, head_dim=head_dim, norm_first=norm_first, eps=eps, activation=activation,
                     bias=bias)
        # 0 is allowed: the embeddings alone (the bag-of-words baseline, an ablation).
        check_count("num_layers", num_layers, minimum=0)
        if positions == "rotary":  # rotary positions live inside self-attention, one table shared by the layers
            layer["rotary"] = RotaryEmbedding(head_width(d_model, num_heads, head_dim), max_positions)
        self.layers = nn.ModuleList(self.layer_class(d_model, num_heads, d_ff, **layer) for _ in range(num_layers))
        # (checked here too: with no layers nothing else reads them)
        if check_flag("norm_first", norm_first):
            self.final_norm: nn.Module = nn.LayerNorm(d_model, eps=check_positive("eps", eps), bias=check_flag("bias", bias))
        else:
            self.final_norm = nn.Identity()


class Encoder(_Stack):
    """Embedder followed by ``num_layers`` encoder layers (and a final norm when pre-norm).

    With a causal ``attend_mask`` the same stack is a decoder-only (GPT) body. Arguments as in
    :class:`_Stack`; ``positions="rotary"`` rotates queries and keys inside every self-attention.
    """

    layer_class = EncoderLayer

    def forward(
        self,
        ids: Tensor,
        *,
        attend_mask: Tensor | None = None,
        need_weights: bool = False,
        caches: list[KVCache] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """(batch, seq) ids -> (batch, seq, d_model) states, plus per-layer self-attention weights.

        ``caches`` (one per layer) turns on incremental decoding: positions continue after the cached ones.
        The weight list is empty unless ``need_weights``.
        """
        _check_caches(caches, len(self.layers), ids)
        offset = 0 if caches is None else len(caches[0])
        x = self.embed(ids, offset)
        weights: list[Tensor] = []
        with restored_on_error(caches or []):  # a step refused by layer i takes back layers 0..i-1's too
            for i, layer in enumerate(self.layers):
                cache = None if caches is None else caches[i]
                x, w = layer(x, attend_mask=attend_mask, need_weights=need_weights, cache=cache)
                if w is not None:
                    weights.append(w)
            return self.final_norm(x), weights


class Decoder(_Stack):
    """Embedder followed by ``num_layers`` decoder layers (and a final norm when pre-norm).

    Arguments as in :class:`_Stack` (sinusoidal, learned or no positions).
    """

    layer_class = DecoderLayer

    def forward(
        self,
        ids: Tensor,
        memory: Tensor,
        *,
        self_attend_mask: Tensor | None = None,
        memory_attend_mask: Tensor | None = None,
        need_weights: bool = False,
        caches: list[tuple[KVCache, KVCache]] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(batch, tgt) ids and (batch, src, d_model) memory -> (batch, tgt, d_model).

        Returns the states and, if ``need_weights``, the attention weights under seed 000's names,
        ``decoder_layer{i}_block1_self_att`` and ``decoder_layer{i}_block2_decenc_att`` (i from 1).
        ``caches`` holds one (self, memory) pair of caches per layer for incremental decoding.
        """
        if caches is not None:
            check_cache_list(caches, pairs=True)
        _check_caches(None if caches is None else [pair[0] for pair in caches], len(self.layers), ids)
        if caches is not None:  # the memory caches too
            _check_distinct([cache for pair in caches for cache in pair if cache is not None])
        offset = 0 if caches is None else len(caches[0][0])
        x = self.embed(ids, offset)
        weights: dict[str, Tensor] = {}
        with restored_on_error(caches or []):  # as in Encoder.forward
            for i, layer in enumerate(self.layers):
                self_cache, memory_cache = (None, None) if caches is None else caches[i]
                x, self_w, cross_w = layer(
                    x, memory, self_attend_mask=self_attend_mask, memory_attend_mask=memory_attend_mask,
                    need_weights=need_weights, self_cache=self_cache, memory_cache=memory_cache,
                )
                if self_w is not None and cross_w is not None:
                    weights[f"decoder_layer{i + 1}_block1_self_att"] = self_w
                    weights[f"decoder_layer{i + 1}_block2_decenc_att"] = cross_w
            return self.final_norm(x), weights
