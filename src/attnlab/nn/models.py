"""Whole models: the encoder-decoder ``Transformer``, the encoder classifier, the decoder-only LM.

Each model builds its own masks from its pad id, so a caller cannot hand it the wrong one:

* encoder self-attention and decoder cross-attention: padding mask from the **source** ids;
* decoder self-attention: causal mask and padding mask from the **target** ids.

Models return logits. Softmax is the caller's choice: :meth:`probabilities` applies it.
Each model keeps the keyword arguments it was built with in ``self.config`` (plain JSON types), so a
checkpoint can store them next to the weights and rebuild the model with ``Model(**config)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError, check_count, check_flag
from attnlab.nn.attention import KVCache, restored_on_error
from attnlab.nn.masks import (
    cached_causal_mask,
    causal_mask,
    check_attend_mask,
    decoder_self_mask,
    padding_mask,
    values_unreadable,
)
from attnlab.nn.positions import ComputedTable
from attnlab.nn.stacks import Decoder, Encoder, PositionKind, check_cache_list, check_id_batch


def refuse_cached_padding(ids: Tensor, pad_id: int) -> None:
    """Refuse padding in positions fed through a KV cache: a cache cannot un-see a key, so the padding mask
    of later steps could not hide it (greedy and beam search never feed padding). ``ids``: (batch, new)."""
    if not values_unreadable(ids) and bool((ids == pad_id).any()):
        raise AttnlabError(f"ids hold the padding id {pad_id}, which cached decoding cannot mask; "
                           "decode sequences of different lengths separately or without caches")


def check_pad_id(pad_id: int, vocab_size: int, what: str) -> int:
    """``pad_id``, if it is an id of the vocabulary; an id no token can take would silently mask nothing."""
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
        raise AttnlabError(f"pad_id must be an id of {what} (0..{vocab_size - 1}), got {pad_id!r}")
    return pad_id


def masked_mean(states: Tensor, *, attend_mask: Tensor) -> Tensor:
    """The mean of the real tokens' states: (batch, seq, d) states and their (batch, 1, 1, seq) padding attend
    mask (:func:`~attnlab.nn.masks.padding_mask`, True = a real token) -> (batch, d).

    An all-padding row has no real token: it divides by 1 instead of 0, so it pools to zeros, not NaN.

    Raises:
        AttnlabError: if ``attend_mask`` is not a bool (batch, 1, 1, seq) mask of these states (a float or
            True = padding mask would average the wrong positions).
    """
    check_attend_mask(attend_mask, (states.shape[0], 1, 1, states.shape[1]))
    if attend_mask.shape[0] != states.shape[0]:  # one row's padding spread over every row would average the wrong ones
        raise AttnlabError(f"masked_mean takes each row's own padding mask: got a mask of batch {attend_mask.shape[0]} "
                           f"for states of batch {states.shape[0]}")
    keep = attend_mask[:, 0, 0, :, None].to(states.dtype)  # (batch, seq, 1)
    return (states * keep).sum(1) / keep.sum(1).clamp(min=1.0)


def _after_load(module: nn.Module, incompatible_keys: Any) -> None:
    """After ``load_state_dict``, for a model built on the ``meta`` device and loaded with ``assign=True``:

    * that puts each saved tensor in its own slot, so the output matrix and the embedding it shares would become
      two parameters, trained apart: tie them again (Hugging Face's models re-tie likewise);
    * the position tables are computed, not saved, so they would stay on ``meta``: compute them on the device the
      weights came to.
    """
    module.tie_weights()
    loaded = next((p for p in module.parameters() if not p.is_meta), None)
    if loaded is not None:  # (a load that left every weight on meta has no device to put the tables on)
        for table in module.modules():
            if isinstance(table, ComputedTable):
                table.materialize(loaded.device)


class _Model(nn.Module):
    config: dict[str, Any]

    def __init__(self) -> None:
        super().__init__()
        self.register_load_state_dict_post_hook(_after_load)

    def tie_weights(self) -> None:
        """Share the matrices the model ties (none here; see the subclasses')."""

    def probabilities(self, *args: Any, **kwargs: Any) -> Tensor:
        """``softmax(forward(...))`` over the last axis: probabilities of the logits' shape, (batch, [seq,] classes
        or vocab)."""
        out = self(*args, **kwargs)
        logits = out[0] if isinstance(out, tuple) else out
        return torch.softmax(logits, dim=-1)

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class Transformer(_Model):
    """The encoder-decoder of Vaswani et al. (2017), as seeds 000 and 003 build it.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        d_model, num_layers, num_heads, d_ff: widths and depth (``num_decoder_layers`` defaults to
            ``num_layers``).
        max_src_positions, max_tgt_positions: longest source and target accepted.
        dropout: dropout rate everywhere the paper puts it.
        head_dim: per-head width (default ``d_model // num_heads``).
        pad_id: the padding id in both vocabularies.
        norm_first: pre-norm layers (default: the paper's post-norm).
        eps: layer-norm epsilon.
        positions: ``"sinusoidal"`` (default), ``"learned"`` or ``"none"``.
        share_embeddings: one embedding table for source and target (a joint vocabulary).
        tie_output: the output projection reuses the target embedding matrix.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 512,
        num_layers: int = 6,
        num_heads: int = 8,
        d_ff: int = 2048,
        *,
        max_src_positions: int = 256,
        max_tgt_positions: int = 256,
        num_decoder_layers: int | None = None,
        dropout: float = 0.1,
        head_dim: int | None = None,
        pad_id: int = 0,
        norm_first: bool = False,
        eps: float = 1e-6,
        positions: PositionKind = "sinusoidal",
        share_embeddings: bool = False,
        tie_output: bool = False,
    ) -> None:
        super().__init__()
        self.config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_count("src_vocab_size", src_vocab_size)  # (before the pad id is compared with them)
        check_count("tgt_vocab_size", tgt_vocab_size)
        self.pad_id = check_pad_id(pad_id, min(src_vocab_size, tgt_vocab_size), "both vocabularies")
        check_flag("share_embeddings", share_embeddings)  # a JSON config's "false" would be true
        check_flag("tie_output", tie_output)
        common = dict(dropout=dropout, head_dim=head_dim, norm_first=norm_first, eps=eps, positions=positions)
        self.encoder = Encoder(src_vocab_size, d_model, num_layers, num_heads, d_ff, max_positions=max_src_positions, **common)
        self.decoder = Decoder(
            tgt_vocab_size, d_model, num_layers if num_decoder_layers is None else num_decoder_layers, num_heads, d_ff,
            max_positions=max_tgt_positions, **common,
        )
        if share_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise AttnlabError(f"shared embeddings need one vocabulary, got sizes {src_vocab_size} and {tgt_vocab_size}")
            self.decoder.embed.tokens = self.encoder.embed.tokens
        self.output = nn.Linear(d_model, tgt_vocab_size)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make the output projection use the target embedding matrix again, if the model ties them.

        ``to_empty`` (after building on the ``meta`` device) gives every module a parameter of its own, which
        unties the two: training would then update two copies apart.
        """
        if self.config["tie_output"]:
            self.output.weight = self.decoder.embed.tokens.weight

    def reset_parameters(self) -> None:
        """Tie the output matrix to the embedding again (:meth:`tie_weights`); each layer initialises its own
        weights (torch's convention: call every module's ``reset_parameters``)."""
        self.tie_weights()

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(batch, src) ids -> memory (batch, src, d_model) and its attend mask (batch, 1, 1, src)."""
        check_id_batch(src)
        if src.shape[1] == 0:  # cross-attention would have no key: every target would read a zero context
            raise AttnlabError("the source is empty (batch, 0): the decoder's cross-attention needs at least one "
                               "source position")
        memory_mask = padding_mask(src, self.pad_id)
        memory, _ = self.encoder(src, attend_mask=memory_mask)
        return memory, memory_mask

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        memory_attend_mask: Tensor,
        need_weights: bool = False,
        caches: list[tuple[KVCache, KVCache]] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Target ids and the encoder's memory -> logits (batch, tgt, tgt_vocab) and attention weights.

        With ``caches``, ``tgt`` holds only the new positions; the causal mask then lets them see every
        cached position (target padding is not re-masked across steps, as greedy and beam search
        never feed padding).
        """
        if caches is None:
            self_mask = decoder_self_mask(tgt, self.pad_id)
        else:
            check_cache_list(caches, pairs=True)  # before its first entry is read as the offset
            refuse_cached_padding(tgt, self.pad_id)
            self_mask = cached_causal_mask(tgt.shape[1], len(caches[0][0]) if caches else 0, device=tgt.device)
        with restored_on_error(caches or []):  # the output layer's step too (see DecoderLM.forward)
            states, weights = self.decoder(
                tgt, memory, self_attend_mask=self_mask, memory_attend_mask=memory_attend_mask,
                need_weights=need_weights, caches=caches,
            )
            return self.output(states), weights

    def new_caches(self) -> list[tuple[KVCache, KVCache]]:
        """Empty (self-attention, cross-attention) caches, one pair per decoder layer."""
        return [(KVCache(), KVCache()) for _ in self.decoder.layers]

    def forward(self, src: Tensor, tgt: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """(batch, src) and (batch, tgt) ids -> logits (batch, tgt, tgt_vocab).

        With ``return_attention=True`` also returns the decoder's attention weights by seed 000's names
        (self- and cross-attention of every layer). The encoder's self-attention weights are a list, one
        (batch, heads, src, src) tensor a layer: ``model.encoder(src, attend_mask=padding_mask(src,
        model.pad_id), need_weights=True)[1]``.
        """
        check_id_batch(src)
        check_id_batch(tgt)
        if src.shape[0] != tgt.shape[0]:  # cross-attention would broadcast
            raise AttnlabError(f"src has batch {src.shape[0]} but tgt has batch {tgt.shape[0]}; each target row "
                               "is decoded against the source row of the same index")
        memory, memory_mask = self.encode(src)
        logits, weights = self.decode(tgt, memory, memory_attend_mask=memory_mask, need_weights=return_attention)
        return (logits, weights) if return_attention else logits


class EncoderClassifier(_Model):
    """Encoder-only classifier with masked mean pooling (seed 004's TinyTransformer).

    token embedding + learned positions -> encoder layers with the padding mask -> final norm ->
    mean over *real* tokens only -> one score per class.

    Args:
        vocab_size, num_classes: sizes.
        d_model, num_layers, num_heads, d_ff: widths and depth.
        max_positions: rows of the position table (seed 004: 120).
        dropout: dropout rate.
        pad_id: padding id (seed 004: 0).
        positions: ``"learned"`` (default), ``"sinusoidal"``, ``"rotary"`` or ``"none"``.
        scale_embedding: multiply token vectors by sqrt(d_model) (seed 004 does not).
        norm_first: pre-norm layers.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        d_ff: int = 128,
        *,
        max_positions: int = 120,
        dropout: float = 0.1,
        pad_id: int = 0,
        positions: PositionKind = "learned",
        scale_embedding: bool = False,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_count("vocab_size", vocab_size)  # (before the pad id is compared with it)
        self.pad_id = check_pad_id(pad_id, vocab_size, "the vocabulary")
        check_count("num_classes", num_classes)
        self.encoder = Encoder(
            vocab_size, d_model, num_layers, num_heads, d_ff, max_positions=max_positions, dropout=dropout,
            norm_first=norm_first, positions=positions, scale_embedding=scale_embedding, eps=1e-5,
        )
        # Post-norm layers end normalised already; seed 004 still applies one more norm before pooling.
        self.norm = nn.LayerNorm(d_model) if not norm_first else nn.Identity()
        self.out = nn.Linear(d_model, num_classes)

    def pooled(self, ids: Tensor) -> Tensor:
        """(batch, seq) ids -> (batch, d_model): the mean of the real tokens' final states."""
        padding = padding_mask(ids, self.pad_id)
        return self._pooled(ids, padding, attend_mask=padding)

    def _pooled(self, ids: Tensor, padding: Tensor, *, attend_mask: Tensor | None) -> Tensor:
        states, _ = self.encoder(ids, attend_mask=attend_mask)
        return masked_mean(self.norm(states), attend_mask=padding)

    def forward(self, ids: Tensor) -> Tensor:
        """(batch, seq) ids -> (batch, num_classes) logits."""
        return self.out(self.pooled(ids))

    def logits_with_mask(self, ids: Tensor, *, attend_mask: Tensor | None) -> Tensor:
        """(batch, seq) ids -> (batch, num_classes) logits with the encoder attending under ``attend_mask``
        (None: every key) instead of the padding mask, for probes that change it; the mean still covers the
        real tokens."""
        return self.out(self._pooled(ids, padding_mask(ids, self.pad_id), attend_mask=attend_mask))


class DecoderLM(_Model):
    """Decoder-only causal language model (GPT-like; seed 004's "decoder" column).

    Embedding + positions -> pre-norm self-attention blocks with the causal mask -> final norm ->
    logits over the vocabulary, the output matrix tied to the embedding by default (GPT-2, nanoGPT).
    Weights start from GPT-2's initialisation (:meth:`reset_parameters`).

    Args:
        vocab_size: vocabulary size.
        d_model, num_layers, num_heads, d_ff: widths and depth (``d_ff`` default ``4 * d_model``).
        max_positions: context length.
        dropout: dropout rate.
        positions: ``"learned"`` (default, GPT-2), ``"sinusoidal"``, ``"rotary"`` or ``"none"``.
        norm_first: pre-norm (default, GPT-2) or post-norm.
        tie_output: share the embedding and output matrices.
        pad_id: if given, keys holding it are masked too (for right-padded batches).
        bias: biases in the linear layers and layer norms (GPT-2 has them; nanoGPT's default, and its
            ``nanogpt-cpu`` recipe, has none).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        d_ff: int | None = None,
        *,
        max_positions: int = 256,
        dropout: float = 0.0,
        positions: PositionKind = "learned",
        norm_first: bool = True,
        tie_output: bool = True,
        pad_id: int | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_count("vocab_size", vocab_size)  # (before the pad id is compared with it)
        self.pad_id = None if pad_id is None else check_pad_id(pad_id, vocab_size, "the vocabulary (or None)")
        check_flag("tie_output", tie_output)  # a JSON config's "false" would be true
        self.max_positions = max_positions
        self.body = Encoder(
            vocab_size, d_model, num_layers, num_heads, 4 * d_model if d_ff is None else d_ff, max_positions=max_positions,
            dropout=dropout, norm_first=norm_first, eps=1e-5, activation="gelu", positions=positions,
            scale_embedding=False, bias=bias,
        )
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.reset_parameters()
        self.tie_weights()  # also when a subclass's own reset_parameters does not call this one

    def tie_weights(self) -> None:
        """Make the output matrix the embedding matrix again, if the model ties them (see
        :meth:`Transformer.tie_weights`: ``to_empty`` unties them)."""
        if self.config["tie_output"]:
            self.lm_head.weight = self.body.embed.tokens.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation, as nanoGPT applies it: N(0, 0.02) weights, zero biases, and the two
        projections that write into the residual stream (attention output, feed-forward down) at
        0.02 / sqrt(2 * layers), so the stream's variance does not grow with depth.

        PyTorch's defaults draw embeddings from N(0, 1); with the output matrix tied to the embedding the
        first logits would have a standard deviation of about sqrt(d_model), and training would start at a
        loss of tens of nats instead of ln(vocab_size), wasting hundreds of steps.

        Ties the output matrix to the embedding first (:meth:`tie_weights`), which ``to_empty`` undoes.
        """
        self.tie_weights()
        residual_std = 0.02 / math.sqrt(2 * max(len(self.body.layers), 1))  # (no layers: nothing uses it)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                std = residual_std if name.endswith(("out_proj", "ffn.down")) else 0.02
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def new_caches(self) -> list[KVCache]:
        """Empty key/value caches, one per layer."""
        return [KVCache() for _ in self.body.layers]

    def forward(
        self, ids: Tensor, *, caches: list[KVCache] | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """(batch, seq) ids -> logits (batch, seq, vocab); position t sees ids 0..t only.

        With ``caches``, ``ids`` holds only the new positions, which follow the cached ones. Cached decoding
        masks no padding (a cache cannot un-see a key), so ids holding ``pad_id`` are refused there: feed
        prompts of one length, or decode them one at a time (a check of values, left out inside ``torch.compile``).
        """
        check_id_batch(ids)  # before its shape is read below
        if caches is not None and self.pad_id is not None:
            refuse_cached_padding(ids, self.pad_id)
        if caches is None:
            mask = causal_mask(ids.shape[1], device=ids.device) if self.pad_id is None else decoder_self_mask(
                ids, self.pad_id)
        else:  # cached decoding never feeds padding
            check_cache_list(caches, pairs=False)  # before its first entry is read as the offset
            # (an empty list reaches the stack, which names the number of caches it needs)
            mask = cached_causal_mask(ids.shape[1], len(caches[0]) if caches else 0, device=ids.device)
        # The output layer inside too: out of memory or Ctrl-C there would leave the step in every cache.
        with restored_on_error(caches or []):
            states, weights = self.body(ids, attend_mask=mask, need_weights=return_attention, caches=caches)
            logits = self.lm_head(states)
        return (logits, weights) if return_attention else logits
