"""Layers and models: parameter counts from the seeds and the paper, mask behaviour, bad input."""

import math

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn import (
    DecoderLayer,
    DecoderLM,
    Embedder,
    Encoder,
    EncoderClassifier,
    EncoderLayer,
    Transformer,
    causal_mask,
    padding_mask,
)
from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.layers import FeedForward
from attnlab.nn.masks import cached_causal_mask
from attnlab.nn.positions import RotaryEmbedding
from attnlab.presets import build_preset


def count(module):
    return sum(p.numel() for p in module.parameters())


def test_lab_toy_counts_7131_parameters():
    assert build_preset("lab-toy").num_parameters() == 7131


def test_seed_003_encoder_layer_counts_2233536():
    assert count(EncoderLayer(512, 8, 2048, head_dim=8)) == 2_233_536


def test_seed_003_decoder_layer_differs_from_the_seed_by_one_norm():
    # Seed 003 prints 2,365,312: its DecoderLayer reuses one AddNormalization for two sub-layers, so
    # Keras counts two norms. A decoder layer with three norms has 1,024 parameters more.
    assert count(DecoderLayer(512, 8, 2048, head_dim=8)) == 2_365_312 + 1024


def test_paper_base_layers():
    assert count(EncoderLayer(512, 8, 2048)) == 3_152_384
    assert count(DecoderLayer(512, 8, 2048)) == 4_204_032


def test_paper_base_model_is_about_63_million():
    assert build_preset("paper-base").num_parameters() == 63_119_496


def lab_toy_forward():
    torch.manual_seed(10)
    model = build_preset("lab-toy").eval()
    src = torch.tensor([[2, 1, 4, 3, 0]])
    tgt = torch.tensor([[3, 2, 1, 0, 0]])
    return model, src, tgt, model(src, tgt, return_attention=True)


def test_lab_toy_forward_shapes_and_names():
    model, src, tgt, (logits, weights) = lab_toy_forward()
    assert logits.shape == (1, 5, 35)
    torch.testing.assert_close(model.probabilities(src, tgt).sum(-1), torch.ones(1, 5))
    assert list(weights) == [f"decoder_layer{i}_block{b}" for i in range(1, 7) for b in
                             ("1_self_att", "2_decenc_att")]
    assert all(w.shape == (1, 4, 5, 5) for w in weights.values())


def test_decoder_self_attention_is_exactly_zero_above_the_diagonal_in_every_layer():
    *_, (_, weights) = lab_toy_forward()
    for name, w in weights.items():
        if "self_att" in name:
            assert float(torch.triu(w, diagonal=1).detach().abs().sum()) == 0.0, name


def test_cross_attention_is_exactly_zero_on_padded_source():
    *_, (_, weights) = lab_toy_forward()
    for name, w in weights.items():
        if "decenc" in name:
            assert float(w[..., -1].detach().abs().sum()) == 0.0, name


def test_cross_mask_comes_from_the_source_with_different_lengths():
    torch.manual_seed(0)
    model = Transformer(20, 25, 16, 2, 2, 32, dropout=0.0).eval()
    src = torch.tensor([[5, 6, 7, 0, 0, 0, 0]])  # 7 source positions, 4 of them padding
    tgt = torch.tensor([[1, 2, 3]])  # 3 target positions, none padding
    _, weights = model(src, tgt, return_attention=True)
    cross = weights["decoder_layer2_block2_decenc_att"]
    assert cross.shape == (1, 2, 3, 7)
    assert float(cross[..., 3:].detach().abs().sum()) == 0.0
    # Changing the source's padding ids changes nothing: the mask really hides them.
    other = src.clone()
    other[0, 3:] = 9
    torch.testing.assert_close(model(src, tgt), model(torch.where(src == 0, 0, other), tgt))


def test_padded_query_rows_are_finite():
    torch.manual_seed(0)
    model = Transformer(20, 20, 16, 2, 2, 32, dropout=0.0).eval()
    src = torch.tensor([[0, 0, 0], [4, 5, 0]])  # an all-padding source
    tgt = torch.tensor([[0, 0], [3, 0]])  # a target that starts with padding: its first row hides all keys
    logits, weights = model(src, tgt, return_attention=True)
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_sequence_alone_equals_sequence_padded_in_a_batch():
    torch.manual_seed(0)
    model = Transformer(30, 30, 32, 2, 4, 64, dropout=0.0).eval()
    src, tgt = torch.tensor([[4, 5, 6]]), torch.tensor([[7, 8]])
    batch_src = torch.tensor([[4, 5, 6, 0, 0], [9, 8, 7, 6, 5]])
    batch_tgt = torch.tensor([[7, 8, 0, 0], [1, 2, 3, 4]])
    alone = model(src, tgt)
    padded = model(batch_src, batch_tgt)[:1, :2]
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=0)

    clf = EncoderClassifier(30, 5, 32, 2, 4, 64, dropout=0.0).eval()
    torch.testing.assert_close(clf(src), clf(batch_src)[:1], atol=1e-5, rtol=0)


def test_without_positions_a_permuted_input_gives_the_permuted_output():
    torch.manual_seed(0)
    enc = Encoder(30, 16, 2, 2, 32, max_positions=10, dropout=0.0, positions="none").eval()
    ids = torch.tensor([[3, 7, 9, 4, 11]])
    perm = torch.tensor([2, 0, 4, 1, 3])
    out, _ = enc(ids)
    out_perm, _ = enc(ids[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=0)
    with_pos = Encoder(30, 16, 2, 2, 32, max_positions=10, dropout=0.0).eval()
    a, _ = with_pos(ids)
    b, _ = with_pos(ids[:, perm])
    assert not torch.allclose(b, a[:, perm], atol=1e-3)


def test_eval_is_deterministic_and_train_dropout_is_not():
    model, src, tgt, _ = lab_toy_forward()
    torch.testing.assert_close(model(src, tgt), model(src, tgt), atol=0, rtol=0)
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))


def test_token_id_outside_vocabulary_names_id_and_size():
    model = build_preset("lab-toy")
    with pytest.raises(AttnlabError, match="token id 30 is outside the vocabulary of size 30"):
        model(torch.tensor([[1, 30]]), torch.tensor([[1]]))
    with pytest.raises(AttnlabError, match="token id -1"):
        model(torch.tensor([[1, 2]]), torch.tensor([[-1]]))
    with pytest.raises(AttnlabError, match="integer tensor"):
        model(torch.tensor([[1.0, 2.0]]), torch.tensor([[1]]))


def test_sequence_longer_than_position_table_is_an_error():
    model = build_preset("lab-toy")
    with pytest.raises(AttnlabError, match="only 5 rows"):
        model(torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.tensor([[1]]))


def test_wrong_mask_to_a_stack_is_an_error():
    enc = Encoder(30, 16, 2, 2, 32, max_positions=10)
    ids = torch.tensor([[1, 2, 0]])
    with pytest.raises(AttnlabError, match="rank"):
        enc(ids, attend_mask=padding_mask(ids)[:, 0, 0])
    with pytest.raises(AttnlabError, match="torch.bool"):
        enc(ids, attend_mask=padding_mask(ids).float())


@torch.no_grad()
def test_a_model_without_positions_keeps_to_its_context_as_the_others_do():
    lm = DecoderLM(20, 16, 1, 2, max_positions=4, positions="none").eval()
    assert lm(torch.ones(1, 4, dtype=torch.long)).shape == (1, 4, 20)
    with pytest.raises(AttnlabError, match=r"reaches position 9 but the model's context is 4 positions"):
        lm(torch.ones(1, 10, dtype=torch.long))
    caches = lm.new_caches()
    lm(torch.ones(1, 4, dtype=torch.long), caches=caches)
    with pytest.raises(AttnlabError, match=r"reaches position 4 but the model's context is 4"):  # a cache too
        lm(torch.ones(1, 1, dtype=torch.long), caches=caches)


def test_ids_of_the_wrong_rank_or_type_are_named_before_torch_sees_them():
    lm = DecoderLM(20, 16, 1, 2, max_positions=8)
    with pytest.raises(AttnlabError, match=r"must be \(batch, seq\), got shape \(3,\)"):
        lm(torch.tensor([1, 2, 3]))
    with pytest.raises(AttnlabError, match=r"got shape \(2, 3, 4\)"):
        Encoder(20, 16, 1, 2, 32, max_positions=8)(torch.ones(2, 3, 4, dtype=torch.long))
    for dtype in (torch.int16, torch.uint8):  # nn.Embedding takes int64 and int32 only
        with pytest.raises(AttnlabError, match="integer tensor"):
            lm(torch.tensor([[1, 2, 3]], dtype=dtype))
    assert lm(torch.tensor([[1, 2, 3]], dtype=torch.int32)).shape == (1, 3, 20)


def test_caches_must_match_the_layers_and_the_batch():
    lm = DecoderLM(20, 16, 2, 2, max_positions=8).eval()
    with pytest.raises(AttnlabError, match="caches has 1 entries, the stack has 2 layers"):
        lm(torch.tensor([[1, 2]]), caches=lm.new_caches()[:1])
    caches = lm.new_caches()
    lm(torch.tensor([[1, 2]]), caches=caches)  # a prompt of batch 1...
    with pytest.raises(AttnlabError, match="the caches hold a batch of 1, but the ids have a batch of 2"):
        lm(torch.tensor([[3], [4]]), caches=caches)  # ...continued with a batch of 2


def test_padding_cannot_enter_a_cache_and_pad_ids_must_be_real_ids():
    lm = DecoderLM(20, 16, 1, 2, max_positions=8, pad_id=0).eval()
    with pytest.raises(AttnlabError, match="padding id 0, which cached decoding cannot mask"):
        lm(torch.tensor([[5, 6, 0]]), caches=lm.new_caches())
    assert lm(torch.tensor([[5, 6, 0]])).shape == (1, 3, 20)  # without caches the padding is masked
    seq2seq = Transformer(12, 15, 16, 1, 2, 32).eval()  # and the same for the encoder-decoder's target
    memory, memory_mask = seq2seq.encode(torch.tensor([[3, 4]]))
    with pytest.raises(AttnlabError, match="padding id 0, which cached decoding cannot mask"):
        seq2seq.decode(torch.tensor([[1, 0]]), memory, memory_attend_mask=memory_mask, caches=seq2seq.new_caches())
    for bad in (None, 20, -1):
        with pytest.raises(AttnlabError, match="pad_id must be an id of both vocabularies"):
            Transformer(12, 15, 16, 1, 2, 32, pad_id=bad)
    with pytest.raises(AttnlabError, match=r"pad_id must be an id of the vocabulary \(or None\)"):
        DecoderLM(20, 16, 1, 2, pad_id=20)


def test_source_and_target_batches_must_agree():
    model = Transformer(12, 15, 16, 1, 2, 32).eval()
    src, tgt = torch.tensor([[3, 4, 5, 0]]), torch.tensor([[1, 2, 3], [1, 4, 5]])
    with pytest.raises(AttnlabError, match="src has batch 1 but tgt has batch 2"):
        model(src, tgt)  # would otherwise decode both targets against source row 0
    memory, mask = model.encode(src)
    with pytest.raises(TypeError):  # the memory mask is keyword-only, like every mask
        model.decode(tgt[:1], memory, mask)


def test_lm_cache_gives_the_same_logits_as_recomputing():
    torch.manual_seed(0)
    for positions in ("learned", "sinusoidal", "rotary"):
        lm = DecoderLM(50, 32, 2, 4, max_positions=16, positions=positions).eval()
        ids = torch.randint(0, 50, (2, 9))
        full = lm(ids)
        caches = lm.new_caches()
        steps = [lm(ids[:, :4], caches=caches)] + [lm(ids[:, t : t + 1], caches=caches) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_lm_is_causal():
    torch.manual_seed(0)
    lm = DecoderLM(50, 32, 2, 4, max_positions=16).eval()
    ids = torch.randint(0, 50, (1, 8))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 50
    torch.testing.assert_close(lm(ids)[:, :5], lm(changed)[:, :5])
    assert not torch.allclose(lm(ids)[:, 5:], lm(changed)[:, 5:])


def test_lm_starts_near_uniform_guessing():
    """GPT-2's initialisation in the core: the tied output must not start with logits sqrt(d) wide."""
    torch.manual_seed(0)
    lm = DecoderLM(65, 128, 4, 4, max_positions=32)
    ids = torch.randint(0, 65, (8, 32))
    with torch.no_grad():
        logits = lm(ids)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())
    assert abs(float(loss) - math.log(65)) < 0.1
    residual = 0.02 / math.sqrt(2 * 4)  # the two projections into the residual stream, in every layer
    for layer in lm.body.layers:
        for weight in (layer.self_attn.out_proj.weight, layer.ffn.down.weight):
            assert weight.std().item() == pytest.approx(residual, rel=0.05)
        assert layer.ffn.up.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_one_cached_query_needs_no_mask_and_several_get_the_causal_one():
    assert cached_causal_mask(1, 7) is None
    torch.testing.assert_close(cached_causal_mask(3, 2), causal_mask(3, 5))


def test_transformer_cached_decoding_matches_full_decoding():
    torch.manual_seed(0)
    model = Transformer(30, 30, 32, 2, 4, 64, dropout=0.0).eval()
    src, tgt = torch.tensor([[4, 5, 6, 0]]), torch.tensor([[1, 7, 8, 9]])
    memory, memory_mask = model.encode(src)
    full, _ = model.decode(tgt, memory, memory_attend_mask=memory_mask)
    caches = model.new_caches()
    steps = [model.decode(tgt[:, t : t + 1], memory, memory_attend_mask=memory_mask, caches=caches)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_a_decoding_step_refused_part_way_leaves_every_cache_as_it_was():
    torch.manual_seed(0)
    model = Transformer(30, 30, 32, 2, 4, 64, num_decoder_layers=2, dropout=0.0).eval()
    src, tgt = torch.tensor([[4, 5, 6, 0], [7, 8, 0, 0]]), torch.tensor([[1, 7], [1, 9]])
    memory, memory_mask = model.encode(src)
    full, _ = model.decode(tgt, memory, memory_attend_mask=memory_mask)
    caches = model.new_caches()
    first, _ = model.decode(tgt[:, :1], memory, memory_attend_mask=memory_mask, caches=caches)
    held = [(cache.k.clone(), cache.v.clone()) for pair in caches for cache in pair]
    # Layer 0's self-attention takes the step before its cross-attention refuses the mask of one key too few.
    with pytest.raises(AttnlabError, match="does not broadcast to the scores' shape"):
        model.decode(tgt[:, 1:], memory, memory_attend_mask=memory_mask[..., :3], caches=caches)
    for cache, (k, v) in zip((c for p in caches for c in p), held):
        assert torch.equal(cache.k, k) and torch.equal(cache.v, v)
    # Interrupted in the output layer, after every layer took the step: taken back too.
    def interrupt(*_):
        raise KeyboardInterrupt

    hook = model.output.register_forward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        model.decode(tgt[:, 1:], memory, memory_attend_mask=memory_mask, caches=caches)
    hook.remove()
    assert [len(cache) for pair in caches for cache in pair] == [1, 4, 1, 4]
    second, _ = model.decode(tgt[:, 1:], memory, memory_attend_mask=memory_mask, caches=caches)  # the retry
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, atol=1e-5, rtol=0)
    # A first step that fails empties the memory caches it filled; pairs without a memory cache are taken.
    fresh = [(KVCache(), None) for _ in model.decoder.layers]
    with pytest.raises(AttnlabError):
        model.decode(tgt[:, :1], memory, memory_attend_mask=memory_mask[..., :3], caches=fresh)
    assert all(len(self_cache) == 0 for self_cache, _ in fresh)
    steps = [model.decode(tgt[:, t : t + 1], memory, memory_attend_mask=memory_mask, caches=fresh)[0] for t in (0, 1)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_caches_of_different_lengths_are_refused_not_read_from_the_first_ones_length():
    lm = DecoderLM(20, 16, 2, 2, max_positions=8).eval()
    caches = lm.new_caches()
    lm(torch.tensor([[1, 2]]), caches=caches)
    caches[1].k, caches[1].v = caches[1].k[..., :1, :], caches[1].v[..., :1, :]  # one layer's cache cut short
    with pytest.raises(AttnlabError, match=r"the layers' caches hold different numbers of positions \(\[2, 1\]\)"):
        lm(torch.tensor([[4]]), caches=caches)
    with pytest.raises(AttnlabError, match="one cache object serves several layers"):
        lm(torch.tensor([[4]]), caches=[KVCache()] * 2)  # every layer would append to the one
    model = Transformer(30, 30, 16, 2, 2, 32, num_decoder_layers=2).eval()
    memory, memory_mask = model.encode(torch.tensor([[4, 5, 6]]))
    shared = KVCache()
    for caches in ([(KVCache(), shared), (KVCache(), shared)], [(shared, shared), (KVCache(), KVCache())]):
        with pytest.raises(AttnlabError, match="one cache object serves several layers"):
            model.decode(torch.tensor([[1]]), memory, memory_attend_mask=memory_mask, caches=caches)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "learned"])
def test_a_model_built_on_the_meta_device_runs_shapes_and_loads_its_weights_after_reset_parameters(positions):
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    made = DecoderLM(20, 16, 2, 2, max_positions=8, positions=positions, pad_id=0).eval()
    with torch.device("meta"):
        empty = DecoderLM(20, 16, 2, 2, max_positions=8, positions=positions, pad_id=0).eval()
    assert empty(ids.to("meta")).shape == (2, 3, 20)  # shape inference: the id checks leave the values unread
    empty.to_empty(device="cpu")
    for module in empty.modules():  # torch's convention after to_empty: each module sets itself up again
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    empty.load_state_dict(made.state_dict())  # the position tables are not in it: they were computed again
    torch.testing.assert_close(empty(ids), made(ids), atol=0, rtol=0)


@pytest.mark.parametrize("make, output, embedding", [
    (lambda: DecoderLM(20, 16, 2, 2, max_positions=8), "lm_head", "body.embed.tokens"),
    (lambda: Transformer(20, 22, 16, 1, 2, 32, tie_output=True), "output", "decoder.embed.tokens"),
])
def test_reset_parameters_after_to_empty_ties_the_output_matrix_to_the_embedding_again(make, output, embedding):
    made = make()
    with torch.device("meta"):
        empty = make()
    empty.to_empty(device="cpu")  # a parameter each for the output and the embedding: untied
    for module in empty.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    empty.load_state_dict(made.state_dict())
    assert empty.get_submodule(output).weight is empty.get_submodule(embedding).weight
    assert empty.num_parameters() == made.num_parameters()

    class OwnInit(DecoderLM):  # a subclass whose own initialisation does not call DecoderLM's
        def reset_parameters(self):
            torch.nn.init.zeros_(self.lm_head.weight)

    own = OwnInit(20, 16, 2, 2, max_positions=8)
    assert own.lm_head.weight is own.body.embed.tokens.weight
    untied = Transformer(20, 22, 16, 1, 2, 32)  # a model that does not tie keeps two matrices
    untied.reset_parameters()
    assert untied.output.weight is not untied.decoder.embed.tokens.weight


@pytest.mark.parametrize("make, output, embedding", [
    (lambda: DecoderLM(20, 16, 2, 2, max_positions=8), "lm_head", "body.embed.tokens"),
    (lambda: Transformer(20, 22, 16, 1, 2, 32, tie_output=True), "output", "decoder.embed.tokens"),
])
def test_loading_with_assign_keeps_the_output_matrix_tied_to_the_embedding(make, output, embedding):
    """Built on the meta device and given its weights with ``assign=True`` (loading without a first allocation):
    torch puts each saved tensor in its own slot, which untied the two matrices; training then moved them apart."""
    torch.manual_seed(0)
    made = make()
    with torch.device("meta"):
        loaded = make()
    loaded.load_state_dict({name: t.clone() for name, t in made.state_dict().items()}, assign=True)
    assert loaded.get_submodule(output).weight is loaded.get_submodule(embedding).weight
    assert loaded.num_parameters() == made.num_parameters()
    untied = Transformer(20, 22, 16, 1, 2, 32)  # a model that does not tie keeps two matrices
    untied.load_state_dict({name: t.clone() for name, t in untied.state_dict().items()}, assign=True)
    assert untied.output.weight is not untied.decoder.embed.tokens.weight


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
def test_loading_with_assign_computes_the_position_tables_on_the_weights_device(positions):
    """The tables are not in a checkpoint, so a model built on ``meta`` and loaded with ``assign=True`` kept them on
    ``meta``: its first call failed on a device mismatch. The load hook computes them where the weights landed."""
    torch.manual_seed(0)
    made = DecoderLM(20, 16, 2, 2, max_positions=8, positions=positions).eval()
    with torch.device("meta"):
        loaded = DecoderLM(20, 16, 2, 2, max_positions=8, positions=positions).eval()
    loaded.load_state_dict({name: t.clone() for name, t in made.state_dict().items()}, assign=True)
    assert not any(buffer.is_meta for buffer in loaded.buffers())
    ids = torch.randint(1, 20, (2, 6))
    torch.testing.assert_close(loaded(ids), made(ids), atol=0, rtol=0)
    with torch.device("meta"):  # a state dict of meta tensors leaves no device to compute the tables on
        still = DecoderLM(20, 16, 2, 2, max_positions=8, positions=positions)
    still.load_state_dict(still.state_dict(), assign=True)
    assert all(buffer.is_meta for buffer in still.buffers())


def test_tied_and_shared_embeddings():
    model = Transformer(40, 40, 16, 1, 2, 32, share_embeddings=True, tie_output=True)
    assert model.output.weight is model.encoder.embed.tokens.weight
    with pytest.raises(AttnlabError, match="one vocabulary"):
        Transformer(40, 41, 16, 1, 2, 32, share_embeddings=True)


@pytest.mark.parametrize("make, message", [
    (lambda: Transformer(20, 22, 8, 1, 2, 16, num_decoder_layers=-1), "num_layers must be a whole number >= 0, got -1"),
    (lambda: DecoderLM(20, 8, 1.5, 2), "num_layers must be a whole number >= 0, got 1.5"),
    (lambda: EncoderClassifier(20, 3, 8, 1, 2, 16, pad_id=50), r"pad_id must be an id of the vocabulary \(0..19\)"),
    (lambda: EncoderClassifier(20, 3, 8, 1, 2, 16, pad_id=None), "pad_id must be an id of the vocabulary"),
    (lambda: EncoderClassifier(20, 3, 8, 1, 2, 16, pad_id=-1), "got -1"),
    # The head count that does not divide the width is the problem, not the odd head width it would give.
    (lambda: DecoderLM(20, 10, 1, 3, positions="rotary"), "d_model=10 is not divisible by num_heads=3"),
    # An empty feed-forward would add nothing to the residual stream, silently.
    (lambda: DecoderLM(20, 8, 1, 2, d_ff=0), "d_ff must be a whole number >= 1, got 0"),
    (lambda: Transformer(20, 22, 8, 1, 2, 16.0), "d_ff must be a whole number >= 1, got 16.0"),
    (lambda: RotaryEmbedding(8, -1), "max_positions must be a whole number >= 1, got -1"),
    # Built, these refused every input at the first forward (or trained with torch's own error at the first step).
    (lambda: Transformer(20, 22, 8, 1, 2, 16, max_src_positions=0), "max_positions must be a whole number >= 1"),
    (lambda: EncoderClassifier(20, 0), "num_classes must be a whole number >= 1, got 0"),
    (lambda: Transformer(20, 22, 8, 1, 2, 16, dropout=2.0), "dropout must be a probability between 0 and 1, got 2.0"),
    # Sizes before torch sees them (torch's own "negative dimension" or "argument 'size'" errors), the width of
    # every model and of the feed-forward too, and the vocabularies before the pad id is compared with them.
    (lambda: DecoderLM(10, d_model=-8), "d_model must be a whole number >= 1, got -8"),
    (lambda: Transformer(10, 10, d_model="4"), "d_model must be a whole number >= 1, got '4'"),
    (lambda: EncoderClassifier(20, 3, d_model=0), "d_model must be a whole number >= 1, got 0"),
    (lambda: FeedForward(0, 4), "d_model must be a whole number >= 1, got 0"),
    (lambda: FeedForward(4, 4, activation=["relu"]), r"unknown activation \['relu'\]"),
    (lambda: Transformer("30", 35), "src_vocab_size must be a whole number >= 1, got '30'"),
    (lambda: Transformer(30, None), "tgt_vocab_size must be a whole number >= 1, got None"),
    (lambda: EncoderClassifier(0, 3), "vocab_size must be a whole number >= 1, got 0"),
    (lambda: DecoderLM(0), "vocab_size must be a whole number >= 1, got 0"),
    # A layer norm's epsilon <= 0 gives NaN outputs; a JSON config's "false" is a true value to Python.
    (lambda: EncoderLayer(4, 2, 8, eps=-1.0), "eps must be a finite number > 0, got -1.0"),
    (lambda: Transformer(20, 20, 8, 1, 2, 8, eps="1e-6"), "eps must be a finite number > 0"),
    (lambda: Transformer(20, 20, 8, 1, 2, 8, tie_output="false"), "tie_output must be true or false, got 'false'"),
    (lambda: Transformer(20, 20, 8, 1, 2, 8, share_embeddings=1), "share_embeddings must be true or false, got 1"),
    (lambda: DecoderLM(20, 8, 1, 2, norm_first="no"), "norm_first must be true or false"),
    (lambda: DecoderLM(20, 8, 0, 2, bias="no"), "bias must be true or false"),  # (no layer reads it: the final norm)
    (lambda: EncoderClassifier(20, 3, 8, 1, 2, 16, scale_embedding="no"), "^scale_embedding must be true or false"),
    (lambda: MultiHeadAttention(8, 2, bias="false"), "bias must be true or false"),  # the blocks used alone too
    (lambda: FeedForward(8, 16, bias="false"), "bias must be true or false"),
])
def test_models_that_cannot_be_built_as_asked_are_refused(make, message):
    with pytest.raises(AttnlabError, match=message):
        make()


def test_an_empty_source_is_refused_instead_of_decoded_against_nothing():
    model = Transformer(20, 22, 8, 1, 2, 16).eval()
    with pytest.raises(AttnlabError, match="the source is empty"):
        model(torch.zeros(2, 0, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(AttnlabError, match="the source is empty"):
        model.encode(torch.zeros(1, 0, dtype=torch.long))


def test_num_decoder_layers_is_taken_as_given():
    model = Transformer(20, 22, 8, 1, 2, 16, num_decoder_layers=3)
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (1, 3)
    assert len(Transformer(20, 22, 8, 1, 2, 16, num_decoder_layers=0).decoder.layers) == 0  # was num_layers
    empty = DecoderLM(20, 8, 0, 2).eval()  # the embeddings alone
    assert empty(torch.ones(1, 3, dtype=torch.long)).shape == (1, 3, 20)
    with pytest.raises(AttnlabError, match="a stack without layers keeps no caches"):  # nothing counts positions
        empty(torch.ones(1, 3, dtype=torch.long), caches=empty.new_caches())


def test_ids_of_the_wrong_rank_and_empty_caches_are_named():
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(AttnlabError, match=r"token ids must be \(batch, seq\), got shape \(5,\)"):
        Transformer(20, 22, 8, 1, 2, 16).eval()(ids, ids[0])
    with pytest.raises(AttnlabError, match=r"caches has 0 entries, the stack has 1 layers"):
        DecoderLM(20, 8, 1, 2).eval()(ids, caches=[])


def test_the_embedder_scales_token_vectors_by_sqrt_d_and_a_pre_norm_stack_ends_normalised():
    embed = Embedder(10, 16, max_positions=8, positions="none", dropout=0.0)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(embed(ids), embed.tokens.weight[ids] * 4.0)  # sqrt(16)
    torch.manual_seed(0)
    encoder = Encoder(20, 16, 2, 2, 32, max_positions=8, dropout=0.0, norm_first=True).eval()
    with torch.no_grad():
        states, _ = encoder(torch.randint(1, 20, (2, 6)))
    torch.testing.assert_close(states.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)  # the final LayerNorm
    assert float(states.std(-1).min()) > 0.5


@torch.no_grad()
def test_cached_decoding_several_tokens_at_a_time_equals_the_full_pass():
    torch.manual_seed(0)
    lm = DecoderLM(50, 32, 2, 4, max_positions=16).eval()
    ids = torch.randint(1, 50, (2, 9))
    caches = lm.new_caches()
    chunks = [lm(ids[:, a:b], caches=caches) for a, b in ((0, 2), (2, 4), (4, 7), (7, 9))]
    torch.testing.assert_close(torch.cat(chunks, 1), lm(ids), atol=1e-5, rtol=0)
    model = Transformer(30, 30, 32, 2, 4, 64, dropout=0.0).eval()
    src, tgt = torch.tensor([[4, 5, 6, 0]]), torch.tensor([[1, 7, 8, 9, 3]])
    memory, memory_mask = model.encode(src)
    full, _ = model.decode(tgt, memory, memory_attend_mask=memory_mask)
    caches = model.new_caches()
    steps = [model.decode(tgt[:, a:b], memory, memory_attend_mask=memory_mask, caches=caches)[0]
             for a, b in ((0, 3), (3, 5))]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_a_decoder_lm_with_a_pad_id_hides_left_padding_too():
    torch.manual_seed(0)
    lm = DecoderLM(20, 16, 1, 2, max_positions=8, pad_id=0, positions="none").eval()  # left padding moves positions
    torch.testing.assert_close(lm(torch.tensor([[0, 0, 5, 6, 7]]))[:, 2:], lm(torch.tensor([[5, 6, 7]])),
                               atol=1e-5, rtol=0)


@torch.no_grad()
def test_the_classifier_normalises_its_states_before_pooling():
    torch.manual_seed(0)
    model = EncoderClassifier(20, 3, 16, 1, 2, 32, max_positions=8).eval()
    ids = torch.tensor([[3, 4, 5, 0]])
    before = model.pooled(ids)
    model.norm.weight.mul_(2.0)  # the norm's gain (its shift starts at 0) scales what is pooled
    torch.testing.assert_close(model.pooled(ids), 2 * before)


def test_a_compiled_decoder_computes_what_the_eager_one_does(monkeypatch):
    """Under torch.compile on the CPU attention takes the written-out path (Inductor fuses it): same numbers."""
    import attnlab.nn.attention as attention

    traced = []
    reference = attention.attention_reference
    monkeypatch.setattr(attention, "attention_reference", lambda *a, **k: traced.append(1) or reference(*a, **k))
    torch.manual_seed(0)
    model = DecoderLM(17, 16, 1, 2, max_positions=8, dropout=0.0)  # one layer: Inductor's C++ build is most of the time
    ids = torch.randint(0, 17, (3, 8))
    eager = model(ids)
    eager.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    assert not traced  # eager: the fused kernel
    compiled = torch.compile(model)(ids)
    compiled.square().mean().backward()
    assert traced  # compiled: the written-out attention, seen while tracing
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6)


def test_the_models_export_with_dynamic_batch_and_length_and_compute_what_they_do_eagerly():
    """torch.export (the way to deploy a model) traces each core model once for any batch and any length."""
    from torch.export import Dim, export

    torch.manual_seed(0)
    batch, src_len, tgt_len = Dim("batch", min=1, max=16), Dim("src", min=2, max=16), Dim("tgt", min=2, max=16)
    src, tgt = torch.randint(1, 19, (2, 9)), torch.randint(1, 19, (2, 6))
    src[0, 6:] = 0  # a padded row: the padding mask is traced too
    models = [
        (DecoderLM(19, 16, 2, 2, max_positions=16, dropout=0.0, positions="rotary"), (tgt,), ({0: batch, 1: tgt_len},)),
        (EncoderClassifier(19, 5, 16, 1, 2, 32, max_positions=16, dropout=0.0), (src,), ({0: batch, 1: src_len},)),
        (Transformer(19, 19, 16, 1, 2, 32, max_src_positions=16, max_tgt_positions=16, dropout=0.0), (src, tgt),
         ({0: batch, 1: src_len}, {0: batch, 1: tgt_len})),
    ]
    for model, example, shapes in models:
        exported = export(model.eval(), example, dynamic_shapes=shapes).module()
        other = [torch.randint(1, 19, (3, n)) for n in (13, 4)[: len(example)]]
        other[0][1, 2:] = 0
        torch.testing.assert_close(exported(*other), model(*other), rtol=1e-5, atol=1e-5)


def test_masked_mean_takes_its_padding_mask_by_keyword_and_refuses_one_of_another_convention():
    from attnlab.nn.models import masked_mean

    states = torch.tensor([[[1.0], [3.0], [100.0]]])  # (1, 3, 1), the last position padding
    keep = torch.tensor([[[[True, True, False]]]])
    assert masked_mean(states, attend_mask=keep).item() == 2.0
    with pytest.raises(TypeError):
        masked_mean(states, keep)  # positional: a mask could land on the wrong parameter
    with pytest.raises(AttnlabError, match="attend_mask must be torch.bool"):
        masked_mean(states, attend_mask=torch.tensor([[[[0.0, 0.0, float("-inf")]]]]))  # additive
    with pytest.raises(AttnlabError, match="rank 2"):
        masked_mean(states, attend_mask=torch.tensor([[True, True, False]]))
    with pytest.raises(AttnlabError, match="a mask of batch 1 for states of batch 2"):
        masked_mean(states.expand(2, 3, 1), attend_mask=keep)  # one row's padding spread over both


def test_a_memory_mask_of_one_row_is_refused_for_a_batch_of_several():
    # Broadcast, the first row's source padding would hide the same keys of every row: plausible, wrong numbers.
    model = Transformer(20, 20, d_model=8, num_layers=1, num_heads=2, d_ff=8).eval()
    src, tgt = torch.tensor([[3, 4, 0, 0], [5, 6, 7, 8]]), torch.tensor([[1, 2], [1, 2]])
    memory, mask = model.encode(src)
    model.decode(tgt, memory, memory_attend_mask=mask)  # the whole batch's mask: fine
    with pytest.raises(AttnlabError, match="memory_attend_mask has a batch of 1, the memory a batch of 2"):
        model.decode(tgt, memory, memory_attend_mask=mask[:1])
    # Copies of one row (memory.expand, as a search over one sentence makes them) may share its one mask row.
    one, one_mask = model.encode(src[:1])
    copies = model.decode(tgt, one.expand(2, -1, -1), memory_attend_mask=one_mask)[0]
    torch.testing.assert_close(copies, model.decode(tgt, one.expand(2, -1, -1),
                                                    memory_attend_mask=one_mask.expand(2, -1, -1, -1))[0], rtol=0, atol=0)
    with pytest.raises(AttnlabError, match="memory_attend_mask has a batch of 2, the memory a batch of 4"):
        model.decode(tgt[:1].expand(4, -1), one.expand(4, -1, -1), memory_attend_mask=one_mask.expand(2, -1, -1, -1))


def test_rotary_positions_keep_to_the_context_without_layers_too():
    model = DecoderLM(20, d_model=8, num_heads=2, num_layers=0, max_positions=4, positions="rotary")
    model(torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(AttnlabError, match="sequence reaches position 9 but the model's context is 4 positions"):
        model(torch.ones(1, 10, dtype=torch.long))


def test_caches_of_another_kind_are_named_before_they_are_read():
    lm = DecoderLM(20, d_model=8, num_layers=2, num_heads=2)
    seq2seq = Transformer(20, 20, d_model=8, num_layers=2, num_heads=2, d_ff=8)
    ids = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(AttnlabError, match=r"caches must be a list of KVCache objects, one a layer.*entry 0 is a tuple "
                                           r"of 2 \(KVCache, KVCache\)"):
        lm(ids, caches=seq2seq.new_caches())
    memory, mask = seq2seq.encode(ids)
    with pytest.raises(AttnlabError, match=r"caches must be a list of \(self-attention, cross-attention\) pairs.*"
                                           "entry 0 is a KVCache"):
        seq2seq.decode(ids, memory, memory_attend_mask=mask, caches=lm.new_caches())
    with pytest.raises(AttnlabError, match=r"entry 1 is a tuple of 1 \(KVCache\)"):  # a pair short of its second
        seq2seq.decode(ids, memory, memory_attend_mask=mask, caches=[seq2seq.new_caches()[0], (KVCache(),)])
    with pytest.raises(AttnlabError, match="makes; got a KVCache"):
        lm(ids, caches=KVCache())
    with pytest.raises(AttnlabError, match="cache must be a KVCache"):
        MultiHeadAttention(8, 2)(torch.ones(1, 2, 8), cache=[])


def test_a_cache_reorders_only_by_row_numbers_it_holds():
    cache = KVCache()
    cache.append(torch.arange(2.0).view(2, 1, 1, 1), torch.arange(2.0).view(2, 1, 1, 1))
    with pytest.raises(AttnlabError, match=r"row numbers must be 0..1 \(the cache holds 2 rows\), got 5..5"):
        cache.reorder(torch.tensor([5]))
    with pytest.raises(AttnlabError, match="got torch.bool of shape"):
        cache.reorder(torch.tensor([True, False]))
    cache.reorder(torch.tensor([1, 1, 0]))
    assert cache.k.flatten().tolist() == [1.0, 1.0, 0.0]
