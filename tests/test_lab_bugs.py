"""Section 10 of ``attnlab lab``: the silent bugs of seed 000's port and its review questions.

The section function is called directly and every behaviour it claims is asserted, some against an
independent numpy computation; one small lab run checks that the page and numbers.json carry it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attnlab.lab import STEPS, run_lab
from attnlab.lab.silent_bugs import bugs_section
from test_lab import DIM, small_vectors, write_glove


@pytest.fixture(scope="module")
def section():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest on a shared machine
    try:
        yield bugs_section()
    finally:
        torch.set_num_threads(before)


def test_positional_mask_is_ignored_and_the_core_refuses_it(section):
    n = section.numbers["positional_mask"]
    assert n["binds_to"] == {"keras2_call": "attention_mask", "keras3_call": "query_mask"}
    assert n["ignored_equals_no_mask"] and n["ignored"] == n["no_mask"]
    assert n["masked"][2] == 0.0 and n["no_mask"][2] > 0.0
    assert n["masked"] != pytest.approx(n["no_mask"], abs=1e-3)
    assert n["refusals"][0].startswith("AttnlabError:") and "keyword-only" in n["refusals"][0]
    assert n["refusals"][1].startswith("TypeError:")


def test_cross_mask_from_the_target_changes_outputs_and_fails_the_check(section):
    n = section.numbers["cross_mask"]
    assert n["logit_max_difference"] > 1e-4
    assert n["cross_weight_on_source_padding"]["source"] == 0.0
    assert n["cross_weight_on_source_token_3"]["source"] > 0.0 == n["cross_weight_on_source_token_3"]["target"]
    assert n["shorter_target"].startswith("AttnlabError:")
    assert n["padding_invariance"] == {"source mask": "pass", "target mask": "fail"}


def test_broadcast_trap_matches_numpy(section):
    n = section.numbers["broadcast"]
    assert n["shape"] == [3, 3, 5]
    assert n["diagonal_rows_correct"] and n["off_diagonal_pairings_wrong"] == 6
    assert "rank" in n["refusal"] and n["refusal"].startswith("AttnlabError:")
    # Independently: the row the page prints at [1, 0] is sequence 0's scores under sequence 1's mask, and the
    # one at [0, 0] the correct softmax of sequence 0.
    ids = np.array([[7, 6, 0, 0, 1], [1, 2, 3, 0, 0], [0, 0, 0, 4, 5]], dtype=float)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    assert n["row_0_0"] == pytest.approx(softmax(np.where(ids[0] == 0, -np.inf, ids[0])).tolist(), abs=1e-9)
    assert n["row_1_0"] == pytest.approx(softmax(np.where(ids[1] == 0, -np.inf, ids[0])).tolist(), abs=1e-9)
    assert n["row_1_0"][2] > 0.0 == n["row_1_0"][4]  # weight on sequence 0's padding, none on its last real token


def test_rank_change_and_refusal(section):
    n = section.numbers["rank"]
    assert (n["scores"], n["mask"], n["output"]) == ([1, 3], [1, 1, 3], [1, 1, 2])
    assert n["refusal"].startswith("AttnlabError:")


def test_training_flag(section):
    n = section.numbers["training_flag"]
    assert n["train_max_difference"] > 0 and n["eval_identical"]
    assert n["mode_check_dropout_at_eval"] == "fail"
    evidence = n["mode_check_evidence"]  # the page quotes "by up to ..." from here
    assert evidence["max_diff"] > evidence["bound"] and f"{evidence['max_diff']:.2f}" in n["mode_check_summary"]


def test_full_width_heads_are_larger(section):
    n = section.numbers["head_width"]
    paper = n["d 512, 8 heads"]
    # Four 512 x inner projections plus biases: inner = 8 * 512 with full-width heads, 512 per the paper.
    assert paper["key_dim_embedding_dim"] == 4 * 512 * 4096 + 3 * 4096 + 512
    assert paper["per_head"] == 4 * 512 * 512 + 4 * 512
    # Seed 003: d_k = d_v = 64 over all eight heads: 3 x (512 x 64 + 64) + 64 x 512 + 512.
    assert paper["seed003_d_k_64"] == 3 * (512 * 64 + 64) + 64 * 512 + 512 == 131_776
    assert all(v["key_dim_embedding_dim"] > v["per_head"] for v in n.values())
    assert n["lab-toy model"]["key_dim_embedding_dim"] == 7131


def test_multiplied_mask_leaks_and_added_mask_does_not(section):
    n = section.numbers["multiply"]
    assert n["multiplied"][2] > 0 and n["multiplied"][2] == max(n["multiplied"])
    assert n["added"][2] == 0.0 and n["core"][2] == 0.0
    assert n["core"] == pytest.approx(n["added"], abs=1e-12)
    # masked after the softmax: the hidden key is 0 but the rest no longer sums to 1 (review question 2)
    assert n["after_softmax"][2] == 0.0 and n["after_softmax_sum"] == pytest.approx(sum(n["after_softmax"]))
    assert n["after_softmax_sum"] < 0.5


def test_review_question_numbers(section):
    n = section.numbers["questions"]
    assert n["pe0_first8"] == [0.0, 1.0] * 4
    assert n["pe0_norm"] == pytest.approx(math.sqrt(50), rel=1e-6)
    assert n["scale_ratio"] == pytest.approx(10.0, rel=1e-9)
    assert 0 < n["unmasked_future_weight"] < 1
    assert n["padded_output_norm"] > 0.1
    page = section.body
    assert page.count("<b>") >= 6 and "The review questions" in page
    assert len(section.highlights) in (2, 3)


def test_page_and_numbers_carry_the_section(tmp_path):
    assert [k for k, _ in STEPS].index("bugs") == len(STEPS) - 2  # last section, before writing
    glove = tmp_path / f"tiny.{DIM}d.txt"
    write_glove(glove, small_vectors())
    run_lab(tmp_path / "report", glove=glove, max_length=20)
    page = (tmp_path / "report" / "index.html").read_text()
    numbers = json.loads((tmp_path / "report" / "numbers.json").read_text())
    assert '<section id="bugs">' in page and "Silent bugs of the port" in page
    assert numbers["bugs"]["broadcast"]["shape"] == [3, 3, 5]
