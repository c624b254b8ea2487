"""Factories for ``attnlab check``: tiny Hugging Face models built from config objects (no download).

    attnlab check examples/check_hf_models.py:hf_bert --kind encoder
    attnlab check examples/check_hf_models.py:hf_gpt2 --kind decoder
    attnlab check examples/check_hf_models.py:hf_t5 --kind seq2seq
    attnlab check examples/check_hf_models.py:hf_bert_mask_inverted --kind encoder   # fails
    attnlab check examples/check_hf_models.py:hf_t5_without_source_mask --kind seq2seq   # fails

The weights are random (seeded); the checks need no training, only the ability to call the model.
:class:`~attnlab.checks.HFAdapter` turns ``model(input_ids=..., attention_mask=...)`` into ``model(ids)``, and
:class:`~attnlab.checks.HFSeq2SeqAdapter` an encoder-decoder's ``model(input_ids=..., attention_mask=...,
decoder_input_ids=...)`` into ``model(src, tgt)``.
Ids 0..31 with 0 as padding, at most 16 positions: the command's defaults.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

from attnlab.checks import HFAdapter, HFSeq2SeqAdapter
from attnlab.nn.masks import padding_mask, to_hf_attention_mask

VOCAB, WIDTH, HEADS, LAYERS, MAX_LEN, PAD = 32, 16, 2, 2, 16, 0


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        intermediate_size=2 * WIDTH, max_position_embeddings=MAX_LEN, pad_token_id=PAD)
    return BertModel(config, add_pooling_layer=False).eval()


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    # bos/eos default to GPT-2's 50256, outside a tiny vocabulary: point them inside it.
    config = GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=MAX_LEN,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, pad_token_id=PAD)
    return GPT2LMHeadModel(config).eval()


def tiny_t5() -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    # T5 starts every target with its pad id (decoder_start_token_id); eos points inside the tiny vocabulary.
    config = T5Config(vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=2 * WIDTH, num_layers=LAYERS,
                      num_heads=HEADS, pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=1)
    return T5ForConditionalGeneration(config).eval()


def hf_bert() -> nn.Module:
    """BERT-like encoder, per-position hidden states: ``--kind encoder``."""
    return HFAdapter(tiny_bert(), pad_id=PAD)


def hf_gpt2() -> nn.Module:
    """GPT-2-like decoder, per-position logits: ``--kind decoder``."""
    return HFAdapter(tiny_gpt2(), pad_id=PAD)


def hf_t5() -> nn.Module:
    """T5 encoder-decoder, per-target-position logits: ``--kind seq2seq``."""
    return HFSeq2SeqAdapter(tiny_t5(), pad_id=PAD)


class InvertedMask(nn.Module):
    """Wrong on purpose: ``attention_mask`` with 1 on the padding (the torch "True = hide" habit)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Any:
        keep = to_hf_attention_mask(padding_mask(ids, PAD))
        return self.model(input_ids=ids, attention_mask=1 - keep)


def hf_bert_mask_inverted() -> nn.Module:
    """BERT with its attention mask inverted: ``--kind encoder`` fails."""
    return InvertedMask(tiny_bert())


def hf_t5_without_source_mask() -> nn.Module:
    """T5 given no attention_mask, so its encoder and cross-attention read the source's padding: ``--kind seq2seq``
    fails."""
    return HFSeq2SeqAdapter(tiny_t5(), pad_id=None)
