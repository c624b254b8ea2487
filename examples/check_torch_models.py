"""Factories for ``attnlab check``: PyTorch's own transformer modules, used correctly and wrongly.

    attnlab check examples/check_torch_models.py:torch_encoder --kind encoder
    attnlab check examples/check_torch_models.py:torch_decoder --kind decoder
    attnlab check examples/check_torch_models.py:torch_seq2seq --kind seq2seq
    attnlab check examples/check_torch_models.py:torch_encoder_as_decoder --kind decoder   # fails: causal
    attnlab check examples/check_torch_models.py:torch_decoder_hide_mask_added --kind decoder   # fails: causal
    attnlab check examples/check_torch_models.py:torch_encoder_fixed_length --kind encoder
    attnlab check examples/check_torch_models.py:torch_encoder_fixed_length_padding_mask_added --kind encoder  # fails: inference-path

Every model is tiny (width 16, two layers), randomly initialised, takes ids in 0..31 with 0 as
padding and at most 16 positions: the command's defaults. Masks cross into torch's conventions
through :mod:`attnlab.nn.masks` (torch's ``key_padding_mask`` is True = hide, its ``attn_mask`` floats
are added to the scores).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.nn.masks import causal_mask, padding_mask, to_additive_mask, to_key_padding_mask

VOCAB, WIDTH, HEADS, FF, LAYERS, MAX_LEN, PAD = 32, 16, 2, 32, 2, 16, 0

# On its inference fast path (the inference-path check) torch's encoder packs padded batches into nested
# tensors; it warns on every call that the API is a prototype.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors", category=UserWarning)


class Embed(nn.Module):
    """Token plus learned position embedding: (batch, seq) ids -> (batch, seq, WIDTH)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(MAX_LEN, WIDTH)

    def forward(self, ids: Tensor) -> Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


def look_ahead(length: int) -> Tensor:
    """(length, length) additive float mask for torch's ``mask``/``tgt_mask``: 0 below the diagonal, -inf above."""
    return to_additive_mask(causal_mask(length))[0, 0]


class TorchEncoder(nn.Module):
    """``nn.TransformerEncoder`` on ids: per-position outputs (batch, seq, VOCAB).

    Args:
        causal: add the look-ahead mask (a decoder-only LM).
        key_padding: hide padding keys (the encoder needs it; a causal model with right padding does not).
        hide_mask_added: the porting bug: the look-ahead mask as floats 1 = hide, 0 = keep (another library's
            convention). torch *adds* a float mask to the scores, so in training it hides nothing; its
            inference fast path reads it as a bool mask and hides the future, so ``no_grad`` looks right.
        fixed_length: pad every batch to MAX_LEN positions before the layers (a model built for one input
            shape, as a tokenizer's ``padding="max_length"`` gives) and return all of them: (batch, MAX_LEN,
            VOCAB) whatever the input's length.
        padding_mask_added: the same porting bug on the padding mask: floats 1 = pad, which torch adds to the
            scores, so training attends to padding; the fast path's nested tensors drop the padded positions.
    """

    def __init__(self, *, causal: bool, key_padding: bool = True, hide_mask_added: bool = False,
                 fixed_length: bool = False, padding_mask_added: bool = False) -> None:
        super().__init__()
        self.causal, self.key_padding, self.hide_mask_added = causal, key_padding, hide_mask_added
        self.fixed_length, self.padding_mask_added = fixed_length, padding_mask_added
        self.embed = Embed()
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.1, batch_first=True)
        self.body = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        if self.fixed_length:  # right padding up to the position table: every batch is (batch, MAX_LEN)
            ids = nn.functional.pad(ids, (0, MAX_LEN - ids.shape[1]), value=PAD)
        hide = to_key_padding_mask(padding_mask(ids, PAD)) if self.key_padding else None
        if hide is not None and self.padding_mask_added:
            hide = hide.float()
        mask = look_ahead(ids.shape[1]) if self.causal else None
        if self.hide_mask_added:
            mask = torch.triu(torch.ones(ids.shape[1], ids.shape[1], device=ids.device), diagonal=1)
        # torch wants both masks of one kind: make the padding one additive too when both are given.
        if hide is not None and mask is not None:
            hide = to_additive_mask(padding_mask(ids, PAD))[:, 0, 0, :]
        causal = self.causal and not self.hide_mask_added
        return self.head(self.body(self.embed(ids), mask=mask, src_key_padding_mask=hide, is_causal=causal))


class TorchSeq2Seq(nn.Module):
    """``nn.Transformer`` on (source ids, target ids) -> per-target-position logits (batch, tgt, VOCAB).

    Args:
        target_causal: give the decoder its look-ahead mask (without it the model sees the future).
    """

    def __init__(self, *, target_causal: bool = True) -> None:
        super().__init__()
        self.target_causal = target_causal
        self.src_embed, self.tgt_embed = Embed(), Embed()
        self.core = nn.Transformer(WIDTH, HEADS, LAYERS, LAYERS, FF, dropout=0.1, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        # Additive float masks throughout (torch warns when bool and float masks meet in one call).
        src_hide = to_additive_mask(padding_mask(src, PAD))[:, 0, 0, :]
        tgt_hide = to_additive_mask(padding_mask(tgt, PAD))[:, 0, 0, :]
        tgt_mask = look_ahead(tgt.shape[1]) if self.target_causal else None
        states = self.core(
            self.src_embed(src), self.tgt_embed(tgt), tgt_mask=tgt_mask, src_key_padding_mask=src_hide,
            tgt_key_padding_mask=tgt_hide, memory_key_padding_mask=src_hide, tgt_is_causal=self.target_causal,
        )
        return self.head(states)


def _built(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)  # before building: the same random weights on every call, so a report reproduces
    return make().eval()


def torch_encoder() -> nn.Module:
    """``nn.TransformerEncoder`` with a padding mask: check with ``--kind encoder``."""
    return _built(lambda: TorchEncoder(causal=False))


def torch_decoder() -> nn.Module:
    """``nn.TransformerEncoder`` with the look-ahead mask, a GPT-like decoder: ``--kind decoder``."""
    return _built(lambda: TorchEncoder(causal=True, key_padding=False))


def torch_seq2seq() -> nn.Module:
    """``nn.Transformer`` with source padding, target padding and look-ahead masks: ``--kind seq2seq``."""
    return _built(TorchSeq2Seq)


def torch_encoder_as_decoder() -> nn.Module:
    """Wrong on purpose: the encoder (no look-ahead mask) called as a decoder. ``--kind decoder`` fails causal."""
    return _built(lambda: TorchEncoder(causal=False))


def torch_encoder_fixed_length() -> nn.Module:
    """``nn.TransformerEncoder`` that pads every batch to its 16 positions and returns all of them: ``--kind
    encoder``. Its output does not follow the input's length, so the checks read it as pooled."""
    return _built(lambda: TorchEncoder(causal=False, fixed_length=True))


def torch_encoder_fixed_length_padding_mask_added() -> nn.Module:
    """Wrong on purpose: the fixed-length encoder with a 0/1 float padding mask, which torch adds to the scores.
    ``--kind encoder`` fails inference-path alone: padded to one length, every input meets the same padding,
    so the padding checks see no change, but training attends to it and the fast path drops it."""
    return _built(lambda: TorchEncoder(causal=False, fixed_length=True, padding_mask_added=True))


def torch_encoder_without_padding_mask() -> nn.Module:
    """Wrong on purpose: padding is attended. ``--kind encoder`` fails the padding checks."""
    return _built(lambda: TorchEncoder(causal=False, key_padding=False))


def torch_seq2seq_without_look_ahead() -> nn.Module:
    """Wrong on purpose: the decoder sees the whole target. ``--kind seq2seq`` fails causal."""
    return _built(lambda: TorchSeq2Seq(target_causal=False))


def torch_decoder_hide_mask_added() -> nn.Module:
    """Wrong on purpose: a 0/1 float look-ahead mask meant as "1 = hide", which torch adds to the scores.
    ``--kind decoder`` fails causal (the training path leaks) and inference-path (the fast path hides the leak)."""
    return _built(lambda: TorchEncoder(causal=True, key_padding=False, hide_mask_added=True))
