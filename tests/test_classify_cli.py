"""``attnlab train classify``, ``eval classify``, ``predict`` and ``probe`` end to end (in process), and bad input."""

import json
import shutil
import statistics
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from attnlab.cli.main import cli
from attnlab.errors import AttnlabError
from attnlab.training.checkpoint import save_checkpoint
from attnlab.training.distributed import Place
from test_classify_data import write_tickets

# A tiny model and no GloVe (WordLlama's vectors stay: the default): seconds per run. Threads pinned so that runs repeat bit for bit.
SMALL = ["--glove", "none", "--glove-words", "0", "--d-model", "32", "--heads", "2", "--d-ff", "64",
         "--batch-size", "16", "--lr", "3e-3", "--threads", "1", "--no-progress", "--max-seconds", "0"]


def run(*args, input=None):
    result = CliRunner().invoke(cli, [str(a) for a in args], input=input)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One run shared by the read-only tests below: 300 tickets, 10 epochs."""
    root = tmp_path_factory.mktemp("classify")
    train = write_tickets(root / "train.csv", 300, seed=0)
    result = run("train", "classify", "--train", train, "--out", root / "run", "--epochs", "10", *SMALL)
    assert result.exit_code == 0, result.output
    return root, result.output


def test_training_learns_and_writes_the_run_folder(trained):
    root, output = trained
    last = output.strip().splitlines()[-1]
    assert last.startswith("final validation accuracy") and "wall time" in last
    accuracy = float(last.split()[3].rstrip("%")) / 100
    assert accuracy >= 0.8  # 4 teams named by keywords: chance is 25%
    run_dir = root / "run"
    for name in ("model.safetensors", "tokenizer.json", "config.json", "metrics.jsonl", "loss.png", "result.json",
                 "checkpoint/trainer.json"):
        assert (run_dir / name).is_file(), name
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"] == "classify" and config["labels"] == ["account", "delivery", "payment", "refund"]
    assert config["tokenizer_kind"] == "word" and config["label_column"] == "team"
    assert config["model"]["class"] == "TextClassifier" and config["data"]["valid_rows"] == 30
    result = json.loads((run_dir / "result.json").read_text())
    assert result["accuracy"] == pytest.approx(accuracy, abs=5e-5)
    assert config["model"]["kwargs"]["vector_dim"] == 256  # WordLlama's vectors, on by default (GloVe is off here)


def test_no_wordllama_leaves_the_token_vectors_without_pretrained_ones(tmp_path):
    train = write_tickets(tmp_path / "train.csv", 120, seed=0)
    result = run("train", "classify", "--train", train, "--out", tmp_path / "run", "--steps", "2", "--no-wordllama",
                 *SMALL)
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["kwargs"]["vector_dim"] == 0 and config["classify"]["wordllama"] is False


def test_eval_json_table_and_unseen_labels(trained):
    root, _ = trained
    test = write_tickets(root / "test.csv", 80, seed=1)
    with open(test, "a", encoding="utf-8") as f:
        f.write("where is my new card,cards\nlost my card again,cards\n")  # a label the run never saw
    result = run("eval", "classify", root / "run", "--data", test, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["total"] == 82 and report["unseen"] == {"cards": 2}
    assert 0.7 <= report["accuracy"] <= 80 / 82 and 0 < report["macro_f1"] <= 1
    assert {r["label"] for r in report["per_class"]} == {"account", "delivery", "payment", "refund", "cards"}
    assert sum(r["support"] for r in report["per_class"]) == 82
    assert (root / "run" / "confusion-test.png").stat().st_size > 5000
    table = run("eval", "classify", root / "run", "--data", test, "--confusion", root / "cm.png")
    assert "labels not seen in training, counted as errors: cards (2)" in table.output
    assert table.output.strip().splitlines()[-1].startswith(f"accuracy {report['accuracy']:.2%}")
    assert (root / "cm.png").is_file()
    inside = root / "run" / "checkpoint" / "cm.png"  # the resume checkpoint is the run's own
    refused = run("eval", "classify", root / "run", "--data", test, "--confusion", inside)
    assert refused.exit_code == 2 and f"--confusion {inside} is a file of the run" in refused.stderr
    assert not inside.exists()


def test_a_default_confusion_figure_never_replaces_the_figure_of_another_file(trained, tmp_path, monkeypatch):
    """held.csv, held.jsonl and b/held.csv all drew RUN/confusion-held.png, each over the one before without a word.
    Each file now keeps a figure of its own, which scoring it again (by any path) replaces; a file of that name
    that is not such a figure is left alone."""
    root, _ = trained
    (tmp_path / "b").mkdir()
    files = [write_tickets(tmp_path / "held.csv", 20, seed=1), write_tickets(tmp_path / "held.jsonl", 20, seed=2),
             write_tickets(tmp_path / "b" / "held.csv", 20, seed=3)]

    def figure(data):
        result = run("eval", "classify", root / "run", "--data", data, "--json")
        assert result.exit_code == 0, result.output
        return Path(json.loads(result.output)["confusion_figure"])

    figures = [figure(data) for data in files]
    assert figures == [root / "run" / name for name in ("confusion-held.png", "confusion-held-2.png",
                                                          "confusion-held-3.png")]
    drawn = [path.stat().st_mtime_ns for path in figures]
    monkeypatch.chdir(tmp_path / "b")
    assert figure(Path("held.csv")) == figures[2]  # (a relative path to the same file)
    assert [path.stat().st_mtime_ns for path in figures][:2] == drawn[:2]
    (root / "run" / "confusion-mine.png").write_text("my notes")
    assert figure(write_tickets(tmp_path / "mine.csv", 20, seed=4)) == root / "run" / "confusion-mine-2.png"
    assert (root / "run" / "confusion-mine.png").read_text() == "my notes"


def test_a_run_that_cannot_be_written_is_scored_with_the_output_put_elsewhere(trained, monkeypatch, tmp_path):
    import attnlab.cli.params as params

    root, _ = trained
    test = write_tickets(tmp_path / "scored.csv", 20, seed=1)  # (test.csv has a figure there)
    real_access = params.os.access
    # (root may write anywhere: pretend the run is on a read-only disk)
    monkeypatch.setattr(params.os, "access", lambda p, mode, **kw: (mode != params.os.W_OK or Path(p) != root / "run")
                        and real_access(p, mode, **kw))
    refused = run("eval", "classify", root / "run", "--data", test, "--json")
    assert refused.exit_code == 2 and refused.stderr == (f"error: {root / 'run'} is not writable, and confusion-scored.png "
                                                         "goes there by default; give --confusion PATH to write it "
                                                         "elsewhere\n")
    elsewhere = run("eval", "classify", root / "run", "--data", test, "--json", "--confusion", tmp_path / "cm.png")
    assert elsewhere.exit_code == 0 and (tmp_path / "cm.png").is_file()


def test_predict_arguments_and_stdin(trained):
    root, _ = trained
    result = run("predict", root / "run", "my parcel has not arrived", "i forgot my password", "--json")
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [r["label"] for r in rows] == ["delivery", "account"]
    top = [t["probability"] for t in rows[0]["top"]]
    assert len(top) == 3 and top[0] == rows[0]["probability"] and top == sorted(top, reverse=True) and sum(top) <= 1
    piped = run("predict", root / "run", input="refund my money please\ncharged twice on my card\n")
    lines = piped.output.strip().splitlines()
    assert len(lines) == 2 and lines[0].split("\t")[0] == "refund" and lines[1].split("\t")[0] == "payment"
    assert lines[0].split("\t")[-1] == "refund my money please"
    latin1 = run("predict", root / "run", input=b"refund my money\ncaf\xe9 charged twice\n")
    assert latin1.exit_code == 2 and latin1.stderr == ("error: standard input is not UTF-8 text (line 2: invalid "
                                                       "continuation byte)\n")
    crlf = run("predict", root / "run", input="refund my money please\r\ncharged twice on my card\r\n")
    assert [line.split("\t")[-1] for line in crlf.output.splitlines()] == ["refund my money please",
                                                                          "charged twice on my card"]
    bom = run("predict", root / "run", input=b"\xef\xbb\xbfrefund my money please\nrefund my money please\n")
    first, second = bom.output.splitlines()  # a byte-order mark is not part of the first text
    assert first == second and first.endswith("\trefund my money please")
    # A tab or a line break inside a text keeps its four fields on its one line.
    odd = run("predict", root / "run", "refund\tmy money\nplease \\o/").output.splitlines()
    assert len(odd) == 1 and odd[0].split("\t")[3:] == ["refund\\tmy money\\nplease \\\\o/"]
    # An empty line is refused, not skipped: skipping would pair every later output line with the wrong input.
    gap = run("predict", root / "run", input="refund my money please\n\ncharged twice on my card\n")
    assert gap.exit_code == 2 and gap.stdout == "" and "line 2 of 3 is empty" in gap.stderr


def test_eval_shows_labels_as_written_in_its_table_and_figure(trained, tmp_path):
    """Labels with rich markup ([/] raised MarkupError, [red] vanished) or matplotlib mathtext ($10_$20 raised,
    $10-$20 was drawn as a formula) are user text; a thousand unseen labels share rows of the figure."""
    root, _ = trained
    test = write_tickets(tmp_path / "test.csv", 20, seed=1)
    with open(test, "a", encoding="utf-8") as f:
        f.write("top up please,top_up_$10_$20\nwhere is it,[/]\nmy card,[red]\n")
    result = run("eval", "classify", root / "run", "--data", test, "--confusion", tmp_path / "cm.png")
    assert result.exit_code == 0, result.output
    assert "top_up_$10_$20" in result.output and "[red]" in result.output and "[/]" in result.output
    import matplotlib.image

    from attnlab.tasks.classify_eval import UNSEEN_ROWS, draw_confusion

    truth = [f"unseen {i}" for i in range(1000)] + ["refund"]
    draw_confusion(truth, ["refund"] * len(truth), ["refund", "payment"], tmp_path / "many.png")
    height = matplotlib.image.imread(tmp_path / "many.png").shape[0]
    assert UNSEEN_ROWS == 30 and height < 6000, height  # 1,002 rows drew 100,000 pixels


def test_predict_escapes_labels_as_it_escapes_texts(tmp_path):
    rows = [{"text": f"good fine {i}" if i % 2 else f"bad poor {i}", "label": "tab\there" if i % 2 else "new\nline"}
            for i in range(40)]
    (tmp_path / "weird.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trained = run("train", "classify", "--train", tmp_path / "weird.jsonl", "--out", tmp_path / "run", "--steps", "3",
                  "--no-wordllama", *SMALL)
    assert trained.exit_code == 0, trained.output
    lines = run("predict", tmp_path / "run", input="good fine\nbad poor\n").output.splitlines()
    assert len(lines) == 2  # one line a text, four fields: the labels' tab and line break written \t and \n
    assert all(len(line.split("\t")) == 4 and {line.split("\t")[0], line.split("\t")[2].rsplit(":", 1)[0]}
               == {"tab\\there", "new\\nline"} for line in lines), lines
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # and the confusion plot writes them so too
        warnings.simplefilter("always")
        evaluated = run("eval", "classify", tmp_path / "run", "--data", tmp_path / "weird.jsonl")
    assert evaluated.exit_code == 0, evaluated.output
    assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]
    table = [line for line in evaluated.stdout.splitlines() if line.startswith("│")]  # the per-class rows
    assert sum("tab\\there" in line for line in table) == 1 and sum("new\\nline" in line for line in table) == 1
    assert not any(line.split("│")[1].strip() in ("tab", "here", "new", "line") for line in table), table
    probed = run("probe", "padding", tmp_path / "run", "--data", tmp_path / "weird.jsonl")
    assert probed.exit_code == 0, probed.output
    shown = [line for line in probed.stdout.splitlines() if not line.startswith("note: ")]
    assert shown[0].startswith("shortest text (") and ("tab\\there" in shown[0] or "new\\nline" in shown[0])
    assert all(line.startswith(("  ", "shortest", "note", "accuracy", f"{40} texts")) for line in shown), shown
    assert run("predict", tmp_path / "run", "ok \udcff").exit_code == 2  # bytes that are not UTF-8, as stdin's


def test_one_line_writes_every_control_character_visibly_and_keeps_values_apart():
    from attnlab.tasks.tables import one_line

    assert one_line("tab\there\nnew\\") == "tab\\there\\nnew\\\\"
    assert one_line("ff\x0cfeed") == "ff\\x0cfeed" and one_line("esc\x1b[31m") == "esc\\x1b[31m"
    assert one_line("a\u2028b\x85c") == "a\\u2028b\\x85c" and one_line("é🙂") == "é🙂"
    assert one_line("ff\x0cfeed") != one_line("fffeed")


def test_summary_never_cuts_its_figures_short_on_a_narrow_terminal():
    result = CliRunner().invoke(cli, ["summary", "--preset", "paper-big"], env={"COLUMNS": "50"})
    assert result.exit_code == 0 and "214,282,376" in result.stdout, result.stdout


def test_probes_order_and_padding(trained):
    root, _ = trained
    test = write_tickets(root / "probe.csv", 60, seed=2)
    order = json.loads(run("probe", "order", root / "run", "--data", test, "--json").output)
    assert order["texts"] == 60 and order["positions"] == "learned"
    assert order["zeroed_identical"] is True and order["zeroed"] == order["zeroed_shuffled"]
    assert 0 <= order["changed_by_shuffle"] <= 1 and order["in_order"] > 0.6
    for share in ("in_order", "shuffled", "zeroed", "changed_by_shuffle"):  # counted exactly, not a float32 mean
        assert order[share] == round(order[share] * 60) / 60, (share, order[share])
    scored = json.loads(run("eval", "classify", root / "run", "--data", test, "--json").output)
    assert order["in_order"] == scored["accuracy"]  # the same rows, the same model: the same figure
    padding = json.loads(run("probe", "padding", root / "run", "--data", test, "--json").output)
    assert padding["mask_identical"] is True and padding["alone"] == padding["padded_mask"]
    for share in ("alone", "padded_mask", "padded_no_mask", "inverted", "no_mask_changed"):
        assert padding[share] == round(padding[share] * 60) / 60, (share, padding[share])
    assert padding["no_mask_max_diff"] > 1e-3  # without the mask the padding is read like words
    assert padding["inverted_all_hidden"] >= 1 and padding["inverted_nan"] == 0
    assert padding["example"]["padding"] == padding["longest"] - padding["example"]["tokens"] > 0
    text = run("probe", "padding", root / "run", "--data", test).output
    assert "padded, without mask:" in text and "accuracy with the mask inverted" in text
    assert "nothing gets padded" not in text
    same = root / "same-length.csv"  # three-word texts only: the probe has nothing to pad
    same.write_text("text,label\nwhere is parcel,delivery\nforgot my password,account\nrefund my money,refund\n")
    vacuous = run("probe", "padding", root / "run", "--data", same)
    assert vacuous.exit_code == 0 and vacuous.output.startswith("note: every text is 3 tokens long, so nothing gets")
    long = root / "long.csv"  # a text past the position table is cut, and the probes say so as eval classify does
    long.write_text("text,label\n" + "refund " * 500 + ",refund\nwhere is parcel,delivery\n")
    for probe in ("order", "padding"):
        said = run("probe", probe, root / "run", "--data", long, "--json")
        assert said.exit_code == 0 and "note: the probed texts: 1 of 2 texts were longer than" in said.stderr


def test_options_the_chosen_model_does_not_read_are_named_not_silently_dropped(tmp_path):
    train, valid = write_tickets(tmp_path / "train.csv", 60, seed=0), write_tickets(tmp_path / "valid.csv", 20, seed=1)
    result = run("train", "classify", "--train", train, "--valid", valid, "--valid-fraction", "0.5", "--out",
                 tmp_path / "bow", "--model", "bow", "--positions", "rotary", "--no-wide", "--steps", "1",
                 "--bpe-vocab-size", "500", *SMALL)
    assert result.exit_code == 0, result.output
    for line in ("note: --positions is not used by --model bow; ignored", "note: --wide is not used by --model bow; ignored",
                 "note: --valid-fraction is for a run without --valid (it holds out part of --train); ignored",
                 "note: --bpe-vocab-size is for --tokenizer bpe; ignored"):
        assert line in result.stderr and line not in result.stdout  # (as train lm says its notes)
    plain = run("train", "classify", "--train", train, "--out", tmp_path / "plain", "--steps", "1", *SMALL)
    assert plain.exit_code == 0 and "; ignored" not in plain.output  # what a model reads is not named


def test_bow_and_bpe_variants_train(tmp_path):
    train = write_tickets(tmp_path / "train.jsonl", 200, seed=3)
    for extra in (["--model", "bow"], ["--tokenizer", "bpe", "--bpe-vocab-size", "120", "--layers", "1"]):
        out = tmp_path / extra[1]
        result = run("train", "classify", "--train", train, "--out", out, "--epochs", "2", *SMALL, *extra)
        assert result.exit_code == 0, result.output
        assert run("predict", out, "where is the courier").exit_code == 0
    probe = json.loads(run("probe", "order", tmp_path / "bow", "--data", train, "--json").output)
    assert probe["positions"] == "none" and probe["in_order"] == probe["shuffled"]
    assert run("probe", "order", tmp_path / "bow", "--data", train).output.startswith("200 texts; positions: none\n")
    other = tmp_path / "other.csv"  # labels the run never saw: said, as eval classify says it
    other.write_text("text,label\nwhere is my parcel,lost_parcel\nmy card broke,broken_card\n", encoding="utf-8")
    noted = run("probe", "order", tmp_path / "bow", "--data", other, "--json")
    assert noted.exit_code == 0 and noted.stderr.startswith("note: 2 rows have labels the run never saw (broken_card, "
                                                            "lost_parcel); they count as errors in every accuracy")
    padding = run("probe", "padding", tmp_path / "bow", "--data", train).output
    assert padding.startswith("note: this model has no attention layers") and "identical" in padding
    assert "zero attention" not in padding  # and no keys to hide either
    layered = run("probe", "padding", tmp_path / "bpe", "--data", train).output
    assert "no attention layers" not in layered and "zero attention here" in layered


def one_error_line(result):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_bad_training_input_is_one_line_and_exit_2(tmp_path):
    good = write_tickets(tmp_path / "good.csv", 40)
    train = ["train", "classify", "--out", tmp_path / "out", *SMALL, "--epochs", "1"]
    assert "not found" in one_error_line(run(*train, "--train", tmp_path / "missing.csv"))
    assert "no label column 'intent'" in one_error_line(run(*train, "--train", good, "--label-column", "intent"))
    (tmp_path / "in").mkdir()
    for name in ("metrics.jsonl", "result.json"):  # in the run folder, under names the run writes
        inside = tmp_path / "in" / name
        inside.write_bytes(good.read_bytes())
        for option in ("--train", "--valid"):
            assert f"{option} {inside} is a file the run writes in its folder" in one_error_line(
                run(*train, "--train", good, option, inside, "--out", inside.parent))
        assert inside.read_bytes() == good.read_bytes()
    assert "--glove is empty: give auto, none or a GloVe text file" in one_error_line(
        run(*train, "--train", good, "--glove", ""))
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\nhello,a\n,b\n", encoding="utf-8")
    assert "empty 'text'" in one_error_line(run(*train, "--train", empty))
    single = tmp_path / "single.csv"
    single.write_text("text,label\n" + "".join(f"text {i},same\n" for i in range(20)), encoding="utf-8")
    assert "one class only" in one_error_line(run(*train, "--train", single))
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("text,label\nhello there,a\nextra,field,here,now\n", encoding="utf-8")
    assert "ragged.csv:3: 4 fields where the header has 2" in one_error_line(run(*train, "--train", ragged))
    short = tmp_path / "short.csv"
    short.write_text("text,label\nhello there,a\nonly text\n", encoding="utf-8")
    assert "short.csv:3: 1 field where the header has 2" in one_error_line(run(*train, "--train", short))
    unclosed = tmp_path / "unclosed.csv"  # the quote of line 3 takes in every line after it
    unclosed.write_text('text,label\nhi,a\n"what is up,b\nsup,a\nho,b\n', encoding="utf-8")
    assert ("unclosed.csv:3: a quote opened on this line is never closed, so the text runs on to the end of the file "
            "(line 5)") in one_error_line(run(*train, "--train", unclosed))
    multiline = tmp_path / "multiline.csv"  # a closed quote over two lines, then a row without its label
    multiline.write_text('text,label\n"two\nlines",a\nonly text\nyo,b\n', encoding="utf-8")
    assert "multiline.csv:4: 1 field where the header has 2" in one_error_line(run(*train, "--train", multiline))
    later = tmp_path / "later.csv"  # a closed two-line quote short of its label, and an unclosed quote after it
    later.write_text('text,label\n"two\nlines"\ngood,pos\n"never closed,neg\nmore,pos\n', encoding="utf-8")
    assert "later.csv:3: 1 field where the header has 2" in one_error_line(run(*train, "--train", later))
    ran_on = tmp_path / "ran_on.csv"  # a quote left open on line 3 is closed by the quote that opens line 5
    ran_on.write_text('text,label\nhi,a\n"what is up,b\nsup,a\n"hey, you",b\nho,b\n', encoding="utf-8")
    assert ("ran_on.csv:3: a quote opened on this line runs on to line 5, where the record has 3 fields and the "
            "header 2") in one_error_line(run(*train, "--train", ran_on))
    closed = tmp_path / "closed.csv"  # a quote over two lines closed where meant, then a field too many
    closed.write_text('text,label\nhi,a\n"hello\nworld", said she,b\nho,b\n', encoding="utf-8")
    assert "closed.csv:4: 3 fields where the header has 2" in one_error_line(run(*train, "--train", closed))
    lenient = tmp_path / "lenient.csv"  # text after a closing quote (read as it is), then an unclosed quote
    lenient.write_text('text,label\n"said"so,pos\nok,neg\n"never closed,neg\nmore,pos\n', encoding="utf-8")
    assert "lenient.csv:4: a quote opened on this line is never closed" in one_error_line(run(*train, "--train", lenient))
    three = tmp_path / "three.csv"
    three.write_text("text,a,b\nx,1,2\n", encoding="utf-8")
    assert "['text', 'a', 'b']" in one_error_line(run(*train, "--train", three))
    assert "'--ema': 1.5 is not in the range 0<=x<1" in one_error_line(run(*train, "--train", good, "--ema", "1.5"))
    # Values outside an option's range and values that are not numbers: Click's own check, as one line.
    assert "'--heads': 0 is not in the range x>=1" in one_error_line(run(*train, "--train", good, "--heads", "0"))
    assert "'--dropout': 1.5 is not in the range" in one_error_line(run(*train, "--train", good, "--dropout", "1.5"))
    assert "'--epochs': 'abc' is not a valid integer" in one_error_line(run(*train, "--train", good, "--epochs", "abc"))
    assert "--min-freq 1000" in one_error_line(run(*train, "--train", good, "--min-freq", "1000"))
    assert "--d-model 32 is not divisible by --heads 3" in one_error_line(run(*train, "--train", good, "--heads", "3"))
    assert "--positions rotary needs an even head width, and --d-model 32 / --heads 32 gives 1" in one_error_line(
        run(*train, "--train", good, "--heads", "32", "--positions", "rotary"))
    joined = tmp_path / "joined.csv"  # two exports joined, headers and all: the second header is no ticket
    joined.write_text(good.read_text(encoding="utf-8") * 2, encoding="utf-8")
    assert "joined.csv:42: this row repeats the header (text,team)" in one_error_line(run(*train, "--train", joined))
    unseen = tmp_path / "unseen.csv"
    unseen.write_text("text,label\nclose my account,close_account\nlost my card,lost_card\n", encoding="utf-8")
    assert "none of the 2 validation rows has a label the training data holds" in one_error_line(
        run(*train, "--train", good, "--valid", unseen))
    assert not (tmp_path / "out").exists()  # nothing was started


def test_bad_run_folders_are_one_line_and_exit_2(trained, tmp_path):
    root, _ = trained
    data = write_tickets(tmp_path / "d.csv", 10)
    assert "not an attnlab run folder" in one_error_line(run("eval", "classify", tmp_path, "--data", data))
    assert "does not exist: no run there" in one_error_line(run("predict", tmp_path / "nothing", "hi"))
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((root / "run" / name).read_bytes())
    (broken / "model.safetensors").write_bytes((root / "run" / "model.safetensors").read_bytes()[:300])
    assert "not a readable safetensors file" in one_error_line(run("eval", "classify", broken, "--data", data))
    config = json.loads((root / "run" / "config.json").read_text())
    for change, message in (({"tokenizer": 5}, "names its tokenizer file 5, not a file name"),
                            ({"max_positions": -3}, "gives the model's max_positions as -3, not a count of positions"),
                            ({"max_positions": "abc"}, "max_positions as 'abc'"),
                            ({"model": {**config["model"], "class": [1]}}, "its class is [1], not a name")):
        damaged = tmp_path / "damaged"
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(root / "run", damaged)
        (damaged / "config.json").write_text(json.dumps({**config, **change}))
        assert message in one_error_line(run("predict", damaged, "hi"))
    assert "is a 'lm' run" in one_error_line(run("predict", _lm_run(tmp_path), "hi"))
    out = tmp_path / "again"
    train = write_tickets(tmp_path / "t.csv", 40)
    assert run("train", "classify", "--train", train, "--out", out, *SMALL, "--steps", "2").exit_code == 0
    assert "already holds a run" in one_error_line(run("train", "classify", "--train", train, "--out", out, *SMALL))
    other = write_tickets(tmp_path / "other.csv", 40, seed=9)
    assert "not the training file" in one_error_line(
        run("train", "classify", "--train", other, "--out", out, *SMALL, "--resume"))
    # A finished run given more steps goes on, its schedule re-planned (as train lm and train translate do).
    resumed = run("train", "classify", "--train", train, "--out", out, *SMALL, "--steps", "7", "--lr", "1e-2",
                  "--threads", "2", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "resume: the run now ends at step 7 instead of 2; its learning-rate schedule is re-planned" in resumed.stderr
    assert "ignored: lr=0.01 (the run has 0.003)" in resumed.stderr and "steps=" not in resumed.output
    assert "threads=" not in resumed.output  # a resume may set the thread count
    assert json.loads((out / "result.json").read_text())["steps"] == 7
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["max_steps"] == 7 and saved["classify"]["steps"] == 7
    assert saved["classify"]["threads"] == 2  # recorded, so that a plain --resume goes on with it
    report = (out / "result.json").read_bytes()
    again = run("train", "classify", "--train", train, "--out", out, *SMALL, "--resume")  # the new length is kept
    assert one_error_line(again) == (f"error: {out} has finished its 7 steps (its report is in result.json); nothing "
                                     "to resume, unless with --steps more than 7 to take it further")
    assert (out / "result.json").read_bytes() == report  # not redone
    assert one_error_line(run("train", "classify", "--train", train, "--out", out, *SMALL, "--steps", "3",
                              "--resume")) == f"error: {out} has reached step 7, past the 3 steps it is given; to go on, " \
                                             "resume with --steps more than 7"
    assert "validated on --valid-fraction 0.1 of the training file" in one_error_line(
        run("train", "classify", "--train", train, "--valid", data, "--out", out, *SMALL, "--resume"))
    # The same names with other bytes: the training file, and a --valid file the best weights were chosen on.
    checked = tmp_path / "checked"
    valid = write_tickets(tmp_path / "v.csv", 20, seed=3)
    assert run("train", "classify", "--train", train, "--valid", valid, "--out", checked, *SMALL, "--steps", "2",
               "--checkpoint-every", "1").exit_code == 0
    for edited in (valid, train):
        kept = edited.read_bytes()
        edited.write_bytes(kept[: len(kept) // 2].rsplit(b"\n", 1)[0] + b"\n")  # rows cut, the name the same
        said = one_error_line(run("train", "classify", "--train", train, "--valid", valid, "--out", checked, *SMALL,
                                  "--steps", "4", "--resume"))
        assert said == f"error: {edited} has changed since this run started (its bytes differ); resume needs the " \
                       f"{'validation' if edited == valid else 'training'} file it started with"
        edited.write_bytes(kept)
    # The same bytes under another name (a copy, or the file named from another folder) are the same data.
    shutil.copy(valid, tmp_path / "v-copy.csv")
    same = run("train", "classify", "--train", train, "--valid", tmp_path / "v-copy.csv", "--out", checked, *SMALL,
               "--steps", "3", "--resume")
    assert same.exit_code == 0, same.output
    other_valid = write_tickets(tmp_path / "v2.csv", 20, seed=4)
    assert "is not the validation file this run started with" in one_error_line(
        run("train", "classify", "--train", train, "--valid", other_valid, "--out", checked, *SMALL, "--steps", "4",
            "--resume"))


def _lm_run(tmp_path):
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"task": "lm", "model": {}}), encoding="utf-8")
    return folder


def test_a_failed_checkpoint_write_leaves_the_good_one(trained, tmp_path, monkeypatch):
    """A write that dies half-way (disk full, kill) must not replace the last good checkpoint or weights."""
    root, _ = trained
    run_dir = tmp_path / "copy"
    run_dir.mkdir()
    for path in (root / "run").rglob("*"):
        target = run_dir / path.relative_to(root / "run")
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    before = load_file(run_dir / "checkpoint" / "model.safetensors")

    def dies(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("attnlab.training.checkpoint.save_file", dies)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(AttnlabError, match=f"cannot write {run_dir / 'checkpoint'}: No space left on device"):
        save_checkpoint(run_dir, model, torch.optim.AdamW(model.parameters()), {"step": 999})
    after = load_file(run_dir / "checkpoint" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert json.loads((run_dir / "checkpoint" / "trainer.json").read_text())["trainer"]["step"] != 999
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    assert run("predict", run_dir, "where is my parcel").exit_code == 0


def test_settings_reject_unknown_names():
    from attnlab.tasks.classify_train import ClassifySettings

    with pytest.raises(AttnlabError, match="unknown classification settings: colour"):
        ClassifySettings().with_overrides(colour="red")


def test_a_fitted_schedule_is_the_same_run_as_its_fixed_length(tmp_path):
    """--epochs 0 times a few steps on a copy of the model; that must not change the run it then makes."""
    train = write_tickets(tmp_path / "t.csv", 120, seed=4)
    at = SMALL.index("--max-seconds")
    common = SMALL[:at] + SMALL[at + 2 :]
    fitted = run("train", "classify", "--train", train, "--out", tmp_path / "fit", *common, "--max-seconds", "120",
                 "--max-epochs", "2")
    assert "schedule: 2 epochs of 7 steps fit in 120 s" in fitted.output, fitted.output
    fixed = run("train", "classify", "--train", train, "--out", tmp_path / "fix", *common, "--max-seconds", "120",
                "--epochs", "2")
    assert "schedule:" not in fixed.output
    a, b = load_file(tmp_path / "fit" / "model.safetensors"), load_file(tmp_path / "fix" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_fitted_run_stopped_by_its_budget_resumes_with_no_limit(tmp_path):
    """A budget too short for one epoch says so; --max-seconds 0 on resume (the stop's own advice) runs the
    planned steps to the end; a new run with neither a length nor a budget is refused in one line."""
    train = write_tickets(tmp_path / "t.csv", 120, seed=4)
    common = SMALL[: SMALL.index("--max-seconds")]
    short = run("train", "classify", "--train", train, "--out", tmp_path / "r", *common, "--max-seconds", "0.001")
    assert "schedule: 1 epoch of 7 steps, though it does not fit in 0.001 s" in short.output, short.output
    stopped = run("train", "classify", "--train", train, "--out", tmp_path / "r", *common, "--max-seconds", "0.001",
                  "--resume")
    assert stopped.exit_code == 2 and "(0: no limit)" in stopped.output
    done = run("train", "classify", "--train", train, "--out", tmp_path / "r", *common, "--max-seconds", "0",
               "--resume")
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "r" / "result.json").read_text())["steps"] == 7
    assert done.output.strip().splitlines()[-1].endswith(" s of this resume")  # not the whole run's wall time
    none = run("train", "classify", "--train", train, "--out", tmp_path / "n", *common, "--max-seconds", "0")
    assert none.exit_code == 2 and "--max-seconds 0 sets no limit to fit it to; give --epochs or --steps" in none.output
    assert not (tmp_path / "n").exists()


def test_validating_on_the_training_file_is_noted(tmp_path):
    train = write_tickets(tmp_path / "t.csv", 60, seed=4)
    result = run("train", "classify", "--train", train, "--valid", train, "--out", tmp_path / "r", *SMALL, "--epochs", "1")
    assert result.exit_code == 0, result.output
    assert f"validation: {train} is the training file too; its accuracy measures memory" in result.output


def test_texts_taken_for_labels_are_named_as_the_likely_cause(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("text,subject,intent\n" + "".join(f"card {i},ticket {i},card\n" for i in range(40)))
    result = run("train", "classify", "--train", table, "--label-column", "subject", "--out", tmp_path / "r", *SMALL,
                 "--epochs", "1")
    assert result.exit_code == 2 and "none of the 4 validation rows has a label the training data holds" in result.output
    assert "column 'subject' holds a different value in each row: is it the column of labels?" in result.output


def test_the_epoch_timing_follows_the_batches_padded_sizes_not_the_typical_batch(monkeypatch):
    """Bucketed batches are skewed (most short, a few long); the epoch estimate must sum the real batches.

    A fake clock, moved on by the toy model in proportion to each training batch's padded size, makes the true
    epoch time known exactly (and the test independent of this machine's load); "median timed step x steps"
    would come out about three times too small here.
    """
    import types

    from torch import nn

    import attnlab.tasks.classify_train as classify_train
    from attnlab.tasks.classify import ClassifyTask
    from attnlab.tasks.classify_train import ClassifySettings, time_one_epoch

    per_token, clock = 1e-4, [0.0]
    monkeypatch.setattr(classify_train, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Embedding(20, 4), nn.Linear(4, 2)

        def forward(self, ids):
            if self.training:
                clock[0] += 0.002 + per_token * ids.numel()  # a fixed cost per step, and one per padded token
            return self.out(self.embed(ids).mean(1))

    lengths = [60 if i % 10 == 0 else 4 for i in range(640)]  # one text in ten is long
    ids = [[1 + i % 19] * n for i, n in enumerate(lengths)]
    task = ClassifyTask(ids, [i % 2 for i in range(640)], ids[:8], [0] * 8, batch_size=8, seed=0)
    padded = [b.data["ids"].numel() for b in task.batches(0, Place())]
    assert statistics.median(padded) * len(padded) < 0.5 * sum(padded)  # the skew this test is about
    estimate = time_one_epoch(Slow(), task, ClassifySettings(batch_size=8))
    assert estimate == pytest.approx(0.002 * len(padded) + per_token * sum(padded), rel=1e-9)
    median = sorted(padded)[len(padded) // 2]  # one timed step: the median-sized batch, times the steps
    assert time_one_epoch(Slow(), task, ClassifySettings(batch_size=8), steps=1) == pytest.approx(
        (0.002 + per_token * median) * len(padded), rel=1e-9)
    # The writes after each evaluation (best weights, checkpoint) count too: left out, a short epoch's plan ran
    # past the time budget, which stopped the cosine schedule before its end.
    real_save = classify_train.save_checkpoint

    def slow_save(*args, **kwargs):
        clock[0] += 0.25
        real_save(*args, **kwargs)

    monkeypatch.setattr(classify_train, "save_checkpoint", slow_save)
    clock[0] = 0.0  # (the first call's clock: the same sums, rounded alike)
    assert time_one_epoch(Slow(), task, ClassifySettings(batch_size=8)) == pytest.approx(estimate + 0.25, rel=1e-9)


def test_load_run_in_a_fresh_process_rebuilds_a_classifier_run(trained):
    """``load_run`` must find ``TextClassifier`` even when nothing imported the classification task yet."""
    import subprocess
    import sys

    code = ("import sys; from attnlab.training.checkpoint import load_run\n"
            "model, config = load_run(sys.argv[1], 'classify')\n"
            "print(type(model).__name__, model.training, len(config['labels']))")
    done = subprocess.run([sys.executable, "-c", code, str(trained[0] / "run")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    labels = json.loads((trained[0] / "run" / "config.json").read_text())["labels"]
    assert done.stdout.split() == ["TextClassifier", "False", str(len(labels))]


def test_check_reads_a_classifier_runs_contract(trained):
    root, _ = trained
    result = run("check", root / "run", "--json", "--seeds", "1")
    report = json.loads(result.stdout)
    assert report["contract"]["kind"] == "encoder" and report["contract"]["pad_id"] == 0
    assert report["contract"]["max_length"] == json.loads((root / "run" / "config.json").read_text())["model"]["kwargs"][
        "max_positions"]
    assert {c["name"]: c["status"] for c in report["checks"]}["padding-invariance"] == "pass"


def test_check_names_a_runs_own_pad_id_outside_its_vocabulary_as_the_runs(trained, tmp_path):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(trained[0] / "run", damaged)
    config = json.loads((damaged / "config.json").read_text())
    config["model"]["kwargs"]["pad_id"] = 10**6
    (damaged / "config.json").write_text(json.dumps(config))
    result = run("check", damaged)
    assert result.exit_code == 2 and result.stderr.startswith("error: the run's config.json gives pad_id 1000000, "
                                                              "outside its vocabulary"), result.stderr
    assert "--pad-id" in result.stderr and "Invalid value" not in result.stderr
    for value in ("0", True, 1.5):  # of another type: it ended in a TypeError
        config["model"]["kwargs"]["pad_id"] = value
        (damaged / "config.json").write_text(json.dumps(config))
        result = run("check", damaged)
        assert result.exit_code == 2 and result.stderr == (f"error: the run's config.json gives pad_id {value!r}, not "
                                                           "a whole number\n"), result.stderr


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_run_behind(tmp_path):
    good = write_tickets(tmp_path / "good.csv", 40)
    args = ["train", "classify", "--train", good, "--out", tmp_path / "out", *SMALL, "--epochs", "1"]
    failed = run(*args, "--lr", "1e30")
    *notes, said = failed.stderr.splitlines()  # (a note on the warmup, as long as this short run, comes first)
    assert failed.exit_code == 2 and said == "error: loss became nan at step 2; training stopped, no checkpoint had " \
        "been written yet" and all(line.startswith("note: ") for line in notes)
    assert not (tmp_path / "out").exists()  # the fixed command may use the same --out
    assert run(*args).exit_code == 0


def test_lengthening_a_classify_run_on_resume_is_refused_when_it_could_not_go_on_and_survives_an_interruption(
        tmp_path, monkeypatch):
    from attnlab.training.engine import Trainer

    train = write_tickets(tmp_path / "t.csv", 40)
    assert SMALL[-2:] == ["--max-seconds", "0"]
    fixed = SMALL[:-2]  # each run below sets its own budget

    def out_of(name, *args):
        return run("train", "classify", "--train", train, "--out", tmp_path / name, *fixed, *args)

    # Ended by early stopping: no step would be taken, so a new length is refused, with why.
    assert out_of("patient", "--steps", "60", "--patience", "1", "--eval-every", "1", "--max-seconds", "0").exit_code == 0
    assert json.loads((tmp_path / "patient" / "result.json").read_text())["stopped_by"] == "patience"
    said = one_error_line(out_of("patient", "--steps", "200", "--resume"))
    assert said.startswith(f"error: {tmp_path / 'patient'} was ended by early stopping at step ")
    assert said.endswith("it takes no further step; train a new run with a larger --patience (0: none)")
    (tmp_path / "patient" / "result.json").unlink()  # killed before its report: still no step to take
    assert "was ended by early stopping" in one_error_line(out_of("patient", "--steps", "200", "--resume"))
    assert out_of("patient", "--resume").exit_code == 0  # a plain resume writes the missing report
    # A spent time budget: refused unless the resume raises it too, which it may now.
    assert out_of("timed", "--steps", "2", "--max-seconds", "1e-9").exit_code == 0
    said = one_error_line(out_of("timed", "--steps", "5", "--resume"))
    assert "all of its time budget (--max-seconds 1e-09), after" in said and "or more (0: no limit)" in said
    assert one_error_line(out_of("timed", "--resume")) == said.replace("of 5 steps", "of 2 steps")  # plain resume too
    longer = out_of("timed", "--steps", "5", "--max-seconds", "0", "--resume")
    assert longer.exit_code == 0 and json.loads((tmp_path / "timed" / "result.json").read_text())["steps"] == 5
    # No checkpoint yet: the run starts again from step 0, with the new length.
    assert out_of("fresh", "--steps", "2", "--max-seconds", "0").exit_code == 0
    import shutil

    shutil.rmtree(tmp_path / "fresh" / "checkpoint")
    # its report left: the checkpoint was deleted from a run that ran, which a resume must not train over
    assert "holds the report of a run that ran" in one_error_line(out_of("fresh", "--steps", "3", "--resume"))
    (tmp_path / "fresh" / "result.json").unlink()  # as a run killed before its first checkpoint leaves it
    again = out_of("fresh", "--steps", "3", "--resume")
    assert again.exit_code == 0 and "resume: the run starts again with 3 steps instead of 2" in again.stderr
    assert "has no checkpoint yet: starting the run again from step 0" in again.stderr  # (stderr, as train lm's)
    assert "resume" not in again.stdout and "checkpoint" not in again.stdout.split("run folder:")[0]
    assert json.loads((tmp_path / "fresh" / "result.json").read_text())["steps"] == 3
    # Interrupted while going on to its new length: a plain --resume finishes it (the length was saved first).
    assert out_of("cut", "--steps", "4", "--checkpoint-every", "1", "--max-seconds", "0").exit_code == 0
    step = Trainer._step
    taken = []

    def interrupted(self, micro):
        taken.append(1)
        if len(taken) > 2:
            raise KeyboardInterrupt
        return step(self, micro)

    monkeypatch.setattr(Trainer, "_step", interrupted)
    assert out_of("cut", "--steps", "9", "--resume").exit_code == 130
    monkeypatch.undo()
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["train"]["max_steps"] == 9
    finished = out_of("cut", "--resume")
    assert finished.exit_code == 0 and json.loads((tmp_path / "cut" / "result.json").read_text())["steps"] == 9


def test_a_run_whose_labels_do_not_match_its_model_is_one_error_line(trained, tmp_path):
    import shutil

    root, _ = trained
    for name, labels in (("short", lambda ls: ls[:1]), ("doubled", lambda ls: [ls[0]] * len(ls))):
        folder = tmp_path / name
        shutil.copytree(root / "run", folder)
        config = json.loads((folder / "config.json").read_text())
        config["labels"] = labels(config["labels"])  # an index past the list, or two answers under one name
        (folder / "config.json").write_text(json.dumps(config))
        said = one_error_line(run("predict", folder, "where is my parcel"))
        assert "labels" in said and "mixes files of different runs" in said


def test_a_run_finished_meanwhile_in_the_same_new_folder_is_not_replaced(tmp_path, finished_meanwhile):
    """A run another process started into the same new folder, and finished between this one's first check and
    its lock, is refused again under the lock, not replaced (both ended with status 0, the second run's files in
    the folder)."""
    import attnlab.tasks.classify_train
    finished_meanwhile(attnlab.tasks.classify_train, "config.json", '{"task": "classify", "theirs": true}')
    out = tmp_path / "race"
    train = write_tickets(tmp_path / "t.csv", 40)
    result = run("train", "classify", "--train", train, "--out", out, *SMALL, "--steps", "2")
    assert result.exit_code == 2 and result.stderr.splitlines()[-1].endswith("already holds a run; pass --resume to "
                                                                              "continue it or choose another --out")
    assert [p.name for p in out.iterdir()] == ["config.json"] and "theirs" in (out / "config.json").read_text()


def test_a_run_no_longer_than_its_warmup_says_it_never_decays(tmp_path):
    """--steps 3 under the default warmup of one epoch: the rate never reached its peak, and nothing said so."""
    train = write_tickets(tmp_path / "t.csv", 120, seed=0)  # 108 training rows: 7 batches of 16 an epoch
    short = run("train", "classify", "--train", train, "--out", tmp_path / "short", "--model", "tiny", *SMALL,
                "--steps", "3")
    assert short.exit_code == 0, short.output
    assert ("note: --warmup-epochs 1 is 7 steps, not fewer than the run's 3: the learning rate warms up for the whole "
            "run (no cosine decay, never reaching its peak 0.003)\n") in short.stderr  # (as train lm says it)
    assert "warms up" not in short.stdout
    whole = run("train", "classify", "--train", train, "--out", tmp_path / "whole", "--model", "tiny", *SMALL,
                "--epochs", "1")
    assert "is 7 steps, not fewer than the run's 7: the learning rate warms up for the whole run (no cosine decay)\n" \
        in whole.stderr
    longer = run("train", "classify", "--train", train, "--out", tmp_path / "long", "--model", "tiny", *SMALL,
                 "--epochs", "2")
    assert longer.exit_code == 0 and "warm" not in longer.output


def test_the_logged_accuracy_counts_unseen_validation_labels_as_the_report_does(tmp_path):
    """The metrics log (and loss.png) said 14/297 where the last line and result.json said 14/300."""
    train = write_tickets(tmp_path / "t.csv", 120, seed=0)
    valid = write_tickets(tmp_path / "v.csv", 20, seed=1)
    known = train.read_text(encoding="utf-8").splitlines()[1].rsplit(",", 1)[1]
    with open(valid, "a", encoding="utf-8") as f:
        f.write("where is my parcel,lost_parcel\nmy parcel is lost,lost_parcel\n")
        f.write(f"{'card ' * 300},{known}\n{'parcel ' * 300},lost_parcel\n")  # one too long of each kind
    out = tmp_path / "run"
    result = run("train", "classify", "--train", train, "--valid", valid, "--out", out, "--model", "tiny", *SMALL,
                 "--epochs", "2")
    assert result.exit_code == 0 and "3 rows have labels not in the training data (lost_parcel)" in result.output
    # The long rows are counted among those encoded, which the unseen labels are not; it said "1 of 21" beside
    # "24 validation rows".
    assert "validation (rows with a label training saw): 1 of 21 texts were longer than the model's" in result.output
    assert "24 validation rows" in result.output
    report = json.loads((out / "result.json").read_text())
    assert report["total"] == 24 and report["correct"] <= 21
    logged = [r["eval"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval" in r]
    best = max(r["accuracy"] for r in logged)
    assert best == pytest.approx(report["correct"] / 24) == pytest.approx(report["accuracy"])


def test_a_run_from_before_unseen_labels_counted_resumes_with_its_own_accuracy(tmp_path):
    """Its saved best was taken over the rows with known labels: a resume judging new evaluations over all rows
    compared the two (10/70 lost to 9/60, keeping worse weights) and reported 11/70 for weights that score 9/70."""
    from attnlab.tasks.classify_train import UNSEEN_COUNTED

    train = write_tickets(tmp_path / "t.csv", 120, seed=0)
    valid = write_tickets(tmp_path / "v.csv", 20, seed=1)
    with open(valid, "a", encoding="utf-8") as f:
        f.write("where is my parcel,lost_parcel\nmy parcel is lost,lost_parcel\n")
    out = tmp_path / "run"
    args = ["train", "classify", "--train", train, "--valid", valid, "--out", out, "--model", "tiny", *SMALL]
    assert run(*args, "--epochs", "2").exit_code == 0
    config = json.loads((out / "config.json").read_text())
    assert config.pop(UNSEEN_COUNTED) is True  # as a run from before it wrote its config
    (out / "config.json").write_text(json.dumps(config))
    before = len((out / "metrics.jsonl").read_text().splitlines())
    resumed = run(*args, "--epochs", "4", "--resume")
    assert resumed.exit_code == 0, resumed.output
    added = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()[before:]]
    evals = [r["eval"]["accuracy"] for r in added if "eval" in r]
    assert len(evals) == 2 and all(abs(a * 20 - round(a * 20)) < 1e-9 for a in evals)  # over the 20 known rows
    report = json.loads((out / "result.json").read_text())
    kept = [r["eval"]["accuracy"] for r in added if r.get("best")]  # a best of the resumed part: counted over 20
    assert report["total"] == 22 and kept and report["correct"] == round(kept[-1] * 20)


def test_a_label_written_one_way_in_training_and_another_in_validation_is_refused(tmp_path):
    """1 in the training file and 1.0 in the validation file made 1.0 a label training never saw: its rows all
    counted as errors (50% where every prediction was right)."""
    train, valid = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    train.write_text("".join(json.dumps({"text": f"ticket {i} {'card' if i % 2 else 'parcel'}", "label": i % 2}) + "\n"
                             for i in range(40)))
    valid.write_text("".join(json.dumps({"text": f"ticket {i}", "label": 1.0 if i % 2 else 0}) + "\n"
                             for i in range(10)))
    refused = run("train", "classify", "--train", train, "--valid", valid, "--out", tmp_path / "r", *SMALL,
                  "--epochs", "1")
    assert refused.exit_code == 2 and refused.stderr.endswith(
        f"error: {train} and {valid}: the labels 1 and 1.0 are one number written two ways, which would make two "
        "classes; write each label one way\n")
    assert not (tmp_path / "r").exists()


def test_eval_names_a_run_that_is_no_run_before_its_default_outputs(tmp_path):
    """A file given as RUN was blamed on an option never given (--confusion FILE/confusion-val.png), and on a
    read-only folder the advice to give --confusion led only to "not a run folder"."""
    data = write_tickets(tmp_path / "val.csv", 10, seed=0)
    for command, extra in ((["eval", "classify"], ["--data", data]),
                           (["eval", "translate"], ["--src-file", data, "--ref-file", data])):
        assert one_error_line(run(*command, data, *extra)) == f"error: {data} is not a folder"
        (tmp_path / "folder").mkdir(exist_ok=True)
        assert one_error_line(run(*command, tmp_path / "folder", *extra)) == \
            f"error: {tmp_path / 'folder'} is not an attnlab run folder (no config.json)"
    (tmp_path / "odd" / "config.json").mkdir(parents=True)
    assert one_error_line(run("eval", "classify", tmp_path / "odd", "--data", data)) == \
        f"error: {tmp_path / 'odd' / 'config.json'} is a folder, not a run's config file"
