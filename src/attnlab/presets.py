"""Named model configurations: the seeds' and the paper's.

``build_preset(name)`` returns a freshly initialised model; ``MODEL_PRESETS`` lists what exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnlab.errors import AttnlabError
from attnlab.nn.models import DecoderLM, EncoderClassifier, Transformer


@dataclass(frozen=True)
class ModelPreset:
    """A model class, the keyword arguments to build it, and where the numbers come from."""

    model: type[nn.Module]
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""


MODEL_PRESETS: dict[str, ModelPreset] = {
    "paper-base": ModelPreset(
        Transformer,
        dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=512, num_layers=6, num_heads=8, d_ff=2048,
             dropout=0.1, max_src_positions=512, max_tgt_positions=512, share_embeddings=True, tie_output=True),
        "Vaswani et al. (2017), base model: shared 37k BPE vocabulary, tied embeddings",
    ),
    "paper-big": ModelPreset(
        Transformer,
        dict(src_vocab_size=37000, tgt_vocab_size=37000, d_model=1024, num_layers=6, num_heads=16, d_ff=4096,
             dropout=0.3, max_src_positions=512, max_tgt_positions=512, share_embeddings=True, tie_output=True),
        "Vaswani et al. (2017), big model",
    ),
    "lab-toy": ModelPreset(
        Transformer,
        dict(src_vocab_size=30, tgt_vocab_size=35, d_model=4, num_layers=6, num_heads=4, head_dim=4, d_ff=8,
             dropout=0.1, max_src_positions=5, max_tgt_positions=6),
        "seed 000's full-model demonstration: Keras full-width heads (key_dim = embedding_dim), 7,131 parameters",
    ),
    "seed003": ModelPreset(
        Transformer,
        dict(src_vocab_size=20, tgt_vocab_size=20, d_model=512, num_layers=6, num_heads=8, head_dim=8, d_ff=2048,
             dropout=0.1, max_src_positions=5, max_tgt_positions=5),
        "seed 003's TransformerModel: h=8 heads projecting to d_k=64 in all (8 each), d_ff=2048, n=6. Each "
        "DecoderLayer here has its three LayerNorms (2,366,336 parameters); the seed's printed summary shows "
        "1,024 fewer because its code reuses one LayerNorm for two sub-layers",
    ),
    "tiny-router": ModelPreset(
        EncoderClassifier,
        dict(vocab_size=3000, num_classes=5, d_model=64, num_layers=2, num_heads=4, d_ff=128, max_positions=120),
        "seed 004's TinyTransformer shape: 64 wide, a learned table of 120 positions, 5 teams",
    ),
    "gpt-char": ModelPreset(
        DecoderLM,
        dict(vocab_size=65, d_model=128, num_layers=4, num_heads=4, max_positions=64, bias=False),
        "nanoGPT's CPU character-level Shakespeare model: 4 layers, 4 heads, width 128, context 64, no biases",
    ),
}


def build_preset(name: str) -> nn.Module:
    """A new model built from preset ``name``."""
    if name not in MODEL_PRESETS:
        raise AttnlabError(f"unknown preset {name!r}; choose one of: {', '.join(MODEL_PRESETS)}")
    preset = MODEL_PRESETS[name]
    return preset.model(**preset.kwargs)
