"""The transformer core, in the order the data flows: positions, masks, attention, layers, stacks, models.

Mask convention everywhere: ``attend_mask`` is ``torch.bool``, True = may attend (see :mod:`attnlab.nn.masks`).
"""

from attnlab.nn.attention import (
    KVCache,
    MultiHeadAttention,
    attention_reference,
    masked_softmax,
    scaled_dot_product_attention,
)
from attnlab.nn.layers import DecoderLayer, EncoderLayer, FeedForward
from attnlab.nn.masks import (
    causal_mask,
    check_attend_mask,
    decoder_self_mask,
    from_additive_mask,
    from_hf_attention_mask,
    from_hide_mask,
    from_keep_mask,
    from_key_padding_mask,
    from_torch_attn_mask,
    padding_mask,
    to_additive_mask,
    to_hf_attention_mask,
    to_key_padding_mask,
)
from attnlab.nn.models import DecoderLM, EncoderClassifier, Transformer
from attnlab.nn.positions import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    sinusoidal_angles,
    sinusoidal_encoding,
)
from attnlab.nn.stacks import Decoder, Embedder, Encoder

__all__ = [
    "KVCache", "MultiHeadAttention", "attention_reference", "masked_softmax", "scaled_dot_product_attention",
    "DecoderLayer", "EncoderLayer", "FeedForward",
    "causal_mask", "check_attend_mask", "decoder_self_mask", "from_additive_mask", "from_hf_attention_mask",
    "from_hide_mask", "from_keep_mask", "from_key_padding_mask", "from_torch_attn_mask", "padding_mask", "to_additive_mask", "to_hf_attention_mask", "to_key_padding_mask",
    "DecoderLM", "EncoderClassifier", "Transformer",
    "LearnedPositions", "RotaryEmbedding", "SinusoidalPositions", "sinusoidal_angles", "sinusoidal_encoding",
    "Decoder", "Embedder", "Encoder",
]
