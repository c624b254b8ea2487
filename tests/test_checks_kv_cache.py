"""The kv-cache check: cached decoding must equal the full forward pass; planted cache bugs must fail it."""

import pytest
import torch
from torch import nn

from attnlab.checks import Contract, assert_kv_cache, run_checks
from attnlab.checks.kv_cache import cache_protocol
from attnlab.nn.attention import KVCache
from attnlab.nn.models import DecoderLM, Transformer
from attnlab.nn.positions import RotaryEmbedding


def kv_cache(model, kind="decoder", seeds=3, **contract):
    return run_checks(model, Contract(kind, **contract), seeds=seeds, only=["kv-cache"]).result("kv-cache")


def decoder(**kwargs):
    torch.manual_seed(0)
    return DecoderLM(32, 16, 2, 2, max_positions=16, **kwargs)


def seq2seq():
    torch.manual_seed(0)
    return Transformer(32, 32, 16, 2, 2, 32, max_src_positions=16, max_tgt_positions=16)


def restart_positions(embedder):
    """The bug: the embedder ignores the offset, so every cached step's tokens sit at positions 0.. again."""
    forward = embedder.forward
    embedder.forward = lambda ids, offset=0: forward(ids, 0)


class RestartingRotary(RotaryEmbedding):
    """The bug with rotary positions: the angles of new tokens restart at 0."""

    def forward(self, x, offset=0):
        return super().forward(x, 0)


class MaskDroppedWhenCached(DecoderLM):
    """The bug: calls after the prompt pass no look-ahead mask (right for one new token, a leak within a chunk)."""

    def forward(self, ids, *, caches=None, return_attention=False):
        if caches is None or not len(caches[0]):
            return super().forward(ids, caches=caches, return_attention=return_attention)
        return self.lm_head(self.body(ids, attend_mask=None, caches=caches)[0])


class DoubledCache(KVCache):
    """The bug: every step's keys and values are appended twice."""

    def append(self, k, v):
        super().append(k, v)
        return super().append(k, v)


class CachesAppendedTwice(DecoderLM):
    def new_caches(self):
        return [DoubledCache() for _ in self.body.layers]


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary", "none"])
def test_attnlab_decoders_pass_with_every_kind_of_position(positions):
    result = kv_cache(decoder(positions=positions), seeds=5, pad_id=None)
    assert result.status == "pass", result.describe()
    assert "attnlab's caches" in result.summary


def test_positions_restarting_at_zero_fail():
    model = decoder()
    restart_positions(model.body.embed)
    result = kv_cache(model, pad_id=None)
    assert result.failed and "positions restarting at 0" in result.summary
    assert result.evidence["seed"] == 0 and result.evidence["positions"][0] > 0  # the prefix itself agrees


def test_rotary_angles_restarting_at_zero_fail():
    model = decoder(positions="rotary")
    broken = RestartingRotary(model.body.layers[0].self_attn.rotary.head_dim, 16)
    for layer in model.body.layers:
        layer.self_attn.rotary = broken
    assert kv_cache(model, pad_id=None).failed


def test_a_mask_dropped_on_cached_calls_fails_only_where_chunks_of_several_tokens_are_fed():
    torch.manual_seed(0)
    model = MaskDroppedWhenCached(32, 16, 2, 2, max_positions=16)
    result = kv_cache(model, seeds=4, pad_id=None)
    assert result.failed and result.evidence["seed"] > 0  # the first seed feeds one token at a time: no leak
    assert max(result.evidence["chunks"][1:]) > 1
    assert kv_cache(model, seeds=1, pad_id=None).status == "pass"


def test_keys_cached_twice_fail():
    torch.manual_seed(0)
    assert kv_cache(CachesAppendedTwice(32, 16, 2, 2, max_positions=16), pad_id=None).failed


def test_seq2seq_decoding_is_checked_through_encode_and_decode():
    assert kv_cache(seq2seq(), "seq2seq", seeds=5).status == "pass"
    model = seq2seq()
    restart_positions(model.decoder.embed)
    result = kv_cache(model, "seq2seq")
    assert result.failed and "source" in result.evidence


def test_assert_kv_cache_raises_with_the_chunks_fed():
    model = decoder()
    restart_positions(model.body.embed)
    with pytest.raises(AssertionError, match=r"kv-cache: fail: .*\n(.|\n)*chunks: \["):
        assert_kv_cache(model, pad_id=None)


def test_a_model_without_a_cache_the_check_knows_skips_and_says_which_it_knows():
    result = kv_cache(lambda ids: torch.nn.functional.one_hot(ids, 32).float().cumsum(1))
    assert result.status == "skip" and "new_caches()" in result.summary and "Hugging Face" in result.summary
    assert cache_protocol(nn.Linear(2, 2), "decoder") is None


def test_encoders_skip():
    assert kv_cache(decoder(), "encoder").status == "skip"


class WrongLengthWhenCached(DecoderLM):
    """Returns only the last new position from a cached call, as some generation helpers do."""

    def forward(self, ids, *, caches=None, return_attention=False):
        out = super().forward(ids, caches=caches)
        return out if caches is None else out[:, -1:]


class RaisesWhenCached(DecoderLM):
    def forward(self, ids, *, caches=None, return_attention=False):
        if caches is not None and len(caches[0]):
            raise RuntimeError("cache layout mismatch")
        return super().forward(ids, caches=caches)


def test_a_cached_call_with_one_output_per_call_is_reported_as_an_unusable_output():
    torch.manual_seed(0)
    result = kv_cache(WrongLengthWhenCached(32, 16, 2, 2, max_positions=16), pad_id=None)
    assert result.failed and "one output per new position" in result.summary
    assert "output_error" in result.evidence


def test_a_cached_call_that_raises_is_a_failed_check_quoting_the_exception_and_input():
    torch.manual_seed(0)
    result = kv_cache(RaisesWhenCached(32, 16, 2, 2, max_positions=16), pad_id=None)
    assert result.failed and "RuntimeError: cache layout mismatch" in result.summary
    assert "ids of shape (2, 16)" in result.summary


def test_hugging_face_decoders_are_driven_through_their_cache_and_encoders_skip():
    transformers = pytest.importorskip("transformers")
    config = dict(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=16)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2,
                                                                n_positions=16)).eval()
    result = kv_cache(gpt2, pad_id=None)
    assert result.status == "pass" and "Hugging Face" in result.summary
    bert = transformers.BertModel(transformers.BertConfig(**config), add_pooling_layer=False).eval()
    skipped = kv_cache(bert, pad_id=None)
    assert skipped.status == "skip" and "keeps no key/value cache" in skipped.summary
