"""Tokenizers and batching."""

import pytest
import torch

from attnlab.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    bucketed_batches,
    load_tokenizer,
    pad_batch,
    word_tokens,
)
from attnlab.errors import AttnlabError


def padding_fraction(batches, lengths) -> float:
    """Share of the padded tokens in ``batches`` that are padding."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return 1.0 - real / padded if padded else 0.0

def test_word_tokenizer_counts_and_reserves_padding(tmp_path):
    assert word_tokens("Damaged on arrival, NOT after use!") == ["damaged", "on", "arrival", ",", "not", "after", "use", "!"]
    tok = WordTokenizer.train(["the parcel is late", "the parcel is lost"], min_freq=1)
    assert tok.itos[:2] == ["<pad>", "<unk>"] and tok.stoi["the"] == 2
    assert tok.encode("the unicorn") == [2, UNK_ID]
    tok.save(tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json").encode("parcel is late") == tok.encode("parcel is late")


def test_char_tokenizer_round_trip_and_unknown_character(tmp_path):
    tok = CharTokenizer.train("hello world")
    assert tok.pad_id == PAD_ID and min(tok.encode("hello")) >= 1
    assert tok.decode(tok.encode("hello world")) == "hello world"
    with pytest.raises(AttnlabError, match="character 'z' is not in this model's vocabulary"):
        tok.encode("zebra")
    tok.save(tmp_path / "c.json")
    assert load_tokenizer(tmp_path / "c.json").decode(tok.encode("old")) == "old"


def test_bpe_tokenizer_specials_and_exact_detokenization(tmp_path):
    texts = ["Ein Mann fährt Fahrrad.", "Eine Frau liest ein Buch.", "Zwei Hunde spielen im Schnee."] * 20
    tok = BPETokenizer.train(texts, vocab_size=120, min_frequency=1)
    assert (tok.pad_id, BOS_ID, EOS_ID) == (0, 2, 3)
    assert tok.hf.token_to_id("<pad>") == 0 and tok.hf.token_to_id("<eos>") == 3
    for text in ("Ein Mann fährt Fahrrad.", "Zwei Frauen spielen."):
        assert tok.decode(tok.encode(text)) == text
        assert tok.decode([BOS_ID, *tok.encode(text), EOS_ID, PAD_ID, PAD_ID]) == text  # what a decoder emits
    # "q" and "x" were never seen: they stay visible instead of vanishing into a real-looking "Fahrrad ist"
    assert UNK_ID in tok.encode("Fahrrad quixt")
    assert tok.decode(tok.encode("Fahrrad quixt")) == "Fahrrad <unk>ui<unk>t"
    tok.save(tmp_path / "b.json")
    assert load_tokenizer(tmp_path / "b.json").encode(texts[0]) == tok.encode(texts[0])


def test_bpe_reads_tabs_and_extra_spaces_as_one_space_unless_told_to_keep_them(tmp_path):
    """A tab became <unk> and a trailing or double space a piece of its own: an invisible difference changed a
    translation. The language model keeps its text's line breaks and indentation (collapse_whitespace=False)."""
    texts = ["Ein Mann fährt Fahrrad.", "Eine Frau liest ein Buch.", "Zwei Hunde spielen im Schnee."] * 20
    tok = BPETokenizer.train(texts, vocab_size=120, min_frequency=1)
    tok.save(tmp_path / "b.json")
    clean = tok.encode("Ein Mann fährt Fahrrad.")
    for t in (tok, load_tokenizer(tmp_path / "b.json")):  # the rule is saved with the tokenizer
        for messy in ("Ein\tMann\tfährt\tFahrrad.", "Ein Mann fährt Fahrrad. ", "  Ein Mann  fährt\u00a0Fahrrad.",
                      "Ein Mann\nfährt\r\nFahrrad.\u3000"):
            assert t.encode(messy) == clean, messy
    running = BPETokenizer.train(["To be,\n  or not\tto be."] * 20, vocab_size=120, min_frequency=1,
                                 collapse_whitespace=False)
    assert running.decode(running.encode("To be,\n  or not\tto be.")) == "To be,\n  or not\tto be."


def test_bpe_reads_special_token_names_in_a_text_as_plain_characters(tmp_path):
    """A sentence quoting "<pad>" or "<eos>" must not turn into padding or an end of sentence (the loss would
    skip the one and a decoder learn to stop at the other), neither when trained nor once read back."""
    texts = ["tags such as <pad> and <eos> appear in html", "a plain sentence about tags",
             "in a listing (<pad>) or <b><eos></b>"] * 10
    tok = BPETokenizer.train(texts, vocab_size=200, min_frequency=1)
    tok.save(tmp_path / "b.json")
    for t in (tok, load_tokenizer(tmp_path / "b.json")):
        for text in texts[:3]:
            ids = t.encode(text)
            assert not {PAD_ID, UNK_ID, BOS_ID, EOS_ID} & set(ids)
            assert t.decode(ids) == text
    # Glued to other marks, "<pad" + ">" becomes a merge the trainer learns, whose result had the padding id.
    glued = ["the html <b><pad></b> tag and the end marker\n<eos>\nshown in a listing", "a line (<pad>) quoted"] * 20
    tok = BPETokenizer.train(glued, vocab_size=200, min_frequency=1)
    ids = tok.encode("a line <pad> quoted <b><pad></b>")
    assert not {PAD_ID, UNK_ID, BOS_ID, EOS_ID} & set(ids) and tok.decode(ids) == "a line <pad> quoted <b><pad></b>"


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(AttnlabError, match="no tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(AttnlabError, match="not a tokenizer file"):
        load_tokenizer(tmp_path / "x.json")
    for content, why in (('{"model": {"type": "BPE"}}', "Missing vocab/merges"), ('{"kind": "char"}', "no 'chars'"),
                         ('{"kind": "char", "chars": 5}', "'chars' must be a list of strings"),
                         ('{"kind": "word", "itos": ["<pad>", 7]}', "'itos' must be a list of strings"),
                         # damaged entries that decoded wrongly without a word: a text with two ids, one gone
                         ('{"kind": "char", "chars": ["a", "b", "a"]}', "'chars' holds 'a' twice"),
                         ('{"kind": "char", "chars": ["a", ""]}', "'chars' holds '', which is not one character"),
                         ('{"kind": "char", "chars": ["a", "bc"]}', "'chars' holds 'bc', which is not one character"),
                         ('{"kind": "word", "itos": ["<pad>", "<unk>", "the", "the"]}', "'itos' holds 'the' twice"),
                         ('{"kind": "word", "itos": ["<pad>", "<unk>", ""]}', "'itos' holds '', which is not a word")):
        (tmp_path / "x.json").write_text(content)
        with pytest.raises(AttnlabError, match=f"x.json is a broken tokenizer file \\(.*{why}"):
            load_tokenizer(tmp_path / "x.json")
    (tmp_path / "x.json").write_bytes(b'{"kind": "char", "chars": "\xff"}')
    with pytest.raises(AttnlabError, match=r"x.json is not UTF-8 text \(line 1"):
        load_tokenizer(tmp_path / "x.json")


def test_pad_batch():
    assert torch.equal(pad_batch([[5, 6, 7], [8]]), torch.tensor([[5, 6, 7], [8, 0, 0]]))


def test_bucketing_covers_every_example_once_and_reduces_padding():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (1000,), generator=g).tolist()
    batches = bucketed_batches(lengths, seed=0, epoch=0, batch_size=16)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert all(len(b) <= 16 for b in batches)
    random_batches = [list(range(i, min(i + 16, 1000))) for i in range(0, 1000, 16)]
    assert padding_fraction(batches, lengths) < 0.5 * padding_fraction(random_batches, lengths)
    assert bucketed_batches(lengths, seed=0, epoch=0, batch_size=16) == batches  # deterministic
    assert bucketed_batches(lengths, seed=0, epoch=1, batch_size=16) != batches  # reshuffled per epoch
    by_tokens = bucketed_batches(lengths, seed=0, epoch=0, max_tokens=200)
    assert all(len(b) * max(lengths[i] for i in b) <= 200 or len(b) == 1 for b in by_tokens)
    assert sorted(i for b in by_tokens for i in b) == list(range(1000))
    largest = bucketed_batches(lengths, seed=2**32 - 1, epoch=3, batch_size=16)  # the top of every --seed range
    assert sorted(i for b in largest for i in b) == list(range(1000)) and largest != batches
