"""One layer of each kind: the feed-forward network, the encoder layer and the decoder layer.

Each sub-layer (attention or feed-forward) is wrapped in a residual connection and a layer norm.
Post-norm, ``LayerNorm(x + Dropout(Sublayer(x)))``, is the paper's and the seeds' arrangement and the
default; pre-norm, ``x + Dropout(Sublayer(LayerNorm(x)))``, trains more stably in deep stacks and is what
GPT-2 and nanoGPT use (``norm_first=True``).

The encoder layer (self-attention + feed-forward) is also the block of a decoder-only language model:
give it a causal mask and it is a GPT block.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from attnlab.errors import AttnlabError, check_count, check_flag, check_positive
from attnlab.nn.attention import KVCache, MultiHeadAttention, check_attention_inputs, restored_on_error
from attnlab.nn.positions import RotaryEmbedding

#: The feed-forward activations by name: ReLU in the paper, GELU in GPT-2 and BERT.
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``Linear(d, d_ff) -> activation -> Linear(d_ff, d)``.

    Shapes: (batch, seq, d_model) -> (batch, seq, d_model), each position independently.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", bias: bool = True) -> None:
        super().__init__()
        check_count("d_model", d_model)
        check_flag("bias", bias)
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise AttnlabError(f"unknown activation {activation!r}; use {' or '.join(ACTIVATIONS)}")
        check_count("d_ff", d_ff)  # 0 would build empty matrices and silently add nothing to the residual
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = ACTIVATIONS[activation]()
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.activation(self.up(x)))


class _Residual(nn.Module):
    """Residual connection plus layer norm around one sub-layer, pre- or post-norm."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=check_positive("eps", eps), bias=check_flag("bias", bias))
        self.dropout = nn.Dropout(dropout)
        self.norm_first = check_flag("norm_first", norm_first)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self._dropout(sublayer(self.norm(x)))
        return self.norm(x + self._dropout(sublayer(x)))

    def _dropout(self, y: Tensor) -> Tensor:
        # Outside training dropout passes y as it is; not calling the module then saves a few microseconds a
        # sub-layer, 3-4% of a cached decoding step (issue 6).
        return self.dropout(y) if self.training else y


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each with residual and norm.

    Args:
        d_model: model width.
        num_heads: attention heads.
        d_ff: feed-forward inner width.
        dropout: dropout on each sub-layer's output (the paper) and on the attention weights.
        head_dim: per-head width (default ``d_model // num_heads``).
        norm_first: pre-norm instead of the paper's post-norm.
        eps: layer-norm epsilon (1e-6, as in seed 000).
        activation: ``"relu"`` (paper) or ``"gelu"`` (GPT).
        rotary: optional rotary position embedding for the self-attention.
        bias: biases in the projections and layer norms (the paper, GPT-2); nanoGPT's default has none.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        head_dim: int | None = None,
        norm_first: bool = False,
        eps: float = 1e-6,
        activation: str = "relu",
        rotary: RotaryEmbedding | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, head_dim=head_dim, dropout=dropout, bias=bias,
                                            rotary=rotary)
        self.attn_block = _Residual(d_model, dropout, norm_first, eps, bias)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias)
        self.ffn_block = _Residual(d_model, dropout, norm_first, eps, bias)

    def forward(
        self,
        x: Tensor,
        *,
        attend_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """(batch, seq, d_model) -> (batch, seq, d_model), and the self-attention weights if asked.

        ``attend_mask``: (batch or 1, heads or 1, seq or 1, keys) bool, True = may attend; keys is seq,
        or the cached positions plus seq when decoding with ``cache``.
        """
        # Checked here as well as in the attention: with norm_first the LayerNorm sees x first and would
        # fail inside torch on a wrong width.
        check_attention_inputs(x, None, self.self_attn.d_model)
        weights: Tensor | None = None

        def attend(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(h, attend_mask=attend_mask, need_weights=need_weights, cache=cache)
            return out

        x = self.attn_block(x, attend)
        return self.ffn_block(x, self.ffn), weights


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, then feed-forward.

    Block 1 attends over the target so far (``self_attend_mask``: causal, plus target padding); block 2
    takes its queries from block 1 and its keys and values from the encoder (``memory_attend_mask``:
    the *source* padding, because the keys are source positions; seed 000, change 8). Arguments as in
    :class:`EncoderLayer`, but for ``rotary``: the cross-attention's queries and keys share no positions.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        head_dim: int | None = None,
        norm_first: bool = False,
        eps: float = 1e-6,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, head_dim=head_dim, dropout=dropout, bias=bias)
        self.self_block = _Residual(d_model, dropout, norm_first, eps, bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, head_dim=head_dim, dropout=dropout, bias=bias)
        self.cross_block = _Residual(d_model, dropout, norm_first, eps, bias)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias)
        self.ffn_block = _Residual(d_model, dropout, norm_first, eps, bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        self_attend_mask: Tensor | None = None,
        memory_attend_mask: Tensor | None = None,
        need_weights: bool = False,
        self_cache: KVCache | None = None,
        memory_cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Run one decoder layer.

        Args:
            x: (batch, tgt, d_model) target-side states.
            memory: (batch, src, d_model) encoder output.
            self_attend_mask: (batch or 1, heads or 1, tgt or 1, keys) bool, usually causal plus target
                padding; keys is tgt, or the cached positions plus tgt when decoding with ``self_cache``.
            memory_attend_mask: (batch, heads or 1, tgt or 1, src) bool, usually the (batch, 1, 1, src)
                padding mask of the source ids: one row for each memory row, since a mask of one row would
                spread that row's padding over the whole batch.
            need_weights: also return both attention weight tensors.
            self_cache, memory_cache: caches for incremental decoding.

        Returns:
            (batch, tgt, d_model), self-attention weights (batch, heads, tgt, keys) (keys as above) and cross-attention
            weights (batch, heads, tgt, src), the weights None unless asked for.
        """
        # Up front, before the self-attention runs: with norm_first the LayerNorm sees x first and would
        # fail inside torch on a wrong width, and a memory of the wrong batch would only be noticed after
        # the self-attention block had been computed.
        if memory is None:  # cross-attention would turn into a second, unmasked self-attention over the target
            raise AttnlabError("a decoder layer needs memory, the encoder's (batch, src, d_model) output, got None; "
                               "a decoder-only model stacks self-attention layers (EncoderLayer with a causal mask)")
        check_attention_inputs(x, memory, self.self_attn.d_model)
        # (The attention allows a batch of 1 for causal masks.) One mask row for a memory of copies of one row
        # (memory.expand(k, -1, -1): its rows share their storage) is that row's own mask, and fine.
        copies = memory.shape[0] > 1 and memory.stride(0) == 0
        if isinstance(memory_attend_mask, Tensor) and memory_attend_mask.dim() == 4 \
                and memory_attend_mask.shape[0] != memory.shape[0] and not (copies and memory_attend_mask.shape[0] == 1):
            raise AttnlabError(f"memory_attend_mask has a batch of {memory_attend_mask.shape[0]}, the memory a batch of "
                               f"{memory.shape[0]}: each memory row needs its own padding mask (padding_mask(src) of "
                               "the whole batch, or mask.expand(batch, -1, -1, -1) where every row has the same)")
        self_w: Tensor | None = None
        cross_w: Tensor | None = None

        def attend_self(h: Tensor) -> Tensor:
            nonlocal self_w
            out, self_w = self.self_attn(h, attend_mask=self_attend_mask, need_weights=need_weights, cache=self_cache)
            return out

        def attend_memory(h: Tensor) -> Tensor:
            nonlocal cross_w
            out, cross_w = self.cross_attn(
                h, memory, attend_mask=memory_attend_mask, need_weights=need_weights, cache=memory_cache
            )
            return out

        with restored_on_error([cache for cache in (self_cache, memory_cache) if cache is not None]):
            x = self.self_block(x, attend_self)
            x = self.cross_block(x, attend_memory)  # (a refusal here must take back the self-attention's step)
        return self.ffn_block(x, self.ffn), self_w, cross_w
