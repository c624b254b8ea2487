"""Masks: one convention (bool, True = may attend), seed 000's examples, converters and shape traps."""

import numpy as np
import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn import (
    causal_mask,
    check_attend_mask,
    decoder_self_mask,
    from_additive_mask,
    from_hide_mask,
    from_keep_mask,
    masked_softmax,
    padding_mask,
    to_additive_mask,
    to_hf_attention_mask,
    to_key_padding_mask,
)
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.masks import from_hf_attention_mask, from_key_padding_mask, from_torch_attn_mask

X = torch.tensor([[7.0, 6.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 4.0, 5.0]])


def test_padding_mask_of_the_3_by_5_example():
    mask = padding_mask(X.long())
    assert mask.shape == (3, 1, 1, 5) and mask.dtype == torch.bool
    expected = [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [0, 0, 0, 1, 1]]
    np.testing.assert_array_equal(mask[:, 0, 0].int().numpy(), expected)


def test_softmax_with_and_without_the_padding_mask():
    scores = X[:, None, :]  # (3, 1, 5): one query per sequence, as seed 000 corrects it
    mask = padding_mask(X.long())[:, 0]  # (3, 1, 5), same rank as the scores
    plain, masked = masked_softmax(scores), masked_softmax(scores, attend_mask=mask)
    np.testing.assert_allclose(plain[1, 0].numpy(), [0.0844, 0.2295, 0.6239, 0.0311, 0.0311], atol=1e-4)
    np.testing.assert_allclose(masked[1, 0].numpy(), [0.09, 0.2447, 0.6652, 0, 0], atol=1e-4)
    np.testing.assert_allclose(plain[2, 0].numpy(), [0.0049, 0.0049, 0.0049, 0.265, 0.7204], atol=1e-4)
    np.testing.assert_allclose(masked[2, 0].numpy(), [0, 0, 0, 0.2689, 0.7311], atol=1e-4)
    assert float(masked[2, 0, :3].abs().sum()) == 0.0  # exactly zero, not small


def test_rank_changing_broadcast_is_an_error():
    # Seed 000, change 9: a (3, 1, 5) mask against bare (3, 5) scores would broadcast to (3, 3, 5).
    mask = padding_mask(X.long())[:, 0]
    with pytest.raises(AttnlabError, match="rank"):
        masked_softmax(X, attend_mask=mask)


def test_wrong_dtype_and_wrong_size_are_errors():
    with pytest.raises(AttnlabError, match="torch.bool"):
        check_attend_mask(torch.ones(3, 1, 5), (3, 1, 5))
    with pytest.raises(AttnlabError, match="axis 2"):
        check_attend_mask(torch.ones(3, 1, 4, dtype=torch.bool), (3, 1, 5))


def test_look_ahead_mask_4_by_4():
    expected = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    np.testing.assert_array_equal(causal_mask(4)[0, 0].int().numpy(), expected)
    assert int((~causal_mask(6)).sum()) == 15  # seed 004: 15 of 36 cells hidden


def test_causal_mask_with_cached_keys_sees_the_past():
    mask = causal_mask(2, 5)[0, 0]
    np.testing.assert_array_equal(mask.int().numpy(), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_decoder_self_mask_combines_causal_and_target_padding():
    mask = decoder_self_mask(torch.tensor([[5, 6, 0]]))
    np.testing.assert_array_equal(mask[0, 0].int().numpy(), [[1, 0, 0], [1, 1, 0], [1, 1, 0]])


def test_converters_from_other_conventions():
    keep = torch.tensor([[1.0, 1.0, 0.0]])  # seed 000 / Hugging Face: 1 = attend
    hide = torch.tensor([[0.0, 0.0, 1.0]])  # seed 003 / torch key_padding_mask: 1 = hide
    additive = torch.tensor([[0.0, 0.0, float("-inf")]])
    big_negative = torch.tensor([[0.0, 0.0, -1e9]])
    expected = torch.tensor([[True, True, False]])
    for converted in (from_keep_mask(keep), from_hide_mask(hide), from_additive_mask(additive),
                      from_additive_mask(big_negative)):
        assert torch.equal(converted, expected)


def test_converters_to_other_libraries_round_trip():
    attend = padding_mask(torch.tensor([[3, 4, 0], [5, 0, 0]]))
    kpm = to_key_padding_mask(attend)
    assert torch.equal(kpm, torch.tensor([[False, False, True], [False, True, True]]))
    assert torch.equal(from_hide_mask(kpm)[:, None, None], attend)
    assert torch.equal(to_hf_attention_mask(attend), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.equal(from_additive_mask(to_additive_mask(attend)), attend)


# The libraries' masks, written out in their own conventions, for two sequences of 4 and 2 real tokens.
IDS = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
HF_ATTENTION_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])  # Hugging Face: (batch, keys), 1 = keep
KEY_PADDING_MASK = torch.tensor([[False] * 4, [False, False, True, True]])  # torch: (batch, keys), True = hide


def _torch_causal_masks(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's two causal ``attn_mask`` forms: bool (True = not allowed) and float (0 / -inf)."""
    return torch.ones(n, n, dtype=torch.bool).triu(1), torch.nn.Transformer.generate_square_subsequent_mask(n)


def test_from_additive_mask_refuses_bool_and_integer_masks():
    # torch's bool attn_mask (True = not allowed): compared with -1e4 every cell was True, the mask gone.
    with pytest.raises(AttnlabError, match="torch.bool.*from_hide_mask"):
        from_additive_mask(~causal_mask(4)[0, 0])
    with pytest.raises(AttnlabError, match="torch.int64.*from_keep_mask"):
        from_additive_mask(HF_ATTENTION_MASK)


def test_from_additive_mask_refuses_zero_one_floats_and_soft_biases():
    with pytest.raises(AttnlabError, match="looks like a 0/1 mask"):
        from_additive_mask(HF_ATTENTION_MASK.float())  # would hide nothing
    with pytest.raises(AttnlabError, match="no bool equivalent"):
        from_additive_mask(torch.tensor([0.0, -0.5, -1.0]))  # an ALiBi-like bias
    with pytest.raises(AttnlabError, match="nan"):
        from_additive_mask(torch.tensor([0.0, float("nan")]))
    # Every usual way of writing "hidden" still converts: -inf, -1e9, -1e4, the dtype's minimum.
    for hidden in (float("-inf"), -1e9, -1e4, torch.finfo(torch.float16).min):
        converted = from_additive_mask(torch.tensor([0.0, hidden], dtype=torch.float16))
        assert torch.equal(converted, torch.tensor([True, False]))


@pytest.mark.parametrize("convert", [from_keep_mask, from_hide_mask])
def test_zero_one_converters_refuse_additive_masks(convert):
    # 0/-inf read as "1 = keep" is exactly inverted; read as "1 = hide" the -inf cells are kept.
    with pytest.raises(AttnlabError, match="looks like an additive mask.*from_additive_mask"):
        convert(to_additive_mask(causal_mask(4)))
    with pytest.raises(AttnlabError, match="0s and 1s.*2"):
        convert(torch.tensor([[0, 1, 2]]))


def test_zero_one_converters_take_bool_int_and_float_and_keep_the_shape():
    for keep in (HF_ATTENTION_MASK, HF_ATTENTION_MASK.bool(), HF_ATTENTION_MASK.float()):
        assert torch.equal(from_keep_mask(keep), HF_ATTENTION_MASK == 1)
        assert torch.equal(from_hide_mask(1 - keep.long()), HF_ATTENTION_MASK == 1)
    assert from_keep_mask(torch.ones(1, 3)).shape == (1, 3)  # seed 000's (1, 3) mask for (1, 3) scores


def test_hf_attention_mask_round_trips_through_an_attend_mask():
    attend = from_hf_attention_mask(HF_ATTENTION_MASK)
    assert attend.shape == (2, 1, 1, 4) and torch.equal(attend, padding_mask(IDS))
    assert torch.equal(to_hf_attention_mask(attend), HF_ATTENTION_MASK)


def test_key_padding_mask_round_trips_through_an_attend_mask():
    attend = from_key_padding_mask(KEY_PADDING_MASK)
    assert attend.shape == (2, 1, 1, 4) and torch.equal(attend, padding_mask(IDS))
    assert torch.equal(to_key_padding_mask(attend), KEY_PADDING_MASK)
    # torch adds a float key_padding_mask to the scores, so a float one is read as additive.
    additive = torch.zeros(2, 4).masked_fill(KEY_PADDING_MASK, float("-inf"))
    assert torch.equal(from_key_padding_mask(additive), attend)


def test_padding_converters_refuse_other_ranks_and_conventions():
    with pytest.raises(AttnlabError, match=r"\(batch, keys\), got shape \(2, 1, 1, 4\)"):
        from_hf_attention_mask(padding_mask(IDS))
    with pytest.raises(AttnlabError, match="torch.int64"):
        from_key_padding_mask(KEY_PADDING_MASK.long())  # torch itself refuses integer masks
    with pytest.raises(AttnlabError, match="looks like a 0/1 mask.*from_hide_mask"):
        from_key_padding_mask(KEY_PADDING_MASK.float())  # seed 003's float "1 = hide": torch would add it


def test_converters_on_the_meta_device_give_masks_of_the_right_shape_without_reading_values():
    """Shape inference (torch.device("meta")) has no values to check: torch.nonzero raised NotImplementedError."""
    assert from_keep_mask(torch.ones(2, 3, device="meta")).shape == (2, 3)
    assert from_additive_mask(torch.zeros(2, 3, device="meta")).shape == (2, 3)
    assert from_hf_attention_mask(torch.ones(2, 3, dtype=torch.long, device="meta")).shape == (2, 1, 1, 3)


def test_padding_mask_refuses_what_is_not_ids_and_a_pad_id():
    with pytest.raises(AttnlabError, match="pad_id must be a whole number .* got None"):
        padding_mask(IDS, None)  # compared with a tensor, None gave one False, not a mask
    with pytest.raises(AttnlabError, match=r"token ids must be a \(batch, seq\) tensor, got list"):
        padding_mask([[1, 0]])
    import numpy as np

    for pad_id in (np.int64(0), torch.tensor(0)):  # a tokenizer's or a config's integers are ids too
        assert torch.equal(padding_mask(IDS, pad_id), padding_mask(IDS, 0))
    for pad_id in (torch.tensor(True), torch.tensor([0]), torch.tensor(0.0), True):  # not one whole number
        with pytest.raises(AttnlabError, match="pad_id must be a whole number"):
            padding_mask(IDS, pad_id)


def test_converted_library_masks_work_in_multi_head_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 4, 8)
    expected, _ = mha(x, attend_mask=padding_mask(IDS))
    for attend in (from_hf_attention_mask(HF_ATTENTION_MASK), from_key_padding_mask(KEY_PADDING_MASK)):
        assert torch.equal(mha(x, attend_mask=attend)[0], expected)
    causal, _ = mha(x, attend_mask=causal_mask(4))
    for torch_mask in _torch_causal_masks(4):
        assert torch.equal(mha(x, attend_mask=from_torch_attn_mask(torch_mask))[0], causal)


def test_torch_bool_and_float_causal_attn_masks_become_causal_mask():
    for torch_mask in _torch_causal_masks(5):
        assert torch.equal(from_torch_attn_mask(torch_mask), causal_mask(5))
    bool_mask, float_mask = _torch_causal_masks(5)
    assert torch.equal(from_hide_mask(bool_mask)[None, None], causal_mask(5))  # values-only converters agree
    assert torch.equal(from_additive_mask(float_mask)[None, None], causal_mask(5))


def test_conversions_read_torch_masks_as_torch_does():
    # torch's own attention gives exactly zero weight where our converted masks say False, per head.
    torch.manual_seed(0)
    batch, heads, n = 2, 2, 4
    torch_mha = torch.nn.MultiheadAttention(8, heads, batch_first=True).eval()
    x = torch.randn(batch, n, 8)
    per_head = torch.rand(batch * heads, n, n) < 0.5
    per_head[..., 0] = False  # key 0 always allowed, so no row is fully hidden (torch gives NaN there)
    _, weights = torch_mha(x, x, x, key_padding_mask=KEY_PADDING_MASK, attn_mask=per_head, average_attn_weights=False)
    attend = from_key_padding_mask(KEY_PADDING_MASK) & from_torch_attn_mask(per_head, num_heads=heads)
    assert attend.shape == (batch, heads, n, n)
    assert torch.equal(weights != 0, attend)


def test_torch_attn_mask_needs_num_heads_for_a_per_head_mask():
    with pytest.raises(AttnlabError, match="num_heads=None"):
        from_torch_attn_mask(torch.zeros(4, 3, 3, dtype=torch.bool))
    with pytest.raises(AttnlabError, match="must divide 4"):
        from_torch_attn_mask(torch.zeros(4, 3, 3, dtype=torch.bool), num_heads=3)
    for heads in (True, 2.0):  # True was read as 1 head (a (4, 1, 3, 3) mask), 2.0 failed inside torch
        with pytest.raises(AttnlabError, match=f"num_heads={heads}"):
            from_torch_attn_mask(torch.zeros(4, 3, 3, dtype=torch.bool), num_heads=heads)
    assert from_torch_attn_mask(torch.zeros(4, 3, 3, dtype=torch.bool), num_heads=np.int64(2)).shape == (2, 2, 3, 3)
    with pytest.raises(AttnlabError, match="from_key_padding_mask"):
        from_torch_attn_mask(torch.zeros(4, dtype=torch.bool))


def test_a_two_d_padding_mask_in_attention_points_to_the_converters():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(AttnlabError, match="rank.*from_hf_attention_mask or from_key_padding_mask"):
        mha(torch.randn(2, 4, 8), attend_mask=from_keep_mask(HF_ATTENTION_MASK))


def test_converters_back_out_refuse_masks_that_are_not_bool():
    # ~ on an integer mask is a bitwise not (1 -> -2): the result would be garbled, not inverted.
    with pytest.raises(AttnlabError, match="to_key_padding_mask takes an attend mask"):
        to_key_padding_mask(padding_mask(IDS).long())
    with pytest.raises(AttnlabError, match="to_additive_mask takes an attend mask"):
        to_additive_mask(causal_mask(3).float())


@pytest.mark.parametrize("args", [(-1,), (2.5,), (3, 4.0), (True,), (2, True)])
def test_causal_mask_of_a_non_length_is_named(args):
    from attnlab.nn import causal_mask

    with pytest.raises(AttnlabError, match="causal mask takes whole numbers of queries and keys"):
        causal_mask(*args)


def test_additive_masks_need_a_floating_dtype_and_the_decoder_mask_ids_of_rank_two():
    from attnlab.nn.masks import decoder_self_mask, to_additive_mask

    for dtype in (torch.bool, torch.int64):  # bool came out inverted (True where hidden), int64 failed in torch
        with pytest.raises(AttnlabError, match=f"to_additive_mask needs a floating dtype.*got {dtype}"):
            to_additive_mask(causal_mask(3), dtype=dtype)
    with pytest.raises(AttnlabError, match=r"token ids must be \(batch, seq\), got shape \(5,\)"):
        decoder_self_mask(torch.ones(5, dtype=torch.long))


def test_from_hf_attention_mask_names_itself_and_a_converter_that_fits_a_mask_of_another_convention():
    additive = torch.tensor([[0.0, 0.0, float("-inf")]])  # (batch, keys), 0 / -inf: torch's key_padding_mask form
    with pytest.raises(AttnlabError, match=r"^from_hf_attention_mask takes a 0/1 mask.*convert it with "
                                           r"from_key_padding_mask$"):
        from_hf_attention_mask(additive)
    assert from_key_padding_mask(additive)[0, 0, 0].tolist() == [True, True, False]  # the one advised fits
    with pytest.raises(AttnlabError, match=r"^from_hf_attention_mask takes a mask of 0s and 1s"):
        from_hf_attention_mask(torch.tensor([[1, 2]]))


def test_a_mask_of_one_key_is_refused_for_scores_of_several_keys_not_broadcast_over_them():
    # The likeliest way here: the padding mask of one decoding step's ids while the cache holds earlier keys.
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    with pytest.raises(AttnlabError, match=r"attend_mask has shape \(2, 1, 1, 1\): one key, for scores of shape "
                                           r"\(2, 2, 5, 5\) with 5 keys"):
        mha(x, attend_mask=torch.ones(2, 1, 1, 1, dtype=torch.bool))
    out, _ = mha(x[:, :1], x, attend_mask=torch.ones(2, 1, 1, 5, dtype=torch.bool))  # one query: its axis may be 1
    assert out.shape == (2, 1, 8)


@pytest.mark.parametrize("convert", [from_keep_mask, from_hf_attention_mask])
def test_a_float_keep_mask_of_zeros_only_is_refused_as_possibly_additive(convert):
    no_padding = torch.zeros(2, 3)  # torch's float key_padding_mask of a batch without padding: hides nothing
    with pytest.raises(AttnlabError, match=r"float32 mask is all 0, which would hide every key; an additive mask"):
        convert(no_padding)
    assert not convert(torch.zeros(2, 3, dtype=torch.long)).any()  # an integer one is unambiguous: all hidden
    assert not convert(torch.zeros(2, 3, dtype=torch.bool)).any()
    assert convert(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])).sum() == 1  # some zeros: 0/1 as before
    assert from_additive_mask(no_padding).all()  # where it belongs
