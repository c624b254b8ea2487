"""Scaled dot-product and multi-head attention: seed 000's example, fused = reference, the mask contract."""

import numpy as np
import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn import (
    MultiHeadAttention,
    attention_reference,
    causal_mask,
    from_keep_mask,
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
