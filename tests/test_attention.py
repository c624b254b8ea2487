"""Scaled dot-product and multi-head attention: seed 000's example, fused = reference, the mask contract."""

import re

import numpy as np
import pytest
import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.nn import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    attention_reference,
    causal_mask,
    from_keep_mask,
    from_key_padding_mask,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
)

Q = torch.tensor([[1.0, 0, 1, 0]])
K = torch.tensor([[1.0, 2, 0, 0], [0, 2, 0, 0], [1, 0, 0, 1]])
V = torch.tensor([[0.0, 0], [1, 0], [1, 0]])


def test_seed_example_without_mask():
    out, weights = attention_reference(Q, K, V)
    np.testing.assert_allclose(weights.numpy(), [[0.3837, 0.2327, 0.3837]], atol=1e-4)
    assert float(weights.sum()) == pytest.approx(1.0)
    np.testing.assert_allclose(out.numpy(), [[0.6163, 0.0]], atol=1e-4)


def test_seed_example_with_mask_hiding_the_last_key():
    mask = from_keep_mask(torch.tensor([[1.0, 1.0, 0.0]]))  # (1, 3), matching the (1, 3) scores
    out, weights = attention_reference(Q, K, V, attend_mask=mask)
    np.testing.assert_allclose(weights.numpy(), [[0.6225, 0.3775, 0.0]], atol=1e-4)
    np.testing.assert_allclose(out.numpy(), [[0.3775, 0.0]], atol=1e-4)


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "both"])
def test_fused_path_matches_reference(kind):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16) for _ in range(3))
    ids = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    mask = {"none": None, "padding": padding_mask(ids), "causal": causal_mask(7),
            "both": causal_mask(7) & padding_mask(ids)}[kind]
    fused, none = scaled_dot_product_attention(q, k, v, attend_mask=mask)
    ref, weights = scaled_dot_product_attention(q, k, v, attend_mask=mask, need_weights=True)
    assert none is None and weights is not None
    torch.testing.assert_close(fused, ref, atol=1e-6, rtol=0)


def test_fully_hidden_rows_are_finite_with_zero_weight():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])[None, None]
    for need in (False, True):
        out, weights = scaled_dot_product_attention(q, k, v, attend_mask=mask, need_weights=need)
        assert torch.isfinite(out).all()
        assert float(out[:, :, 1].abs().sum()) == 0.0
        if weights is not None:
            assert float(weights[:, :, 1].abs().sum()) == 0.0
            torch.testing.assert_close(weights[:, :, 0].sum(-1), torch.ones(1, 2))


def test_head_width_defaults_to_share_and_can_be_set():
    assert MultiHeadAttention(512, 8).head_dim == 64
    full = MultiHeadAttention(4, 4, head_dim=4)  # seed 000's Keras heads: key_dim = embedding_dim
    assert full.in_proj.out_features == 3 * 16
    assert sum(p.numel() for p in full.parameters()) == 308


def test_d_model_not_divisible_by_heads_is_an_error():
    with pytest.raises(AttnlabError, match="d_model=10 is not divisible by num_heads=4"):
        MultiHeadAttention(10, 4)


def test_mask_cannot_be_passed_positionally():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError):
        mha(x, x, causal_mask(3))  # the third positional slot does not exist: masks are keyword-only


def test_cross_attention_shapes():
    mha = MultiHeadAttention(8, 2)
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    with torch.no_grad():
        out, weights = mha(x, memory, attend_mask=padding_mask(torch.tensor([[1, 1, 1, 1, 0]] * 2)), need_weights=True)
    assert out.shape == (2, 3, 8) and weights.shape == (2, 2, 3, 5)
    assert float(weights[..., -1].abs().sum()) == 0.0


# Bad input: one AttnlabError naming the problem and the shapes, never silent broadcasting or a torch error.


@pytest.mark.parametrize("need_weights", [False, True])  # fused path and reference path
def test_q_k_v_leading_dims_must_be_equal_not_broadcast(need_weights):
    q = torch.randn(1, 2, 4, 8)
    for k_shape in [(3, 2, 5, 8), (1, 3, 5, 8)]:  # batch 1 vs 3, heads 2 vs 3
        k = v = torch.randn(k_shape)
        with pytest.raises(AttnlabError, match=re.escape(f"same leading dims (batch, heads), got q (1, 2, 4, 8), k {k_shape}")):
            scaled_dot_product_attention(q, k, v, need_weights=need_weights)
    # Queries fewer than keys (KV-cache decoding) and masks of batch 1 / heads 1 stay valid.
    k = v = torch.randn(3, 2, 5, 8)
    out, _ = scaled_dot_product_attention(torch.randn(3, 2, 1, 8), k, v, attend_mask=torch.ones(1, 1, 1, 5, dtype=torch.bool),
                                          need_weights=need_weights)
    assert out.shape == (3, 2, 1, 8)


@pytest.mark.parametrize("need_weights", [False, True])
def test_keys_and_values_of_different_lengths_are_one_error_on_both_paths(need_weights):
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 6, 8)
    shapes = "q (1, 2, 4, 8), k (1, 2, 5, 8), v (1, 2, 6, 8)"
    with pytest.raises(AttnlabError, match=re.escape(f"k and v must have the same number of positions (keys), got {shapes}")):
        scaled_dot_product_attention(q, k, v, need_weights=need_weights)


@pytest.mark.parametrize("need_weights", [False, True])
def test_queries_and_keys_of_different_widths_are_an_error(need_weights):
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 6), torch.randn(1, 2, 5, 8)
    with pytest.raises(AttnlabError, match=r"q and k must have the same width d_k"):
        scaled_dot_product_attention(q, k, v, need_weights=need_weights)


def test_attention_reference_checks_shapes_too():
    with pytest.raises(AttnlabError, match="same leading dims"):
        attention_reference(torch.randn(1, 4, 8), torch.randn(3, 5, 8), torch.randn(3, 5, 8))


def test_cross_attention_batch_mismatch_is_an_error_not_a_broadcast():
    x, memory = torch.randn(1, 4, 16), torch.randn(3, 5, 16)
    with pytest.raises(AttnlabError, match="x has batch 1 but memory has batch 3"):
        MultiHeadAttention(16, 2)(x, memory)
    with pytest.raises(AttnlabError, match="x has batch 1 but memory has batch 2"):
        DecoderLayer(16, 2, 32)(x, torch.randn(2, 5, 16))
    # Equal batches, a (batch, 1, 1, src) mask, and a cached decoding step still work; a (1, 1, 1, src) mask is
    # refused: one row's source padding would be spread over every row.
    layer = DecoderLayer(16, 2, 32).eval()
    memory = torch.randn(3, 5, 16)
    with torch.no_grad():
        out, _, _ = layer(torch.randn(3, 4, 16), memory, memory_attend_mask=torch.ones(3, 1, 1, 5, dtype=torch.bool))
        assert out.shape == (3, 4, 16)
        with pytest.raises(AttnlabError, match="memory_attend_mask has a batch of 1, the memory a batch of 3"):
            layer(torch.randn(3, 4, 16), memory, memory_attend_mask=torch.ones(1, 1, 1, 5, dtype=torch.bool))
        self_cache, memory_cache = KVCache(), KVCache()
        for _ in range(2):
            out, _, _ = layer(torch.randn(3, 1, 16), memory, self_cache=self_cache, memory_cache=memory_cache)
    assert out.shape == (3, 1, 16) and len(self_cache) == 2 and len(memory_cache) == 5


@pytest.mark.parametrize("make", [
    lambda: MultiHeadAttention(16, 2),
    lambda: EncoderLayer(16, 2, 32),
    lambda: EncoderLayer(16, 2, 32, norm_first=True),
])
def test_unbatched_input_is_refused(make):
    with pytest.raises(AttnlabError, match=re.escape("x must be (batch, seq, d_model), got shape (4, 16)")):
        make()(torch.randn(4, 16))


def test_a_mask_passed_positionally_as_memory_is_named():
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(1, 4, 16)
    with pytest.raises(AttnlabError, match=r"memory is a bool tensor .*masks are keyword-only, pass it as attend_mask="):
        mha(x, causal_mask(4))
    with pytest.raises(AttnlabError, match=re.escape("memory must be (batch, keys, d_model), got shape (5, 16)")):
        mha(x, torch.randn(5, 16))
    with pytest.raises(AttnlabError, match="memory must be a floating tensor"):
        mha(x, torch.ones(1, 5, 16, dtype=torch.long))


@pytest.mark.parametrize("make", [
    lambda: MultiHeadAttention(16, 4),
    lambda: EncoderLayer(16, 4, 32),
    lambda: EncoderLayer(16, 4, 32, norm_first=True),  # the LayerNorm would see the wrong width first
])
def test_wrong_input_width_is_named(make):
    with pytest.raises(AttnlabError, match="x has width 15, the layer expects d_model=16"):
        make()(torch.randn(2, 4, 15))


@pytest.mark.parametrize("norm_first", [False, True])
def test_wrong_memory_width_is_named(norm_first):
    layer = DecoderLayer(16, 4, 32, norm_first=norm_first)
    with pytest.raises(AttnlabError, match="memory has width 12, the layer expects d_model=16"):
        layer(torch.randn(2, 4, 16), torch.randn(2, 5, 12))
    with pytest.raises(AttnlabError, match="x has width 15, the layer expects d_model=16"):
        layer(torch.randn(2, 4, 15), torch.randn(2, 5, 16))


@pytest.mark.parametrize("make", [
    lambda: MultiHeadAttention(16, 0),
    lambda: EncoderLayer(16, 0, 32),
    lambda: DecoderLayer(16, 0, 32),
])
def test_zero_heads_is_an_error(make):
    with pytest.raises(AttnlabError, match="num_heads must be a whole number >= 1, got 0"):
        make()


def test_unknown_activation_is_named():
    for make in (lambda: FeedForward(16, 32, activation="silu"), lambda: EncoderLayer(16, 2, 32, activation="silu")):
        with pytest.raises(AttnlabError, match="unknown activation 'silu'; use relu or gelu"):
            make()
    assert isinstance(FeedForward(16, 32, activation="gelu").activation, torch.nn.GELU)


def test_docs_match_dropout_weights_and_per_head_masks():
    # With dropout the weights returned are the dropped-out ones, as the docstring says.
    torch.manual_seed(0)
    q = k = v = torch.randn(1, 2, 6, 8)
    _, weights = attention_reference(q, k, v, dropout_p=0.5)
    assert (weights == 0).any() and not torch.allclose(weights.sum(-1), torch.ones(1, 2, 6))
    assert "after dropout" in attention_reference.__doc__
    # An encoder layer takes a mask with heads in axis 1, as its docstring and MultiHeadAttention's say.
    per_head = torch.rand(1, 2, 4, 4) > 0.3
    per_head[..., 0] = True
    with torch.no_grad():
        out, w = EncoderLayer(16, 2, 32).eval()(torch.randn(3, 4, 16), attend_mask=per_head, need_weights=True)
    assert out.shape == (3, 4, 16) and float(w.masked_select(~per_head.expand(3, -1, -1, -1)).abs().sum()) == 0.0
    assert "(batch or 1, heads or 1, seq or 1, keys)" in EncoderLayer.forward.__doc__


@pytest.mark.parametrize("make, message", [
    (lambda: MultiHeadAttention(8, 2.0), "num_heads must be a whole number >= 1, got 2.0"),
    (lambda: MultiHeadAttention(0, 1), "d_model must be a whole number >= 1, got 0"),
    (lambda: MultiHeadAttention(-4, 2), "d_model must be a whole number >= 1, got -4"),
    (lambda: MultiHeadAttention(8, 2, head_dim=0), "head_dim must be a whole number >= 1, got 0"),
    # A table of another width would rotate the wrong pairs (2 wide: one frequency for all) or fail in torch.
    (lambda: MultiHeadAttention(8, 2, rotary=RotaryEmbedding(2, 16)), "the rotary embedding is 2 wide but each "
                                                                       r"head is 4 wide; build it as RotaryEmbedding\(4,"),
    (lambda: MultiHeadAttention(8, 2, rotary=RotaryEmbedding(8, 16)), "the rotary embedding is 8 wide"),
])
def test_sizes_that_cannot_make_heads_are_named(make, message):
    with pytest.raises(AttnlabError, match=message):
        make()


def test_a_decoder_layer_without_memory_is_refused_not_turned_into_self_attention():
    with pytest.raises(AttnlabError, match="a decoder layer needs memory"):
        DecoderLayer(8, 2, 16).eval()(torch.randn(1, 4, 8), None)


def test_a_cache_refuses_positions_of_another_batch():
    mha, cache = MultiHeadAttention(8, 2).eval(), KVCache()
    mha(torch.randn(2, 3, 8), cache=cache)
    with pytest.raises(AttnlabError, match="this cache holds a batch of 2, the new positions a batch of 3"):
        mha(torch.randn(3, 1, 8), cache=cache)
    assert len(cache) == 3  # unchanged by the refused call


def test_a_cache_truncates_to_a_length_and_refuses_a_negative_one():
    mha, cache = MultiHeadAttention(8, 2).eval(), KVCache()
    mha(torch.randn(1, 3, 8), cache=cache)
    with pytest.raises(AttnlabError, match="length must be a whole number >= 0, got -1"):
        cache.truncate(-1)  # as a slice it would drop the last position
    assert len(cache) == 3
    cache.truncate(2)
    assert len(cache) == 2
    cache.truncate(0)
    assert len(cache) == 0 and cache.k is None


def _kv(positions: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of ``positions`` new positions, (1, 2, positions, 4), filled with ``fill`` and ``-fill``."""
    return torch.full((1, 2, positions, 4), fill), torch.full((1, 2, positions, 4), -fill)


def test_a_cache_appends_in_place_without_copying_what_it_has_seen():
    cache = KVCache()
    with torch.inference_mode():
        for step in range(3):  # a prompt of 3, then two single positions: the second lands in room left by the first
            cache.append(*_kv(3 if step == 0 else 1, float(step)))
            if step == 1:
                storage = cache.k.untyped_storage().data_ptr()
        assert cache.k.untyped_storage().data_ptr() == storage  # written in place, not concatenated afresh
    assert len(cache) == 5
    assert cache.k[0, 0, :, 0].tolist() == [0.0, 0.0, 0.0, 1.0, 2.0]
    assert cache.v[0, 1, :, 3].tolist() == [-0.0, -0.0, -0.0, -1.0, -2.0]


def test_a_cache_never_changes_keys_it_has_handed_out():
    cache = KVCache()
    with torch.inference_mode():
        cache.append(*_kv(2, 1.0))
        k, v = cache.append(*_kv(1, 2.0))  # views of the cache's buffers
        held = k.clone(), v.clone()
        cache.append(*_kv(1, 3.0))
        cache.truncate(2)  # cut back, then grown again: the position k holds as its third is not overwritten
        cache.append(*_kv(1, 4.0))
        cache.reorder(torch.tensor([0]))
        cache.append(*_kv(1, 5.0))
    assert torch.equal(k, held[0]) and torch.equal(v, held[1])
    assert cache.k[0, 0, :, 0].tolist() == [1.0, 1.0, 4.0, 5.0]
    with torch.no_grad():  # outside inference mode a step concatenates
        cache.append(*_kv(1, 6.0))
    assert cache.k[0, 0, :, 0].tolist() == [1.0, 1.0, 4.0, 5.0, 6.0]
    assert torch.equal(k, held[0]) and torch.equal(v, held[1])


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # (forward_ad imports it)
def test_a_cache_outside_inference_mode_keeps_forward_mode_tangents():
    import torch.autograd.forward_ad as fwad

    cache = KVCache()
    with fwad.dual_level(), torch.no_grad():  # no_grad leaves forward-mode AD on
        for step in range(3):
            k = fwad.make_dual(torch.full((1, 1, 1, 2), float(step)), torch.full((1, 1, 1, 2), 10.0 + step))
            keys, _ = cache.append(k, k)
        assert fwad.unpack_dual(keys).tangent[0, 0, :, 0].tolist() == [10.0, 11.0, 12.0]


def test_a_cache_keeps_what_autograd_saved_when_steps_are_recorded():
    torch.manual_seed(0)
    mha, x = MultiHeadAttention(8, 2).eval(), torch.randn(1, 4, 8)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    full = mha(x, attend_mask=causal.view(1, 1, 4, 4))[0]
    full.square().sum().backward()
    want = [p.grad.clone() for p in mha.parameters()]
    mha.zero_grad()
    cache = KVCache()  # one position at a time, every step recorded: a write into keys a step saved would
    steps = [mha(x[:, i : i + 1], cache=cache)[0] for i in range(4)]  # fail the backward (or change it)
    torch.cat(steps, dim=1).square().sum().backward()
    for got, expected in zip((p.grad for p in mha.parameters()), want, strict=True):
        torch.testing.assert_close(got, expected)


def test_a_cache_used_with_a_query_that_needs_gradients_keeps_the_keys_the_backward_needs():
    torch.manual_seed(0)
    wq = torch.randn(4, 4, requires_grad=True)  # only the query projection is trained: k and v need no gradient
    cache, outputs = KVCache(), []
    for _ in range(3):
        x = torch.randn(1, 2, 1, 4)
        k, v = cache.append(x, 2 * x)
        outputs.append(scaled_dot_product_attention(x @ wq, k, v)[0])
    torch.cat(outputs, dim=-2).sum().backward()  # a key written in place after a step saved it would fail here
    assert wq.grad is not None and torch.isfinite(wq.grad).all()


def test_a_copied_cache_writes_its_own_positions():
    import copy
    import pickle

    with torch.inference_mode():
        cache = KVCache()
        cache.append(*_kv(2, 0.0))
        cache.append(*_kv(1, 1.0))  # buffers with room for more
        twin, frozen = copy.copy(cache), pickle.loads(pickle.dumps(cache))
        held, _ = cache.append(*_kv(1, 2.0))
        twin.append(*_kv(1, 3.0))  # into the same room it would overwrite the original's fourth position
    assert cache.k[0, 0, :, 0].tolist() == held[0, 0, :, 0].tolist() == [0.0, 0.0, 1.0, 2.0]
    assert twin.k[0, 0, :, 0].tolist() == [0.0, 0.0, 1.0, 3.0]
    assert frozen.k[0, 0, :, 0].tolist() == [0.0, 0.0, 1.0] and len(frozen) == 3
    data = sum(t.numel() * t.element_size() for t in (frozen.k, frozen.v))
    assert len(pickle.dumps(cache)) < 2 * data + 2000  # the positions, not the buffers' spare room


def test_keys_handed_out_without_gradients_serve_a_backward_after_the_cache_moved_on():
    torch.manual_seed(0)
    cache = KVCache()
    with torch.no_grad():
        cache.append(*_kv(2, 1.0))
        k, v = cache.append(*_kv(1, 2.0))  # views of the buffers
    q = torch.randn(1, 2, 1, 4, requires_grad=True)
    out = (q @ k.transpose(-1, -2)).softmax(-1) @ v  # autograd saves k and v
    with torch.no_grad():
        cache.append(*_kv(1, 3.0))  # written past their end: nothing they hold changed
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


class _TaggedCache(KVCache):
    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer = layer


def test_a_cache_subclass_survives_copy_deepcopy_and_pickle_with_its_attributes():
    import copy
    import pickle

    cache = _TaggedCache(3)
    with torch.inference_mode():
        cache.append(*_kv(2, 1.0))
        cache.append(*_kv(1, 2.0))
    for twin in (copy.copy(cache), copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert type(twin) is _TaggedCache and twin.layer == 3 and twin.k[0, 0, :, 0].tolist() == [1.0, 1.0, 2.0]


def test_a_pickled_cache_of_one_row_and_one_head_holds_its_positions_only():
    import pickle

    cache = KVCache()
    with torch.inference_mode():
        cache.append(torch.ones(1, 1, 64, 32), torch.ones(1, 1, 64, 32))
        cache.append(torch.ones(1, 1, 1, 32), torch.ones(1, 1, 1, 32))  # a contiguous view of a 130-position room
    data = 2 * 65 * 32 * 4
    assert len(pickle.dumps(cache)) < data + 2000


def test_a_cache_keeps_keys_and_values_of_different_lengths_for_the_attention_to_refuse():
    with torch.inference_mode():
        cache = KVCache()
        cache.append(*_kv(3, 0.0))
        cache.append(*_kv(1, 1.0))
        k, v = cache.append(torch.full((1, 2, 2, 4), 7.0), torch.full((1, 2, 1, 4), -7.0))
    assert (k.shape[-2], v.shape[-2]) == (6, 5)  # one value is not spread over two positions


def test_a_reordered_cache_keeps_its_room_and_its_rows():
    with torch.inference_mode():
        cache = KVCache()
        rows = torch.arange(3.0).view(3, 1, 1, 1)
        cache.append(rows.expand(3, 2, 2, 4).clone(), -rows.expand(3, 2, 2, 4).clone())
        cache.append(10 + rows.expand(3, 2, 1, 4), -10 - rows.expand(3, 2, 1, 4))
        cache.reorder(torch.tensor([2, 2, 0]))  # beam search: the best rows, one twice
        storage = cache.k.untyped_storage().data_ptr()
        cache.append(20 + rows.expand(3, 2, 1, 4), -20 - rows.expand(3, 2, 1, 4))
        assert cache.k.untyped_storage().data_ptr() == storage  # appended into the reordered room
    assert cache.k[:, 0, :, 0].tolist() == [[2.0, 2.0, 12.0, 20.0], [2.0, 2.0, 12.0, 21.0], [0.0, 0.0, 10.0, 22.0]]
    assert cache.v[:, 1, :, 3].tolist() == [[-2.0, -2.0, -12.0, -20.0], [-2.0, -2.0, -12.0, -21.0],
                                            [-0.0, -0.0, -10.0, -22.0]]


def test_a_cache_concatenates_positions_of_another_dtype_as_torch_cat_does():
    cache = KVCache()
    with torch.inference_mode():
        cache.append(*_kv(2, 1.0))
        cache.append(*(t.double() for t in _kv(1, 2.0)))
        assert cache.k.dtype == torch.float64 and len(cache) == 3
        with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
            cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))  # 3 heads where the cache holds 2


def test_rotary_attention_refuses_memory_instead_of_dropping_its_positions():
    mha = MultiHeadAttention(8, 2, rotary=RotaryEmbedding(4, 16)).eval()
    assert mha(torch.randn(1, 5, 8))[0].shape == (1, 5, 8)
    with pytest.raises(AttnlabError, match="rotary positions are for self-attention"):
        mha(torch.randn(1, 5, 8), torch.randn(1, 3, 8))


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_computes_what_torchs_multihead_attention_computes(bias):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, bias=bias, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(theirs)
    assert not ours.training and ours.num_heads == 2 and (ours.in_proj.bias is None) is not bias
    x, memory = torch.randn(3, 5, 8), torch.randn(3, 7, 8)
    hide = torch.rand(3, 7) < 0.3  # torch's key_padding_mask: True = hide
    hide[:, 0] = False  # every query keeps a key
    with torch.no_grad():
        want, want_w = theirs(x, memory, memory, key_padding_mask=hide)
        got, got_w = ours(x, memory, attend_mask=from_key_padding_mask(hide), need_weights=True)
        torch.testing.assert_close(ours(x)[0], theirs(x, x, x, need_weights=False)[0])  # self-attention too
    torch.testing.assert_close(got, want)  # cross-attention: queries from x, keys and values from memory
    torch.testing.assert_close(got_w.mean(1), want_w)  # torch averages its heads' weights
    with torch.no_grad():  # a copy: changing torch's module leaves ours alone
        theirs.in_proj_weight.add_(1.0)
    assert not torch.equal(ours.in_proj.weight, theirs.in_proj_weight)


def test_from_torch_copies_float64_weights_exactly():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    with torch.no_grad():  # weights that float32 cannot hold (``.double()`` of float32 ones could be)
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    ours = MultiHeadAttention.from_torch(theirs)
    assert ours.in_proj.weight.dtype == torch.float64
    assert torch.equal(ours.in_proj.weight, theirs.in_proj_weight)  # not rounded through float32 on the way
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (ours(x)[0] - theirs(x, x, x, need_weights=False)[0]).abs().max() < 1e-12


@pytest.mark.parametrize("dropout", [-0.5, 1.5, float("nan")])
def test_attention_refuses_a_dropout_that_is_no_probability_when_built(dropout):
    with pytest.raises(AttnlabError, match="dropout must be a probability between 0 and 1"):
        MultiHeadAttention(8, 2, dropout=dropout)


@pytest.mark.parametrize("kwargs", [{"kdim": 4}, {"add_bias_kv": True}, {"add_zero_attn": True}])
def test_from_torch_refuses_variants_attnlab_has_no_counterpart_for(kwargs):
    with pytest.raises(AttnlabError, match="counterpart"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, **kwargs))


def test_a_numpy_dropout_rate_is_a_rate():
    import numpy as np

    assert MultiHeadAttention(8, 2, dropout=np.float32(0.25)).dropout == pytest.approx(0.25)


def test_from_torch_refuses_a_module_that_is_not_torchs_attention():
    with pytest.raises(AttnlabError, match="from_torch takes an nn.MultiheadAttention, got Linear"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))  # an AttributeError before


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@torch.no_grad()
def test_encoder_and_decoder_layers_compute_what_torchs_compute_with_the_same_weights(norm_first, activation):
    torch.manual_seed(0)
    kwargs = dict(dropout=0.0, activation=activation, norm_first=norm_first)
    t_enc = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, **kwargs).eval()
    t_dec = nn.TransformerDecoderLayer(16, 4, 32, batch_first=True, **kwargs).eval()
    enc = EncoderLayer(16, 4, 32, eps=1e-5, **kwargs).eval()
    dec = DecoderLayer(16, 4, 32, eps=1e-5, **kwargs).eval()
    enc.self_attn.load_state_dict(MultiHeadAttention.from_torch(t_enc.self_attn).state_dict())
    dec.self_attn.load_state_dict(MultiHeadAttention.from_torch(t_dec.self_attn).state_dict())
    dec.cross_attn.load_state_dict(MultiHeadAttention.from_torch(t_dec.multihead_attn).state_dict())
    for ours, theirs in ((enc.ffn.up, t_enc.linear1), (enc.ffn.down, t_enc.linear2), (enc.attn_block.norm, t_enc.norm1),
                         (enc.ffn_block.norm, t_enc.norm2), (dec.ffn.up, t_dec.linear1), (dec.ffn.down, t_dec.linear2),
                         (dec.self_block.norm, t_dec.norm1), (dec.cross_block.norm, t_dec.norm2),
                         (dec.ffn_block.norm, t_dec.norm3)):
        ours.load_state_dict(theirs.state_dict())
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    torch.testing.assert_close(enc(x)[0], t_enc(x), atol=1e-5, rtol=1e-5)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    torch.testing.assert_close(dec(x, memory, self_attend_mask=causal_mask(5))[0], t_dec(x, memory, tgt_mask=causal),
                               atol=1e-5, rtol=1e-5)


def test_half_precision_attention_on_the_cpu_is_written_out_with_a_float32_softmax(monkeypatch):
    """bfloat16 on the CPU takes the written-out path (the fused kernel is slow backward there); its softmax
    runs in float32, so it stays within bfloat16's rounding of the float32 result, and hidden keys stay at 0."""
    import attnlab.nn.attention as attention

    calls = []
    reference = attention.attention_reference
    monkeypatch.setattr(attention, "attention_reference", lambda *a, **k: calls.append(1) or reference(*a, **k))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8) for _ in range(3))
    mask = causal_mask(6)
    exact, _ = scaled_dot_product_attention(q, k, v, attend_mask=mask)
    assert not calls  # float32: the fused kernel
    half, weights = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), attend_mask=mask)
    assert calls and weights is None and half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), exact, rtol=0.02, atol=0.02)
    probs = masked_softmax(torch.randn(4, 5).bfloat16() * 30, attend_mask=torch.tensor([[True] * 4 + [False]]))
    assert probs.dtype == torch.bfloat16 and (probs[:, -1] == 0).all()
    torch.testing.assert_close(probs.float().sum(-1), torch.ones(4), rtol=0, atol=0.01)


@pytest.mark.parametrize("need_weights", [False, True])
def test_float16_attention_with_scores_past_float16s_range_stays_finite_on_both_paths(need_weights):
    q = k = torch.full((1, 1, 4, 64), 40.0, dtype=torch.float16)  # q.k = 102,400: past float16's 65,504
    v = torch.arange(4 * 64, dtype=torch.float16).reshape(1, 1, 4, 64) / 256
    out, weights = scaled_dot_product_attention(q, k, v, attend_mask=causal_mask(4), need_weights=need_weights)
    expected, _ = scaled_dot_product_attention(q.float(), k.float(), v.float(), attend_mask=causal_mask(4))
    torch.testing.assert_close(out.float(), expected, rtol=0.01, atol=0.01)  # (the weights path gave NaN)
    if need_weights:
        torch.testing.assert_close(weights[0, 0, -1].float(), torch.full((4,), 0.25))
