"""Parallel data for translation: file checks with line numbers, the length rule, shifted targets, batches."""

import gzip
import warnings

import pytest
import torch
from click.testing import CliRunner

from attnlab.cli.main import cli
from attnlab.data import BOS_ID, EOS_ID, PAD_ID
from attnlab.errors import AttnlabError
from attnlab.tasks.parallel_data import (
    LengthWarning,
    Pairs,
    collate,
    encode_pairs,
    pair_sources,
    read_lines,
    read_parallel,
    source_ids,
    token_batches,
)
from attnlab.tasks.translate import TranslateSettings, TranslationTask
from attnlab.training.distributed import Place


def write_pair(tmp_path, src_lines, tgt_lines, name="corpus"):
    (tmp_path / f"{name}.xx").write_text("".join(x + "\n" for x in src_lines), encoding="utf-8")
    (tmp_path / f"{name}.yy").write_text("".join(x + "\n" for x in tgt_lines), encoding="utf-8")
    return tmp_path / name


def test_gzip_and_crlf_files_read_like_plain_ones(tmp_path):
    with gzip.open(tmp_path / "c.xx.gz", "wt", encoding="utf-8") as f:
        f.write("Ein Mann.\r\nZwei Frauen.\r\n")
    (tmp_path / "c.yy").write_text("A man.\nTwo women.\n", encoding="utf-8")
    assert read_parallel(tmp_path / "c", "xx", "yy") == (["Ein Mann.", "Zwei Frauen."], ["A man.", "Two women."])
    assert read_lines(tmp_path / "c.yy") == ["A man.", "Two women."]


def test_misaligned_files_name_both_counts_and_the_first_unpaired_line(tmp_path):
    prefix = write_pair(tmp_path, ["a", "b", "c"], ["x", "y"])
    with pytest.raises(AttnlabError, match=r"corpus.xx has 3 lines but .*corpus.yy has 2.*line 3 exists on one side only"):
        read_parallel(prefix, "xx", "yy")


def test_empty_lines_are_reported_with_their_line_numbers(tmp_path):
    prefix = write_pair(tmp_path, ["a", "b", "c", "d"], ["x", "", "z", "  "])
    with pytest.raises(AttnlabError, match=r"corpus.yy: empty lines 2, 4 \(2 in all\)"):
        read_parallel(prefix, "xx", "yy")


def test_long_sources_are_truncated_with_a_counted_warning_and_keep_their_eos():
    with pytest.warns(LengthWarning, match="2 source lines longer than the model's 4 source positions were truncated"):
        out = source_ids([[7, 8, 9, 10, 11], [7], [5, 6, 7, 8]], max_positions=4)
    assert out == [[7, 8, 9, EOS_ID], [7, EOS_ID], [5, 6, 7, EOS_ID]]


def test_pairs_with_targets_too_long_are_left_out_of_training_with_a_warning():
    with pytest.warns(LengthWarning, match="1 training pair whose target is longer .* 3 target positions was left out"):
        pairs = encode_pairs([[5], [6], [7]], [[8, 9], [8, 9, 10], [11]], max_src=8, max_tgt=3, what="training")
    assert pairs.kept == [0, 2] and pairs.tgt == [[8, 9], [11]]


def test_validation_pairs_reuse_the_translated_sources_and_warn_about_their_truncation_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sources = source_ids([[5, 6, 7, 8, 9], [6], [7, 8, 9, 5, 6]], max_positions=4, what="validation source")
        pairs = pair_sources(sources, [[8, 9], [8, 9, 10], [11]], max_tgt=3, what="validation")
    assert [str(w.message) for w in caught] == [
        "2 validation source lines longer than the model's 4 source positions were truncated to fit",
        "1 validation pair whose target is longer than the model's 3 target positions was left out"]
    assert pairs.kept == [0, 2] and pairs.src == [sources[0], sources[2]] and pairs.tgt == [[8, 9], [11]]


def test_targets_are_shifted_with_bos_and_eos():
    pairs = Pairs(src=[[5, 6, EOS_ID], [7, EOS_ID]], tgt=[[8, 9, 10], [11]], kept=[0, 1])
    batch = collate(pairs, [0, 1])
    assert batch["src"].tolist() == [[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 8, 9, 10], [BOS_ID, 11, PAD_ID, PAD_ID]]
    assert batch["tgt_out"].tolist() == [[8, 9, 10, EOS_ID], [11, EOS_ID, PAD_ID, PAD_ID]]


def test_batches_respect_the_token_budget_and_count_real_target_tokens():
    g = torch.Generator().manual_seed(0)
    src = [torch.randint(4, 30, (int(n),), generator=g).tolist() + [EOS_ID] for n in torch.randint(1, 20, (200,), generator=g)]
    tgt = [torch.randint(4, 30, (int(n),), generator=g).tolist() for n in torch.randint(1, 20, (200,), generator=g)]
    pairs = Pairs(src, tgt, list(range(200)))
    task = TranslationTask(pairs, pairs, [], [], None, TranslateSettings(max_tokens=100))
    batches = list(task.batches(0, Place()))
    assert sum(b.data["src"].shape[0] for b in batches) == 200  # every pair once per epoch
    for b in batches:
        assert b.data["src"].numel() <= 100 and b.data["tgt_out"].numel() <= 100
        assert b.count == int((b.data["tgt_out"] != PAD_ID).sum())
        assert b.tokens == b.count + int((b.data["src"] != PAD_ID).sum())
    again = [b.data["src"] for b in task.batches(0, Place())]
    assert all(torch.equal(a, b.data["src"]) for a, b in zip(again, batches))  # a function of (seed, epoch)
    assert token_batches(pairs, max_tokens=100, seed=0, epoch=1) != token_batches(pairs, max_tokens=100, seed=0, epoch=0)


def test_cli_reports_bad_corpora_as_one_line_with_exit_status_2(tmp_path):
    bad = write_pair(tmp_path, ["a", "b", "", "d"], ["w", "x", "y", "z"], name="bad")
    valid = write_pair(tmp_path, ["a"], ["x"], name="valid")
    result = CliRunner().invoke(cli, ["train", "translate", "--train", str(bad), "--valid", str(valid), "--src", "xx",
                                      "--tgt", "yy", "--out", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {bad}.xx: empty line 3 (1 in all); every line must hold one sentence"
    missing = CliRunner().invoke(cli, ["train", "translate", "--train", str(tmp_path / "nothing"), "--valid", str(valid),
                                       "--out", str(tmp_path / "run2")])
    assert missing.exit_code == 2 and "no file" in missing.stderr and "Traceback" not in missing.output


def test_a_missing_validation_corpus_is_said_before_the_tokenizer_is_trained(tmp_path):
    train = write_pair(tmp_path, ["a b", "c d"], ["w x", "y z"], name="train")
    result = CliRunner().invoke(cli, ["train", "translate", "--train", str(train), "--valid", str(tmp_path / "nothing"),
                                      "--src", "xx", "--tgt", "yy", "--out", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [f"error: no file {tmp_path / 'nothing'}.xx or "
                                                  f"{tmp_path / 'nothing'}.xx.gz (a corpus prefix names PREFIX.xx, "
                                                  "optionally .gz)"]  # no "training BPE" line before it
    assert not (tmp_path / "run").exists()


def test_a_corpus_side_that_is_a_folder_is_named_a_folder(tmp_path):
    """It was reported as "no file", which sends one looking for a file that is there, as a folder."""
    valid = write_pair(tmp_path, ["a"], ["x"], name="valid")
    write_pair(tmp_path, ["a"], ["x"], name="train")
    (tmp_path / "train.xx").unlink()
    (tmp_path / "train.xx").mkdir()
    result = CliRunner().invoke(cli, ["train", "translate", "--train", str(tmp_path / "train"), "--valid", str(valid),
                                      "--src", "xx", "--tgt", "yy", "--out", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'train'}.xx is a folder, not a text file (a "
                                                  "corpus prefix names PREFIX.xx, optionally .gz)"]


def test_a_resume_checks_the_lines_of_the_corpus_file_it_reads_however_they_are_packed(tmp_path):
    from attnlab.files import fingerprint
    from attnlab.tasks.parallel_data import file_record
    from attnlab.tasks.translate import _same_data

    zipped, plain = tmp_path / "train.xx.gz", tmp_path / "train.xx"
    zipped.write_bytes(gzip.compress(b"ka lo\nmi nu\n"))
    saved = {"train": str(tmp_path / "train"), "files": {"train.xx": file_record(zipped)}}
    plain.write_text("ka lo\nmi nu\n")  # gunzip -k: the prefix now finds the plain file first
    _same_data(saved, train=tmp_path / "train")
    zipped.unlink()  # plain gunzip
    _same_data(saved, train=tmp_path / "train")
    plain.write_bytes(b"ka lo\r\nmi nu\r\n")  # CRLF: the same lines to the reader
    _same_data(saved, train=tmp_path / "train")
    plain.unlink()
    zipped.write_bytes(gzip.compress(b"ka lo\nmi nu\n", mtime=12345))  # gzipped again: other bytes, the same lines
    _same_data(saved, train=tmp_path / "train")
    plain.write_text("ka lo\nmi xu\n")  # other lines beside it: refused
    with pytest.raises(AttnlabError, match="train.xx is not the train data this run started with"):
        _same_data(saved, train=tmp_path / "train")
    # A plain file recorded, only its .gz left: the same lines again.
    plain.write_text("ka lo\nmi nu\n")
    both = {"train": str(tmp_path / "train"), "files": {"train.xx": file_record(plain)}}
    plain.unlink()
    _same_data(both, train=tmp_path / "train")
    # A run from before the line digests: the .gz beside the plain file, unchanged, with the same lines.
    zipped.write_bytes(gzip.compress(b"ka lo\n"))
    plain.write_bytes(b"ka lo\r\n")
    old = {"train": str(tmp_path / "train"), "files": {"train.xx": {"path": str(zipped), "sha256": fingerprint(zipped)}}}
    _same_data(old, train=tmp_path / "train")
    zipped.write_bytes(gzip.compress(b"ka mi\n"))
    with pytest.raises(AttnlabError, match="train.xx is not the train data this run started with"):
        _same_data(old, train=tmp_path / "train")
