"""Scaled dot-product attention and multi-head attention.

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V``, where ``M`` hides the keys that the attend
mask marks ``False``. Two implementations give the same output, up to rounding:

* :func:`attention_reference` writes the formula out and can return the weights;
* the fused ``torch.nn.functional.scaled_dot_product_attention`` is used when the weights are not asked
  for (as in nanoGPT's ``model.py``: fast path first, the readable one beside it), except on the CPU under
  ``torch.compile`` or in bfloat16, where the written-out path is faster (see
  :func:`scaled_dot_product_attention`). In bfloat16 that path rounds the scores to bfloat16 before its
  float32 softmax, so it is less accurate than the fused kernel, which keeps them in float32.

A query row whose keys are *all* hidden (a padding query under causal-plus-padding masking) would be
``softmax`` of all ``-inf``, i.e. 0/0 = NaN. Both paths give such a row zero weight and a zero output.

Shapes are checked before any arithmetic: ``q``, ``k`` and ``v`` must have *equal* leading dims (batch,
heads), not merely broadcastable ones, because a batch of 1 broadcast against a batch of 3 would silently
pair one query sequence with three unrelated key sequences and still return a tensor of plausible shape.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import AttnlabError, check_count, check_flag, check_probability, whole_number
from attnlab.nn.masks import check_attend_mask, values_unreadable
from attnlab.nn.positions import RotaryEmbedding


def masked_softmax(scores: Tensor, *, attend_mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis (the keys) with hidden keys at exactly zero weight.

    Hidden scores are set to ``-inf`` *before* the softmax, never multiplied by zero (``e^0 = 1`` would
    still compete). A row whose keys are all hidden gets all-zero weights instead of 0/0 = NaN.

    Args:
        scores: (..., queries, keys).
        attend_mask: bool of the same rank, True = may attend.
    """
    if attend_mask is not None:
        check_attend_mask(attend_mask, scores.shape)
        scores = scores.masked_fill(~attend_mask, float("-inf"))
    if scores.dtype in (torch.bfloat16, torch.float16):  # in float32, as the fused kernels accumulate, then back
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    else:  # float32 and float64 keep their own precision
        weights = torch.softmax(scores, dim=-1)
    if attend_mask is None:
        return weights
    return weights.masked_fill(~attend_mask.any(dim=-1, keepdim=True), 0.0)


def _shapes(q: Tensor, k: Tensor, v: Tensor) -> str:
    return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise :class:`AttnlabError` unless ``q`` (..., queries, d_k), ``k`` (..., keys, d_k) and
    ``v`` (..., keys, d_v) fit together.

    Only shapes are compared (Python tuples, no work on the elements), so the fused path stays fast.
    Queries and keys may differ in number (a KV cache gives one new query and many keys).
    """
    if not q.dim() == k.dim() == v.dim() >= 2:
        raise AttnlabError(f"q, k and v must have one rank, at least 2 (..., positions, width), got {_shapes(q, k, v)}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise AttnlabError(
            f"q, k and v must have the same leading dims (batch, heads), got {_shapes(q, k, v)}; "
            "they are not broadcast, which would pair queries with another sequence's keys"
        )
    if q.shape[-1] != k.shape[-1]:
        raise AttnlabError(f"q and k must have the same width d_k (last dim), got {_shapes(q, k, v)}")
    if k.shape[-2] != v.shape[-2]:
        raise AttnlabError(f"k and v must have the same number of positions (keys), got {_shapes(q, k, v)}")


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, *, attend_mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention written out; returns the output and the weights.

    Args:
        q: (..., queries, d_k).
        k: (..., keys, d_k).
        v: (..., keys, d_v).
        attend_mask: bool, same rank as the scores (..., queries, keys), True = may attend.
        dropout_p: dropout on the weights (pass 0 outside training).

    Returns:
        output (..., queries, d_v) and weights (..., queries, keys). Without dropout each visible row of
        weights sums to 1 and a fully hidden row is all zeros. With ``dropout_p > 0`` the weights returned
        are the ones the output was computed from, i.e. after dropout (as in torch): some entries are
        zeroed, the rest scaled by ``1 / (1 - dropout_p)``, so rows no longer sum to 1.

    Raises:
        AttnlabError: if the shapes of ``q``, ``k`` and ``v`` do not fit (see :func:`check_qkv`) or the
            mask is not a valid attend mask for the scores.
    """
    check_qkv(q, k, v)
    # Dividing by sqrt(d_k) brings the scores back to unit variance so the softmax does not saturate. It is
    # applied to q, before the product: float16 scores of unscaled vectors overflow to inf (as torch's math path).
    scores = (q / math.sqrt(k.shape[-1])) @ k.transpose(-2, -1)  # (..., Q, K)
    weights = masked_softmax(scores, attend_mask=attend_mask)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attend_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention through the fused kernel, or the reference when ``need_weights`` is set.

    Shapes as in :func:`attention_reference`, checked the same way on both paths (the fused kernel
    would broadcast a batch of 1, and with keys and values of different lengths returns garbage).
    Returns ``(output, weights or None)``.

    On the CPU the reference is taken too under ``torch.compile``, which fuses its mask and softmax around two
    batched matmuls (a nanoGPT-sized training step 7% faster than around the fused kernel), and in bfloat16,
    where the CPU's fused kernel is slow backward and the batched matmuls are not (a step of the
    ``shakespeare-fast`` preset under bfloat16 autocast 1.7x faster; issue 6).
    """
    written_out = q.device.type == "cpu" and (torch.compiler.is_compiling() or q.dtype == torch.bfloat16)
    if need_weights or written_out:
        out, weights = attention_reference(q, k, v, attend_mask=attend_mask, dropout_p=dropout_p)  # checks there
        return out, weights if need_weights else None
    check_qkv(q, k, v)
    if attend_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
    check_attend_mask(attend_mask, (*q.shape[:-1], k.shape[-2]))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend_mask, dropout_p=dropout_p)
    # The fused kernels do not agree on fully hidden rows (NaN on some backends): make them zero.
    return out.masked_fill(~attend_mask.any(dim=-1, keepdim=True), 0.0), None


def _check_states(name: str, t: Tensor, positions: str, d_model: int) -> None:
    """``t`` must be a floating (batch, positions, d_model) tensor."""
    if not isinstance(t, Tensor):
        raise AttnlabError(f"{name} must be a torch.Tensor (batch, {positions}, d_model), got {type(t).__name__}")
    if t.dtype == torch.bool:  # the likeliest way here: mha(x, mask) binds the mask to memory
        raise AttnlabError(
            f"{name} is a bool tensor of shape {tuple(t.shape)}: masks are keyword-only, pass it as attend_mask=..."
        )
    if not t.is_floating_point():
        raise AttnlabError(f"{name} must be a floating tensor (batch, {positions}, d_model), got {t.dtype}")
    if t.dim() != 3:
        raise AttnlabError(f"{name} must be (batch, {positions}, d_model), got shape {tuple(t.shape)}")
    if t.shape[-1] != d_model:
        raise AttnlabError(
            f"{name} has width {t.shape[-1]}, the layer expects d_model={d_model} (shape {tuple(t.shape)})"
        )


def head_width(d_model: int, num_heads: int, head_dim: int | None = None) -> int:
    """The width of one head: ``head_dim`` if given, else ``d_model // num_heads``, which must divide evenly."""
    check_count("d_model", d_model)
    check_count("num_heads", num_heads)
    if head_dim is not None:
        return check_count("head_dim", head_dim)
    if d_model % num_heads:
        raise AttnlabError(f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                           "choose another head count or pass head_dim explicitly")
    return d_model // num_heads


def check_heads_option(width: int, heads: int, *, width_option: str, rotary: bool = False) -> None:
    """:func:`head_width`'s check, and the rotary embedding's even head width, said in a command's options
    (``width_option``, ``--heads``, ``--positions``) before any work: the core's messages name ``d_model`` and
    ``head_dim``, which a command line does not have."""
    if width % heads:
        raise AttnlabError(f"{width_option} {width} is not divisible by --heads {heads}: each head gets "
                           f"{width_option.removeprefix('--')} / heads dimensions")
    if rotary and (width // heads) % 2:
        raise AttnlabError(f"--positions rotary needs an even head width, and {width_option} {width} / --heads "
                           f"{heads} gives {width // heads}: rotary turns the head's dimensions in pairs")


def check_attention_inputs(x: Tensor, memory: Tensor | None, d_model: int) -> None:
    """Raise :class:`AttnlabError` unless ``x`` (batch, queries, d_model) and ``memory`` (batch, keys, d_model)
    or None are what :class:`MultiHeadAttention` takes.

    Without these checks torch either fails deep inside ``F.linear`` ("mat1 and mat2 shapes cannot be
    multiplied", or a dtype message when a bool mask lands on ``memory``), or silently does the wrong
    thing: an unbatched (seq, d_model) ``x`` gets its seq axis taken for the batch and attends across
    heads, and a memory of batch 3 is broadcast against queries of batch 1. Shapes only, no element work.
    """
    _check_states("x", x, "seq", d_model)
    if memory is None:
        return
    _check_states("memory", memory, "keys", d_model)
    if memory.shape[0] != x.shape[0]:
        raise AttnlabError(
            f"x has batch {x.shape[0]} but memory has batch {memory.shape[0]} "
            f"(x {tuple(x.shape)}, memory {tuple(memory.shape)}); row i of x attends to row i of memory"
        )


class KVCache:
    """Keys and values already computed by one attention layer, for incremental decoding.

    For self-attention each step appends the new positions; for cross-attention the encoder's keys
    and values are stored on the first step and reused on every later one.

    Appending writes into buffers with room to spare, whose capacity doubles when full, instead of
    concatenating: ``torch.cat`` copied the whole cache at every step (each generated token cost O(seen)
    copies, a quarter of a cached step at a context of 256). This is done in inference mode only
    (``torch.inference_mode()``, where generation and the decoders run): its tensors carry neither autograd
    history nor version counters, so no backward pass, forward-mode tangent or ``torch.func`` transform can see
    the writes; anywhere else a step concatenates as before. ``k`` and ``v`` are then views of the positions
    seen (not contiguous after the second step); a tensor once handed out is never written again (a write
    goes past its end, or into new buffers when ``k`` or ``v`` were replaced or cut by :meth:`truncate`, and
    a copy (``copy.copy``) gets buffers of its own). A pickled cache holds its positions only, not the room.

    Attributes:
        k, v: (batch, heads, seen, head_dim), or None before the first step.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self._buffers: tuple[Tensor, Tensor] | None = None  # (batch, heads, capacity, head_dim) each
        self._views: tuple[Tensor, Tensor] | None = None  # the k and v these buffers were last viewed as

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def __copy__(self) -> KVCache:
        """The same keys and values (and any other attributes), without the buffers: two caches writing one
        buffer's room would overwrite each other's next positions."""
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__, _buffers=None, _views=None)
        return copied

    def __getstate__(self) -> dict[str, object]:
        """The attributes, with the positions seen only, not the buffers' room (pickle and ``copy.deepcopy``)."""
        return {**self.__dict__, "_buffers": None, "_views": None,
                **{name: _compact(t) for name, t in (("k", self.k), ("v", self.v))}}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update({"k": None, "v": None, **state, "_buffers": None, "_views": None})

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new positions, (batch, heads, new, head_dim) each, and return all keys and values seen so far,
        (batch, heads, seen + new, head_dim)."""
        if self.k is not None and k.shape[0] != self.k.shape[0]:  # torch.cat would name only tensor sizes
            raise AttnlabError(f"this cache holds a batch of {self.k.shape[0]}, the new positions a batch of "
                               f"{k.shape[0]}; one cache follows one batch (reorder() keeps a subset of its rows)")
        if self.k is None or self.v is None:  # the first step: kept as given (a cross-attention cache stays so)
            self.k, self.v, self._buffers, self._views = k, v, None, None
        elif (not torch.is_inference_mode_enabled() or not (_same_layout(self.k, k) and _same_layout(self.v, v))
              or k.shape[-2] != v.shape[-2] or self.k.shape[-2] != self.v.shape[-2]):
            # (torch.cat promotes mixed dtypes, names mismatched sizes in its error, and keeps keys and values of
            # different lengths as they are, for the attention to refuse; a copy into room would broadcast them)
            self.k, self.v, self._buffers, self._views = torch.cat((self.k, k), -2), torch.cat((self.v, v), -2), None, None
        else:
            seen, total = self.k.shape[-2], self.k.shape[-2] + k.shape[-2]
            k_buffer, v_buffer = (self._buffers if self._buffers is not None and self._has_room(total)
                                  else (_grown(self.k, 2 * total), _grown(self.v, 2 * total)))
            self._buffers = (k_buffer, v_buffer)
            k_buffer[..., seen:total, :].copy_(k)
            v_buffer[..., seen:total, :].copy_(v)
            self.k, self.v = k_buffer[..., :total, :], v_buffer[..., :total, :]
            self._views = (self.k, self.v)
        return self.k, self.v

    def _holds_buffers(self) -> bool:
        """Whether ``k`` and ``v`` are still the views of the buffers (neither replaced nor cut since)."""
        return self._views is not None and self.k is self._views[0] and self.v is self._views[1]

    def _has_room(self, total: int) -> bool:
        """Whether the buffers hold ``k`` and ``v``, have room for ``total`` positions, and are inference tensors
        (a buffer reordered outside inference mode has a version counter, which a write would move)."""
        return self._holds_buffers() and all(buffer.shape[-2] >= total and buffer.is_inference()
                                             for buffer in self._buffers or ())

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (none: the cache is empty again)."""
        length = whole_number("length", length, 0)  # -1 would drop the last position, as a slice does
        if self.k is not None and self.v is not None and length < len(self):
            self.k, self.v = (self.k[..., :length, :], self.v[..., :length, :]) if length else (None, None)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index``, (rows,) long (beam search reorders hypotheses between steps)."""
        if not isinstance(index, Tensor) or index.dim() != 1 or index.dtype not in (torch.int64, torch.int32):
            given = f"{index.dtype} of shape {tuple(index.shape)}" if isinstance(index, Tensor) else type(index).__name__
            raise AttnlabError(f"reorder takes a (rows,) tensor of row numbers (int64 or int32), got {given}")
        if self.k is not None and self.v is not None:
            rows = self.k.shape[0]
            if index.numel() and not values_unreadable(index) and not (0 <= int(index.min()) and int(index.max()) < rows):
                raise AttnlabError(f"reorder: row numbers must be 0..{rows - 1} (the cache holds {rows} rows), got "
                                   f"{index.min().item()}..{index.max().item()}")
            if self._holds_buffers() and self._buffers is not None:  # the rows with their room (beam search
                seen = len(self)  # reorders at every step: appends stay in place, memory stays one set of buffers)
                k_buffer, v_buffer = (buffer.index_select(0, index) for buffer in self._buffers)
                self._buffers = (k_buffer, v_buffer)
                self.k, self.v = k_buffer[..., :seen, :], v_buffer[..., :seen, :]
                self._views = (self.k, self.v)
            else:
                self.k, self.v, self._buffers, self._views = self.k.index_select(0, index), self.v.index_select(0, index), None, None


def _same_layout(seen: Tensor, new: Tensor) -> bool:
    """Whether ``new`` positions can be written after ``seen`` ones as they are: the same batch, heads, head
    width, dtype and device."""
    return (seen.shape[:-2] == new.shape[:-2] and seen.shape[-1] == new.shape[-1] and seen.dtype == new.dtype
            and seen.device == new.device)


def _compact(t: Tensor | None) -> Tensor | None:
    """``t`` in storage of its own size (a view of a buffer, even a contiguous one, would carry its room)."""
    if t is None or (t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _grown(seen: Tensor, capacity: int) -> Tensor:
    """A buffer of ``capacity`` positions holding ``seen`` (batch, heads, seen, head_dim) first."""
    buffer = seen.new_empty((*seen.shape[:-2], capacity, seen.shape[-1]))
    buffer[..., : seen.shape[-2], :].copy_(seen)
    return buffer


@contextlib.contextmanager
def restored_on_error(caches: Sequence[KVCache | Sequence[KVCache | None]]) -> Iterator[None]:
    """Put ``caches`` (a list of caches, or of (self, memory) pairs) back as they were if the step run inside
    fails part-way (or is interrupted).

    Layers before the one that refused the step (a mask of the wrong shape, say) would keep its positions
    and the later layers would not: a corrected retry would then attend to keys the sequence never had and
    return plausible, wrong numbers. Only the lengths are kept, not the tensors, which would hold every layer's
    previous cache in memory until the step ends: a failed step cuts each cache back to its length (a cache
    filled by the step is emptied).
    """
    held = list(_kv_caches(caches))  # (anything else in the list is refused by the stack, which names it)
    lengths = [len(cache) for cache in held]
    try:
        yield
    except BaseException:
        for cache, length in zip(held, lengths, strict=True):
            cache.truncate(length)
        raise


def _kv_caches(caches: object) -> Iterator[KVCache]:
    """The :class:`KVCache` objects in ``caches``, a list of them or of pairs of them (None where there is none)."""
    if isinstance(caches, KVCache):
        yield caches
    elif isinstance(caches, list | tuple):
        for item in caches:
            yield from _kv_caches(item)


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self- and cross-attention.

    Queries, keys and values are projected to ``num_heads`` heads of width ``head_dim`` each, attended
    in parallel, concatenated and projected back to ``d_model``. The head width is
    ``d_model // num_heads`` by default (the paper); pass ``head_dim`` to choose it, e.g.
    ``head_dim=d_model`` for seed 000's full-width Keras heads (``key_dim=embedding_dim``) or
    ``head_dim=8`` for seed 003's 8 x 8 projection of a 512-wide model.

    Args:
        d_model: width of the input and output vectors.
        num_heads: number of heads.
        head_dim: width of each head (default ``d_model // num_heads``).
        dropout: dropout on the attention weights during training.
        bias: whether the four projections have biases (they do in the paper and the seeds).
        rotary: optional rotary embedding applied to queries and keys (self-attention only: a call with ``memory`` is refused).

    Inputs are batched only: an unbatched (seq, d_model) ``x`` is refused, because the head split
    assumes a batch axis; without one, seq would be taken for the batch and the attention would run
    across each position's head features instead of across positions.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        head_dim = head_width(d_model, num_heads, head_dim)
        check_probability("dropout", dropout)
        check_flag("bias", bias)  # ("false" from a JSON config would keep the biases)
        if rotary is not None and rotary.head_dim != head_dim:  # it would rotate the wrong pairs, or fail in torch
            raise AttnlabError(f"the rotary embedding is {rotary.head_dim} wide but each head is {head_dim} wide; "
                               f"build it as RotaryEmbedding({head_dim}, max_positions)")
        self.d_model, self.num_heads, self.head_dim, self.dropout = d_model, num_heads, head_dim, dropout
        inner = num_heads * head_dim
        # W_Q, W_K and W_V stacked in one (3 * inner, d_model) matrix, as torch's nn.MultiheadAttention
        # does: self-attention projects q, k and v in one matmul, cross-attention k and v in one.
        # Each third is initialised like a separate nn.Linear(d_model, inner), whose fan-in is the same.
        self.in_proj = nn.Linear(d_model, 3 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.rotary = rotary

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """attnlab's attention holding the weights of torch's ``nn.MultiheadAttention`` (a copy).

        Both stack W_Q, W_K and W_V in one ``in_proj`` matrix, so the weights carry over as they are; the
        result computes what ``module`` computes (attnlab's inputs are always batch-first). Variants with no
        counterpart here are refused: separate key/value widths, ``add_bias_kv`` and ``add_zero_attn``.
        The dropout probability carries over too; masks do not (convert them with ``from_torch_attn_mask`` and
        ``from_key_padding_mask``).
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise AttnlabError(f"from_torch takes an nn.MultiheadAttention, got {type(module).__name__}")
        if module.kdim != module.embed_dim or module.vdim != module.embed_dim or module.bias_k is not None \
                or module.add_zero_attn:
            raise AttnlabError("only an nn.MultiheadAttention with kdim = vdim = embed_dim, no add_bias_kv and no "
                               "add_zero_attn has an attnlab counterpart")
        bias = module.in_proj_bias is not None
        # Built in the module's dtype and on its device first: loading float64 weights into a float32 layer
        # would round them.
        mha = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=bias).to(
            module.in_proj_weight.device, module.in_proj_weight.dtype)
        weights = {"in_proj.weight": module.in_proj_weight, "out_proj.weight": module.out_proj.weight}
        if bias:
            weights |= {"in_proj.bias": module.in_proj_bias, "out_proj.bias": module.out_proj.bias}
        mha.load_state_dict({k: v.detach().clone() for k, v in weights.items()})
        return mha.train(module.training)

    def _project(self, x: Tensor, first: int, parts: int) -> tuple[Tensor, ...]:
        """Rows ``first`` to ``first + parts`` (in units of ``inner``) of the stacked projection applied
        to ``x``: (batch, seq, d_model) -> ``parts`` x (batch, heads, seq, head_dim), views of one product."""
        inner = self.num_heads * self.head_dim
        weight, bias = self.in_proj.weight, self.in_proj.bias
        if parts * inner != weight.shape[0]:  # some of the rows (cross-attention); all of them need no slicing
            rows = slice(first * inner, (first + parts) * inner)  # a view of the weights, no copy
            weight, bias = weight[rows], None if bias is None else bias[rows]
        batch, seq = x.shape[:2]
        # One view and one permute split the product into parts and heads: the same strides as chunking it and
        # moving each chunk's heads forward, in two tensor operations instead of seven (a cached decoding step
        # is made of such small calls; issue 6).
        heads = F.linear(x, weight, bias).view(batch, seq, parts, self.num_heads, self.head_dim)
        return heads.permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        attend_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to ``memory`` (cross-attention) or to ``x`` itself (self-attention).

        Args:
            x: (batch, queries, d_model), the queries' source.
            memory: (batch, keys, d_model), the keys' and values' source; None for self-attention.
            attend_mask: bool (batch or 1, heads or 1, queries or 1, keys), True = may attend; with a cache,
                keys counts the cached positions too.
            need_weights: also return the attention weights (uses the reference path).
            cache: keys and values of earlier steps, updated in place.

        Returns:
            output (batch, queries, d_model) and weights (batch, heads, queries, keys) or None.

        Raises:
            AttnlabError: if ``x`` or ``memory`` is not a floating (batch, positions, d_model) tensor
                (a bool ``memory`` is a mask passed by position) or their batches differ (see
                :func:`check_attention_inputs`), or the mask does not fit the scores (see
                :func:`~attnlab.nn.masks.check_attend_mask`).
        """
        check_attention_inputs(x, memory, self.d_model)
        if cache is not None and not isinstance(cache, KVCache):
            raise AttnlabError(f"cache must be a KVCache (or None), got a {type(cache).__name__}")
        # A step refused once the cache has grown (a mask that does not fit the scores) leaves it as it was.
        with restored_on_error([cache] if cache is not None else []):
            q, k, v = self._queries_keys_values(x, memory, cache)
            dropout_p = self.dropout if self.training else 0.0
            out, weights = scaled_dot_product_attention(
                q, k, v, attend_mask=attend_mask, dropout_p=dropout_p, need_weights=need_weights
            )
        return self.out_proj(out.transpose(1, 2).flatten(-2)), weights

    def _queries_keys_values(self, x: Tensor, memory: Tensor | None,
                             cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """q (batch, heads, queries, head_dim) and k, v (batch, heads, keys, head_dim), the cache's included."""
        if memory is None:  # self-attention: q, k and v from one matmul, faster than three
            q, k, v = self._project(x, 0, 3)
            if self.rotary is not None:
                offset = 0 if cache is None else len(cache)
                q, k = self.rotary(q, offset), self.rotary(k, offset)
            if cache is not None:
                k, v = cache.append(k, v)
            return q, k, v
        if self.rotary is not None:  # skipping it silently would leave the layer without positions
            raise AttnlabError("rotary positions are for self-attention: queries and keys from two sequences "
                               "share no positions; build the cross-attention without rotary")
        (q,) = self._project(x, 0, 1)
        if cache is not None and cache.k is not None and cache.v is not None:
            return q, cache.k, cache.v  # the encoder's keys and values, projected on the first step
        k, v = self._project(memory, 1, 2)
        if cache is not None:
            cache.append(k, v)
        return q, k, v
