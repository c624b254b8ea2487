"""Adapters that turn other libraries' models into the ids-only callables the checks take.

The checks call an encoder or a decoder as ``model(ids)`` and a seq2seq model as ``model(src, tgt)``.
A Hugging Face model takes its inputs by keyword, with its masks in its own convention (``attention_mask``,
(batch, keys), 1 = keep): the adapters build those masks from pad ids with attnlab's converters
(:func:`~attnlab.nn.masks.padding_mask`, then :func:`~attnlab.nn.masks.to_hf_attention_mask`), so that the
one mask convention of the package stays the only one written by hand.

A Hugging Face encoder-decoder (T5, BART, Marian, ...) is never called positionally: ``model(src, tgt)``
would bind the target to its second parameter, ``attention_mask``, and a BART would quietly decode its own
shifted source instead. :class:`HFAdapter` refuses one, and the checks refuse one passed bare
(:func:`refuse_bare_encoder_decoder`): both name :class:`HFSeq2SeqAdapter`, which calls it by keyword.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from typing import Any

from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.nn.masks import padding_mask, to_hf_attention_mask


def accepts_keyword(method: Any, name: str) -> bool:
    """Whether ``method`` accepts a keyword argument ``name`` (by name, not through ``**kwargs``)."""
    try:
        return callable(method) and name in inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return False


def is_hf_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` is a Hugging Face encoder-decoder: an ``nn.Module`` with a ``config`` whose ``forward``
    takes ``input_ids``, ``attention_mask`` and ``decoder_input_ids`` by name (``T5ForConditionalGeneration``,
    ``BartModel``, ``MarianMTModel``, ``EncoderDecoderModel``; not ``T5EncoderModel``, which has no decoder)."""
    forward = getattr(model, "forward", None)
    return (isinstance(model, nn.Module) and hasattr(model, "config")
            and all(accepts_keyword(forward, n) for n in ("input_ids", "attention_mask", "decoder_input_ids")))


def refuse_bare_encoder_decoder(model: Any, kind: str) -> None:
    """Raise :class:`AttnlabError` when ``model`` is a Hugging Face encoder-decoder that is not wrapped.

    Called positionally as the checks call a model, it would read the target as its attention mask (or, as
    ``model(ids)``, decode its own shifted source): every check would judge a call no user makes. Building
    its masks bare would mean guessing which pad ids to hide on which side, which is the adapter's to say.
    """
    if not is_hf_encoder_decoder(model):
        return
    name = type(model).__name__
    if kind != "seq2seq":
        raise AttnlabError(f"{name} is a Hugging Face encoder-decoder: check it as seq2seq (--kind seq2seq), wrapped "
                           "as HFSeq2SeqAdapter(model, pad_id=...) from attnlab.checks")
    raise AttnlabError(f"{name} is a Hugging Face encoder-decoder, whose second positional argument is "
                       "attention_mask: called as model(src, tgt) it would take the target for a mask; wrap it as "
                       "HFSeq2SeqAdapter(model, pad_id=...) from attnlab.checks, which passes input_ids, "
                       "attention_mask and decoder_input_ids by name")


def hf_attention_mask(ids: Tensor, pad_id: int | None) -> Tensor | None:
    """Hugging Face's ``attention_mask`` for (batch, seq) ids: (batch, seq) int64, 1 on every id but ``pad_id``;
    None without a pad id (the model then attends to every position)."""
    return None if pad_id is None else to_hf_attention_mask(padding_mask(ids, pad_id))


def _pad_id(name: str, value: Any) -> int | None:
    """``value`` as a pad id (a whole number, or None); anything else is one clear line, not a later torch error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        # (a negative id is no token: the advice the checks gave, "--vocab-size above -1", could not be followed)
        raise AttnlabError(f"{name} must be a token id (a whole number >= 0) or None, got {value!r}")
    return int(value)


class HFAdapter(nn.Module):
    """A Hugging Face encoder or decoder as ``model(ids)``: the ``attention_mask`` is built from the pad id.

    Args:
        model: e.g. ``BertModel`` or ``GPT2LMHeadModel``; called as ``model(input_ids=..., attention_mask=...)``.
            An encoder-decoder is refused (:class:`AttnlabError`): it goes in :class:`HFSeq2SeqAdapter`.
        pad_id: the id that marks padding, or None to pass no mask.

    Returns the model's own output (a ``ModelOutput``); the checks take its ``logits`` or
    ``last_hidden_state``. Being an ``nn.Module``, the adapter passes ``train()``/``eval()`` through.
    """

    def __init__(self, model: nn.Module, pad_id: int | None = 0) -> None:
        super().__init__()
        if is_hf_encoder_decoder(model):
            raise AttnlabError(f"HFAdapter takes an encoder or a decoder, and {type(model).__name__} is an "
                               "encoder-decoder: wrap it as HFSeq2SeqAdapter(model, pad_id=...) and check it as seq2seq")
        self.model, self.pad_id = model, _pad_id("pad_id", pad_id)

    def forward(self, ids: Tensor) -> Any:
        """(batch, seq) ids -> the wrapped model's output."""
        if self.pad_id is None:
            return self.model(input_ids=ids)
        return self.model(input_ids=ids, attention_mask=hf_attention_mask(ids, self.pad_id))


class HFSeq2SeqAdapter(nn.Module):
    """A Hugging Face encoder-decoder (T5, BART, Marian, ...) as ``model(src, tgt)``, its masks built from pad ids.

    Calls ``model(input_ids=src, attention_mask=..., decoder_input_ids=tgt, decoder_attention_mask=...)``. The
    ``attention_mask`` hides the source's padding from the encoder and from the decoder's cross-attention.

    Args:
        model: e.g. ``T5ForConditionalGeneration``, ``BartForConditionalGeneration``, ``MarianMTModel``, or the
            bare ``T5Model``/``BartModel``; anything else is refused (:class:`AttnlabError`).
        pad_id: the source's pad id, or None to pass no ``attention_mask``.
        decoder_pad_id: the target's pad id for ``decoder_attention_mask``, or None (the default) to pass none, as
            generation does; the model's own look-ahead mask still applies. Right padding on a causal target
            comes after every real position, so no real output reads it either way; and T5 starts every target
            with its pad id (its ``decoder_start_token_id``), which a mask built from that id would hide.

    Returns the model's own output (a ``Seq2SeqLMOutput`` or ``Seq2SeqModelOutput``); the checks take its
    ``logits`` or ``last_hidden_state``, (batch, tgt_seq, ...). Being an ``nn.Module``, the adapter passes
    ``train()``/``eval()`` through. The ``kv-cache`` check drives the wrapped model's own cache, with these masks.
    """

    def __init__(self, model: nn.Module, pad_id: int | None = 0, decoder_pad_id: int | None = None) -> None:
        super().__init__()
        if not is_hf_encoder_decoder(model):
            raise AttnlabError(f"HFSeq2SeqAdapter takes a Hugging Face encoder-decoder (a model whose forward takes "
                               f"input_ids, attention_mask and decoder_input_ids), got {type(model).__name__}; an "
                               "encoder or a decoder goes in HFAdapter")
        self.model = model
        self.pad_id, self.decoder_pad_id = _pad_id("pad_id", pad_id), _pad_id("decoder_pad_id", decoder_pad_id)

    def source_mask(self, src: Tensor) -> Tensor | None:
        """The ``attention_mask`` of (batch, src_seq) source ids: (batch, src_seq), 1 = keep; None without a pad id."""
        return hf_attention_mask(src, self.pad_id)

    def target_mask(self, tgt: Tensor) -> Tensor | None:
        """The ``decoder_attention_mask`` of (batch, tgt_seq) target ids, all of them up to the newest (a cached
        decoding passes the cached ones too): (batch, tgt_seq), 1 = keep; None without a decoder pad id."""
        return hf_attention_mask(tgt, self.decoder_pad_id)

    def forward(self, src: Tensor, tgt: Tensor) -> Any:
        """(batch, src_seq) source ids and (batch, tgt_seq) target ids -> the wrapped model's output."""
        return self.model(input_ids=src, attention_mask=self.source_mask(src),
                          decoder_input_ids=tgt, decoder_attention_mask=self.target_mask(tgt))


class PadIdWarning(UserWarning):
    """An adapter (or one of attnlab's models) hides one pad id while the checks pad with another."""


def is_attnlab_model(model: Any) -> bool:
    """Whether ``model`` is one of attnlab's own models, whose ``pad_id`` (None included) is the one it hides."""
    from attnlab.nn.models import DecoderLM, EncoderClassifier, Transformer

    return isinstance(model, DecoderLM | EncoderClassifier | Transformer)


def hidden_pad_id(model: Any) -> int | None:
    """The pad id ``model`` hides when it is one of these adapters or one of attnlab's models (their ``pad_id``);
    None for one that hides none (a decoder built without ``pad_id``), and for any other model, whose pad id only
    the user knows (``--pad-id``)."""
    owns = isinstance(model, HFAdapter | HFSeq2SeqAdapter) or is_attnlab_model(model)
    return model.pad_id if owns else None


def pad_id_holder(model: Any) -> str:
    """Who says which pad id is hidden, for messages: "the adapter", or "the model" (one of attnlab's)."""
    return "the adapter" if isinstance(model, HFAdapter | HFSeq2SeqAdapter) else "the model"


def warn_other_pad_id(model: Any, pad_id: int | None) -> None:
    """Warn when ``model`` is an adapter (or one of attnlab's models, see :func:`hidden_pad_id`) that hides a pad id
    other than ``pad_id``, the one the checks pad with: its padding checks would then judge a model that is never
    told where that padding is; or, with checks that pad with nothing (``pad_id`` None), whose real tokens may be
    the id the model hides as padding (attnlab's own decoders refuse it in cached decoding). (A model with no pad
    id is no mismatch: a forgotten mask is what the padding checks catch.)"""
    hidden = hidden_pad_id(model)
    if hidden is None or hidden == pad_id:
        return
    if pad_id is None:
        warnings.warn(f"{pad_id_holder(model)} hides pad id {hidden} but the checks pad with none (the contract's "
                      f"pad_id, --pad-id): they draw {hidden} as a real token, which the model hides as padding; give "
                      f"pad id {hidden}", PadIdWarning, stacklevel=3)
    else:
        warnings.warn(f"{pad_id_holder(model)} hides pad id {hidden} but the checks pad with {pad_id} (the contract's pad_id, "
                      "--pad-id): the padding checks judge a model that is not told where that padding is",
                      PadIdWarning, stacklevel=3)
