"""``attnlab.checks`` and ``attnlab check``: the tool's parts, no false alarms on correct models (ours,
torch's, Hugging Face's) over 20 seeds, failures on the same models used wrongly, and the command line.
The planted-bug suite is in ``test_checks_mutants.py``."""

import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from attnlab.checks import (
    Contract,
    assert_all_checks,
    assert_batch_independent,
    assert_causal,
    assert_finite,
    assert_inference_path,
    assert_mode,
    assert_order_sensitive,
    assert_padding_content_ignored,
    assert_padding_invariant,
    load_model,
    output_tensor,
    run_checks,
)
from attnlab.checks.calling import ModelUnderTest, OutputError
from attnlab.checks.compare import NOT_FINITE, TOLERANCE, Tally, difference
from attnlab.checks.inputs import generator, other_tokens, pad_rows, random_tokens, reordering
from attnlab.checks.runner import CHECKS
from attnlab.cli.main import cli
from attnlab.errors import AttnlabError
from attnlab.nn import DecoderLM, EncoderClassifier, Transformer
from mutants import Tiny

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TORCH_EXAMPLES, HF_EXAMPLES = EXAMPLES / "check_torch_models.py", EXAMPLES / "check_hf_models.py"


pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


# --- the parts -------------------------------------------------------------------------------------

def test_output_tensor_adapts_tensors_tuples_and_model_outputs():
    transformers = pytest.importorskip("transformers")
    x = torch.ones(2, 3)
    assert output_tensor(x) is x
    assert output_tensor((x, {"attention": 1})) is x
    assert output_tensor(transformers.modeling_outputs.CausalLMOutput(logits=x)) is x
    assert output_tensor(transformers.modeling_outputs.BaseModelOutput(last_hidden_state=x)) is x
    assert output_tensor({"logits": x}) is x
    with pytest.raises(TypeError, match="expected a tensor"):
        output_tensor("logits")


def test_pooled_output_is_told_apart_from_per_position_even_when_its_size_equals_a_length():
    pooled = ModelUnderTest(lambda ids: torch.zeros(ids.shape[0], 2), Contract("encoder"))  # 2 = a probe length
    per_position = ModelUnderTest(lambda ids: ids.float()[..., None], Contract("encoder"))
    assert not pooled.per_position and per_position.per_position


def test_a_wrong_batch_axis_is_an_output_error_not_an_exception_of_the_model():
    mut = ModelUnderTest(lambda ids: torch.zeros(1, 4), Contract("encoder"))
    with pytest.raises(OutputError, match="batch has 3 rows"):
        mut(torch.ones(3, 4, dtype=torch.long))


def test_the_input_is_described_by_shape_and_a_length_a_row_per_side():
    mut = ModelUnderTest(lambda src, tgt: tgt.float(), Contract("seq2seq"))
    mut(torch.tensor([[5, 6, 7], [5, 0, 0], [5, 6, 7]]), torch.tensor([[1, 2], [3, 4], [5, 6]]))
    assert mut.input_summary() == ("source of shape (3, 3) with row lengths 3, 1, 3; "
                                   "target of shape (3, 2) with row lengths 2, 2, 2")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "lstm"}, "unknown model kind"),
    ({"kind": "encoder", "vocab_size": 3}, "vocab size"),
    ({"kind": "encoder", "max_length": 2}, "max length"),
    ({"kind": "encoder", "pad_id": 32}, "pad id 32"),
    ({"kind": "encoder", "pad_id": 1.5}, "pad_id must be a whole number or None, got 1.5"),
    ({"kind": "encoder", "vocab_size": 8.5}, "vocab_size must be a whole number, got 8.5"),
    ({"kind": "encoder", "max_length": True}, "max_length must be a whole number, got True"),
])
def test_contract_rejects_what_the_checks_cannot_use(kwargs, message):
    with pytest.raises(AttnlabError, match=message):
        Contract(**kwargs)


def test_random_ids_stay_in_the_vocabulary_and_off_the_pad():
    contract, gen = Contract("encoder", pad_id=3, vocab_size=6), generator("test", 0)
    ids = random_tokens(gen, contract, 50, 8)
    assert ids.dtype == torch.long and ids.min() >= 0 and ids.max() < 6 and not (ids == 3).any()
    changed = other_tokens(gen, contract, ids)
    assert (changed != ids).all() and not (changed == 3).any() and changed.max() < 6
    assert pad_rows([torch.tensor([1, 2]), torch.tensor([4])], 3, 3).tolist() == [[1, 2, 3], [4, 3, 3]]
    x = torch.tensor([5, 5, 1])
    assert not torch.equal(x[reordering(gen, x)], x)


def test_generators_are_reproducible_and_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a = torch.randint(100, (5,), generator=generator("causal", 7))
    assert torch.equal(a, torch.randint(100, (5,), generator=generator("causal", 7)))
    assert torch.equal(state, torch.random.get_rng_state())


def test_difference_is_relative_and_nan_agrees_only_with_nan():
    big = torch.full((3, 2), 1000.0)
    assert difference(big, big + 0.05).same  # 5e-5 relative: float32 noise at this scale
    assert not difference(big, big + 1.0).same
    nan, one = torch.tensor([[float("nan")], [1.0]]), torch.tensor([[1.0], [1.0]])
    assert difference(nan, nan.clone()).same  # the same NaN twice: deterministic, for the finite check to report
    diff = difference(nan, one)
    assert not diff.same and math.isinf(diff.max_diff) and diff.positions == [[0]]
    assert "NaN or infinite" in str(diff)
    assert difference(one, one.clone()).finite and not diff.finite  # NaN on one side only decides nothing
    # NaN alike on both sides is left out and the finite rest judged; with no finite rest nothing is decided
    assert difference(nan, nan.clone()).finite and not difference(nan[:1], nan[:1].clone()).finite
    assert not difference(nan, torch.tensor([[float("nan")], [1.5]])).same


def test_one_outlying_feature_widens_only_its_own_bound():
    """A pad logit masked to -1e4 (or -inf) must not hide a difference in the other logits; small outputs
    (probabilities over a large vocabulary) are judged at their own scale."""
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    logits[:, 0] = -1e4
    moved = logits.clone()
    moved[1, 3] += 0.01
    diff = difference(logits, moved)
    assert not diff.same and diff.positions == [[1]] and abs(diff.max_diff - 0.01) < 1e-6
    assert difference(logits, logits + 1e-6).same  # float32 noise at the logits' own scale
    pad = logits.clone()
    pad[:, 0] = -1e4 * (1 + 1e-6)  # rounding of the outlier itself, at its scale
    assert difference(logits, pad).same
    logits[:, 0] = -math.inf  # non-finite alike on both sides: left out, the rest still judged
    moved[:, 0] = -math.inf
    diff = difference(logits, moved)
    assert diff.finite and not diff.same and diff.positions == [[1]]
    pooled = torch.tensor([1e9, 1.0, 2.0, 3.0])  # position_dims=0: each entry is its own feature
    assert not difference(pooled, pooled + torch.tensor([0.0, 0.01, 0.0, 0.0]), position_dims=0).same
    score = torch.tensor([-3e-4])  # a pooled score near 0 carries the rounding of its larger terms: the floor stays
    assert difference(score, score + 7.7e-8, position_dims=0).same
    per_position = torch.tensor([10.0, 0.001])  # one value a position: one feature, scaled across the positions
    assert difference(per_position, torch.tensor([10.0, 0.0012])).same
    assert difference(per_position, torch.tensor([10.0, 0.0012])) == difference(per_position[:, None],
                                                                               torch.tensor([[10.0], [0.0012]]))
    assert difference(torch.zeros(0, 3), torch.zeros(0, 3)).max_diff == 0  # no positions: nothing differs
    wide = torch.tensor([[1.0, -1e4]])
    assert TOLERANCE.bound(wide, wide) == pytest.approx(1e-5 + 1e-4 * 1e4)  # the widest entry's bound


def test_a_leak_shows_past_an_outlying_or_infinite_pad_logit_and_a_correct_model_still_passes():
    """Generation code often masks the pad logit with -1e4, -1e9 or -inf: one maximum over the whole output
    made the bound about 1 (a leaking decoder passed causal) or left every comparison out (-inf)."""
    def pad_logit(model, value):
        def call(ids):
            out = model(ids).clone()
            out[..., 0] = value
            return out
        return call

    def masked_slots(model, value):  # two thirds of a larger vocabulary masked: the median of the features with them
        def call(ids):
            out = model(ids)
            return torch.cat((out, out.new_full((*out.shape[:-1], 2 * out.shape[-1]), value)), dim=-1)
        return call

    def added_to_slots(model, value):  # Hugging Face style, logits + -1e4: no two masked values alike
        def call(ids):
            out = model(ids)
            return torch.cat((out, out.repeat(1, 1, 2) + value), dim=-1)
        return call

    cases = [(v, pad_logit) for v in (-1e4, -1e9, -math.inf)] + [(-1e9, masked_slots), (-1e4, added_to_slots)]
    for value, wrap in cases:
        leaky = run_checks(wrap(load_model(f"{TORCH_EXAMPLES}:torch_encoder_as_decoder"), value),
                           Contract("decoder"), seeds=2, only=["causal", "order-sensitivity"])
        assert leaky.results[0].status == "fail", (value, leaky.results[0])
        correct = run_checks(wrap(load_model(f"{TORCH_EXAMPLES}:torch_decoder"), value), Contract("decoder"),
                             seeds=2, only=["causal", "padding-invariance", "order-sensitivity", "mode"])
        assert [r.status for r in correct.results] == ["pass"] * 4, (value, correct.results)


def test_dropout_left_on_is_found_when_padding_positions_are_nan():
    """NaN at padding positions on both calls (a model whose loss ignores them) is left out of the comparison:
    mode fails and the comparing checks skip, instead of blaming masks for the noise."""
    model = load_model(f"{TORCH_EXAMPLES}:torch_decoder")

    def noisy(ids):
        out = torch.nn.functional.dropout(model(ids), 0.2, training=True)
        return torch.where((ids == 0)[..., None], math.nan, out)

    report = {r.name: r.status for r in run_checks(noisy, Contract("decoder"), seeds=2).results}
    assert report["mode"] == "fail" and report["causal"] == "skip" and report["padding-invariance"] == "skip"


def test_a_tally_leaves_out_comparisons_of_non_finite_outputs():
    nan, one = torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0])
    tally = Tally()
    assert not tally.judge(difference(nan, one, position_dims=0))  # NaN on one side only proves nothing
    assert not tally.judge(difference(nan[:1], nan[:1].clone(), position_dims=0))  # nor NaN agreeing with NaN
    assert tally.judge(difference(one, one + 0.5, position_dims=0))
    assert (tally.judged, tally.left_out, tally.worst) == (1, 2, 0.5)
    assert tally.note == "; 2 comparison(s) with non-finite outputs left out"


# --- the runner: modes, exceptions, evidence ------------------------------------------------------

def test_mode_is_restored_submodule_by_submodule():
    model = Tiny(causal=True).train()
    model.embed.eval()  # a mixed state, as after freezing part of a model
    report = run_checks(model, Contract("decoder"), seeds=1)
    assert not report.failed
    assert model.training and model.block.training and not model.embed.training


def test_checks_other_than_mode_run_in_eval_mode():
    # The controls have dropout: in train mode every comparison would fail.
    report = run_checks(Tiny(causal=True).train(), Contract("decoder"), seeds=2)
    assert not report.failed


def test_an_exception_inside_the_contract_is_a_failed_check_not_a_crash():
    def short_only(ids):
        if ids.shape[1] > 5:
            raise ValueError("no more than 5 tokens\n(second line)")
        return ids.float()

    report = run_checks(short_only, Contract("encoder", max_length=8), seeds=3)
    finite = report.result("finite-outputs")
    assert finite.failed and finite.summary.startswith("the model raised ValueError: no more than 5 tokens")
    assert "(second line)" in finite.evidence["exception"] and len(finite.evidence["input"]["ids"][0]) > 5
    assert finite.evidence["seed"] == 0


def test_an_exception_names_the_input_that_raised_it():
    positions = nn.Embedding(16, 4)  # a model built for 16 positions, checked with --max-length 100

    def overruns(ids):
        return positions(torch.arange(ids.shape[1]))[None].expand(ids.shape[0], -1, -1)

    finite = run_checks(overruns, Contract("encoder", max_length=100), seeds=1, only=["finite-outputs"]).results[0]
    assert finite.summary == ("the model raised IndexError: index out of range in self [ids are drawn below vocab "
                              "size 32 (--vocab-size), rows are up to max length 100 (--max-length) long: does the "
                              "model take both?] (seed 0; ids of shape (2, 100) with row lengths 100, 100)")


@pytest.mark.parametrize(("model", "message"), [
    (lambda ids: torch.zeros(3, 7), r"the checks cannot use the model's output: the output has shape \(3, 7\), but "
                                    r"the batch has 2 rows \(ids of shape \(2, 2\) with row lengths 2, 2\)"),
    (lambda ids: "logits", "the checks cannot use the model's output: the model returned str; expected a tensor"),
    (lambda ids: torch.polar(torch.ones(*ids.shape, 4), ids[..., None].float()),  # the imaginary part was dropped
     r"the output is complex \(torch.complex64\); the checks compare real numbers"),
    (lambda ids: torch.zeros(*ids.shape, 0), r"the output has shape \(2, 2, 0\): it holds no values"),  # passed all
    # A [CLS] put in front inside the model: it failed two checks as a "pooled" output, with a message that said
    # the position axis may change while showing only that axis changing.
    (lambda ids: torch.cat((torch.zeros(ids.shape[0], 1), ids.float()), 1)[..., None].expand(-1, -1, 4),
     r"the output has 1 position\(s\) more than the input \(shapes \(2, 3, 4\), \(2, 4, 4\) for inputs of 2 and 3 "
     r"positions\): a token added inside the model \(a \[CLS\] in front\?\)"),
    (lambda ids: ids[:, 1:].float(), r"the output has 1 position\(s\) fewer than the input"),
])
def test_an_output_no_check_can_use_is_one_error_not_a_failure_in_every_check(model, message):
    with pytest.raises(AttnlabError, match=message):
        run_checks(model, Contract("encoder"), seeds=1)


@pytest.mark.parametrize(("model", "message"), [
    # (batch, seq, seq): the last axis follows the width, so a row alone and padded cannot be compared
    (lambda ids: (ids + torch.arange(ids.shape[1])).float()[..., None].expand(-1, -1, ids.shape[1]),
     "one row's outputs have shapes"),
    # (batch, 2 x width + 1): taken as pooled, whose size may not change (the message said the position axis may)
    (lambda ids: torch.cat((ids, ids, ids[:, :1]), 1).float() * torch.arange(2 * ids.shape[1] + 1),
     r"one row's outputs have shapes \(\d+,\) and \(\d+,\) in two calls; the output does not follow the input's "
     r"length, so it is taken as pooled"),
])
def test_an_output_the_checks_cannot_use_is_reported_as_such_not_as_a_model_exception(model, message):
    report = run_checks(model, Contract("encoder"), seeds=1)
    assert report.result("padding-invariance").failed  # compares a row alone with it padded: every case fails it
    for result in (r for r in report.results if r.failed):
        assert re.match(message, result.summary), result.summary
        assert "the model raised" not in result.summary and "exception" not in result.evidence
        assert "output_error" in result.evidence and result.evidence["input"]


def test_a_type_error_the_model_raises_is_still_the_model_s():
    def raises_type_error(ids):
        raise TypeError("forward() missing 1 required positional argument: 'mask'")

    result = run_checks(raises_type_error, Contract("encoder"), seeds=1, only=["finite-outputs"]).results[0]
    assert result.summary.startswith("the model raised TypeError: forward() missing 1 required")
    assert "output_error" not in result.evidence


def test_a_model_that_calls_sys_exit_is_a_failed_check_not_the_end_of_the_run():
    def exits(ids):
        sys.exit(3)

    report = run_checks(exits, Contract("encoder"), seeds=1)
    assert report.result("finite-outputs").summary.startswith("the model raised SystemExit: 3 (seed 0;")
    assert report.failed and len(report.results) == len(CHECKS)


def test_trouble_in_the_check_itself_is_not_blamed_on_the_model(monkeypatch):
    def broken_check(mut, seeds):
        raise ValueError("an attnlab bug")

    monkeypatch.setitem(CHECKS, "causal", broken_check)
    result = run_checks(Tiny(causal=True), Contract("decoder"), seeds=1, only=["causal"]).results[0]
    assert result.failed and result.summary == "the check stopped on ValueError: an attnlab bug"
    assert "exception" not in result.evidence


def test_outputs_that_are_all_nan_skip_every_comparison_and_fail_the_finite_check():
    def all_nan(ids):
        return torch.full((*ids.shape, 3), float("nan"))

    report = run_checks(all_nan, Contract("decoder"), seeds=2)
    assert report.result("finite-outputs").failed and report.failed
    for name in ("causal", "padding-invariance", "padding-content", "batch-independence", "order-sensitivity",
                 "mode"):
        result = report.result(name)
        assert result.status == "skip" and result.summary == NOT_FINITE, (name, result.summary)


def test_evidence_names_a_seed_that_reproduces_the_failure():
    model = Tiny(causal=True, bug="causal_dropped")
    first = run_checks(model, Contract("decoder"), seeds=[4, 5], only=["causal"]).results[0]
    again = run_checks(model, Contract("decoder"), seeds=[first.evidence["seed"]], only=["causal"]).results[0]
    assert first.failed and first.evidence == again.evidence
    json.dumps(first.as_dict(), allow_nan=False)


def test_no_pad_id_skips_the_padding_checks():
    report = run_checks(Tiny(causal=True), Contract("decoder", pad_id=None), seeds=2)
    assert report.result("padding-invariance").status == "skip"
    assert report.result("padding-content").status == "skip"
    assert not report.failed


def test_all_padding_rows_are_fed_only_when_the_contract_allows_them():
    def nan_on_empty_rows(ids):  # (batch, seq) -> (batch, seq): NaN on rows without a real token
        return torch.where((ids != 0).any(1, keepdim=True), ids.float(), float("nan"))

    allowed = run_checks(nan_on_empty_rows, Contract("encoder"), seeds=1, only=["finite-outputs"]).results[0]
    assert allowed.failed and allowed.evidence["rows"] == ["all-padding row"]
    refused = run_checks(nan_on_empty_rows, Contract("encoder", empty_rows=False), seeds=3, only=["finite-outputs"])
    assert refused.results[0].status == "pass"


def test_nan_on_real_tokens_names_the_inverted_padding_mask_that_usually_causes_it():
    """A decoder whose padding mask is inverted attends to padding only: its first query sees no key at all."""
    def inverted_padding(ids):  # (batch, seq) -> (batch, seq, seq): attention weights
        t = ids.shape[1]
        attend = torch.ones(t, t).tril().bool() & (ids == 0)[:, None, :]
        return torch.zeros(ids.shape[0], t, t).masked_fill(~attend, float("-inf")).softmax(-1)

    nan = run_checks(inverted_padding, Contract("decoder"), seeds=1, only=["finite-outputs"]).results[0]
    assert nan.failed and "NaN is what softmax gives a query whose every key is masked" in nan.summary
    inf = run_checks(lambda ids: (ids.float() + 1) / 0, Contract("decoder"), seeds=1, only=["finite-outputs"]).results[0]
    assert inf.failed and "softmax" not in inf.summary  # infinities only: another cause, no hint
    on_padding = run_checks(lambda ids: torch.where(ids == 0, float("nan"), ids.float()), Contract("decoder"), seeds=1,
                            only=["finite-outputs"]).results[0]
    assert on_padding.failed and "softmax" not in on_padding.summary  # no real token's output lost: no hint


def test_a_tiny_vocabulary_still_gives_reorderings():
    report = run_checks(Tiny(causal=True), Contract("decoder", vocab_size=4, max_length=12), seeds=5)
    assert not report.failed


def test_a_model_without_dropout_is_a_note_not_a_failure():
    result = assert_mode(DecoderLM(32, 16, 1, 2, max_positions=16, dropout=0.0), kind="decoder", seeds=2)
    assert result.status == "note" and "no dropout" in result.summary


# --- the assert_* functions ------------------------------------------------------------------------

def test_assert_functions_pass_quietly_on_a_correct_model():
    encoder, decoder = Tiny(), Tiny(causal=True)
    assert assert_causal(decoder, seeds=2).status == "pass"
    for check in (assert_padding_invariant, assert_padding_content_ignored, assert_batch_independent,
                  assert_order_sensitive, assert_finite, assert_mode, assert_inference_path):
        assert check(encoder, kind="encoder", seeds=2).status == "pass"
    assert len(assert_all_checks(decoder, kind="decoder", seeds=2)) == len(CHECKS) == 9


def test_assert_causal_raises_with_the_evidence():
    with pytest.raises(AssertionError) as info:
        assert_causal(Tiny(causal=True, bug="causal_dropped"), seeds=2)
    message = str(info.value)
    assert message.startswith("causal: fail: seed 0: changing tokens after position 0")
    for evidence in ("seed: 0", "input: [", "changed_input: [", "positions: [0", "max_diff: ", "tolerance: "):
        assert evidence in message


def test_assert_all_checks_lists_every_failure():
    with pytest.raises(AssertionError, match=r"check\(s\) failed:\n") as info:
        assert_all_checks(Tiny(bug="no_positions"), kind="encoder", seeds=2, vocab_size=32)
    assert "order-sensitivity: fail" in str(info.value) and "causal" not in str(info.value)


# --- no false alarms: correct models over 20 seeds -------------------------------------------------

def own_models():
    torch.manual_seed(0)
    return {
        "EncoderClassifier": (EncoderClassifier(32, 3, 16, 2, 2, 32, max_positions=16), "encoder"),
        "DecoderLM": (DecoderLM(32, 16, 2, 2, max_positions=16, dropout=0.1, pad_id=0), "decoder"),
        "Transformer": (Transformer(32, 40, 16, 2, 2, 32, max_src_positions=16, max_tgt_positions=16), "seq2seq"),
    }


EXTERNAL = [
    (TORCH_EXAMPLES, "torch_encoder", "encoder"),
    (TORCH_EXAMPLES, "torch_decoder", "decoder"),
    (TORCH_EXAMPLES, "torch_seq2seq", "seq2seq"),
    (TORCH_EXAMPLES, "torch_encoder_fixed_length", "encoder"),  # the fast path zero-fills its padded positions
    (HF_EXAMPLES, "hf_bert", "encoder"),
    (HF_EXAMPLES, "hf_gpt2", "decoder"),
    (HF_EXAMPLES, "hf_t5", "seq2seq"),
]

#: The same external models used wrongly, and a check that must say so.
WRONG = [
    (TORCH_EXAMPLES, "torch_encoder_as_decoder", "decoder", "causal"),
    (TORCH_EXAMPLES, "torch_encoder_without_padding_mask", "encoder", "padding-invariance"),
    (TORCH_EXAMPLES, "torch_seq2seq_without_look_ahead", "seq2seq", "causal"),
    (TORCH_EXAMPLES, "torch_decoder_hide_mask_added", "decoder", "causal"),
    (TORCH_EXAMPLES, "torch_decoder_hide_mask_added", "decoder", "inference-path"),
    (TORCH_EXAMPLES, "torch_encoder_fixed_length_padding_mask_added", "encoder", "inference-path"),
    (HF_EXAMPLES, "hf_bert_mask_inverted", "encoder", "padding-invariance"),
    (HF_EXAMPLES, "hf_t5_without_source_mask", "seq2seq", "padding-invariance"),
]


#: Models without a key/value cache the kv-cache check can drive (it skips them).
UNCACHED = {"torch_decoder", "torch_seq2seq"}


def assert_clean(report, *, cached=True):
    assert not report.failed, "\n".join(r.describe() for r in report.results if r.failed)
    expected_skips = {"causal", "kv-cache"} if report.contract.kind == "encoder" else set() if cached else {"kv-cache"}
    assert {r.name for r in report.results if r.status == "skip"} == expected_skips
    assert len(report.seeds) >= 20


@pytest.mark.parametrize("name", ["EncoderClassifier", "DecoderLM", "Transformer"])
def test_attnlab_models_pass_every_check_over_20_seeds(name):
    model, kind = own_models()[name]
    report = run_checks(model, Contract(kind), seeds=20)
    assert_clean(report)
    assert report.output == ("pooled" if name == "EncoderClassifier" else "per-position")
    assert report.result("mode").status == "pass"  # all three have dropout


@pytest.mark.parametrize(("path", "factory", "kind"), EXTERNAL, ids=[f for _, f, _ in EXTERNAL])
def test_external_models_pass_every_check_over_20_seeds(path, factory, kind):
    if path == HF_EXAMPLES:
        pytest.importorskip("transformers")
    model = load_model(f"{path}:{factory}")
    was_training = model.training
    assert_clean(run_checks(model, Contract(kind), seeds=20), cached=factory not in UNCACHED)
    assert model.training == was_training


@pytest.mark.parametrize(("path", "factory", "kind", "check"), WRONG, ids=[f"{f}-{c}" for _, f, _, c in WRONG])
def test_external_models_used_wrongly_fail(path, factory, kind, check):
    if path == HF_EXAMPLES:
        pytest.importorskip("transformers")
    report = run_checks(load_model(f"{path}:{factory}"), Contract(kind), seeds=3)
    assert report.result(check).failed and "exception" not in report.result(check).evidence


# --- the command line ------------------------------------------------------------------------------

def invoke(*args):
    return CliRunner().invoke(cli, ["check", *map(str, args)], catch_exceptions=False)


@pytest.mark.parametrize(("path", "factory", "kind"), EXTERNAL, ids=[f for _, f, _ in EXTERNAL])
def test_cli_checks_each_external_model_as_json(path, factory, kind):
    if path == HF_EXAMPLES:
        pytest.importorskip("transformers")
    result = invoke(f"{path}:{factory}", "--kind", kind, "--seeds", 2, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # one JSON object, nothing else on stdout
    assert report["passed"] and report["contract"]["kind"] == kind and report["seeds"] == 2
    assert [c["name"] for c in report["checks"]] == [
        "causal", "padding-invariance", "padding-content", "batch-independence", "order-sensitivity",
        "finite-outputs", "mode", "inference-path", "kv-cache"]


@pytest.mark.parametrize(("path", "factory", "kind", "check"), WRONG, ids=[f"{f}-{c}" for _, f, _, c in WRONG])
def test_cli_exits_1_on_models_used_wrongly(path, factory, kind, check):
    if path == HF_EXAMPLES:
        pytest.importorskip("transformers")
    result = invoke(f"{path}:{factory}", "--kind", kind, "--seeds", 2, "--json")
    assert result.exit_code == 1
    statuses = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert statuses[check] == "fail"


def test_cli_prints_a_table_with_evidence():
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder_as_decoder", "--kind", "decoder", "--seeds", 1)
    assert result.exit_code == 1
    out = " ".join(result.stdout.split())
    assert "causal" in out and "FAIL" in out and "changing tokens after position 0" in out
    assert "checks:" in out and "failed" in out and "1 seed)" in out


def test_cli_reads_a_package_module_spec(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "from attnlab.nn import DecoderLM\n"
        "def lm():\n    return DecoderLM(32, 16, 1, 2, max_positions=16, dropout=0.1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("my_models:lm", "--kind", "decoder", "--seeds", 1, "--pad-id", "none", "--json")
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks["padding-invariance"] == "skip" and checks["causal"] == "pass"


def test_an_exception_in_the_layout_probe_is_quoted_without_a_seed_it_did_not_use():
    def no_rows_of_3(ids):
        assert ids.shape[1] != 3, "no rows of 3"
        return ids.float()

    report = run_checks(no_rows_of_3, Contract("decoder", pad_id=None), seeds=1, only=["causal", "mode"])
    for result in report.results:
        assert result.status == "fail" and result.evidence["seed"] is None
        assert result.summary == ("the model raised AssertionError: no rows of 3 (ids of shape (2, 3) with row "
                                  "lengths 3, 3, the output-layout probe, the same for every seed)")


def test_a_spec_may_name_a_model_built_at_module_level(tmp_path):
    """``model = GPT(config)`` at module level is checked as it is: called without its ids as a factory, it would
    fail with a TypeError about a missing argument that blames the model."""
    (tmp_path / "built.py").write_text(
        "import torch\nfrom attnlab.nn import DecoderLM\ntorch.manual_seed(0)\n"
        "model = DecoderLM(32, 16, 1, 2, max_positions=16, dropout=0.1)\n")
    result = invoke(f"{tmp_path / 'built.py'}:model", "--kind", "decoder", "--seeds", 1, "--pad-id", "none", "--json")
    assert result.exit_code == 0, result.output
    assert {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}["causal"] == "pass"


@pytest.mark.parametrize(("source", "spec", "message"), [
    (None, "{dir}/missing.py:factory", "no such file: .*missing.py"),
    ("x = 1\n", "{file}:factory", "has no factory 'factory'"),
    # Only what the file defines is listed, not torch and everything else it imports.
    ("import torch\nfrom torch import nn\ndef lm():\n    pass\nclass Net(nn.Module):\n    pass\n", "{file}:factory",
     r"has no factory 'factory' \(the functions and classes it defines: Net, lm\)$"),
    (None, "{dir}:factory", "is a folder: give a run folder alone"),
    ("def factory():\n    raise RuntimeError('no weights')\n", "{file}:factory",
     "factory .* raised RuntimeError: no weights"),
    ("import not_a_module_anywhere\n", "{file}:factory", "importing .* failed: ModuleNotFoundError"),
    ("def factory():\n    return 3\n", "{file}:factory", "returned an int, which cannot be called"),
    ("def factory():\n    return None\n", "{file}:factory", "returned None, which cannot be called"),
    ("x = 1\n", "{file}:x", "is an int, not a factory function"),
    ("import sys\nsys.exit(3)\n", "{file}:factory", "importing .* failed: SystemExit: 3$"),
    ("import sys\nsys.exit()\n", "{file}:factory", "importing .* failed: SystemExit$"),
    ("def factory():\n    raise SystemExit('no GPU here')\n", "{file}:factory", "factory .* raised SystemExit: no GPU"),
    ("import warnings\ndef factory():\n    warnings.warn('old')\n    raise RuntimeError('no weights')\n",
     "{file}:factory", "factory .* raised RuntimeError: no weights"),  # and no warning line after the error
    (None, "no_such_package.models:factory", "no such module: no_such_package.models .*path/to/file.py:factory"),
    (None, "no_colon_here", "is neither a run folder nor path/to/file.py:factory"),
])
def test_cli_bad_spec_is_one_error_line_and_exit_2(tmp_path, source, spec, message):
    file = tmp_path / "factories.py"
    if source is not None:
        file.write_text(source)
    result = invoke(spec.format(dir=tmp_path, file=file), "--kind", "encoder")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert re.search(message, lines[0]), lines[0]


def test_a_factory_interrupted_by_ctrl_c_is_not_reported_as_an_error(tmp_path):
    (tmp_path / "f.py").write_text("def factory():\n    raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_model(f"{tmp_path / 'f.py'}:factory")


def test_cli_finds_a_module_in_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "cwd_models.py").write_text(
        "from attnlab.nn import DecoderLM\n"
        "def lm():\n    return DecoderLM(32, 16, 1, 2, max_positions=16, dropout=0.1)\n")
    (tmp_path / "cwd_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    # The test runner puts its own folder on the path; a console script does not, so neither may this test.
    here = {"", os.getcwd(), str(tmp_path)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    for name in ("cwd_models", "cwd_exits"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    result = invoke("cwd_models:lm", "--kind", "decoder", "--seeds", 1, "--pad-id", "none", "--json")
    assert result.exit_code == 0, result.output
    result = invoke("cwd_exits:factory", "--kind", "decoder")
    assert result.exit_code == 2 and result.stderr == "error: importing cwd_exits failed: SystemExit: 3\n"


def test_cli_collects_warnings_and_prints_each_once_after_the_report(tmp_path):
    (tmp_path / "noisy.py").write_text(
        "import warnings\n"
        "import torch\n"
        "warnings.filterwarnings('ignore', message='quiet')  # the user's own filter still holds\n"
        "def model(ids):\n"
        "    warnings.warn('slow path taken')\n"
        "    warnings.warn('quiet please')\n"
        "    return torch.nn.functional.one_hot(ids, 32).float()\n"
        "def factory():\n"
        "    warnings.warn('factory is old', DeprecationWarning)\n"
        "    return model\n")
    result = invoke(f"{tmp_path / 'noisy.py'}:factory", "--kind", "decoder", "--seeds", 2, "--json")
    json.loads(result.stdout)  # stdout is the report alone
    assert result.stderr.splitlines() == ["warning: DeprecationWarning: factory is old",
                                          "warning: UserWarning: slow path taken"]


def test_cli_rejects_a_bad_pad_id():
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder", "--kind", "encoder", "--pad-id", "zero")
    assert result.exit_code == 2 and "not an integer or 'none'" in result.output


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--vocab-size", 0, "Invalid value for '--vocab-size': 0 is not in the range 4<=x<=2147483647."),
    ("--max-length", 2, "Invalid value for '--max-length': 2 is not in the range x>=3."),
    ("--pad-id", 40, "Invalid value for '--pad-id': 40 is outside the vocabulary 0..31 (--vocab-size 32)"),
])
def test_cli_option_out_of_range_is_one_error_line_naming_the_option(option, value, message):
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder", "--kind", "encoder", option, value)
    assert result.exit_code == 2
    assert result.stderr.endswith(" check --help')\n") and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {message} (see '")


def test_cli_exits_1_when_outputs_are_nan_though_the_comparisons_skip(tmp_path):
    (tmp_path / "nan.py").write_text("import torch\n"
                                     "def factory():\n    return lambda ids: torch.full(ids.shape, float('nan'))\n")
    result = invoke(f"{tmp_path / 'nan.py'}:factory", "--kind", "encoder", "--seeds", 1, "--json")
    assert result.exit_code == 1
    statuses = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert statuses == {"causal": "skip", "padding-invariance": "skip", "padding-content": "skip",
                        "batch-independence": "skip", "order-sensitivity": "skip", "finite-outputs": "fail",
                        "mode": "skip", "inference-path": "skip", "kv-cache": "skip"}


def test_plain_callables_are_checked_without_switching_modes():
    linear = nn.Linear(1, 1)

    def model(ids):  # a closure: the tool cannot reach the module inside
        return linear(ids.float()[..., None])

    result = assert_mode(model, kind="encoder", seeds=1)
    assert result.status == "pass" and "not an nn.Module" in result.summary


def test_printing_a_report_shows_the_table_and_the_tally():
    report = run_checks(Tiny(causal=True), Contract("decoder", vocab_size=4, max_length=12), seeds=1)
    text = str(report)
    assert text.startswith("attnlab check (decoder") and "causal" in text and "PASS" in text
    assert text.splitlines()[-1] == report.footer() and "CheckReport(" not in text


def test_evidence_with_square_brackets_prints_as_text_not_markup(tmp_path):
    (tmp_path / "brackets.py").write_text(
        "def factory():\n"
        "    def model(ids):\n"
        "        raise ValueError('mask must be [batch, keys]; got [/b] and [bold]x[/bold]')\n"
        "    return model\n")
    result = invoke(f"{tmp_path / 'brackets.py'}:factory", "--kind", "decoder", "--seeds", 1)
    assert result.exit_code == 1  # a failed report, not a crash of the table
    out = "".join(result.stdout.split())  # the table folds long cells over lines
    assert "[batch,keys];got[/b]and[bold]x[/bold]" in out


def test_run_checks_refuses_a_contract_that_is_not_one_and_a_model_that_cannot_be_called():
    with pytest.raises(TypeError, match=r"contract must be an attnlab.checks.Contract, e.g. Contract\('decoder'\)"):
        run_checks(Tiny(causal=True), "decoder")
    with pytest.raises(TypeError, match="model must be callable"):
        run_checks(None, Contract("decoder"))


def test_cli_refuses_a_vocabulary_too_large_to_draw_ids_from():
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder", "--kind", "encoder", "--vocab-size", 10**20)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: Invalid value for '--vocab-size'")
    with pytest.raises(AttnlabError, match="vocab size must be between 4 and"):
        Contract("encoder", vocab_size=10**20)


def test_a_spec_file_imports_its_neighbours_and_its_prints_stay_off_stdout(tmp_path):
    (tmp_path / "neighbour.py").write_text("import torch\nSCALE = 2.0\n")
    (tmp_path / "model.py").write_text(
        "import torch\n"
        "from neighbour import SCALE\n"  # as `python model.py` would find it
        "def factory():\n"
        "    print('building the model')\n"
        "    def model(ids):\n"
        "        print('called')\n"
        "        return SCALE * torch.nn.functional.one_hot(ids, 32).float().cumsum(1)\n"
        "    return model\n")
    result = invoke(f"{tmp_path / 'model.py'}:factory", "--kind", "decoder", "--seeds", 1, "--json")
    report = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert report["checks"][0]["name"] == "causal" and report["checks"][0]["status"] == "pass"
    assert "building the model" in result.stderr and "called" in result.stderr


def test_cli_missing_kind_is_one_error_line():
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "Missing option '--kind'" in result.stderr and "encoder, decoder, seq2seq" in result.stderr


def test_failures_hint_at_the_option_that_usually_explains_them():
    def nan_on_empty_rows(ids):
        out = torch.nn.functional.one_hot(ids, 32).float().cumsum(1)
        empty = (ids == 0).all(1)
        return torch.where(empty[:, None, None], torch.full_like(out, float("nan")), out)

    finite = run_checks(nan_on_empty_rows, Contract("decoder"), seeds=1, only=["finite-outputs"]).results[0]
    assert finite.failed and "--no-empty-rows" in finite.summary
    without_empty = run_checks(nan_on_empty_rows, Contract("decoder", empty_rows=False), seeds=1, only=["finite-outputs"])
    assert without_empty.results[0].status == "pass"
    small_table = torch.nn.Embedding(10, 4)  # ids up to 31 are drawn: an IndexError
    raised = run_checks(small_table, Contract("encoder"), seeds=1, only=["padding-invariance"]).results[0]
    assert raised.failed and "IndexError" in raised.summary and "vocab size 32 (--vocab-size)" in raised.summary


def test_the_checks_run_the_training_path_even_when_the_model_is_frozen_or_calls_no_grad_itself():
    """torch takes its fast path whenever nothing needs a gradient; the checks switch it off instead."""
    frozen = load_model(f"{TORCH_EXAMPLES}:torch_decoder_hide_mask_added").requires_grad_(False)
    inner = load_model(f"{TORCH_EXAMPLES}:torch_decoder_hide_mask_added")

    def no_grad_inside(ids):
        with torch.no_grad():
            return inner(ids)

    for model in (frozen, no_grad_inside):
        report = run_checks(model, Contract("decoder"), seeds=2, only=["causal", "inference-path"])
        assert [r.status for r in report.results] == ["fail", "fail"], report


def test_a_leak_only_at_lengths_between_the_short_and_the_longest_rows_fails_causal():
    """Chunked attention whose partial last chunk reads ahead leaks only at some lengths past 8: rows of a width
    between the short ones (2..8) and the longest are checked too."""
    def chunked(ids):
        out = torch.cumsum(ids.float(), dim=1)[..., None]  # causal: a running sum
        if 8 < ids.shape[1] < 16:
            out[:, :-1] += ids[:, 1:, None].float()  # the future, at these lengths only
        return out

    result = run_checks(chunked, Contract("decoder", max_length=16), seeds=1, only=["causal"]).results[0]
    assert result.status == "fail" and 8 < len(result.evidence["input"]) < 16, result


def test_a_model_that_edits_its_ids_in_place_changes_no_input_the_checks_compare_or_report():
    def remaps(ids):
        out = torch.cumsum(ids.float(), dim=1)[..., None]
        ids[ids == 3] = 0  # e.g. a pad id remapped in place
        return out

    ids = torch.tensor([[3, 1, 3]])
    ModelUnderTest(remaps, Contract("decoder", pad_id=3))(ids)
    assert ids.tolist() == [[3, 1, 3]]
    assert not run_checks(remaps, Contract("decoder", pad_id=None), seeds=2, only=["causal"]).failed


def test_a_failed_padding_check_names_the_mask_parameter_the_checks_never_pass():
    inner = load_model(f"{TORCH_EXAMPLES}:torch_encoder_without_padding_mask")

    class TakesMask(nn.Module):  # Hugging Face style: the caller gives the mask, and the checks call model(ids)
        def forward(self, input_ids, attention_mask=None):
            return inner(input_ids)

    told = run_checks(TakesMask(), Contract("encoder"), seeds=1, only=["padding-invariance"]).results[0]
    assert told.status == "fail" and "the model takes attention_mask, which the checks never pass" in told.summary
    plain = run_checks(inner, Contract("encoder"), seeds=1, only=["padding-invariance"]).results[0]
    assert plain.status == "fail" and "never pass" not in plain.summary

    class Flags(nn.Module):  # flags and masks of another kind are no padding mask
        def forward(self, ids, mask_future=False, mask_token_id=4, head_mask=None, encoder_attention_mask=None):
            return inner(ids)

    flags = run_checks(Flags(), Contract("encoder"), seeds=1, only=["padding-invariance"]).results[0]
    assert flags.status == "fail" and "never pass" not in flags.summary
    from attnlab.checks.calling import unpassed_mask_parameters

    def seq2seq(src, tgt, memory_key_padding_mask=None, tgt_key_padding_mask=None, decoder_head_mask=None):
        return tgt.float()

    assert unpassed_mask_parameters(seq2seq) == ["tgt_key_padding_mask"]  # a cross-attention's is no encoder's
    assert unpassed_mask_parameters(seq2seq, seq2seq=True) == ["memory_key_padding_mask", "tgt_key_padding_mask"]


def test_a_frozen_torchscript_model_is_checked_and_meta_weights_are_one_error():
    import warnings

    model = nn.Sequential(nn.Embedding(32, 8), nn.Dropout(0.1), nn.Linear(8, 4)).eval()  # per position: no mixing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated, and still in use
        frozen = torch.jit.freeze(torch.jit.script(model))
    assert not hasattr(frozen, "training")  # what made mode() raise AttributeError
    report = run_checks(frozen, Contract("encoder"), seeds=2, only=["padding-invariance", "batch-independence", "mode"])
    assert [r.status for r in report.results] == ["pass", "pass", "note"], report.results  # frozen: dropout gone
    assert not hasattr(frozen, "training")  # left as it was
    with torch.device("meta"):
        unloaded = DecoderLM(20, 8, 1, 2).eval()
    with pytest.raises(AttnlabError, match="meta tensor.*weights still on the meta device, never loaded"):
        run_checks(unloaded, Contract("decoder", vocab_size=20), seeds=1)


def test_an_inference_only_wrapper_is_checked_without_gradients():
    model = load_model(f"{TORCH_EXAMPLES}:torch_encoder")
    as_numpy = lambda ids: torch.from_numpy(model(ids).numpy())  # noqa: E731 - fails on a tensor needing grad
    assert not run_checks(as_numpy, Contract("encoder"), seeds=2).failed


def test_half_precision_kernels_are_compared_at_their_own_precision_and_nothing_else_is():
    model = load_model(f"{TORCH_EXAMPLES}:torch_decoder").to(torch.bfloat16)
    path = run_checks(model, Contract("decoder"), seeds=3, only=["inference-path"]).results[0]
    assert path.status == "pass", path  # fast path against training path: bfloat16 rounding only
    one_ulp = torch.tensor([1.5, -2.0]).to(torch.bfloat16), torch.tensor([1.5078125, -2.0]).to(torch.bfloat16)
    assert difference(*one_ulp, tolerance=TOLERANCE.for_kernels(torch.bfloat16)).same
    assert not difference(*one_ulp).same  # the other checks keep 1e-4: a small leak in bfloat16 still shows
    assert TOLERANCE.for_kernels(torch.float32) == TOLERANCE


def test_the_fast_path_flag_is_restored_after_the_checks_even_when_the_model_raises():
    def raises(ids):
        assert not torch.backends.mha.get_fastpath_enabled()  # the training path while a check runs
        raise RuntimeError("boom")

    for before in (True, False):
        torch.backends.mha.set_fastpath_enabled(before)
        try:
            assert run_checks(raises, Contract("decoder"), seeds=1, only=["causal"]).failed
            assert torch.backends.mha.get_fastpath_enabled() is before
        finally:
            torch.backends.mha.set_fastpath_enabled(True)


def test_a_usage_error_keeps_the_users_own_text():
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder", "--kind", "encoder", "--seeds", "a  b")
    assert result.exit_code == 2 and "'a  b' is not a valid integer" in result.stderr


def test_a_constant_output_is_not_reported_as_permuted():
    def constant(ids):
        return torch.ones(*ids.shape, 4)

    result = run_checks(constant, Contract("encoder"), seeds=1, only=["order-sensitivity"]).results[0]
    assert result.failed and "the output is the same at every position and did not change" in result.summary


def test_a_model_random_in_eval_mode_is_blamed_on_its_mode_not_on_masks():
    """Noise in eval mode makes any two calls differ: the comparing checks skip and name mode, which fails."""
    torch.manual_seed(0)
    lm = DecoderLM(32, 16, 1, 2, max_positions=16, pad_id=0).eval()

    def noisy(ids):
        return torch.nn.functional.dropout(lm(ids), 0.3, training=True)

    report = run_checks(noisy, Contract("decoder"), seeds=2)
    status = {r.name: r.status for r in report.results}
    assert status["mode"] == "fail" and status["finite-outputs"] == "pass"
    for name in ("causal", "padding-invariance", "padding-content", "batch-independence", "inference-path"):
        assert status[name] == "skip", (name, status)
        assert "eval mode gave one input two different outputs" in report.result(name).summary
    alone = run_checks(noisy, Contract("decoder"), seeds=2, only=["causal"])  # without mode to say why
    assert alone.results[0].status == "fail" and "see mode" in alone.results[0].summary
    assert not run_checks(lm, Contract("decoder"), seeds=2).failed  # the same model without the noise


@pytest.mark.filterwarnings("ignore:std\\(\\)")  # the 0/0 the model under test is built to make
def test_a_model_that_fails_only_past_the_short_rows_or_alone_in_its_batch_is_caught():
    torch.manual_seed(0)
    lm = DecoderLM(32, 16, 1, 2, max_positions=16, pad_id=0).eval()

    def long_leak(ids):  # the look-ahead mask is dropped for rows longer than 8 (the checks' short rows)
        return lm(ids) if ids.shape[1] <= 8 else lm.lm_head(lm.body(ids)[0])  # the stack with no mask at all

    report = run_checks(long_leak, Contract("decoder", max_length=16), seeds=1, only=["causal", "padding-invariance"])
    assert [r.status for r in report.results] == ["fail", "fail"], report.results

    def batch_std(ids):  # NaN for a batch of one (an unbiased std over one row)
        return lm(ids) * (ids.float().std(0, keepdim=True)[..., None] * 0 + 1)

    finite = run_checks(batch_std, Contract("decoder"), seeds=1, only=["finite-outputs"]).results[0]
    assert finite.status == "fail" and "row alone" in finite.summary


def test_ids_are_drawn_from_a_vocabulary_of_any_size_without_a_table_of_it():
    from attnlab.checks.inputs import distinct_tokens, generator, other_tokens, random_tokens

    huge = Contract("decoder", vocab_size=2**31 - 1, pad_id=5)
    gen = generator("test", 0)
    ids = random_tokens(gen, huge, 4, 6)
    assert ids.shape == (4, 6) and not (ids == 5).any() and int(ids.max()) < 2**31 - 1
    distinct = distinct_tokens(gen, huge, 12)
    assert len(set(distinct.tolist())) == 12 and 5 not in distinct.tolist()
    other = other_tokens(gen, huge, ids)
    assert not (other == ids).any() and not (other == 5).any()
    small = Contract("decoder", vocab_size=4, pad_id=1)  # real ids 0, 2, 3: every draw stays among them
    draws = torch.cat([random_tokens(gen, small, 50), other_tokens(gen, small, torch.tensor([0, 2, 3] * 10)),
                       distinct_tokens(gen, small, 7)])
    assert set(draws.tolist()) == {0, 2, 3}


def test_only_takes_one_name_as_a_name_and_refuses_an_empty_selection():
    lm = DecoderLM(20, 8, 1, 2).eval()
    report = run_checks(lm, Contract("decoder", vocab_size=20), seeds=1, only="causal")  # was: unknown check 'c'
    assert [r.name for r in report.results] == ["causal"] and not report.failed
    with pytest.raises(AttnlabError, match="only names no check"):  # was: a passing report of 0 checks
        run_checks(lm, Contract("decoder", vocab_size=20), seeds=1, only=[])


def test_a_model_that_requires_a_keyword_only_mask_is_one_error_line_that_says_what_to_pass():
    """Python says "missing 1 required keyword-only argument": every check failed on it, blaming the model."""
    lm = DecoderLM(20, 8, 1, 2).eval()

    class NeedsMask(nn.Module):
        def forward(self, ids, *, attend_mask):
            return lm(ids)

    with pytest.raises(AttnlabError, match=r"^the model cannot be called as a decoder is, model\(ids\): TypeError: "
                                           r".*missing 1 required keyword-only argument: 'attend_mask'; the checks pass "
                                           r"ids alone: give a factory whose model builds its masks from the ids"):
        run_checks(NeedsMask(), Contract("decoder", vocab_size=20), seeds=1)


def test_a_model_of_another_kind_is_told_to_check_its_kind():
    seq2seq = Transformer(20, 20, 8, 1, 2, 16).eval()
    with pytest.raises(AttnlabError, match=r"^the model cannot be called as a decoder is, model\(ids\): TypeError: "
                                           r"Transformer.forward\(\) missing 1 required positional argument: 'tgt'; "
                                           r"is --kind right\?$"):
        run_checks(seq2seq, Contract("decoder", vocab_size=20), seeds=1, only=["causal"])
    with pytest.raises(AttnlabError, match=r"missing 1 required positional argument: 'tgt'; is --kind right\?$"):
        run_checks(nn.DataParallel(seq2seq), Contract("decoder", vocab_size=20), seeds=1)  # torch's wrappers pass it on

    class NoGrad(Transformer):  # and so do torch's decorators
        @torch.no_grad()
        def forward(self, src, tgt):
            return super().forward(src, tgt)

    with pytest.raises(AttnlabError, match=r"is --kind right\?$"):
        run_checks(NoGrad(20, 20, 8, 1, 2, 16).eval(), Contract("decoder", vocab_size=20), seeds=1)
    lm = DecoderLM(20, 8, 1, 2).eval()
    with pytest.raises(AttnlabError, match=r"cannot be called as a seq2seq is, model\(src, tgt\)"):
        run_checks(lm, Contract("seq2seq", vocab_size=20), seeds=1, only=["causal"])

    class Optional(nn.Module):  # Python says "forward() takes from 1 to 2 positional arguments but 3 were given"
        def forward(self, ids=None):
            return lm(ids)

    with pytest.raises(AttnlabError, match="takes from 1 to 2 positional.*is --kind right"):
        run_checks(Optional(), Contract("seq2seq", vocab_size=20), seeds=1, only=["causal"])

    class Inner(nn.Module):  # the same words from inside the model: its own bug, reported by the checks
        def forward(self, ids):
            def helper(x, mask):
                return x

            return helper(lm(ids))

    result = run_checks(Inner(), Contract("decoder", vocab_size=20), seeds=1, only=["causal"]).results[0]
    assert result.status == "fail" and "missing 1 required positional argument: 'mask'" in result.summary
    assert "--kind" not in result.summary

    class Submodule(nn.Module):  # a submodule called with a mask it does not take: the model's own bug too
        def __init__(self):
            super().__init__()
            self.ff = nn.Sequential(nn.Identity())

        def forward(self, ids):
            return self.ff(lm(ids), ids != 0)

    result = run_checks(Submodule(), Contract("decoder", vocab_size=20), seeds=1, only=["causal"]).results[0]
    assert result.status == "fail" and "Sequential.forward() takes 2" in result.summary
    assert "--kind" not in result.summary
    torch_only = nn.Sequential(nn.Embedding(20, 8), nn.TransformerDecoderLayer(8, 2, 16, batch_first=True)).eval()
    result = run_checks(torch_only, Contract("decoder", vocab_size=20), seeds=1, only=["causal"]).results[0]
    assert result.status == "fail" and "missing 1 required positional argument: 'memory'" in result.summary
    assert "--kind" not in result.summary  # torch's frames all the way, and still the model's bug

    def broken(ids):  # a TypeError of torch's, inside a model of the right kind: no hint about --kind
        return torch.nn.functional.linear((ids,), torch.ones(2, 2))

    result = run_checks(broken, Contract("encoder"), seeds=1, only=["batch-independence"]).results[0]
    assert result.status == "fail" and "TypeError" in result.summary and "--kind" not in result.summary


@pytest.mark.parametrize("p", [0.5, 0.1])
def test_train_mode_noise_from_another_generator_is_not_called_a_leak(p):
    import random

    class PythonDropout(nn.Module):  # a correct decoder whose train mode zeroes its output at Python's random
        def __init__(self):
            super().__init__()
            self.inner = Tiny(causal=True)

        def forward(self, ids):
            out = self.inner(ids)
            return out * 0 if self.training and random.random() < p else out

    noted = 0
    for trial in range(6):
        random.seed(trial)
        result = run_checks(PythonDropout(), Contract("decoder"), seeds=3, only=["causal"]).results[0]
        assert result.status == "pass", result.summary
        noted += "eval mode only: train mode is not repeatable from torch's seed" in result.summary
    assert noted >= (3 if p == 0.5 else 0)  # said whenever the noise showed (a run may not draw a zeroed call)
    leaky = run_checks(Tiny(causal=True, bug="causal_at_eval_only"), Contract("decoder"), seeds=3, only=["causal"])
    assert leaky.results[0].status == "fail" and "(train mode)" in leaky.results[0].summary


def test_a_causal_model_whose_outputs_do_not_follow_the_length_fails_causal_instead_of_skipping():
    pooled = Tiny(causal=True, pool="mean")  # one output per sequence: nothing to compare position by position

    class FixedLength(nn.Module):  # a decoder that pads every batch to 16 positions and reads ahead
        def __init__(self):
            super().__init__()
            self.inner = Tiny()  # an encoder: every position reads every other one

        def forward(self, ids):
            return self.inner(torch.cat((ids, ids.new_zeros(ids.shape[0], 16 - ids.shape[1])), dim=1))

    for model, shapes in ((pooled, "(2, 4) and (2, 4)"), (FixedLength(), "(2, 16, 32) and (2, 16, 32)")):
        result = run_checks(model, Contract("decoder"), seeds=1, only=["causal"]).results[0]
        assert result.status == "fail" and "the outputs do not follow the input's length" in result.summary
        assert f"gave outputs of shape {shapes}" in result.summary
    assert run_checks(pooled, Contract("encoder"), seeds=1, only=["causal"]).results[0].status == "skip"


def test_a_long_failing_row_is_shortened_in_the_summary_and_kept_whole_in_the_evidence():
    torch.manual_seed(0)
    lm = DecoderLM(32, 16, 1, 2, max_positions=300, pad_id=None).eval()

    def long_leak(ids):
        return lm(ids) if ids.shape[1] <= 8 else lm.lm_head(lm.body(ids)[0])

    result = run_checks(long_leak, Contract("decoder", pad_id=None, max_length=300), seeds=1,
                        only=["causal"]).results[0]
    assert result.status == "fail" and "more ..." in result.summary and len(result.summary) < 600
    assert len(result.evidence["input"]) == 300


def test_a_package_lists_the_factories_it_re_exports(tmp_path, monkeypatch):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "models.py").write_text("import torch\ndef make_model():\n    pass\nclass TinyNet:\n    pass\n")
    (tmp_path / "mypkg" / "__init__.py").write_text("from mypkg.models import TinyNet, make_model\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("mypkg:make_modle", "--kind", "encoder")
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("has no factory 'make_modle' (the functions and classes it defines: "
                                          "TinyNet, make_model)")


def test_padding_invariance_compares_every_real_position_not_only_the_first():
    torch.manual_seed(0)
    lm = DecoderLM(32, 16, 1, 2, max_positions=16, pad_id=0).eval()

    def counts_padding_after_the_first(ids):  # position 0 is untouched; later ones read how many pads follow
        out = lm(ids).clone()
        out[:, 1:] += (ids == 0).sum(1, keepdim=True)[..., None].float()
        return out

    result = run_checks(counts_padding_after_the_first, Contract("decoder"), seeds=2,
                        only=["padding-invariance"]).results[0]
    assert result.status == "fail", result
    assert result.evidence["positions"] and min(result.evidence["positions"]) >= 1


def test_a_model_whose_output_is_nan_on_one_path_only_fails_inference_path():
    torch.manual_seed(0)
    lm = DecoderLM(32, 16, 1, 2, max_positions=16, pad_id=0).eval()

    def nan_on_the_fast_path(ids):
        out = lm(ids)
        return out * math.nan if torch.backends.mha.get_fastpath_enabled() else out

    result = run_checks(nan_on_the_fast_path, Contract("decoder"), seeds=1, only=["inference-path"]).results[0]
    assert result.status == "fail" and "not finite on torch's inference fast path" in result.summary, result


def fixed_length_model(*, real_moves: bool):
    """A model padding every batch to 16 positions, (batch, seq) ids -> (batch, 16, 2), as nn.TransformerEncoder's
    fast path leaves it: its padded positions are zeros there and something else on the training path. With
    ``real_moves`` the fast path also moves the real positions, as a mask read two ways does."""
    def model(ids):
        padded = nn.functional.pad(ids, (0, 16 - ids.shape[1])).float()  # pad id 0
        out = torch.stack([padded.cumsum(1), padded.flip(1).cumsum(1).flip(1)], -1)  # every position reads the row
        if torch.backends.mha.get_fastpath_enabled():
            out = torch.where((padded != 0)[..., None], out + float(real_moves), 0.0)
        return out
    return model


def test_inference_path_judges_a_fixed_length_output_on_its_real_positions():
    """The fast path fills a model's own padding its own way: a row that differs only there passes, and
    says so; one whose real positions move too still fails."""
    passed = run_checks(fixed_length_model(real_moves=False), Contract("encoder"), seeds=3,
                        only=["inference-path"])
    assert passed.output == "pooled"  # (batch, 16, 2) whatever the input's length
    result = passed.results[0]
    assert result.status == "pass" and "differed only past their length" in result.summary, result
    assert result.evidence["rows_judged_on_real_positions"] == 9  # three rows a seed, every one padded to 16
    failed = run_checks(fixed_length_model(real_moves=True), Contract("encoder"), seeds=3, only=["inference-path"])
    assert failed.results[0].failed, failed.results[0]


class PooledFixedLength(nn.Module):
    """Pads every batch to 16 with a float 0/1 padding mask (the bug: training adds it to the scores), then pools
    the real positions of [embedding, encoder output] into (batch, 32): features, not positions, come first."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(32, 16), nn.Embedding(16, 16)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2)

    def forward(self, ids):
        ids = nn.functional.pad(ids, (0, 16 - ids.shape[1]), value=0)
        x = self.tokens(ids) + self.positions(torch.arange(16))
        h = self.body(x, src_key_padding_mask=(ids == 0).float())
        real = (ids != 0).unsqueeze(-1).float()
        return (torch.cat((x, h), dim=-1) * real).sum(1) / real.sum(1).clamp(min=1)


def test_a_pooled_output_is_judged_whole_even_where_its_first_features_agree():
    """Its first 16 features (the embedding's) are the same on both paths; the encoder's are not."""
    result = run_checks(PooledFixedLength().eval(), Contract("encoder"), seeds=3, only=["inference-path"]).results[0]
    assert result.failed and "differs by up to" in result.summary, result


class FixedLengthScores(nn.Module):
    """A correct fixed-length encoder (bool padding mask) with one score a position: (batch, 16), no feature axis,
    the shape of a pooled output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(32, 16), nn.Embedding(16, 16)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2)
        self.head = nn.Linear(16, 1)

    def forward(self, ids):
        ids = nn.functional.pad(ids, (0, 16 - ids.shape[1]), value=0)
        h = self.body(self.tokens(ids) + self.positions(torch.arange(16)), src_key_padding_mask=ids == 0)
        return self.head(h).squeeze(-1)


def test_a_fixed_length_output_without_a_feature_axis_is_judged_on_its_real_positions_too():
    """Told apart from a pooled one by where its rows part: at each row's own first padded position."""
    result = run_checks(FixedLengthScores().eval(), Contract("encoder"), seeds=3, only=["inference-path"]).results[0]
    assert result.status == "pass" and result.evidence["rows_judged_on_real_positions"] == 9, result


def test_the_fixed_length_torch_encoder_differs_on_the_fast_path_only_in_its_padding():
    """What the fixed-length factory stands for (so that its passing proves something): torch's nested tensors
    change its padded positions and nothing else."""
    model = load_model(f"{TORCH_EXAMPLES}:torch_encoder_fixed_length")
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    before = torch.backends.mha.get_fastpath_enabled()
    try:
        with torch.no_grad():
            torch.backends.mha.set_fastpath_enabled(False)
            training = model(ids)
            torch.backends.mha.set_fastpath_enabled(True)
            inference = model(ids)
    finally:
        torch.backends.mha.set_fastpath_enabled(before)
    real = (ids != 0).nonzero(as_tuple=True)
    torch.testing.assert_close(inference[real], training[real])
    assert (inference[:, 4:] - training[:, 4:]).abs().amax(-1).min() > 0.1  # every padded position moved


class CheckpointedDecoder(nn.Module):
    """The bug: gradient checkpointing, taken whenever autograd records (every training step), calls the block
    without its look-ahead mask; inference, under no_grad, passes it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(32, 16), nn.Embedding(16, 16)
        self.qkv, self.head = nn.Linear(16, 48), nn.Linear(16, 32)

    def block(self, x, hide=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2)
        if hide is not None:
            scores = scores.masked_fill(hide, float("-inf"))
        return x + scores.softmax(-1) @ v

    def forward(self, ids):
        from torch.utils.checkpoint import checkpoint

        n = ids.shape[1]
        hide = torch.ones(n, n, dtype=torch.bool).triu(1)
        x = self.tok(ids) + self.pos(torch.arange(n))
        x = checkpoint(self.block, x, use_reentrant=False) if torch.is_grad_enabled() else self.block(x, hide)
        return self.head(x)


def test_a_look_ahead_mask_dropped_only_while_autograd_records_fails_causal():
    result = run_checks(CheckpointedDecoder(), Contract("decoder", pad_id=None), seeds=1, only=["causal"])
    assert result.result("causal").status == "fail" and result.result("causal").evidence["train_mode"]


class NormedEncoder(nn.Module):
    """A correct encoder with batch norm over its features: train-mode calls move its running statistics."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.norm = nn.Embedding(32, 8), nn.BatchNorm1d(8)

    def forward(self, ids):
        return self.norm(self.tok(ids).transpose(1, 2)).transpose(1, 2)


def test_the_checks_leave_a_models_buffers_as_they_found_them():
    model = NormedEncoder().eval()
    before = {name: b.clone() for name, b in model.named_buffers()}
    run_checks(model, Contract("encoder", pad_id=None), seeds=1)
    assert all(torch.equal(before[name], b) for name, b in model.named_buffers())
    assert not model.training


def test_a_model_loaded_under_inference_mode_is_checked_not_reported_as_raising():
    with torch.inference_mode():
        model = NormedEncoder()  # weights and batch-norm statistics are inference tensors
    report = run_checks(model, Contract("encoder", pad_id=None), seeds=1, only=["mode", "finite-outputs"])
    assert all("raised" not in r.summary for r in report.results), [r.summary for r in report.results]
    assert report.result("mode").status in ("pass", "note")


def test_attnlabs_own_models_are_padded_with_their_own_pad_id(tmp_path):
    """A model built with pad_id=1 was padded with the default 0: the padding checks failed a correct model, and
    the cache check drew its pad id as a real token."""
    (tmp_path / "own.py").write_text(
        "import torch\n"
        "from attnlab.nn import DecoderLM, EncoderClassifier\n"
        "def clf():\n    torch.manual_seed(0)\n    return EncoderClassifier(32, 3, 32, 2, 2, 64, max_positions=64, pad_id=1).eval()\n"
        "def lm():\n    torch.manual_seed(0)\n    return DecoderLM(32, 32, 2, 2, max_positions=64, pad_id=1).eval()\n")
    for factory, kind in (("clf", "encoder"), ("lm", "decoder")):
        result = invoke(f"{tmp_path / 'own.py'}:{factory}", "--kind", kind, "--seeds", 2, "--json")
        report = json.loads(result.stdout)
        assert result.exit_code == 0 and report["passed"] and report["contract"]["pad_id"] == 1, result.output
    told = CliRunner().invoke(cli, ["check", f"{tmp_path / 'own.py'}:clf", "--kind", "encoder", "--seeds", "1",
                                    "--pad-id", "0"])
    assert "warning: PadIdWarning: the model hides pad id 1 but the checks pad with 0" in told.stderr


def test_attnlabs_own_models_without_a_pad_id_are_checked_without_padding_and_none_against_one_is_warned(tmp_path):
    """A DecoderLM built without pad_id was padded with the factory default 0; one built with pad_id=0 and checked
    with --pad-id none failed kv-cache (its real tokens held the pad id, which cached decoding refuses) unwarned."""
    (tmp_path / "own.py").write_text(
        "import torch\n"
        "from attnlab.nn import DecoderLM\n"
        "def bare():\n    torch.manual_seed(0)\n    return DecoderLM(32, 32, 2, 2, max_positions=64).eval()\n"
        "def padded():\n    torch.manual_seed(0)\n    return DecoderLM(32, 32, 2, 2, max_positions=64, pad_id=0).eval()\n")
    bare = invoke(f"{tmp_path / 'own.py'}:bare", "--kind", "decoder", "--seeds", 1, "--json")
    assert bare.exit_code == 0 and json.loads(bare.stdout)["contract"]["pad_id"] is None, bare.output
    told = CliRunner().invoke(cli, ["check", f"{tmp_path / 'own.py'}:padded", "--kind", "decoder", "--seeds", "1",
                                    "--pad-id", "none"])
    assert ("warning: PadIdWarning: the model hides pad id 0 but the checks pad with none (the contract's pad_id, "
            "--pad-id): they draw 0 as a real token, which the model hides as padding; give pad id 0") in told.stderr


def test_a_failed_comparison_of_a_half_precision_output_says_rounding_may_be_the_cause():
    """A correct bfloat16 model failed padding-invariance by 0.0156, and the message blamed its masks alone. The
    note goes only with a difference of rounding's size: a leak far larger, or a failure that is no difference,
    gets none (it would invite users to dismiss a real bug)."""
    table = torch.randn(20, 8)

    def looks_ahead(ids):  # each position sums its own and every later token's vectors: not causal
        return table[ids].flip(1).cumsum(1).flip(1)

    def report(model, dtype):
        return run_checks(lambda ids: model(ids).to(dtype), Contract("decoder", vocab_size=20, pad_id=None),
                          seeds=1, only=["causal"]).result("causal")

    faint = report(lambda ids: 2.0 + 0.003 * looks_ahead(ids), torch.bfloat16)  # moves by a unit or two of bfloat16
    assert faint.failed and faint.summary.endswith(
        "; note: the output is bfloat16, whose rounding alone can pass this bound: check the model in float32 to "
        "tell a bug from rounding")
    for model, dtype in ((looks_ahead, torch.bfloat16), (looks_ahead, torch.float32),
                         (lambda ids: looks_ahead(ids).sum(1), torch.bfloat16)):  # a leak, a pooled output
        result = report(model, dtype)
        assert result.failed and "rounding" not in result.summary, result.summary
    # kv-cache's bound allows for half precision's rounding already: a cache restarting its positions at 0 differs
    # by 0.25, and was told "rounding alone can pass this bound".
    torch.manual_seed(0)
    lm = DecoderLM(32, 16, 2, 2, max_positions=16)
    whole = lm.body.embed.forward
    lm.body.embed.forward = lambda ids, offset=0: whole(ids, 0)
    cache = run_checks(lm.to(torch.bfloat16).eval(), Contract("decoder", vocab_size=32, pad_id=None), seeds=3,
                       only=["kv-cache"]).result("kv-cache")
    assert cache.failed and "rounding" not in cache.summary, cache.summary


def test_a_logit_masked_to_minus_infinity_everywhere_passes_finite_outputs_and_is_said():
    """A decoder that never predicts its padding id (its logit -inf) failed finite-outputs as broken arithmetic."""
    lm = DecoderLM(20, 8, 1, 2, max_positions=32, pad_id=0).eval()

    class NoPadLogit(nn.Module):
        def __init__(self, everywhere):
            super().__init__()
            self.lm, self.everywhere = lm, everywhere

        def forward(self, ids):
            logits = self.lm(ids)
            if self.everywhere:
                logits[..., 0] = -torch.inf
            else:  # only where the input is padding: arithmetic of the padding, not a masked logit
                logits[..., 0] = logits[..., 0].masked_fill(ids == 0, -torch.inf)
            return logits

    contract = Contract("decoder", vocab_size=20)
    passed = run_checks(NoPadLogit(True), contract, seeds=2, only=["finite-outputs"]).result("finite-outputs")
    assert passed.status == "pass" and passed.summary.endswith("; feature [0] -inf everywhere, a masked logit")
    failed = run_checks(NoPadLogit(False), contract, seeds=2, only=["finite-outputs"]).result("finite-outputs")
    assert failed.failed and "not finite" in failed.summary

    class Broken(nn.Module):  # every logit -inf, or all of them in a batch of one only: broken, not masked
        def __init__(self, alone_only):
            super().__init__()
            self.lm, self.alone_only = lm, alone_only

        def forward(self, ids):
            logits = self.lm(ids)
            return logits - torch.inf if not self.alone_only or len(ids) == 1 else logits

    everything = run_checks(Broken(False), contract, seeds=2, only=["finite-outputs"]).result("finite-outputs")
    assert everything.failed and "values not finite" in everything.summary
    alone = run_checks(Broken(True), contract, seeds=2, only=["finite-outputs"]).result("finite-outputs")
    assert alone.failed and "values not finite on the row alone" in alone.summary

    class Sometimes(nn.Module):  # the pad logit -inf in batches of one only: finite elsewhere, so no masking
        def forward(self, ids):
            logits = lm(ids)
            if len(ids) == 1:
                logits[..., 0] = -torch.inf
            return logits

    sometimes = run_checks(Sometimes(), contract, seeds=2, only=["finite-outputs"]).result("finite-outputs")
    assert sometimes.failed, sometimes.summary


def test_a_seq2seq_model_whose_output_follows_the_source_is_told_to_check_its_arguments():
    """Probed with a source and a target of one length, a model taking (tgt, src) was checked as per-position and
    failed with messages that contradicted each other (shapes (2, 32) and (4, 32) "in two calls")."""
    seq2seq = Transformer(20, 20, 8, 1, 2, 16).eval()

    class Swapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = seq2seq

        def forward(self, tgt, src):
            return self.inner(src, tgt)

    with pytest.raises(AttnlabError, match=r"the checks cannot use the model's output: the output follows the "
                                           r"source's length, not the target's .* does it take them in another order"):
        run_checks(Swapped(), Contract("seq2seq", vocab_size=20), seeds=1)
    assert not run_checks(seq2seq, Contract("seq2seq", vocab_size=20), seeds=1, only=["causal"]).failed


def test_outputs_that_hardly_react_to_any_token_make_causal_inconclusive_not_a_pass():
    """A bidirectional BERT with 0.002 initialisation moved by 3e-6 at most: causal passed it, leak and all."""
    table = torch.randn(20, 8)

    def faint_leak(ids):  # every position sums the later tokens' vectors, at a millionth of the output's size
        return 1.0 + 1e-7 * table[ids].flip(1).cumsum(1).flip(1)

    result = run_checks(faint_leak, Contract("decoder", vocab_size=20, pad_id=None), seeds=1,
                        only=["causal"]).result("causal")
    assert result.status == "note" and result.summary.startswith("inconclusive: the outputs hardly react to any token")
    loud = run_checks(lambda ids: 1.0 + table[ids].cumsum(1), Contract("decoder", vocab_size=20, pad_id=None), seeds=1,
                      only=["causal"]).result("causal")
    assert loud.status == "pass"  # a causal model whose outputs react passes as before
