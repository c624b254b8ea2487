"""The lab's sections from seeds 003 and 004: parameter summaries, and encoders against decoders.

Each section function is called directly; every claim its page makes is asserted on the numbers it
returns, and the counts are recomputed here from the layer sizes.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.lab.encoders_decoders import LENGTHS, ROUTER, SEED_CAUSAL_WEIGHTS, encoders_decoders_section
from attnlab.lab.parameters import SEED_DECODER_TOTAL, SEED_ENCODER_TOTAL, parameters_section


@pytest.fixture(scope="module")
def seed004():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield encoders_decoders_section().numbers
    finally:
        torch.set_num_threads(before)


def test_seed003_layers_are_counted_sub_layer_by_sub_layer():
    n = parameters_section().numbers
    d, d_k, d_ff = 512, 64, 2048
    attention = 3 * (d * d_k + d_k) + d_k * d + d  # W_q, W_k, W_v to 64 in all, W_o back to 512
    ffn, norm = d * d_ff + d_ff + d_ff * d + d, 2 * d
    assert n["encoder_layer"]["rows"] == {"self_attn": attention, "attn_block.norm": norm,
                                          "ffn": ffn, "ffn_block.norm": norm}
    assert n["encoder_layer"]["total"] == attention + ffn + 2 * norm == SEED_ENCODER_TOTAL == 2_233_536
    assert n["encoder_layer"]["equals_seed"] and "seed_total" not in n["encoder_layer"]  # measured, not quoted
    assert n["decoder_layer"]["total"] == 2 * attention + ffn + 3 * norm == 2_366_336
    # The seed prints one LayerNorm fewer: its decoder applies one normalisation to two sub-layers.
    assert n["decoder_layer"]["total"] - SEED_DECODER_TOTAL == n["decoder_layer"]["difference"] == norm
    assert n["model_total"] > 27_000_000  # "more than 27 million" (a reader of seed 003)
    # Output shapes measured sub-layer by sub-layer, one per counted row: the seed's (None, 5, 512) at batch 1.
    for layer in ("encoder_layer", "decoder_layer"):
        assert n[layer]["output_shapes"] == {name: [1, 5, d] for name in n[layer]["rows"]}


def test_seed004_causal_head_is_reproduced_by_torch_and_by_attnlab(seed004):
    head = seed004["causal_head"]
    assert head["matches_seed"]
    assert torch.tensor(head["torch_weights"]) == pytest.approx(torch.tensor(SEED_CAUSAL_WEIGHTS), abs=0.005)
    assert head["max_difference"] < 1e-6 and head["above_diagonal"] == 0.0
    assert head["hidden_cells"] == {n: n * (n - 1) // 2 for n in range(1, 9)}
    assert head["hidden_cells"][6] == 15 and head["hidden_cells"][4] == 6  # the seed's two counts


def test_only_the_decoder_keeps_earlier_outputs_when_the_last_token_changes(seed004):
    change = seed004["who_reads_what"]
    assert change["decoder"][:-1] == [0.0] * 5 and change["decoder"][-1] > 0
    assert min(change["encoder"]) > 1e-3


def test_an_inverted_padding_mask_gives_nan_in_torch_and_wrong_scores_in_attnlab(seed004):
    inv = seed004["inverted_padding_mask"]
    assert inv["key_padding_mask_shape_two_tickets"] == [2, 120]  # seed 004's question: one value per token
    full = sum(length == ROUTER["max_positions"] for length in LENGTHS)
    assert full > 0 and inv["without_padding"] == full
    assert inv["torch_nan_tickets"] == full and inv["torch_nan_exactly_the_unpadded"]
    assert inv["torch_right_nan_tickets"] == 0
    assert inv["attnlab_nan_tickets"] == 0 and inv["attnlab_largest_score_change"] > 1e-2
    assert inv["alone_vs_padded_right"] < 1e-5 < min(inv["alone_vs_padded_wrong"], inv["alone_vs_padded_without_mask"])


def test_rotary_scores_depend_on_distance_only_and_the_learned_table_ends(seed004):
    pos = seed004["positions"]
    assert pos["learned_table_numbers"] == 120 * 64 == 7_680
    assert "120" in pos["learned_refusal"]
    assert pos["rotary_spread"] < 1e-5 and pos["sinusoidal_spread"] > 1e-2
