"""Classification data and models: table readers, splits, encoding, token features, the model classes, probes.

Also holds :func:`write_tickets`, the small synthetic data set every ``test_classify*`` file trains on.
"""

import csv
import json
import os
import random
import re
import sys

import pytest
import torch
import torch.nn.functional as F

from attnlab.data import WordTokenizer, pad_batch
from attnlab.errors import AttnlabError
from attnlab.nn import EncoderClassifier
from attnlab.nn.masks import padding_mask
from attnlab.tasks.classify import IGNORED_LABEL, ClassifyTask, encode_texts
from attnlab.tasks.classify_features import (
    Pretrained,
    char_ngrams,
    join_tables,
    ngram_table,
    pretrained_table,
    token_strings,
    wordllama_table,
)
from attnlab.tasks.classify_models import TextClassifier
from attnlab.tasks.classify_probes import positions_zeroed, shuffle_each
from attnlab.tasks.tables import check_classes, read_table, split_off
from attnlab.training.distributed import Place

TEAMS = {
    "delivery": ["parcel", "courier", "shipping", "tracking", "arrive"],
    "refund": ["refund", "reimburse", "return", "money"],
    "payment": ["card", "charged", "invoice", "payment"],
    "account": ["password", "login", "email", "profile"],
}
FILLER = ["please", "help", "my", "the", "is", "not", "i", "need", "urgent", "today", "hello", "order", "again", "why"]


def tickets(n, seed=0, label_column="team"):
    """``n`` rows whose team is named by one or two keywords among filler words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        team = rng.choice(sorted(TEAMS))
        words = rng.sample(FILLER, rng.randint(2, 8)) + [rng.choice(TEAMS[team]) for _ in range(rng.randint(1, 2))]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), label_column: team})
    return rows


def write_tickets(path, n, seed=0, label_column="team"):
    """Write :func:`tickets` as CSV (or JSON lines when ``path`` ends in .jsonl); returns ``path``."""
    rows = tickets(n, seed, label_column)
    if str(path).endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


def test_csv_and_jsonl_read_the_same_rows_and_two_column_files_find_their_label(tmp_path):
    a = read_table(write_tickets(tmp_path / "t.csv", 20))  # text,team: "team" is the one other column
    b = read_table(write_tickets(tmp_path / "t.jsonl", 20))
    assert a.texts == b.texts and a.labels == b.labels and a.label_column == "team"
    c = read_table(write_tickets(tmp_path / "l.csv", 5, label_column="label"))
    assert c.label_column == "label"



def test_a_text_past_the_csv_modules_field_limit_is_read(tmp_path):
    # (csv refuses fields past 128 KiB by default, without naming their line; no text is longer than its file)
    import csv

    path = tmp_path / "long.csv"
    path.write_text("text,team\n" + "word " * 40_000 + ",a\nshort,b\n", encoding="utf-8")
    limit = csv.field_size_limit()
    table = read_table(path)
    assert len(table.texts[0]) == 200_000 and table.labels == ["a", "b"]
    assert csv.field_size_limit() == limit  # put back

def test_texts_are_read_as_the_csv_and_json_modules_read_them(tmp_path):
    texts = ["my card\nwas stolen", "i want a\r\nrefund", "refund\u2028please", "plain"]
    rows = [{"text": t, "label": "x" if i % 2 else "y"} for i, t in enumerate(texts)]
    with open(tmp_path / "t.csv", "w", newline="", encoding="utf-8") as f:  # quoted fields keep their line breaks
        writer = csv.DictWriter(f, ["text", "label"])
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                      encoding="utf-8")  # U+2028 written as it is
    for name in ("t.csv", "t.jsonl"):  # before: the line breaks were dropped, U+2028 cut a row in two
        assert read_table(tmp_path / name).texts == texts, name
    (tmp_path / "cr.jsonl").write_text("\r".join(json.dumps(r) for r in rows[2:]) + "\r")  # an old Mac's line ends
    assert read_table(tmp_path / "cr.jsonl").texts == texts[2:]


def test_a_json_number_label_written_two_ways_is_refused_and_labels_stay_as_written(tmp_path):
    """1 and 1.0 are the same JSON number; they made two classes of three (six in all). Turning 1.0 into 1 instead
    would make a run trained before on 1.0 score 0% on its own data, and read a CSV's "1.0" as another class."""
    rows = [{"text": f"ticket {i}", "label": (i % 3) if i % 2 else float(i % 3)} for i in range(12)]
    (tmp_path / "n.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(AttnlabError, match=r"n.jsonl, column 'label': the labels 0 and 0.0 are one number "
                                           r"written two ways"):
        read_table(tmp_path / "n.jsonl")
    # A CSV's cells are text: section 1.1 and 1.10, codes 01 and 1, are other labels (a first version refused them).
    (tmp_path / "e.csv").write_text("text,label\na,1.1\nb,1.10\nc,01\nd,1\ne,1e2\nf,100\n")
    assert read_table(tmp_path / "e.csv").labels == ["1.1", "1.10", "01", "1", "1e2", "100"]
    # JSON numbers are compared exactly: long ids a float would round together stay two classes.
    ids = [9007199254740992, 9007199254740993]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps({"text": "t", "label": v}) + "\n" for v in ids))
    assert read_table(tmp_path / "ids.jsonl").labels == ["9007199254740992", "9007199254740993"]
    values = (0.5, 2.0, "2.0", True, 1e23)
    (tmp_path / "f.jsonl").write_text("".join(json.dumps({"text": "t", "label": v}) + "\n" for v in values))
    assert read_table(tmp_path / "f.jsonl").labels == ["0.5", "2.0", "2.0", "true", "1e+23"]


@pytest.mark.parametrize(("column", "value", "kind"), [("label", ["billing", "refund"], "an array"),
                                                       ("label", {"name": "billing"}, "an object"),
                                                       ("text", ["my card", "was charged twice"], "an array")])
def test_a_json_array_or_object_in_a_column_read_is_refused_by_row(tmp_path, column, value, kind):
    """Its JSON spelling became a text, or a class of its own: a multi-label row made a third class beside billing
    and refund. An array in a column the run does not read is left alone."""
    rows = [{"text": "card declined", "label": "billing", "tags": ["x"]}, {"text": "money back", "label": "refund"}]
    rows.insert(1, {**rows[0], column: value})
    (tmp_path / "t.jsonl").write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # (a blank line first)
    with pytest.raises(AttnlabError, match=rf"t.jsonl: row 2: its '{column}' is {kind}; it must be "
                                           + ("one label" if column == "label" else "text")):
        read_table(tmp_path / "t.jsonl")
    if column == "label":  # read without labels (predict), the label column is not read
        assert read_table(tmp_path / "t.jsonl", with_labels=False).texts == ["card declined"] * 2 + ["money back"]
    del rows[1]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_table(tmp_path / "t.jsonl").labels == ["billing", "refund"]


@pytest.mark.parametrize(
    ("content", "kwargs", "message"),
    [
        ("text,team,extra\nhi,a,x\n", {}, r"no 'label' column .* columns are \['text', 'team', 'extra'\]"),
        ("body,team\nhi,a\n", {}, r"no text column 'text'; its columns are \['body', 'team'\]"),
        ("text,team\nhi,a\n", {"label_column": "intent"}, r"no label column 'intent'; its columns are"),
        ("text,team\nhi,a\n  ,b\n,c\n", {}, r"2 row\(s\) have an empty 'text' \(first: data row 2\)"),
        ("text,team\nhi,\n", {}, r"1 row\(s\) have no 'team' label"),
        ("text,team\n", {}, "holds no rows"),
        ("text,team\nhi,a\n", {"label_column": "text"}, r"the text column 'text' is also the label column"),
        ("label,team\nhi,a\n", {"text_column": "label"}, r"the text column 'label' is also the label column"),
        ("text,text\nhi,a\n", {}, r"bad.csv: the header names the column 'text' 2 times"),
        ("text,label,label\nhi,a,b\n", {}, r"bad.csv: the header names the column 'label' 2 times"),
    ],
)
def test_bad_tables_are_one_clear_error(tmp_path, content, kwargs, message):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(AttnlabError, match=message):
        read_table(path, **kwargs)


def test_missing_file_bad_json_one_class_few_shots_and_a_spreadsheet(tmp_path):
    with pytest.raises(AttnlabError, match="data file not found"):
        read_table(tmp_path / "nope.csv")
    with pytest.raises(AttnlabError, match=f"^{re.escape(str(tmp_path))} is a folder, not a table file$"):
        read_table(tmp_path)
    os.mkfifo(tmp_path / "pipe.csv")  # (opened, it would block: refused by what it is)
    with pytest.raises(AttnlabError, match=r"pipe.csv is not a regular file \(a pipe or a device, say\)"):
        read_table(tmp_path / "pipe.csv")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": "x"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(AttnlabError, match=r"bad.jsonl:2: expected a JSON object"):
        read_table(bad)
    one = tmp_path / "one.csv"
    one.write_text("text,label\na,x\nb,x\n", encoding="utf-8")
    with pytest.raises(AttnlabError, match="holds one class only"):
        check_classes(read_table(one))
    few_shot = tmp_path / "few.csv"  # one example a class is a table to learn from (validated on another file)
    few_shot.write_text("text,label\n" + "".join(f"text {i},intent-{i}\n" for i in range(25)), encoding="utf-8")
    assert len(check_classes(read_table(few_shot))) == 25
    sheet = tmp_path / "sheet.csv"  # a spreadsheet's export: empty names for its trailing cells, which go unread
    sheet.write_text("text,label,,\nhi,a,,\nho,b,,\n", encoding="utf-8")
    assert check_classes(read_table(sheet)) == ["a", "b"]


def test_split_is_seeded_disjoint_and_complete(tmp_path):
    table = read_table(write_tickets(tmp_path / "t.csv", 50))
    train, valid = split_off(table, 0.2, seed=3)
    again, _ = split_off(table, 0.2, seed=3)
    other, _ = split_off(table, 0.2, seed=4)
    assert len(valid) == 10 and len(train) == 40 and train.texts == again.texts and train.texts != other.texts
    assert sorted(train.texts + valid.texts) == sorted(table.texts)
    with pytest.raises(AttnlabError, match="between 0 and 1"):
        split_off(table, 1.5, seed=0)
    with pytest.raises(AttnlabError, match=r"--valid-fraction 0.999 of .*'s 50 rows holds out all of them: nothing "
                                           r"would be left to train on"):
        split_off(table, 0.999, seed=0)
    with pytest.raises(AttnlabError, match=r"--valid-fraction 0.001 .* less than one row: nothing would be held out"):
        split_off(table, 0.001, seed=0)


def test_truncation_is_counted_and_no_text_encodes_to_nothing():
    tok = WordTokenizer.train(["a b c d e f"])
    enc = encode_texts(tok, ["a b c d e f", "a b", "\u263a"], max_len=4)
    assert [len(x) for x in enc.ids] == [4, 2, 1] and enc.truncated == 1
    assert "1 of 3 texts were longer than the model's 4 positions" in enc.note("training")
    assert encode_texts(tok, ["a"], max_len=4).note("x") is None


def test_batches_cover_each_epoch_once_and_shard_evenly():
    ids = [[2] * (1 + i % 7) for i in range(41)]
    task = ClassifyTask(ids, [i % 3 for i in range(41)], ids[:5], [0] * 5, batch_size=8, seed=0)
    seen = [int(x) for b in task.batches(0, Place()) for x in b.data["labels"].tolist()]
    assert len(seen) == 41
    ranks = [list(task.batches(1, Place(rank=r, world=2))) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == task.batches_per_epoch()
    assert sum(b.count for r in ranks for b in r) == 41  # a last batch of one is kept: one process gets it
    singles = [i for i, b in enumerate(task.batches(1, Place())) if b.count == 1]
    for i in singles:  # the process with nothing runs a stand-in example whose loss is ignored
        assert ranks[1][i].count == 0 and ranks[1][i].data["labels"].tolist() == [IGNORED_LABEL]
        model = EncoderClassifier(20, 3, 8, 1, 2, 16, max_positions=12)
        assert task.loss(model, ranks[1][i].data).item() == 0.0
    for batch in task.batches(0, Place()):  # padded to the batch's own longest text, not a global maximum
        assert batch.data["ids"].shape[1] == int((batch.data["ids"] != 0).sum(1).max())


def test_char_ngrams_and_table():
    assert char_ngrams("<ab>") == ["<ab", "ab>", "<ab>"]
    tok = WordTokenizer(["<pad>", "<unk>", "card", "cards", "zebra"])
    table, count = ngram_table(token_strings(tok), trained=4, per_token=8)  # "zebra" was not seen in training
    assert table.shape == (5, 8) and table[:2].eq(0).all()
    shared = set(table[2].tolist()) & set(table[3].tolist()) - {0}
    assert len(shared) >= 3  # "<ca", "car", "ard", "<car", "card"...
    assert table[4].eq(0).all() and count == len({g for w in ("<card>", "<cards>") for g in char_ngrams(w)})


def _model(**kw):
    torch.manual_seed(0)
    args = dict(num_ngrams=20, ngrams_per_word=4, vector_dim=6, trained_words=9, dropout=0.0, max_positions=12)
    args.update(kw)
    model = TextClassifier(12, 3, 16, 2, 2, 32, **args).eval()
    if args["num_ngrams"]:
        model.set_features(torch.randint(0, 21, (12, 4)), torch.randn(12, 6) if args["vector_dim"] else None)
    model.fit_idf([[2, 3, 4], [3, 4, 5, 6], [7, 8]])
    if model.wide is not None:
        torch.nn.init.normal_(model.wide.weight)  # a trained wide head, so that it changes the scores
    return model


def test_wordllama_vectors_carry_meaning_and_an_empty_token_gets_zeros():
    strings = ["<card>", "<cards>", "<weather>", "<volcano>", "<refund>", "<reimburse>", "<>"]
    got = wordllama_table(strings)
    assert got.table.shape == (7, 256) and got.found == 6 and "wordllama" in got.source
    assert torch.equal(got.table[6], torch.zeros(256))
    assert got.table[:6].std().item() == pytest.approx(1.0, abs=1e-3)
    v = F.normalize(got.table[:6], dim=1)
    sim = v @ v.T  # the table and the tokenizer belong together: related words are near, others are not
    assert sim[0, 1] > 0.5 > max(sim[0, 2], sim[0, 3])
    assert sim[4, 5] > max(sim[4, 2], sim[4, 3], sim[4, 0])


def test_special_tokens_take_no_pretrained_vector(tmp_path):
    glove = tmp_path / "glove.50d.txt"  # the English words "pad" and "unk" have vectors; <pad> and <unk> must not
    glove.write_text("".join(f"{w} {' '.join(str(i + j) for j in range(50))}\n"
                             for i, w in enumerate(("pad", "unk", "card"))), encoding="utf-8")
    strings = token_strings(WordTokenizer(["<pad>", "<unk>", "card", "pad"]))
    got = pretrained_table(strings, str(glove))
    assert got.found == 2 and got.table[:2].eq(0).all() and got.table[2:].ne(0).any(1).all()  # "pad" the word does
    llama = wordllama_table(strings)
    assert llama.found == 2 and llama.table[:2].eq(0).all()


def test_join_tables_puts_pretrained_tables_side_by_side():
    a, b = Pretrained(torch.ones(3, 2), 2, "a"), Pretrained(torch.zeros(3, 4), 3, "b")
    joined = join_tables(a, None, b)
    assert joined.table.shape == (3, 6) and joined.source == "a + b" and joined.found == 3
    assert torch.equal(joined.table[:, :2], a.table) and join_tables(None, None) is None


def test_a_missing_wordllama_package_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wordllama", None)
    with pytest.raises(AttnlabError, match="need the package wordllama.*--no-wordllama"):
        wordllama_table(["<card>"])


@pytest.mark.parametrize("kw", [{}, {"layer_heads": False}, {"wide": True}, {"wide": True, "layer_heads": False},
                                {"num_layers": 0, "positions": "none", "head_hidden": 8},
                                {"num_ngrams": 0, "vector_dim": 0}])
def test_text_classifier_shapes_mask_and_padding_invariance(kw):
    if "num_layers" in kw:
        torch.manual_seed(0)
        model = TextClassifier(12, 3, 16, kw.pop("num_layers"), 2, 32, num_ngrams=20, ngrams_per_word=4,
                               trained_words=9, dropout=0.0, max_positions=12, **kw).eval()
    else:
        model = _model(**kw)
    ids = pad_batch([[3, 4, 5], [2, 11, 7, 8, 9, 10]])
    logits = model(ids)
    assert logits.shape == (2, 3)
    torch.testing.assert_close(logits, model.logits_with_mask(ids, attend_mask=padding_mask(ids)))
    torch.testing.assert_close(logits[0], model(ids[:1, :3])[0], atol=1e-5, rtol=1e-5)  # padding is invisible
    assert TextClassifier(**model.config).config == model.config  # config rebuilds the same model
    heads = model(ids, each_head=True)
    assert heads.shape == (model.num_heads_out, 2, 3)
    torch.testing.assert_close(model.vote(heads), logits)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_last_head_reads_the_encoder_output_pooled_reads(norm_first):
    torch.manual_seed(0)
    model = TextClassifier(20, 3, 16, 2, 2, 32, dropout=0.0, norm_first=norm_first, layer_heads=False).eval()
    with torch.no_grad():
        model.encoder.final_norm.weight.fill_(2.0) if norm_first else None  # a trained final norm is no identity
    ids = pad_batch([[5, 6, 7], [8, 9]])
    torch.testing.assert_close(model(ids), model.out(model.pooled(ids)))
    model.train()
    model(ids).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)  # DDP needs every one used


def test_wide_head_is_tfidf_weighted_and_votes_half():
    model = _model(wide=True)
    # ids 9.. were never seen in training (trained_words=9): no word feature, only their n-grams.
    feats = model.wide_features(torch.tensor([[2, 10, 0]]))
    assert feats.shape == (1, 3 * 5) and feats[0, 0] == 2 and feats[0, 1] == 0 and feats[0, 2] == 0
    assert (feats[0, 3:] >= 9).logical_or(feats[0, 3:] == 0).all()  # n-gram features sit after the words
    idf = model.wide_idf
    assert idf[0] == 0 and idf[3] == idf[4] < idf[2]  # words 3 and 4 are in two of the three texts, word 2 in one
    heads = model(torch.tensor([[2, 3, 4]]), each_head=True)
    expected = 0.5 * heads[:-1].mean(0) + 0.5 * heads[-1]
    torch.testing.assert_close(model(torch.tensor([[2, 3, 4]])), expected)


def test_the_wide_bag_is_normalised_over_occurrences_so_a_text_said_twice_weighs_sqrt_2():
    model = _model(wide=True)
    once, twice = (model.wide_logits(torch.tensor([[3, 4] * n])) - model.wide_bias for n in (1, 2))
    torch.testing.assert_close(twice, 2**0.5 * once)  # the documented choice (scikit-learn's norm would make them equal)


def test_logits_with_mask_runs_the_core_classifier_like_its_forward():
    torch.manual_seed(0)
    core = EncoderClassifier(12, 3, 16, 2, 2, 32, dropout=0.0).eval()
    ids = pad_batch([[3, 4], [5, 6, 7, 8]])
    torch.testing.assert_close(core(ids), core.logits_with_mask(ids, attend_mask=padding_mask(ids)))
    assert not torch.allclose(core(ids)[0], core.logits_with_mask(ids, attend_mask=None)[0])


def test_zeroed_positions_make_order_invisible_and_come_back():
    model = _model()
    before = model.encoder.embed.positions.table.weight.clone()
    ids = [[2, 3, 4, 5, 6, 7, 8]]
    mixed = shuffle_each(ids, seed=1)
    assert sorted(mixed[0]) == ids[0] and mixed != ids
    x, y = torch.tensor(ids), torch.tensor(mixed)
    assert not torch.allclose(model(x), model(y), atol=1e-5)
    with positions_zeroed(model) as kind:
        assert kind == "learned"
        torch.testing.assert_close(model(x), model(y), atol=1e-5, rtol=1e-5)
    assert torch.equal(model.encoder.embed.positions.table.weight, before)
