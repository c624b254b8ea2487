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
