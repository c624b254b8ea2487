"""Data: tokenizers, padding and length bucketing (task-specific readers live with their tasks)."""

from attnlab.data.batching import bucketed_batches, pad_batch
from attnlab.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    load_tokenizer,
    word_tokens,
)

__all__ = [
    "bucketed_batches", "pad_batch", "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID",
    "BPETokenizer", "CharTokenizer", "WordTokenizer", "load_tokenizer", "word_tokens",
]
