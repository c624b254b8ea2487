"""Hugging Face encoder-decoders (T5, BART, Marian) under ``attnlab check``: every check passes on correct tiny
models in :class:`HFSeq2SeqAdapter`, planted bugs fail the check meant to catch them, and a model passed bare
(or to the wrong adapter) is refused with one line. Models are built from configs: nothing is downloaded."""

import inspect
import json
import warnings

import pytest
import torch
from click.testing import CliRunner

from attnlab.checks import Contract, HFAdapter, HFSeq2SeqAdapter, PadIdWarning, assert_causal, run_checks
from attnlab.cli.main import cli
from attnlab.errors import AttnlabError
from attnlab.nn.masks import padding_mask

transformers = pytest.importorskip("transformers")

#: The checks' defaults: ids below 32, at most 16 positions.
VOCAB, WIDTH, LAYERS, HEADS, MAX_LEN = 32, 16, 2, 2, 16
#: BART's own pad id is 1 (0 is its bos): its contract and adapter say so, and the checks pad with 1.
BART_PAD = 1


pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


def tiny_t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=2 * WIDTH, num_layers=LAYERS, num_heads=HEADS,
        pad_token_id=0, decoder_start_token_id=0, eos_token_id=1))


#: BART's and Marian's layer sizes. init_std 0.2 rather than 0.02: at 0.02 a random model's outputs barely react
#: to the order of its tokens, and order-sensitivity rightly counts a change under the tolerance as none.
BART_LIKE = dict(vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
                 encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=2 * WIDTH,
                 decoder_ffn_dim=2 * WIDTH, max_position_embeddings=MAX_LEN, init_std=0.2)


def tiny_bart():
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(transformers.BartConfig(**BART_LIKE))


def tiny_marian():
    torch.manual_seed(0)
    return transformers.MarianMTModel(transformers.MarianConfig(
        **BART_LIKE, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1))


def check(model, *, pad_id=0, seeds=3, only=None):
    """The report of the checks (``only`` those named) on ``model`` as a seq2seq model padded with ``pad_id``."""
    return run_checks(model, Contract("seq2seq", pad_id=pad_id), seeds=seeds, only=only)


# --- correct models pass every check ------------------------------------------------------------------

CORRECT = {
    "t5": lambda: (HFSeq2SeqAdapter(tiny_t5(), pad_id=0), 0),
    "t5-with-decoder-mask": lambda: (HFSeq2SeqAdapter(tiny_t5(), pad_id=0, decoder_pad_id=0), 0),
    "bart": lambda: (HFSeq2SeqAdapter(tiny_bart(), pad_id=BART_PAD), BART_PAD),
    "bart-base-model": lambda: (HFSeq2SeqAdapter(tiny_bart().model, pad_id=BART_PAD), BART_PAD),  # last_hidden_state
    "marian": lambda: (HFSeq2SeqAdapter(tiny_marian(), pad_id=0), 0),
}


@pytest.mark.parametrize("name", CORRECT)
def test_correct_encoder_decoders_in_the_adapter_pass_every_check(name):
    model, pad_id = CORRECT[name]()
    report = check(model, pad_id=pad_id, seeds=5)
    assert [r.name for r in report.results if r.status != "pass"] == [], report.results
    assert report.output == "per-position"
    assert "HFSeq2SeqAdapter" in report.result("kv-cache").summary  # driven through the model's own cache
    assert "dropout is active" in report.result("mode").summary  # train() reached the wrapped model


def test_the_adapter_passes_everything_by_keyword_with_hugging_face_masks():
    calls = []

    class Recording(transformers.T5ForConditionalGeneration):
        def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                    **kwargs):
            calls.append((input_ids, attention_mask, decoder_input_ids, decoder_attention_mask))
            return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                   decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask,
                                   **kwargs)

    model = Recording(tiny_t5().config).eval()
    src, tgt = torch.tensor([[5, 6, 0], [7, 0, 0]]), torch.tensor([[0, 3, 4, 9], [0, 8, 9, 9]])
    HFSeq2SeqAdapter(model, pad_id=0)(src, tgt)
    HFSeq2SeqAdapter(model, pad_id=0, decoder_pad_id=9)(src, tgt)
    (ids, mask, decoder_ids, no_decoder_mask), (*_, decoder_mask) = calls
    assert ids is src and decoder_ids is tgt
    assert mask.dtype == torch.long and mask.tolist() == [[1, 1, 0], [1, 0, 0]]  # 1 = keep, (batch, src_seq)
    assert no_decoder_mask is None  # T5's target starts with its pad id: no decoder mask unless asked
    assert decoder_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]


# --- planted bugs fail the check that should catch them ------------------------------------------------

@pytest.mark.parametrize("name", ["t5", "bart"])
def test_an_adapter_that_passes_no_source_mask_fails_padding_invariance(name):
    model, pad_id = (tiny_t5(), 0) if name == "t5" else (tiny_bart(), BART_PAD)
    result = check(HFSeq2SeqAdapter(model, pad_id=None), pad_id=pad_id, only=["padding-invariance"]).results[0]
    assert result.failed and any(pad_id in row for row in result.evidence["padded_source_batch"])


class PaddingOnlyDecoderMask(HFSeq2SeqAdapter):
    """The bug: the target's padding mask handed over as 4-D, (batch, 1, tgt, tgt). transformers takes a 4-D mask as
    the whole mask, as it is, so the model's own look-ahead mask is gone: every target position sees the future."""

    def target_mask(self, tgt):
        return padding_mask(tgt, self.decoder_pad_id).expand(-1, -1, tgt.shape[1], -1)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_a_decoder_mask_without_its_look_ahead_part_fails_causal(name):
    model, pad_id = (tiny_t5(), 0) if name == "t5" else (tiny_bart(), BART_PAD)
    result = check(PaddingOnlyDecoderMask(model, pad_id=pad_id, decoder_pad_id=pad_id), pad_id=pad_id,
                   only=["causal"]).results[0]
    assert result.failed and "changing target tokens after position" in result.summary


def drop_source_mask_on_cached_steps(model):
    """The bug: once the cache holds a position, the decoder's cross-attention is given no source mask (a generation
    loop that passes attention_mask only with the first step). The full pass is untouched."""
    forward = model.decoder.forward

    def decoder_forward(**kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # its name before transformers 5
        if cache is not None and cache.get_seq_length() > 0:
            kwargs["encoder_attention_mask"] = None
        return forward(**kwargs)

    model.decoder.forward = decoder_forward
    return model


def test_a_cached_decode_that_reads_the_source_padding_fails_kv_cache_alone():
    report = check(HFSeq2SeqAdapter(drop_source_mask_on_cached_steps(tiny_t5()), pad_id=0))
    assert [r.name for r in report.results if r.failed] == ["kv-cache"]
    result = report.result("kv-cache")
    assert 0 in result.evidence["source"]  # the padded source row is the one that differs


def test_decoder_positions_restarting_at_zero_on_cached_steps_fail_kv_cache():
    bart = tiny_bart()
    positions = bart.model.decoder.embed_positions
    forward = positions.forward
    positions.forward = lambda ids, *args, **kwargs: forward(ids)  # the cache's length dropped: every step at 0
    result = check(HFSeq2SeqAdapter(bart, pad_id=BART_PAD), pad_id=BART_PAD, only=["kv-cache"]).results[0]
    assert result.failed and "positions restarting at 0" in result.summary
    assert result.evidence["seed"] == 0 and result.evidence["positions"][0] > 0  # the prefix itself agrees


# --- a model passed bare, or to the wrong adapter, is refused with one line --------------------------------

@pytest.mark.parametrize(("kind", "message"), [
    ("seq2seq", r"ForConditionalGeneration is a Hugging Face encoder-decoder, whose second positional argument is "
                r"attention_mask: .* wrap it as HFSeq2SeqAdapter\(model, pad_id=\.\.\.\)"),
    ("decoder", r"ForConditionalGeneration is a Hugging Face encoder-decoder: check it as seq2seq \(--kind seq2seq\), "
                r"wrapped as HFSeq2SeqAdapter"),
])
def test_a_bare_encoder_decoder_is_refused_naming_the_adapter(kind, message):
    with pytest.raises(AttnlabError, match=message):
        run_checks(tiny_t5(), Contract(kind))
    with pytest.raises(AttnlabError, match=message):  # the assert_* helpers too
        assert_causal(tiny_bart(), kind=kind)


def test_cli_refuses_a_bare_encoder_decoder_with_one_error_line(tmp_path):
    (tmp_path / "factories.py").write_text(
        "import transformers\n"
        "def bart():\n"
        "    return transformers.BartForConditionalGeneration(transformers.BartConfig(vocab_size=32, d_model=16,\n"
        "        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,\n"
        "        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16))\n")
    result = CliRunner().invoke(cli, ["check", f"{tmp_path / 'factories.py'}:bart", "--kind", "seq2seq"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: BartForConditionalGeneration is a Hugging Face encoder-decoder")
    assert result.stderr.count("\n") == 1


def test_each_adapter_refuses_the_other_kind_of_model_and_a_pad_id_that_is_not_a_number():
    with pytest.raises(AttnlabError, match="HFAdapter takes an encoder or a decoder, and T5ForConditionalGeneration"):
        HFAdapter(tiny_t5())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=1, n_head=2,
                                                                n_positions=MAX_LEN))
    with pytest.raises(AttnlabError, match="HFSeq2SeqAdapter takes a Hugging Face encoder-decoder .* got GPT2LMHeadModel"):
        HFSeq2SeqAdapter(gpt2)
    with pytest.raises(AttnlabError, match=r"decoder_pad_id must be a token id \(a whole number >= 0\) or None, got '0'"):
        HFSeq2SeqAdapter(tiny_t5(), decoder_pad_id="0")
    with pytest.raises(AttnlabError, match=r"pad_id must be a token id \(a whole number >= 0\) or None, got -1"):
        HFAdapter(gpt2, pad_id=-1)  # the checks advised "--vocab-size above -1"
    # T5's encoder alone has no decoder: an encoder, for HFAdapter, and checked as one.
    encoder = transformers.T5EncoderModel(tiny_t5().config)
    report = run_checks(HFAdapter(encoder, pad_id=0), Contract("encoder"), seeds=1, only=["padding-invariance"])
    assert not report.failed


def test_a_seq2seq_model_without_a_cache_skips_kv_cache_naming_both_protocols_it_knows():
    result = check(lambda src, tgt: torch.nn.functional.one_hot(tgt, VOCAB).float().cumsum(1),
                   only=["kv-cache"]).results[0]
    assert result.status == "skip" and "encode(src)" in result.summary and "HFSeq2SeqAdapter" in result.summary


def test_a_wrapped_encoder_decoder_that_keeps_no_cache_skips_kv_cache_saying_so():
    class Forgetful(transformers.T5ForConditionalGeneration):
        """Takes the cache arguments, as every Hugging Face encoder-decoder does, but returns no cache."""

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            for name in ("cache", "past_key_values"):  # transformers 5 and earlier
                if name in out:
                    out[name] = None
            return out

    Forgetful.forward.__signature__ = inspect.signature(transformers.T5ForConditionalGeneration.forward)
    model = HFSeq2SeqAdapter(Forgetful(tiny_t5().config).eval(), pad_id=0)
    result = check(model, seeds=2, only=["kv-cache"]).results[0]
    assert result.status == "skip" and "returned no" in result.summary and "key/value cache" in result.summary, result


def test_the_cli_pads_with_the_adapters_pad_id_unless_told_otherwise_and_then_says_they_differ(tmp_path):
    (tmp_path / "factories.py").write_text(
        "import torch, transformers\n"
        "from attnlab.checks import HFSeq2SeqAdapter\n"
        "def bart():  # BART's pad id is 1\n"
        "    torch.manual_seed(0)\n"
        f"    return HFSeq2SeqAdapter(transformers.BartForConditionalGeneration(transformers.BartConfig(**{BART_LIKE!r})),\n"
        "                            pad_id=1)\n"
        "def far():  # a pad id past the checks' default vocabulary of 32\n"
        "    return HFSeq2SeqAdapter(bart().model, pad_id=40)\n")
    spec = [f"{tmp_path / 'factories.py'}:bart", "--kind", "seq2seq", "--seeds", "1", "--json"]
    result = CliRunner().invoke(cli, ["check", *spec])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["contract"]["pad_id"] == 1  # the adapter's, not the factory default 0
    assert report["passed"] and {c["name"]: c["status"] for c in report["checks"]}["padding-invariance"] == "pass"
    told = CliRunner().invoke(cli, ["check", *spec, "--pad-id", "0"])  # as asked, with a warning that names both
    assert json.loads(told.stdout)["contract"]["pad_id"] == 0
    assert "warning: PadIdWarning: the adapter hides pad id 1 but the checks pad with 0" in told.stderr
    unpadded = CliRunner().invoke(cli, ["check", *spec, "--pad-id", "none"])  # no padding: 1 is drawn as a token
    assert json.loads(unpadded.stdout)["contract"]["pad_id"] is None
    assert ("warning: PadIdWarning: the adapter hides pad id 1 but the checks pad with none (the contract's pad_id, "
            "--pad-id): they draw 1 as a real token, which the model hides as padding; give pad id 1") in unpadded.stderr
    outside = CliRunner().invoke(cli, ["check", f"{tmp_path / 'factories.py'}:far", "--kind", "seq2seq"])
    assert outside.exit_code == 2 and outside.stderr == (
        "error: the adapter's pad id 40 is outside the vocabulary 0..31 the checks draw ids from: give --vocab-size "
        "above 40, or --pad-id\n")


def test_python_callers_are_warned_when_the_contract_pads_with_another_id_than_the_adapter_hides():
    bart = HFSeq2SeqAdapter(tiny_bart(), pad_id=BART_PAD)
    with pytest.warns(PadIdWarning, match="the adapter hides pad id 1 but the checks pad with 0"):
        check(bart, pad_id=0, seeds=1, only=["padding-invariance"])
    with pytest.warns(PadIdWarning, match="the adapter hides pad id 1 but the checks pad with none"):
        check(bart, pad_id=None, seeds=1, only=["padding-invariance"])  # 1 drawn as a real token
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same id: nothing to say
        check(bart, pad_id=BART_PAD, seeds=1, only=["padding-invariance"])
