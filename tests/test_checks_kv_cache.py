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


class SourcePaddingIgnoredWhenCached(Transformer):
    """The bug: cached decoding drops the source's padding mask (its cross-attention reads the padding)."""

    def decode(self, tgt, memory, *, memory_attend_mask, need_weights=False, caches=None):
        if caches is not None:
            memory_attend_mask = torch.ones_like(memory_attend_mask)
        return super().decode(tgt, memory, memory_attend_mask=memory_attend_mask, need_weights=need_weights,
                              caches=caches)


class MemoryAlone(Transformer):
    """A seq2seq model whose encode gives the memory alone (its source has no padding to hide)."""

    def encode(self, src):
        return super().encode(src)[0]

    def forward(self, src, tgt):
        return self.decode(tgt, self.encode(src))[0]

    def decode(self, tgt, memory, *, memory_attend_mask=None, need_weights=False, caches=None):
        mask = torch.ones(memory.shape[0], 1, 1, memory.shape[1], dtype=torch.bool)
        return super().decode(tgt, memory, memory_attend_mask=mask, need_weights=need_weights, caches=caches)


def test_seq2seq_sources_are_padded_so_a_cached_decode_that_reads_source_padding_fails():
    torch.manual_seed(0)
    model = SourcePaddingIgnoredWhenCached(32, 32, 16, 2, 2, 32, max_src_positions=16, max_tgt_positions=16)
    result = kv_cache(model, "seq2seq")
    assert result.failed and 0 in result.evidence["source"]  # the padded source row is the one that differs
    torch.manual_seed(0)
    alone = MemoryAlone(32, 32, 16, 2, 2, 32, max_src_positions=16, max_tgt_positions=16)
    assert kv_cache(alone, "seq2seq").status == "pass"  # the memory alone: no source mask on either path


class HandWritten(nn.Module):
    """Not a Hugging Face model, though it has a config and a forward taking past_key_values and use_cache."""

    def __init__(self):
        super().__init__()
        self.config = {"vocab": 32}
        self.embed = nn.Embedding(32, 8)

    def forward(self, ids, past_key_values=None, use_cache=False):
        return self.embed(ids).cumsum(1)


def test_a_model_that_only_looks_like_hugging_face_skips_instead_of_failing():
    result = kv_cache(HandWritten(), pad_id=None)
    assert result.status == "skip" and "no key/value cache" in result.summary


def test_an_hf_adapter_hides_its_pad_id_on_the_cached_path_too():
    transformers = pytest.importorskip("transformers")
    from attnlab.checks import HFAdapter, PadIdWarning

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2,
                                                                n_positions=16)).eval()
    # The contract lets ids hold 0, which the adapter (pad id 0) hides: both paths must hide it alike (and the
    # checks say that they draw the hidden id as a real token).
    with pytest.warns(PadIdWarning, match="they draw 0 as a real token"):
        assert kv_cache(HFAdapter(gpt2, pad_id=0), pad_id=None, seeds=5).status == "pass"


class NaNWhenCached(DecoderLM):
    """The bug: a cached step divides by the number of cached positions, 0 on the first one."""

    def forward(self, ids, *, caches=None, return_attention=False):
        out = super().forward(ids, caches=caches)
        return out if caches is None else out / torch.tensor(float(len(caches[0]) - ids.shape[1] > 0))


def test_a_cached_path_that_gives_nan_where_the_full_pass_is_finite_fails():
    torch.manual_seed(0)
    result = kv_cache(NaNWhenCached(32, 16, 2, 2, max_positions=16), pad_id=None)
    assert result.failed and "not finite on the cached path but finite on the full forward pass" in result.summary


class ShortWindowCacheLM(nn.Module):
    """The bug: the cache keeps the newest 64 keys and values of a model with 128 positions (a window sized for
    another context), so cached decoding forgets the start of a text past position 64; the full pass does not."""

    window, width, context = 64, 16, 128

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(32, self.width), nn.Embedding(self.context, self.width)
        self.qkv, self.head = nn.Linear(self.width, 3 * self.width), nn.Linear(self.width, 32)

    def new_caches(self):
        return {"seen": 0}

    def forward(self, ids, *, caches=None):
        past = 0 if caches is None else caches["seen"]
        x = self.tok(ids) + self.pos(past + torch.arange(ids.shape[1]))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if caches is not None:
            if "k" in caches:
                k, v = torch.cat((caches["k"], k), 1), torch.cat((caches["v"], v), 1)
            caches["k"], caches["v"], caches["seen"] = k[:, -self.window:], v[:, -self.window:], past + ids.shape[1]
        queries = past + torch.arange(ids.shape[1])
        keys = past + ids.shape[1] - k.shape[1] + torch.arange(k.shape[1])
        scores = (q @ k.transpose(1, 2)).masked_fill(keys[None] > queries[:, None], float("-inf"))
        return self.head(scores.softmax(-1) @ v)


def test_the_first_seed_decodes_one_token_at_a_time_over_the_whole_length_the_contract_gives():
    result = kv_cache(ShortWindowCacheLM().eval(), seeds=1, pad_id=None, max_length=128)
    assert result.status == "fail" and min(result.evidence["positions"]) >= 64
    short = kv_cache(ShortWindowCacheLM().eval(), seeds=1, pad_id=None, max_length=64)  # within the window: right
    assert short.status == "pass" and "one token at a time over 64 positions" in short.summary


def test_a_hugging_face_decoder_whose_generation_inputs_restart_positions_fails_through_generate():
    transformers = pytest.importorskip("transformers")

    class PositionsFromZero(transformers.LlamaForCausalLM):
        """The bug in the generation hook: position ids counted from 0 over the tokens fed this step (with a
        cache, the one new token), as a model with its own prepare_inputs_for_generation may set them."""

        def prepare_inputs_for_generation(self, input_ids, **kwargs):
            inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
            fed = inputs["input_ids"]
            inputs["position_ids"] = torch.arange(fed.shape[1])[None].expand(fed.shape[0], -1)
            return inputs

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      initializer_range=0.5)
    torch.manual_seed(0)
    result = kv_cache(PositionsFromZero(config).eval(), seeds=1, pad_id=None)
    assert result.failed and "greedy generate with the cache differs" in result.summary
    torch.manual_seed(0)
    right = kv_cache(transformers.LlamaForCausalLM(config).eval(), seeds=1, pad_id=None)
    assert right.status == "pass" and "greedy generate too" in right.summary


def test_a_decoder_editing_its_ids_in_place_leaves_the_kv_cache_checks_inputs_as_drawn():
    class Remaps(DecoderLM):  # remaps id 3 in place (its own business); its cached path is off by 0.01 (a bug)
        def forward(self, ids, *, caches=None, return_attention=False):
            ids[ids == 3] = 4
            out = super().forward(ids, caches=caches)
            return out + 0.01 if caches is not None else out

    torch.manual_seed(0)
    result = run_checks(Remaps(20, 8, 1, 2).eval(), Contract("decoder", vocab_size=20, pad_id=None), seeds=1,
                        only=["kv-cache"]).results[0]
    assert result.status == "fail" and 3 in list(result.evidence["input"])  # it showed the remapped 4s
