"""Positional encodings: every deterministic number of seed 000, and the table-length contract."""

import math

import numpy as np
import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn import LearnedPositions, RotaryEmbedding, SinusoidalPositions, sinusoidal_angles, sinusoidal_encoding


def test_angle_matrix_4_by_8_pairs_columns_and_shrinks_tenfold():
    angles = sinusoidal_angles(4, 8).numpy()
    expected = np.array([[p / 10.0**i for i in (0, 0, 1, 1, 2, 2, 3, 3)] for p in range(4)])
    np.testing.assert_allclose(angles, expected, rtol=1e-12)


def test_encoding_50_by_512_first_rows():
    pe = sinusoidal_encoding(50, 512)
    assert pe.shape == (50, 512) and pe.dtype == torch.float32
    np.testing.assert_array_equal(pe[0, :8].numpy(), [0, 1, 0, 1, 0, 1, 0, 1])
    np.testing.assert_allclose(
        pe[1, :8].numpy().round(4), [0.8415, 0.5403, 0.8219, 0.5697, 0.802, 0.5974, 0.7819, 0.6234], atol=1e-4
    )


@pytest.mark.parametrize("pos", [0, 34, 99])
def test_even_d_norm_is_sqrt_half_d(pos):
    pe = sinusoidal_encoding(100, 100)
    assert float(pe[pos].norm()) == pytest.approx(math.sqrt(50), abs=1e-5)


@pytest.mark.parametrize("d", [3, 101])
def test_odd_d_norm_follows_the_unpaired_sine_and_varies(d):
    pe = sinusoidal_encoding(100, d).double()
    pos = torch.arange(100, dtype=torch.float64)
    # The last column is an unpaired sine: squared norm = (d - 1) / 2 + sin^2(pos / 10000^((d - 1) / d)).
    expected = torch.sqrt((d - 1) / 2 + torch.sin(pos / 10000 ** ((d - 1) / d)) ** 2)
    torch.testing.assert_close(pe.norm(dim=1), expected, atol=1e-6, rtol=0)
    assert float(expected.max() - expected.min()) > 1e-6


def test_odd_d_gap_distance_varies_where_even_d_is_constant():
    def spread(d):
        pe = sinusoidal_encoding(200, d, dtype=torch.float64)
        gaps = torch.stack([(pe[p] - pe[p + 2]).norm() for p in range(0, 190, 10)])
        return float(gaps.max() - gaps.min())

    assert spread(100) < 1e-13  # even: constant up to float64 rounding
    assert spread(3) > 1e-7  # odd: the unpaired sine makes it drift, by far more than rounding


@pytest.mark.parametrize("pos", [0, 10, 40, 70, 90])
def test_gap_2_distance_is_position_independent(pos):
    pe = sinusoidal_encoding(100, 100)
    assert float((pe[pos] - pe[pos + 2]).norm()) == pytest.approx(3.266878, abs=1e-5)


def test_module_slices_table_and_rejects_longer_sequences():
    module = SinusoidalPositions(10, 6)
    torch.testing.assert_close(module(4, offset=3), sinusoidal_encoding(10, 6)[3:7])
    with pytest.raises(AttnlabError, match="position 10 .* only 10 rows"):
        module(11)


def test_learned_positions_table_and_limit():
    module = LearnedPositions(120, 64)
    assert module.table.weight.shape == (120, 64)
    assert module(5).shape == (5, 64)
    with pytest.raises(AttnlabError, match="120 rows"):
        module(121)


def test_rotary_dot_product_depends_only_on_distance():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(qpos, kpos):
        return float((rope(q, qpos) * rope(k, kpos)).sum())

    assert score(5, 2) == pytest.approx(score(30, 27), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)
    with pytest.raises(AttnlabError, match="rotary table"):
        rope(torch.randn(1, 1, 65, 8))


def test_position_tables_take_a_length_not_the_input_and_say_so():
    with pytest.raises(AttnlabError, match=r"takes a length and an offset \(whole numbers\).*tensor of shape \(2, 3, 8\)"):
        SinusoidalPositions(5, 8)(torch.zeros(2, 3, 8))  # the Keras idiom pe(x)
    with pytest.raises(AttnlabError, match="learned position table takes a length"):
        LearnedPositions(5, 8)(2.5)
    assert SinusoidalPositions(5, 8)(3).shape == (3, 8)


def test_rotary_turns_pair_2j_2j_plus_1_by_position_times_base_to_the_minus_2j_over_h():
    rotary, position, h = RotaryEmbedding(8, 32), 5, 8
    for j in range(h // 2):
        x = torch.zeros(1, 1, 1, h)
        x[..., 2 * j] = 1.0  # the unit vector of the pair's first dimension
        angle = position * 10000.0 ** (-2 * j / h)
        want = torch.zeros(h)
        want[2 * j], want[2 * j + 1] = math.cos(angle), math.sin(angle)
        torch.testing.assert_close(rotary(x, position)[0, 0, 0], want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("make, message", [
    (lambda: sinusoidal_angles(2.5, 3), "num_positions must be a whole number >= 0, got 2.5"),
    (lambda: sinusoidal_encoding(4, True), "d must be a whole number >= 1, got True"),
    (lambda: SinusoidalPositions(0, 6), "max_positions must be a whole number >= 1, got 0"),
    (lambda: LearnedPositions(0, 6), "max_positions must be a whole number >= 1, got 0"),
    (lambda: LearnedPositions(4, 6.0), "d must be a whole number >= 1, got 6.0"),
    (lambda: SinusoidalPositions(4, 6)(True), "got True as the length"),
    (lambda: LearnedPositions(4, 6)(2, offset=False), "got False as the offset"),
    (lambda: RotaryEmbedding(4, 8)(torch.ones(1, 1, 3, 2)), r"rotates \(..., seq, 4\) queries and keys, got shape \(1, 1, 3, 2\)"),
    (lambda: RotaryEmbedding(4, 8)(torch.ones(1, 1, 3, 6)), r"got shape \(1, 1, 3, 6\)"),
    (lambda: RotaryEmbedding(4, 8, base=0.0), "base must be a finite number > 0, got 0.0"),  # NaN tables otherwise
])
def test_position_modules_refuse_sizes_that_are_not_whole_numbers_and_inputs_of_another_width(make, message):
    with pytest.raises(AttnlabError, match=message):
        make()


def test_sizes_given_as_numpy_integers_are_whole_numbers():
    from attnlab.nn.attention import KVCache

    assert sinusoidal_encoding(np.int64(5), np.int32(4)).shape == (5, 4)
    KVCache().truncate(np.int64(0))
    assert SinusoidalPositions(8, 4)(np.int64(3), np.int32(2)).shape == (3, 4)
    assert LearnedPositions(8, 4)(np.int64(3)).shape == (3, 4)
    with pytest.raises(AttnlabError, match="sequence reaches position 199"):
        SinusoidalPositions(150, 8)(np.int8(100), np.int8(100))  # (100 + 100 wraps around in int8)
    with pytest.raises(AttnlabError, match="got np.True_ as the offset"):
        SinusoidalPositions(8, 4)(2, np.True_)


def test_tables_in_float64_are_computed_in_float64_not_widened_from_float32():
    # .double() used to widen the float32 table: 3e-8 off the formula (rotary 8e-8) where float64 is exact.
    sinusoidal = SinusoidalPositions(64, 8).double()
    assert torch.equal(sinusoidal(64), sinusoidal_encoding(64, 8, torch.float64))
    rotary = RotaryEmbedding(8, 64).double()
    angles = torch.arange(64, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    assert torch.equal(rotary.cos, torch.cos(angles)) and torch.equal(rotary.sin, torch.sin(angles))
    assert torch.equal(rotary.float().cos, torch.cos(angles).float())  # and back
