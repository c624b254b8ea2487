"""Decoding and masks on small random models: caches, beam vs greedy, padding invariance, the leaky decoder."""

import pytest
import torch

from attnlab.data import EOS_ID, PAD_ID
from attnlab.errors import AttnlabError
from attnlab.nn import Transformer
from attnlab.tasks.decoding import DecodeSettings, beam_search, greedy_search, max_lengths, translate_ids
from attnlab.tasks.parallel_data import Pairs, collate
from attnlab.tasks.translate import LeakyTransformer, TranslateSettings, TranslationTask, build_translation_model

pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


def model(seed=0, cls=Transformer, **kw):
    torch.manual_seed(seed)
    args = dict(d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0, max_src_positions=12, max_tgt_positions=20)
    return build_translation_model((30, 40), {**args, **kw}, share_embeddings=False, tie_output=False,
                       look_ahead_mask=cls is Transformer).eval()


def sources(seed=1):
    """Four sources of different lengths (7, 3, 5, 1 real ids, eos last), right-padded to 7."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(4, 30, (n,), generator=g).tolist() + [EOS_ID] for n in (6, 2, 4, 0)]
    return rows, torch.tensor([r + [PAD_ID] * (7 - len(r)) for r in rows])


def test_cached_and_uncached_decoding_give_the_same_tokens():
    m = model()
    _, src = sources()
    greedy = greedy_search(m, src, use_cache=True)
    assert greedy == greedy_search(m, src, use_cache=False)
    assert beam_search(m, src, beam_size=3, use_cache=True) == beam_search(m, src, beam_size=3, use_cache=False)
    assert max(len(h) for h in greedy) > 5  # a random model talks long enough for the caches to matter


def test_beam_size_one_is_greedy_search():
    for seed in range(3):
        m = model(seed)
        _, src = sources(seed + 1)
        assert beam_search(m, src, beam_size=1) == greedy_search(m, src)


def test_a_beam_wider_than_the_tokens_that_can_extend_a_hypothesis_is_refused():
    torch.manual_seed(0)
    tiny = Transformer(6, 6, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.0).eval()  # 3 special ids
    src = torch.tensor([[4, 5, EOS_ID]])
    for use_cache in (True, False):
        assert len(beam_search(tiny, src, beam_size=3, use_cache=use_cache)) == 1  # <unk>, 4 and 5: enough
        with pytest.raises(AttnlabError, match="beam size 4 is larger than the 3 tokens that can extend"):
            beam_search(tiny, src, beam_size=4, use_cache=use_cache)  # would keep a <pad> or <bos> beam alive


def test_decoding_does_not_depend_on_batch_padding():
    """Each sentence alone, unpadded, decodes exactly as inside the padded batch.

    This fails if the encoder or cross-attention mask were built from anything but the source ids (say
    from the target, of another length), because then padded source positions would be attended.
    """
    m = model()
    rows, src = sources()
    batched_greedy, batched_beam = greedy_search(m, src), beam_search(m, src, beam_size=3)
    for i, row in enumerate(rows):
        alone = torch.tensor([row])
        assert greedy_search(m, alone) == [batched_greedy[i]]
        assert beam_search(m, alone, beam_size=3) == [batched_beam[i]]


@torch.no_grad()
def test_cross_attention_ignores_source_padding_content_with_different_target_length():
    m = model()
    _, src = sources()
    tgt = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11, 12, 13]] * 4)  # 10 target positions vs 7 source positions
    logits, weights = m(src, tgt, return_attention=True)
    garbage = src.clone()
    garbage[src == PAD_ID] = 29  # what sits in the padded slots must not matter...
    mask = (src != PAD_ID)[:, None, None, :]
    memory, _ = m.encoder(garbage, attend_mask=mask)
    other, _ = m.decode(tgt, memory, memory_attend_mask=mask)  # ...when the mask comes from the source ids
    torch.testing.assert_close(other, logits)
    cross = weights["decoder_layer2_block2_decenc_att"]  # (batch, heads, tgt 10, src 7)
    assert cross.shape == (4, 4, 10, 7)
    assert float(cross[~mask.expand_as(cross)].abs().max()) == 0.0
    torch.testing.assert_close(cross.sum(-1), torch.ones(4, 4, 10))


def test_training_loss_ignores_target_padding():
    m = model()
    m.train(False)
    pairs = Pairs(src=[[5, 6, 7, EOS_ID], [8, EOS_ID]], tgt=[[9, 10, 11, 12, 13], [14]], kept=[0, 1])
    task = TranslationTask(pairs, pairs, [], [], None, TranslateSettings(label_smoothing=0.1))
    together = task.loss(m, collate(pairs, [0, 1]))
    apart = task.loss(m, collate(pairs, [0])) + task.loss(m, collate(pairs, [1]))
    torch.testing.assert_close(together, apart)


def test_length_limit_is_relative_to_the_source_and_capped_by_the_position_table():
    m = model()
    _, src = sources()
    assert max_lengths(src, m, 1.0, 2).tolist() == [9, 5, 7, 3]
    assert max_lengths(src, m, 5.0, 10).tolist() == [20, 20, 20, 15]
    # "no limit" is the position table, never an int64 overflow that wraps to a limit of 1 token
    assert max_lengths(src, m, 1e19, 0).tolist() == [20] * 4
    assert max_lengths(src, m, 1.0, 99999999999999999999).tolist() == [20] * 4
    for hyp, limit in zip(greedy_search(m, src, max_len_a=0.0, max_len_b=3), [3, 3, 3, 3]):
        assert len(hyp) <= limit
    with pytest.raises(AttnlabError, match="beam size"):
        DecodeSettings(beam_size=0)


def test_translate_ids_restores_the_input_order_across_batches():
    m = model()
    rows, _ = sources()
    settings = DecodeSettings(beam_size=2)
    one_by_one = [translate_ids(m, [r], settings)[0] for r in rows]
    assert translate_ids(m, rows, settings, max_tokens=8) == one_by_one  # several length-sorted batches


def test_leaky_decoder_sees_the_future_under_teacher_forcing_but_not_when_decoding():
    correct, leaky = model(), model(cls=LeakyTransformer)
    leaky.load_state_dict(correct.state_dict())
    _, src = sources()
    tgt = torch.tensor([[2, 5, 6, 7, 8]] * 4)
    changed = tgt.clone()
    changed[:, 4] = 9  # change only the last input token
    for m, leaks in ((correct, False), (leaky, True)):
        first = m(src, tgt)[:, :4]
        second = m(src, changed)[:, :4]
        assert (not torch.allclose(first, second)) == leaks
    # Free running feeds one token at a time through the cache: no future exists, both decode alike.
    assert greedy_search(leaky, src) == greedy_search(correct, src)


@pytest.mark.parametrize(("settings", "said"), [
    ({"max_len_a": float("nan")}, r"max_len_a \(--max-len-a\) must be a finite number >= 0, got nan"),
    ({"max_len_a": float("inf")}, "must be a finite number"),  # accepted before: decoding until the cache ran out
    ({"max_len_a": 0.0, "max_len_b": 0},
     r"max_len_a 0 and max_len_b 0 \(--max-len-a, --max-len-b\) allow no token for the shortest source, one id"),
    ({"max_len_a": None}, "must be a finite number >= 0, got None"),
    ({"max_len_a": 0.0, "max_len_b": float("nan")}, r"max_len_b \(--max-len-b\) must be a whole number >= 0, got nan"),
])
def test_decode_settings_that_allow_no_length_are_refused_in_the_apis_names_and_the_options(settings, said):
    with pytest.raises(AttnlabError, match=said):
        DecodeSettings(**settings)


def test_scores_gone_nan_are_named_as_such_not_as_padding_fed_to_the_caches():
    """Huge finite weights (a run that diverged) give NaN scores; their arg-max is the padding id, and decoding
    said it could not mask padding in its caches: a fix no user could make."""
    m = model()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1e28)
    _, src = sources()
    for search in (greedy_search, lambda *a, **k: beam_search(*a, beam_size=2, **k)):
        with pytest.raises(AttnlabError, match="the model's scores for the next token are NaN or infinite: its "
                                               "weights have diverged"):
            search(m, src)
