"""Adapters that turn other libraries' models into the ids-only callables the checks take."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from attnlab.nn.masks import padding_mask, to_hf_attention_mask


class HFAdapter(nn.Module):
    """A Hugging Face model as ``model(ids)``: the ``attention_mask`` is built from the pad id.

    Args:
        model: e.g. ``BertModel`` or ``GPT2LMHeadModel``; called as ``model(input_ids=..., attention_mask=...)``.
        pad_id: the id that marks padding, or None to pass no mask.

    Returns the model's own output (a ``ModelOutput``); the checks take its ``logits`` or
    ``last_hidden_state``. Being an ``nn.Module``, the adapter passes ``train()``/``eval()`` through.
    """

    def __init__(self, model: nn.Module, pad_id: int | None = 0) -> None:
        super().__init__()
        self.model, self.pad_id = model, pad_id

    def forward(self, ids: Tensor) -> Any:
        """(batch, seq) ids -> the wrapped model's output."""
        if self.pad_id is None:
            return self.model(input_ids=ids)
        return self.model(input_ids=ids, attention_mask=to_hf_attention_mask(padding_mask(ids, self.pad_id)))
