"""Mutation suite: every planted bug is caught, by the check named here, and the correct models are not.

Each row of :data:`MUTANTS` is (bug, kind, the check that must catch it). The test runs that check on
the mutant and requires a failure with evidence; the control test runs every check on the same model
without the bug and requires no failure at all, so a catch cannot come from the harness itself.
"""

import pytest
import torch

from attnlab.checks import Contract, run_checks
from mutants import SEQ2SEQ_BUGS, TINY_BUGS, Tiny, TinySeq2Seq

#: bug, kind, check that catches it. Encoder mutants with a pooled output say so in the kind.
MUTANTS = [
    ("diag_excluded", "decoder", "finite-outputs"),          # row 0 all -inf: NaN
    ("diag_excluded_1e9", "decoder", "causal"),              # row 0 uniform: sees the future
    ("sees_next", "decoder", "causal"),                      # a leak of one token: only the next one moves
    ("mask_multiply", "decoder", "causal"),
    ("mask_multiply", "encoder", "padding-content"),
    ("softmax_wrong_axis", "decoder", "causal"),
    ("mask_query_axis", "encoder", "padding-invariance"),
    ("mask_head_batch_order", "encoder", "batch-independence"),
    ("broadcast_trap", "encoder:attention-pooled", "batch-independence"),
    ("padding_inverted", "encoder", "finite-outputs"),       # seed 004: NaN on full-length rows
    ("no_padding_mask", "encoder", "padding-invariance"),    # seed 004
    ("no_positions", "encoder", "order-sensitivity"),        # seeds 000 and 004
    ("no_positions", "decoder", "order-sensitivity"),
    ("causal_dropped", "decoder", "causal"),                 # seed 000, change 2
    ("causal_at_eval_only", "decoder", "causal"),            # seen by the train-mode trial only
    ("unmasked_batch_of_one", "decoder", "causal"),          # seen by the batch-of-one trial only
    ("leak_past_short", "decoder", "causal"),                # seen by the longest rows' cuts only
    ("dropout_in_eval", "encoder", "mode"),                  # seed 000
    ("batch_stats", "encoder", "batch-independence"),
    ("pool_includes_padding", "encoder:mean-pooled", "padding-content"),
    ("cross_mask_from_target", "seq2seq", "padding-invariance"),  # seed 000, change 8
    ("cross_mask_missing", "seq2seq", "padding-invariance"),
    ("cross_mask_missing", "seq2seq", "padding-content"),    # through the extra source padding columns
    ("padding_mask_batches_only", "encoder", "padding-invariance"),  # seen by the row padded alone only
    ("padding_mask_batches_only", "encoder:mean-pooled", "padding-invariance"),
    ("cross_mask_batches_only", "seq2seq", "padding-invariance"),
    ("look_ahead_dropped_with_padding", "decoder", "causal"),  # seen by the right-padded cuts only
    ("positions_from_end", "decoder", "causal"),             # seen by the row against its first tokens alone only
    ("positions_only", "encoder", "order-sensitivity"),      # outputs neither permuted nor changed: unchanged
]

#: Mutants whose bug shows as an exception on valid inputs rather than as wrong numbers.
RAISES = {"cross_mask_from_target"}  # a source and a target of different lengths: shapes disagree


pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


def build(kind: str, bug: str | None) -> tuple[torch.nn.Module, str]:
    """(model, contract kind) for a MUTANTS kind such as ``"encoder:mean-pooled"``."""
    kind, _, pool = kind.partition(":")
    if kind == "seq2seq":
        return TinySeq2Seq(bug=bug), kind
    return Tiny(causal=kind == "decoder", bug=bug, pool=pool.removesuffix("-pooled") or None), kind


def test_the_suite_plants_every_bug_and_has_at_least_ten():
    planted = {bug for bug, _, _ in MUTANTS}
    assert planted == set(TINY_BUGS) | set(SEQ2SEQ_BUGS)
    assert len(planted) >= 10


@pytest.mark.parametrize(("bug", "kind", "check"), MUTANTS, ids=[f"{b}-{k}" for b, k, _ in MUTANTS])
def test_mutant_is_caught(bug, kind, check):
    model, contract_kind = build(kind, bug)
    result = run_checks(model, Contract(contract_kind), seeds=3, only=[check]).results[0]
    assert result.status == "fail", f"{bug} ({kind}) escaped {check}: {result.summary}"
    if bug in RAISES:
        assert "RuntimeError" in result.evidence["exception"]
    else:  # caught by its numbers, with the evidence a reader needs
        assert "exception" not in result.evidence, result.summary
        assert result.evidence["seed"] in (0, 1, 2)
        assert "max_diff" in result.evidence or "non_finite_values" in result.evidence


@pytest.mark.parametrize("kind", ["encoder", "decoder", "encoder:mean-pooled", "encoder:attention-pooled", "seq2seq"])
def test_the_mutants_without_their_bug_pass_every_check(kind):
    model, contract_kind = build(kind, None)
    report = run_checks(model, Contract(contract_kind), seeds=10)
    assert not report.failed, "\n".join(r.describe() for r in report.results if r.failed)
    assert report.result("mode").status == "pass"  # the controls have dropout, so train mode differs


@pytest.mark.parametrize(("bug", "kind", "check", "cause"), [
    ("no_padding_mask", "encoder", "padding-invariance", "no padding mask"),
    ("mask_query_axis", "encoder", "padding-invariance", "on the queries instead of the keys"),
    ("pool_includes_padding", "encoder:mean-pooled", "padding-content", "pooling that depend"),
    ("mask_multiply", "encoder", "padding-content", "built but not applied"),
    ("batch_stats", "encoder", "batch-independence", "statistics taken across the batch"),
    ("broadcast_trap", "encoder:attention-pooled", "batch-independence", "(batch, 1, seq) mask"),
])
def test_a_failure_names_the_bugs_it_most_often_means(bug, kind, check, cause):
    model, contract_kind = build(kind, bug)
    result = run_checks(model, Contract(contract_kind), seeds=3, only=[check]).results[0]
    assert result.failed and "likely causes:" in result.summary and cause in result.summary


def test_a_single_check_asserted_names_eval_mode_noise_instead_of_blaming_a_mask():
    from attnlab.checks import assert_causal

    model = Tiny(causal=True, bug="dropout_in_eval")  # a correct look-ahead mask, random at eval
    with pytest.raises(AssertionError, match="eval mode gave one input two different outputs") as raised:
        assert_causal(model, kind="decoder", vocab_size=32, max_length=16, pad_id=0)
    assert "changing tokens after position" not in str(raised.value)
