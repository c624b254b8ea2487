"""``attnlab.checks`` and ``attnlab check``: the tool's parts, no false alarms on correct models (ours,
torch's, Hugging Face's) over 20 seeds, failures on the same models used wrongly, and the command line.
The planted-bug suite is in ``test_checks_mutants.py``."""

import json
import math
import re
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
    assert_mode,
    assert_order_sensitive,
    assert_padding_content_ignored,
    assert_padding_invariant,
    load_model,
    output_tensor,
    run_checks,
)
from attnlab.checks.calling import ModelUnderTest
from attnlab.checks.compare import difference
from attnlab.checks.inputs import generator, other_tokens, pad_rows, random_tokens, reordering
from attnlab.cli.main import cli
from attnlab.errors import AttnlabError
from attnlab.nn import DecoderLM, EncoderClassifier, Transformer
from mutants import Tiny

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TORCH_EXAMPLES, HF_EXAMPLES = EXAMPLES / "check_torch_models.py", EXAMPLES / "check_hf_models.py"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; two threads on a busy two-core machine spin for ages."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def test_a_wrong_batch_axis_is_an_error_of_the_model():
    mut = ModelUnderTest(lambda ids: torch.zeros(1, 4), Contract("encoder"))
    with pytest.raises(TypeError, match="batch has 3 rows"):
        mut(torch.ones(3, 4, dtype=torch.long))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "lstm"}, "unknown model kind"),
    ({"kind": "encoder", "vocab_size": 3}, "vocab size"),
    ({"kind": "encoder", "max_length": 2}, "max length"),
    ({"kind": "encoder", "pad_id": 32}, "pad id 32"),
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
                  assert_order_sensitive, assert_finite, assert_mode):
        assert check(encoder, kind="encoder", seeds=2).status == "pass"
    assert len(assert_all_checks(decoder, kind="decoder", seeds=2)) == 7


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
    (HF_EXAMPLES, "hf_bert", "encoder"),
    (HF_EXAMPLES, "hf_gpt2", "decoder"),
]

#: The same external models used wrongly, and a check that must say so.
WRONG = [
    (TORCH_EXAMPLES, "torch_encoder_as_decoder", "decoder", "causal"),
    (TORCH_EXAMPLES, "torch_encoder_without_padding_mask", "encoder", "padding-invariance"),
    (TORCH_EXAMPLES, "torch_seq2seq_without_look_ahead", "seq2seq", "causal"),
    (HF_EXAMPLES, "hf_bert_mask_inverted", "encoder", "padding-invariance"),
]


def assert_clean(report):
    assert not report.failed, "\n".join(r.describe() for r in report.results if r.failed)
    expected_skips = {"causal"} if report.contract.kind == "encoder" else set()
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
    assert_clean(run_checks(model, Contract(kind), seeds=20))
    assert model.training == was_training


@pytest.mark.parametrize(("path", "factory", "kind", "check"), WRONG, ids=[f for _, f, _, _ in WRONG])
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
        "finite-outputs", "mode"]


@pytest.mark.parametrize(("path", "factory", "kind", "check"), WRONG, ids=[f for _, f, _, _ in WRONG])
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
    assert "checks:" in out and "failed" in out


def test_cli_reads_a_package_module_spec(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "from attnlab.nn import DecoderLM\n"
        "def lm():\n    return DecoderLM(32, 16, 1, 2, max_positions=16, dropout=0.1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("my_models:lm", "--kind", "decoder", "--seeds", 1, "--pad-id", "none", "--json")
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks["padding-invariance"] == "skip" and checks["causal"] == "pass"


@pytest.mark.parametrize(("source", "spec", "message"), [
    (None, "{dir}/missing.py:factory", "no such file: .*missing.py"),
    ("x = 1\n", "{file}:factory", "has no factory 'factory'"),
    ("def factory():\n    raise RuntimeError('no weights')\n", "{file}:factory",
     "factory .* raised RuntimeError: no weights"),
    ("import not_a_module_anywhere\n", "{file}:factory", "importing .* failed: ModuleNotFoundError"),
    ("def factory():\n    return 3\n", "{file}:factory", "returned a int, which cannot be called"),
    (None, "no_such_package.models:factory", "no such module: no_such_package.models"),
    (None, "no_colon_here", "SPEC must be"),
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


def test_cli_rejects_a_bad_pad_id():
    result = invoke(f"{TORCH_EXAMPLES}:torch_encoder", "--kind", "encoder", "--pad-id", "zero")
    assert result.exit_code == 2 and "not an integer or 'none'" in result.output


def test_plain_callables_are_checked_without_switching_modes():
    linear = nn.Linear(1, 1)

    def model(ids):  # a closure: the tool cannot reach the module inside
        return linear(ids.float()[..., None])

    result = assert_mode(model, kind="encoder", seeds=1)
    assert result.status == "pass" and "not an nn.Module" in result.summary
