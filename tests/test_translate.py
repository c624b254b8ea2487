"""Translation end to end on a toy language pair the test writes: train, translate, evaluate, attention, reports."""

import gzip
import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from attnlab.cli.main import cli
from attnlab.data import BOS_ID, EOS_ID, PAD_ID, pad_batch
from attnlab.tasks.decoding import DecodeSettings, beam_search, greedy_search, length_normalised
from attnlab.tasks.translate import LeakyTransformer, TranslateSettings, corpus_scores, train_translation
from attnlab.tasks.translator import cross_attention, load_translator, teacher_forcing_rows
from attnlab.training import TrainConfig
from attnlab.training.checkpoint import write_run_config

# A made-up language pair: every "xx" word has one "yy" word, in the same order (a copy through a lexicon).
LEXICON = dict(zip("ka lo mi nu pe ri su ta".split(), "red blue green gold pink grey teal navy".split()))
SMALL = ["--vocab-size", "60", "--d-model", "32", "--layers", "1", "--heads", "4", "--d-ff", "64", "--dropout", "0",
         "--max-positions", "16", "--max-tokens", "600", "--lr", "1e-2", "--schedule", "cosine", "--warmup", "20",
         "--threads", "1", "--no-progress"]


def write_corpus(path, n, rng):
    src, tgt = [], []
    for _ in range(n):
        words = rng.sample(list(LEXICON), rng.randint(2, 4))  # distinct words: alignment is learnt in seconds
        src.append(" ".join(words))
        tgt.append(" ".join(LEXICON[w] for w in words))
    path.with_suffix(".xx").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    path.with_suffix(".yy").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")
    return src, tgt


def run_cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A run trained on 1,500 toy pairs (about 10 s on one core), with held-out test sentences."""
    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("toy")
    rng = random.Random(0)
    write_corpus(root / "train", 1500, rng)
    write_corpus(root / "valid", 40, rng)
    test = write_corpus(root / "test", 40, rng)
    run = root / "run"
    result = run_cli("train", "translate", "--train", root / "train", "--valid", root / "valid", "--src", "xx",
                     "--tgt", "yy", "--out", run, "--max-steps", "300", "--eval-every", "150", *SMALL)
    yield {"root": root, "run": run, "test": test, "train_output": result.stdout}
    torch.set_num_threads(threads)


def test_training_reaches_exact_match_decoding_on_held_out_sentences(toy):
    summary = json.loads((toy["run"] / "result.json").read_text())
    assert summary["steps"] == 300 and summary["best"]["bleu"] > 90
    last = toy["train_output"].strip().splitlines()[-1]  # the same figures, said in one line
    assert last.startswith("300 steps in ") and f"validation BLEU {summary['best']['bleu']:.2f}" in last
    assert "source and target tokens/s" in last  # what the engine counts: real tokens on both sides
    assert "config.json, tokenizer.json, metrics.jsonl" in toy["train_output"]  # the files written, by name
    # The data and the model on stdout first, as train lm and train classify say theirs (it went to stderr).
    assert toy["train_output"].startswith("1500 training pairs, 40 validation pairs; model Transformer with ")
    src, ref = toy["test"]
    out = toy["root"] / "test.hyp"
    run_cli("translate", toy["run"], "--input", toy["root"] / "test.xx", "--output", out, "--beam", "1", "--no-progress")
    assert out.read_text(encoding="utf-8").splitlines() == ref
    single = run_cli("translate", toy["run"], "ka lo mi")
    assert single.stdout == "red blue green\n"


def test_translate_reads_standard_input_with_a_dash_and_refuses_no_sentences(toy, tmp_path):
    piped = CliRunner().invoke(cli, ["translate", str(toy["run"]), "--input", "-", "--beam", "1"],
                               input="ka lo mi\nmi\n")
    assert piped.exit_code == 0, piped.output
    assert piped.stderr == ""  # no progress bar when stderr is not a terminal
    assert piped.stdout.splitlines() == [run_cli("translate", toy["run"], s).stdout.strip() for s in ("ka lo mi", "mi")]
    (tmp_path / "empty.xx").write_text("")
    for args, stdin, name in (([tmp_path / "empty.xx"], None, tmp_path / "empty.xx"), (["-"], "", "standard input")):
        result = CliRunner().invoke(cli, [str(a) for a in ("translate", toy["run"], "--input", *args)], input=stdin)
        assert result.exit_code == 2 and result.stderr == f"error: {name} holds no sentences\n"
    for folder in (tmp_path, tmp_path / "a.gz"):  # (a folder's name may end in .gz too)
        folder.mkdir(exist_ok=True)
        result = CliRunner().invoke(cli, ["translate", str(toy["run"]), "--input", str(folder)])
        assert result.exit_code == 2 and result.stderr == f"error: {folder} is a folder, not a text file\n"
    for option in ("--src-file", "--ref-file"):  # eval reads two files: one stdin cannot be both
        files = {"--src-file": toy["root"] / "test.xx", "--ref-file": toy["root"] / "test.yy", option: "-"}
        args = ["eval", "translate", str(toy["run"])] + [str(a) for pair in files.items() for a in pair]
        refused = CliRunner().invoke(cli, args, input="ka\n")
        assert refused.exit_code == 2 and refused.stderr.startswith(f"error: {option} names a file; standard input")
    blank = CliRunner().invoke(cli, ["translate", str(toy["run"]), "--input", "-"], input="ka\n\nmi\n")
    assert blank.exit_code == 2 and blank.stderr == ("error: standard input: empty line 2 (1 in all); every line must "
                                                     "hold one sentence\n")
    latin1 = CliRunner().invoke(cli, ["translate", str(toy["run"]), "--input", "-"], input="ka\nm\xe4\n".encode("latin-1"))
    assert latin1.exit_code == 2 and latin1.stderr.startswith("error: standard input is not UTF-8 text (line 2: ")


def test_eval_prints_sacrebleu_json_and_writes_hypotheses(toy):
    hyp = toy["root"] / "eval.hyp"
    result = run_cli("eval", "translate", toy["run"], "--src-file", toy["root"] / "test.xx", "--ref-file",
                     toy["root"] / "test.yy", "--beam", "3", "--json", "--hyp-out", hyp, "--no-progress")
    scores = json.loads(result.stdout)
    assert scores["bleu"] == 100.0 and scores["chrf"] == 100.0
    assert "case:mixed" in scores["signature"] and "tok:13a" in scores["signature"]
    assert hyp.read_text(encoding="utf-8").splitlines() == toy["test"][1]


def test_eval_keeps_one_default_hypothesis_file_per_beam_and_length_penalty(toy):
    args = ("eval", "translate", toy["run"], "--src-file", toy["root"] / "test.xx", "--ref-file",
            toy["root"] / "test.yy", "--json", "--no-progress")
    written = [json.loads(run_cli(*args, *extra).stdout)["hypotheses"]
               for extra in (("--beam", "1"), ("--beam", "1", "--length-penalty", "0.6"), ("--beam", "3"),
                             ("--beam", "3", "--length-penalty", "0.6"))]
    # greedy search has no length penalty: both of its runs write (and the second replaces) one file
    assert written == [str(toy["run"] / f"hyp.test.xx.{tail}.txt") for tail in ("beam1", "beam1", "beam3.lp1.0", "beam3.lp0.6")]
    assert all(Path(name).read_text(encoding="utf-8").splitlines() == toy["test"][1] for name in set(written))


def test_an_output_that_would_replace_an_input_or_a_run_file_is_refused_before_any_work(toy, tmp_path):
    src = tmp_path / "src.xx"
    src.write_text("ka lo\n", encoding="utf-8")
    ref = tmp_path / "ref.yy"
    ref.write_text("red blue\n", encoding="utf-8")
    run = toy["run"]
    kept = {name: (run / name).read_bytes() for name in ("config.json", "model.safetensors", "tokenizer.json",
                                                         "loss.png")}
    evaluate = ["eval", "translate", run, "--src-file", src, "--ref-file", ref, "--no-progress", "--hyp-out"]
    cases = [
        (evaluate + [src], f"error: --hyp-out {src} is the --src-file file this command reads"),
        (evaluate + [tmp_path / "." / "ref.yy"], "is the --ref-file file this command reads"),  # the same file, spelled otherwise
        (evaluate + [run / "config.json"], f"error: --hyp-out {run / 'config.json'} is a file of the run {run} itself"),
        (["translate", run, "--input", src, "--output", src], f"error: --output {src} is the --input file"),
        (["translate", run, "ka", "--output", run / "model.safetensors"], "is a file of the run"),
        (["attention", run, "ka", "--out", run / "checkpoint" / "x.png"], "is a file of the run"),
        (["attention", run, "ka", "--out", run / "loss.png"], "is a file of the run"),  # only training draws it
        (evaluate + ["-"], "error: --hyp-out names a file; - (standard output) is not one here"),
        # a folder, said before the decoding (it was said after all of it)
        (evaluate + [tmp_path], f"error: --hyp-out {tmp_path} is a folder; give a file name to write"),
        (["translate", run, "--input", src, "--output", tmp_path], f"error: --output {tmp_path} is a folder"),
        # likewise a place no file can be written (here: under a file)
        (["translate", run, "--input", src, "--output", src / "out.yy"],
         f"error: --output {src / 'out.yy'}: {src} is not a folder this command can write in"),
        (["translate", run, "ka", "--max-len-a", "0", "--max-len-b", "0"],
         "error: max_len_a 0 and max_len_b 0 (--max-len-a, --max-len-b) allow no token"),
    ]
    for args, said in cases:
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.output
    assert src.read_text(encoding="utf-8") == "ka lo\n" and ref.read_text(encoding="utf-8") == "red blue\n"
    assert {name: (run / name).read_bytes() for name in kept} == kept
    piped = CliRunner().invoke(cli, [str(a) for a in ("translate", run, "--input", src, "--output", "-", "--beam", "1")])
    assert piped.exit_code == 0 and piped.stdout == "red blue\n" and not (tmp_path / "-").exists()
    assert not (run / "checkpoint" / "x.png").exists()
    again = tmp_path / "hyp.txt"  # an output of the command's own may be written over
    for _ in range(2):
        run_cli(*evaluate, again)


def test_beam_search_never_returns_a_worse_hypothesis_than_greedy(toy):
    """Under its own objective (length-normalised log-probability) beam search must do at least as well."""
    tr = load_translator(toy["run"])
    src_lines = ["ka lo", "su ta mi", "pe ri su ta nu", "mi"]
    ids = tr.encode_sources(src_lines)

    def objective(i, hyp):
        src, tgt_in = torch.tensor([ids[i]]), torch.tensor([[BOS_ID, *hyp]])
        with torch.no_grad():
            logits = tr.model(src, tgt_in)[0]
        logits[:, [PAD_ID, BOS_ID]] = -float("inf")  # as in decoding: never generated
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor([[*hyp, EOS_ID]]).T).sum()
        return length_normalised(float(logp), len(hyp) + 1, alpha)

    alpha = 0.6
    src = pad_batch(ids)
    beams = beam_search(tr.model, src, beam_size=4, length_penalty=alpha)
    for i, (g, b) in enumerate(zip(greedy_search(tr.model, src), beams)):
        assert objective(i, b) >= objective(i, g) - 1e-5


def test_attention_heatmap_for_one_sentence(toy):
    tr = load_translator(toy["run"])
    att = cross_attention(tr, "ka lo mi nu", decode=DecodeSettings(beam_size=1))
    assert att.translation == "red blue green gold"
    assert att.weights.shape == (len(att.out_pieces), len(att.src_pieces)) and att.src_pieces[-1] == "<eos>"
    torch.testing.assert_close(att.weights.sum(-1), torch.ones(len(att.out_pieces)))
    # A word-for-word pair: while emitting word t the decoder should look mostly at source word t.
    assert att.weights[:4].argmax(-1).tolist() == [0, 1, 2, 3]
    png = toy["root"] / "att.png"
    result = run_cli("attention", toy["run"], "ka lo mi nu", "--out", png, "--layer", "1")
    assert result.stdout == "red blue green gold\n" and png.read_bytes()[:4] == b"\x89PNG"
    pdf = toy["root"] / "att.pdf"  # the name's suffix is the format, not PNG bytes under any name
    run_cli("attention", toy["run"], "ka lo mi nu", "--out", pdf)
    assert pdf.read_bytes()[:4] == b"%PDF"
    svgz = toy["root"] / "att.svgz"  # gzip names no file in its header (it named the temporary one, for gunzip -N)
    run_cli("attention", toy["run"], "ka lo mi nu", "--out", svgz)
    header = svgz.read_bytes()[:10]
    assert header[:2] == b"\x1f\x8b" and not header[3] & 0x08, header
    assert gzip.decompress(svgz.read_bytes()).lstrip().startswith(b"<?xml")
    refused = CliRunner().invoke(cli, ["attention", str(toy["run"]), "ka", "--out", str(toy["root"] / "att.docx")])
    assert refused.exit_code == 2 and "matplotlib cannot write .docx figures" in refused.stderr
    assert not (toy["root"] / "att.docx").exists()
    from attnlab.cli.attention import plot_heatmap

    svg = toy["root"] / "math.svg"  # pieces are drawn as written: mathtext raised on $\\frac$, drew $x_1$ as x₁
    plot_heatmap(["$\\frac$", "$x_1$"], ["$5", "to $10"], torch.full((2, 2), 0.5), svg, "costs $5 to $10")
    drawn = svg.read_text()
    assert "costs $5 to $10" in drawn and "$x_1$" in drawn


def test_a_long_sentences_heatmap_is_squeezed_into_a_bounded_figure(tmp_path):
    """One piece 0.45 inch wide: 280 pieces made a 14,124 x 12,528-pixel image that took 5.9 GB to draw."""
    import struct

    from attnlab.cli.attention import MAX_FIGURE_INCHES, plot_heatmap

    png = tmp_path / "long.png"
    plot_heatmap([f"s{i}" for i in range(600)], [f"o{i}" for i in range(500)], torch.rand(500, 600), png, "long")
    width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the PNG header's size
    assert max(width, height) <= MAX_FIGURE_INCHES * 120 and min(width, height) > 3000
    short = tmp_path / "short.png"  # a short sentence keeps its readable size
    plot_heatmap(["a", "b", "<eos>"], ["x", "<eos>"], torch.full((2, 3), 0.3), short, "short")
    width, height = struct.unpack(">II", short.read_bytes()[16:24])
    assert width < 600 and height < 600


def test_attention_shows_the_weights_decoding_used_even_for_a_model_whose_plain_decode_leaks(toy):
    tr = load_translator(toy["run"])
    tr.model.__class__ = LeakyTransformer  # the same weights, no look-ahead mask in the uncached decode
    att = cross_attention(tr, "ka lo mi nu", decode=DecodeSettings(beam_size=1))
    src = torch.tensor(tr.encode_sources(["ka lo mi nu"]))
    tgt_in = [BOS_ID, *(tr.tgt_tokenizer.hf.token_to_id(p) for p in att.out_pieces[:-1])]
    rows = []
    with torch.no_grad():  # one token a step, as greedy decoding ran
        memory, memory_mask = tr.model.encode(src)
        caches = tr.model.new_caches()
        for t in tgt_in:
            _, w = tr.model.decode(torch.tensor([[t]]), memory, memory_attend_mask=memory_mask, caches=caches,
                                   need_weights=True)
            rows.append(w[f"decoder_layer{att.layer}_block2_decenc_att"][0, :, 0].mean(0))
    torch.testing.assert_close(att.weights, torch.stack(rows))


def test_attention_of_a_translation_that_fills_the_position_table(toy, monkeypatch):
    import attnlab.tasks.translator as translator_module

    tr = load_translator(toy["run"])
    table = tr.model.decoder.embed.max_positions  # 16: a hypothesis this long was stopped by it, with no <eos>
    monkeypatch.setattr(translator_module, "translate_ids", lambda *args, **kwargs: [[7] * table])
    att = cross_attention(tr, "ka lo mi nu")
    assert att.weights.shape == (table, len(att.src_pieces)) and len(att.out_pieces) == table
    assert "<eos>" not in att.out_pieces
    # Cut by --max-len-a/-b instead: one row a generated token, none for an <eos> the decoder never wrote.
    monkeypatch.undo()
    cut = cross_attention(tr, "ka lo mi", decode=DecodeSettings(beam_size=1, max_len_a=0, max_len_b=1))
    assert cut.translation == "red" and cut.out_pieces == ["▁red"] and cut.weights.shape[0] == 1
    whole = cross_attention(tr, "ka lo mi", decode=DecodeSettings(beam_size=1))
    assert whole.out_pieces[-1] == "<eos>" and len(whole.out_pieces) == 4


def test_shared_embeddings_asked_for_with_separate_vocabularies_is_one_line(toy, tmp_path):
    result = CliRunner().invoke(cli, ["train", "translate", "--train", str(toy["root"] / "train"), "--valid",
                                      str(toy["root"] / "valid"), "--src", "xx", "--tgt", "yy", "--out",
                                      str(tmp_path / "r"), "--separate-vocab", "--share-embeddings"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "needs the joint vocabulary" in result.stderr
    assert not (tmp_path / "r").exists()
    heads = CliRunner().invoke(cli, ["train", "translate", "--train", str(toy["root"] / "train"), "--valid",
                                     str(toy["root"] / "valid"), "--src", "xx", "--tgt", "yy", "--out",
                                     str(tmp_path / "r"), "--d-model", "32", "--heads", "3"])
    assert heads.exit_code == 2 and heads.stderr == (
        "error: --d-model 32 is not divisible by --heads 3: each head gets d-model / heads dimensions\n")
    assert not (tmp_path / "r").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    on_file = CliRunner().invoke(cli, ["train", "translate", "--train", str(toy["root"] / "train"), "--valid",
                                       str(toy["root"] / "valid"), "--src", "xx", "--tgt", "yy", "--out", str(blocker)])
    assert on_file.exit_code == 2 and on_file.stderr == f"error: {blocker} exists and is not a folder; --out names a folder\n"
    assert blocker.read_text() == "mine"


def test_eval_of_empty_files_is_one_line(toy, tmp_path):
    (tmp_path / "z.xx").write_text("", encoding="utf-8")
    (tmp_path / "z.yy").write_text("", encoding="utf-8")
    result = CliRunner().invoke(cli, ["eval", "translate", str(toy["run"]), "--src-file", str(tmp_path / "z.xx"),
                                      "--ref-file", str(tmp_path / "z.yy")])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_leaky_model_wins_under_teacher_forcing_and_collapses_free_running(tmp_path):
    """Seed 000's review question 4, on the toy pair with a random end mark (. ! ? or ;) on every target.

    A correct model cannot know which mark comes (its loss keeps log 4 per sentence); a model without the
    look-ahead mask reads every next token from its input, so its teacher-forced loss is far lower, and
    free running, with no future to read, it collapses.
    """
    rng = random.Random(1)
    for name, n in (("train", 1500), ("valid", 40)):
        src = [rng.sample(list(LEXICON), rng.randint(2, 4)) for _ in range(n)]
        (tmp_path / f"{name}.xx").write_text("".join(" ".join(s) + "\n" for s in src), encoding="utf-8")
        (tmp_path / f"{name}.yy").write_text(
            "".join(" ".join(LEXICON[w] for w in s) + rng.choice(".!?;") + "\n" for s in src), encoding="utf-8")
    runs = {}
    for name, mask in (("correct", True), ("leaky", False)):
        runs[name] = tmp_path / name
        train_translation(train=tmp_path / "train", valid=tmp_path / "valid", out=runs[name],
                          settings=TranslateSettings(src="xx", tgt="yy", vocab_size=150, max_tokens=600,
                                                     look_ahead_mask=mask, select="loss"),
                          model_kwargs=dict(d_model=32, num_layers=1, num_heads=4, d_ff=64, dropout=0.0,
                                            max_src_positions=16, max_tgt_positions=16),
                          train_config=TrainConfig(max_steps=150, lr=1e-2, schedule="constant", warmup_steps=20,
                                                   eval_every=150, progress=False), log=lambda m: None)
    correct, broken = teacher_forcing_rows(runs, tmp_path / "valid")
    assert correct["look_ahead_mask"] and not broken["look_ahead_mask"]
    assert broken["teacher_forced_loss"] < 0.5 * correct["teacher_forced_loss"]
    assert broken["free_running_bleu"] < 1.0 < 20.0 < correct["free_running_bleu"]
    assert broken["free_running_chrf"] < correct["free_running_chrf"] / 2
    result = run_cli("experiment", "teacher-forcing", "--valid", tmp_path / "valid", "--src", "xx", "--tgt", "yy",
                     "--correct", runs["correct"], "--leaky", runs["leaky"], "--out", tmp_path / "report")
    assert "| leaky | no |" in result.stdout
    assert json.loads((tmp_path / "report" / "report.json").read_text())[1]["model"] == "leaky"
    # A run of another task is named before anything runs; runs already under --out are not retrained over.
    write_run_config(tmp_path / "lm", {"task": "lm", "model": {"class": "DecoderLM", "kwargs": {}}})
    other = CliRunner().invoke(cli, [str(a) for a in ("experiment", "teacher-forcing", "--valid", tmp_path / "valid",
                                                      "--correct", tmp_path / "lm", "--leaky", runs["leaky"],
                                                      "--out", tmp_path / "r2")])
    assert other.exit_code == 2 and other.stderr == f"error: {tmp_path / 'lm'} is a 'lm' run, not a 'translate' run\n"
    (tmp_path / "r3" / "correct").mkdir(parents=True)
    shutil.copy(runs["correct"] / "config.json", tmp_path / "r3" / "correct" / "config.json")
    again = CliRunner().invoke(cli, [str(a) for a in ("experiment", "teacher-forcing", "--train", tmp_path / "train",
                                                      "--valid", tmp_path / "valid", "--out", tmp_path / "r3")])
    assert again.exit_code == 2 and "measure it again with --correct" in again.stderr
    # Where the second model and the report go is checked before the first model trains, not after.
    def trains_nothing(out, *args):
        done = CliRunner().invoke(cli, [str(a) for a in ("experiment", "teacher-forcing", "--train", tmp_path / "train",
                                                         "--valid", tmp_path / "valid", "--out", out, *args)])
        assert done.exit_code == 2 and len(done.stderr.splitlines()) == 1, done.output
        assert not (out / "correct").exists() and "training the" not in done.stderr
        return done.stderr
    (tmp_path / "r5" / "leaky").mkdir(parents=True)
    (tmp_path / "r5" / "leaky" / "model.safetensors").write_text("someone else's")
    assert trains_nothing(tmp_path / "r5") == (f"error: {tmp_path / 'r5' / 'leaky'} holds model.safetensors, by names "
                                               "a new run writes there (and no config.json to resume); choose another "
                                               "--out\n")
    (tmp_path / "r6").mkdir()
    (tmp_path / "r6" / "leaky").write_text("a file")
    assert trains_nothing(tmp_path / "r6") == (f"error: {tmp_path / 'r6' / 'leaky'} exists and is not a folder; the "
                                               "experiment trains its leaky run there: move it or choose another --out\n")
    (tmp_path / "r7" / "report.md").mkdir(parents=True)
    assert trains_nothing(tmp_path / "r7", "--leaky", runs["leaky"]) == (
        f"error: {tmp_path / 'r7' / 'report.md'} is a folder, where the report goes; move it or choose another --out\n")
    assert not (tmp_path / "r7" / "report.json").exists()
    (tmp_path / "a-file").write_text("mine")
    on_file = CliRunner().invoke(cli, [str(a) for a in ("experiment", "teacher-forcing", "--valid", tmp_path / "valid",
                                                        "--correct", runs["correct"], "--leaky", runs["leaky"], "--out",
                                                        tmp_path / "a-file", "--threads", "1", "--seed", "2")])
    assert on_file.exit_code == 2 and on_file.stderr == (f"error: {tmp_path / 'a-file'} exists and is not a folder; "
                                                         "--out names a folder\n")
    # The two runs swapped, or languages the runs do not translate, are refused before anything is measured.
    def experiment(*args):
        return CliRunner().invoke(cli, [str(a) for a in ("experiment", "teacher-forcing", "--valid", tmp_path / "valid",
                                                          "--out", tmp_path / "r4", *args)])
    swapped = experiment("--correct", runs["leaky"], "--leaky", runs["correct"])
    assert swapped.exit_code == 2 and swapped.stderr == (
        f"error: --correct {runs['leaky']} was trained without the look-ahead mask: it is a leaky run; pass it as "
        "--leaky\n")
    assert "it is a correct run; pass it as --correct" in experiment("--leaky", runs["correct"]).stderr
    languages = experiment("--src", "de", "--tgt", "en", "--correct", runs["correct"], "--leaky", runs["leaky"])
    assert languages.exit_code == 2 and (f"--correct {runs['correct']} translates xx to yy, not as --src de --tgt en "
                                         "says") in languages.stderr
    assert "not as --tgt en says" in experiment("--tgt", "en", "--correct", runs["correct"], "--train", "t").stderr
    # only the sides given are compared: --src xx alone is the run's own (what stops it here is the missing --train)
    assert "no file t.xx" in experiment("--src", "xx", "--correct", runs["correct"], "--train", "t").stderr
    # Runs that cut the target into other tokens cannot be compared per token; other model shapes get a note.
    for name, vocab, width in (("other-tokens", 50, 32), ("wider", 150, 64)):
        train_translation(train=tmp_path / "train", valid=tmp_path / "valid", out=tmp_path / name,
                          settings=TranslateSettings(src="xx", tgt="yy", vocab_size=vocab, max_tokens=600,
                                                     look_ahead_mask=False),
                          model_kwargs=dict(d_model=width, num_layers=1, num_heads=4, d_ff=64, dropout=0.0,
                                            max_src_positions=16, max_tgt_positions=16),
                          train_config=TrainConfig(max_steps=1, eval_every=1, progress=False), log=lambda m: None)
    tokens = experiment("--correct", runs["correct"], "--leaky", tmp_path / "other-tokens")
    assert tokens.exit_code == 2 and tokens.stderr == (
        f"error: the correct run {runs['correct']} and the leaky run {tmp_path / 'other-tokens'} cut target text into "
        "different tokens (their tokenizers differ), so their losses per token cannot be compared; train both on the "
        "same --train with the same --vocab-size\n")
    assert not (tmp_path / "r4").exists()
    wider = experiment("--correct", runs["correct"], "--leaky", tmp_path / "wider")
    assert wider.exit_code == 0, wider.output
    assert "note: the correct and leaky models differ in more than the look-ahead mask (d_model 32 vs 64)" in wider.stderr
    assert "note:" not in result.stderr  # the two runs above differ in the mask alone
    unheard = experiment("--correct", runs["correct"], "--leaky", runs["leaky"], "--max-steps", "5", "--seed", "4")
    assert unheard.exit_code == 0 and "note: --max-steps, --seed unused: both runs are reused" in unheard.stderr
    shutil.copytree(runs["leaky"], tmp_path / "no-tokenizer")
    (tmp_path / "no-tokenizer" / "tokenizer.json").unlink()  # said as missing, not as another tokenizer
    missing = experiment("--correct", runs["correct"], "--leaky", tmp_path / "no-tokenizer")
    assert missing.stderr == f"error: no tokenizer file {tmp_path / 'no-tokenizer' / 'tokenizer.json'}\n"
    # One run reused, the other trained beside it: with the reused run's languages and vocabulary, so that the two
    # compare (an explicit other --vocab-size is refused before anything trains).
    shutil.rmtree(tmp_path / "r4")  # the report of the wider run above
    other_vocab = experiment("--correct", runs["correct"], "--train", tmp_path / "train", "--vocab-size", "50")
    assert other_vocab.exit_code == 2 and "has a vocabulary of 150" in other_vocab.stderr, other_vocab.output
    assert not (tmp_path / "r4").exists()
    for lang in ("xx", "yy"):  # other training text: refused before it trains, naming the run's own
        lines = (tmp_path / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (tmp_path / f"other.{lang}").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    other_text = experiment("--correct", runs["correct"], "--train", tmp_path / "other")
    assert other_text.exit_code == 2 and other_text.stderr == (
        f"error: --train {tmp_path / 'other'} is not the training data of --correct {runs['correct']} (its xx side was "
        f"{tmp_path / 'train.xx'}): the model trained beside it must learn the same tokens from the same text\n")
    assert not (tmp_path / "r4").exists()
    beside = experiment("--correct", runs["correct"], "--train", tmp_path / "train", "--max-steps", "1",
                        "--eval-every", "1", "--no-progress")
    assert beside.exit_code == 0, beside.output
    assert "with the correct run's languages (xx to yy) and vocabulary (150)" in beside.stderr
    assert "| leaky | no |" in beside.stdout
    shutil.rmtree(tmp_path / "r4")
    again = run_cli("experiment", "teacher-forcing", "--valid", tmp_path / "valid", "--correct", runs["correct"],
                    "--leaky", runs["leaky"], "--out", tmp_path / "report")  # the run's own languages by default
    assert f"replacing the report in {tmp_path / 'report'}" in again.stderr


def test_the_model_trained_beside_a_reused_run_of_separate_vocabularies_keeps_its_tables_apart(tmp_path):
    rng = random.Random(0)
    write_corpus(tmp_path / "train", 80, rng)
    write_corpus(tmp_path / "valid", 8, rng)
    sep = ["--separate-vocab", "--no-share-embeddings", "--max-steps", "2"]
    assert _short_run(tmp_path / "train", tmp_path / "valid", tmp_path / "correct", *sep).exit_code == 0
    result = CliRunner().invoke(cli, [str(a) for a in (
        "experiment", "teacher-forcing", "--valid", tmp_path / "valid", "--correct", tmp_path / "correct", "--train",
        tmp_path / "train", "--out", tmp_path / "report", "--max-steps", "1", "--eval-every", "1", "--no-progress",
        "--threads", "1")])
    assert result.exit_code == 0, result.output  # before: "shared embeddings need the joint vocabulary"
    leaky = json.loads((tmp_path / "report" / "leaky" / "config.json").read_text())["model"]["kwargs"]
    assert leaky["share_embeddings"] is False and "| leaky | no |" in result.stdout


def test_overlong_source_is_truncated_with_a_warning(toy, monkeypatch):
    words = list(LEXICON) * 4  # 32 words, 33 positions with eos: the table has 16
    result = run_cli("translate", toy["run"], " ".join(words), "--beam", "1")
    assert "warning: 1 source line longer than the model's 16 source positions was truncated" in result.stderr
    assert result.stdout.strip()  # a translation of the first 15 words, not an error
    with pytest.warns(UserWarning, match="truncated"):
        ids = load_translator(toy["run"]).encode_sources([" ".join(words)])
    assert len(ids[0]) == 16 and ids[0][-1] == EOS_ID
    monkeypatch.setenv("RANK", "1")  # under torchrun, the processes past the first say nothing rank 0 says too
    quiet = run_cli("translate", toy["run"], " ".join(words), "--beam", "1")
    assert quiet.stdout == result.stdout and "warning" not in quiet.stderr


def test_a_long_validation_source_is_warned_about_once_by_training_and_by_the_teacher_forcing_table(toy, tmp_path):
    long = list(LEXICON) * 4  # 32 words: the source is truncated to 16 positions (for the loss and for BLEU)
    for lang, line in (("xx", " ".join(long)), ("yy", "red blue green")):
        lines = (toy["root"] / f"valid.{lang}").read_text(encoding="utf-8")
        (tmp_path / f"valid.{lang}").write_text(line + "\n" + lines, encoding="utf-8")
    result = run_cli("train", "translate", "--train", toy["root"] / "train", "--valid", tmp_path / "valid", "--src", "xx",
                     "--tgt", "yy", "--out", tmp_path / "run", "--max-steps", "2", "--no-look-ahead-mask", *SMALL)
    source = "warning: 1 validation source line longer than the model's 16 source positions was truncated to fit"
    assert result.stderr.count("source line") == 1 and source in result.stderr, result.stderr
    lines = result.output.splitlines()  # said when the data is read, before training, not once the run has ended
    # (output: stderr and stdout, which the data line is on, in the order written)
    assert lines.index(source) < next(i for i, line in enumerate(lines) if "validation pairs; model" in line)
    table = run_cli("experiment", "teacher-forcing", "--valid", tmp_path / "valid", "--correct", toy["run"],
                    "--leaky", tmp_path / "run", "--out", tmp_path / "report")
    assert table.stderr.count("source line") == 2, table.stderr  # once per run


def test_a_hand_broken_settings_block_is_named_in_one_line(toy, tmp_path):
    for name, settings in (("no-tgt", {"tokenizers": {"src": "tokenizer.json"}}), ("string", "oops"),
                           ("numbers", {"tokenizers": {"src": 1, "tgt": 1}})):
        run = tmp_path / name
        shutil.copytree(toy["run"], run)
        config = json.loads((run / "config.json").read_text())
        config["settings"] = settings if isinstance(settings, str) else {**config["settings"], **settings}
        (run / "config.json").write_text(json.dumps(config))
        for args in (["translate", str(run), "ka lo"], ["experiment", "teacher-forcing", "--valid",
                                                        str(toy["root"] / "valid"), "--correct", str(run), "--leaky",
                                                        str(run), "--out", str(tmp_path / "report")]):
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 2 and result.stderr.startswith(f"error: {run / 'config.json'} holds broken "
                                                                      "settings"), result.output


def test_run_of_another_task_and_missing_run_are_one_line_errors(toy, tmp_path):
    other = tmp_path / "lm-run"
    write_run_config(other, {"task": "lm", "model": {"class": "DecoderLM", "kwargs": {}}})
    for args in (["translate", other, "ein Satz"], ["eval", "translate", other, "--src-file", toy["root"] / "test.xx",
                                                    "--ref-file", toy["root"] / "test.yy"],
                 ["attention", other, "ein Satz", "--out", tmp_path / "a.png"], ["translate", tmp_path / "none", "x"]):
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "is a 'lm' run, not a 'translate' run" in CliRunner().invoke(cli, ["translate", str(other), "x"]).stderr


def test_scores_match_sacrebleu_conventions():
    scores = corpus_scores(["The cat sat on the mat."], ["The cat sat on the mat."])
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    lower = corpus_scores(["the cat sat on the mat."], ["The cat sat on the mat."])
    assert lower["bleu"] < 100.0  # cased


def test_resume_continues_a_run_from_its_checkpoint(toy, tmp_path):
    import shutil

    run = tmp_path / "resumed"
    shutil.copytree(toy["run"], run)
    result = run_cli("train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src",
                     "xx", "--tgt", "yy", "--out", run, "--resume", "--max-steps", "305", "--eval-every", "150",
                     *SMALL)
    assert result.stdout.strip().splitlines()[-1].startswith("305 steps in ")
    assert json.loads((run / "result.json").read_text())["steps"] == 305
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]  # none twice
    assert steps[-1] == 305 and steps == sorted(steps)
    # More steps than the run started with is allowed, but said aloud, and config.json records what was used.
    assert "resume: continuing with other training settings than before: max_steps 300 -> 305" in result.stderr
    assert "resume: the run now ends at step 305 instead of 300; its learning-rate schedule is re-planned" in result.stderr
    shorter = CliRunner().invoke(cli, [str(a) for a in (
        "train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx", "--tgt",
        "yy", "--out", run, "--resume", "--max-steps", "200", "--no-progress")])
    assert shorter.exit_code == 2 and "has reached step 305, past the 200 steps it is given; to go on, resume with --max-steps more " \
        "than 305" in shorter.stderr
    assert json.loads((run / "config.json").read_text())["train"]["max_steps"] == 305
    assert "ignored" not in result.stderr  # the same data and model flags as the run: nothing to ignore
    # Other data would give other batches: refused before anything changes, for either split.
    before = (run / "config.json").read_bytes()
    for split in ("train", "valid"):
        other = {"train": toy["root"] / "train", "valid": toy["root"] / "valid", split: toy["root"] / "test"}
        refused = CliRunner().invoke(cli, [str(a) for a in ("train", "translate", "--train", other["train"], "--valid",
                                                             other["valid"], "--src", "xx", "--tgt", "yy", "--out", run,
                                                             "--resume", *SMALL)])
        assert refused.exit_code == 2 and f"is not the {split} data this run started with" in refused.stderr
    assert (run / "config.json").read_bytes() == before


def test_resume_refuses_data_whose_bytes_changed_under_the_same_name(toy, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(toy["run"], run)
    for name in ("train.xx", "train.yy", "valid.xx", "valid.yy"):  # the run's data, moved where it may change
        shutil.copy(toy["root"] / name, tmp_path / name)
    config = json.loads((run / "config.json").read_text())
    assert set(config["data"]["files"]) == {"train.xx", "train.yy", "valid.xx", "valid.yy"}
    config["data"].update(train=str(tmp_path / "train"), valid=str(tmp_path / "valid"))
    for key, file in config["data"]["files"].items():
        file["path"] = str(tmp_path / key)
    (run / "config.json").write_text(json.dumps(config))
    before = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for name in ("train.yy", "valid.xx"):
        kept = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(kept.replace(b"\n", b" x\n", 1))  # one line edited, the name the same
        refused = CliRunner().invoke(cli, [str(a) for a in ("train", "translate", "--train", tmp_path / "train",
                                                             "--valid", tmp_path / "valid", "--src", "xx", "--tgt",
                                                             "yy", "--out", run, "--resume", *SMALL)])
        assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
        assert f"{tmp_path / name} has changed since this run started" in refused.stderr
        (tmp_path / name).write_bytes(kept)
    assert {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def _short_run(train, valid, out, *extra):
    return CliRunner().invoke(cli, [str(a) for a in ("train", "translate", "--train", train, "--valid", valid, "--src",
                                                     "xx", "--tgt", "yy", "--out", out, "--eval-every", "2", *SMALL,
                                                     *extra)])


def test_resume_checks_the_data_by_content_not_by_the_name_it_was_given(tmp_path, monkeypatch):
    rng = random.Random(0)
    (tmp_path / "data").mkdir()
    write_corpus(tmp_path / "data" / "train", 80, rng)
    write_corpus(tmp_path / "data" / "valid", 8, rng)
    monkeypatch.chdir(tmp_path)  # relative prefixes, as a user types them
    assert _short_run("data/train", "data/valid", "run", "--max-steps", "2").exit_code == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the same files named from another folder
    result = _short_run(tmp_path / "data" / "train", tmp_path / "data" / "valid", tmp_path / "run", "--resume",
                        "--max-steps", "4")
    assert result.exit_code == 0, result.output
    for name in ("train.xx", "valid.yy"):  # copies hold the same data: accepted; other bytes are not
        shutil.copy(tmp_path / "data" / name, tmp_path / "elsewhere" / name)
    shutil.copy(tmp_path / "data" / "train.yy", "train.yy")
    shutil.copy(tmp_path / "data" / "valid.xx", "valid.xx")
    assert _short_run("train", "valid", tmp_path / "run", "--resume", "--max-steps", "6").exit_code == 0
    Path("train.yy").write_text("".join(reversed(Path("train.yy").read_text().splitlines(keepends=True))))
    refused = _short_run("train", "valid", tmp_path / "run", "--resume", "--max-steps", "8")
    assert refused.exit_code == 2 and "train.yy is not the train data this run started with" in refused.stderr


def test_resume_reads_a_file_unzipped_from_the_gz_one_only_when_it_holds_the_same_text(tmp_path):
    import gzip

    rng = random.Random(0)
    write_corpus(tmp_path / "train", 80, rng)
    write_corpus(tmp_path / "valid", 8, rng)
    for lang in ("xx", "yy"):  # the run reads train.xx.gz and train.yy.gz
        plain = tmp_path / f"train.{lang}"
        (tmp_path / f"train.{lang}.gz").write_bytes(gzip.compress(plain.read_bytes()))
        plain.rename(tmp_path / f"kept.{lang}")
    assert _short_run(tmp_path / "train", tmp_path / "valid", tmp_path / "run", "--max-steps", "2").exit_code == 0
    shutil.copy(tmp_path / "kept.xx", tmp_path / "train.xx")  # unzipped beside: what side_path now reads
    shuffled = (tmp_path / "kept.yy").read_text().splitlines(keepends=True)
    random.Random(1).shuffle(shuffled)  # other pairs under the plain name
    (tmp_path / "train.yy").write_text("".join(shuffled))
    refused = _short_run(tmp_path / "train", tmp_path / "valid", tmp_path / "run", "--resume", "--max-steps", "4")
    assert refused.exit_code == 2 and "train.yy is not the train data this run started with" in refused.stderr
    shutil.copy(tmp_path / "kept.yy", tmp_path / "train.yy")  # the same lines: the same data
    result = _short_run(tmp_path / "train", tmp_path / "valid", tmp_path / "run", "--resume", "--max-steps", "4")
    assert result.exit_code == 0, result.output
    for lang in ("xx", "yy"):  # plain gunzip, the .gz gone: the text it held is what the run recorded too
        (tmp_path / f"train.{lang}.gz").unlink()
    result = _short_run(tmp_path / "train", tmp_path / "valid", tmp_path / "run", "--resume", "--max-steps", "6")
    assert result.exit_code == 0, result.output
    beside = CliRunner().invoke(cli, [str(a) for a in (  # and a model trained beside the run takes the same text
        "experiment", "teacher-forcing", "--valid", tmp_path / "valid", "--correct", tmp_path / "run", "--train",
        tmp_path / "train", "--out", tmp_path / "report", "--max-steps", "1", "--eval-every", "1", "--no-progress",
        "--threads", "1")])
    assert beside.exit_code == 0, beside.output


def test_translations_written_to_a_gz_name_are_compressed(toy, tmp_path):
    import gzip

    out = tmp_path / "hyp.yy.gz"
    run_cli("translate", toy["run"], "--input", toy["root"] / "test.xx", "--output", out, "--beam", "1", "--no-progress")
    assert gzip.decompress(out.read_bytes()).decode().splitlines() == toy["test"][1]


def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(toy, tmp_path):
    import shutil

    killed = tmp_path / "killed"
    shutil.copytree(toy["run"], killed, ignore=shutil.ignore_patterns("checkpoint", "*.safetensors", "result.json"))
    args = ["train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
            "--tgt", "yy", "--out", killed, "--max-steps", "300", "--eval-every", "150", *SMALL]
    again = CliRunner().invoke(cli, [str(a) for a in args])
    assert again.exit_code == 2 and "already holds a run" in again.stderr  # a new run still refuses the folder
    result = run_cli(*args, "--resume")
    assert "has no checkpoint yet: starting the run again from step 0" in result.stderr
    report = json.loads((killed / "result.json").read_text())
    original = json.loads((toy["run"] / "result.json").read_text())
    assert report["steps"] == 300  # the same run as the uninterrupted one, step for step
    assert report["final_loss"] == pytest.approx(original["final_loss"], abs=1e-5)
    def logged(run):
        return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert logged(killed) == logged(toy["run"])  # the killed run's log was started afresh, not appended to


def test_resume_names_the_model_flags_it_ignores(toy, tmp_path):
    import shutil

    run = tmp_path / "resumed"
    shutil.copytree(toy["run"], run)
    (run / "result.json").unlink()  # killed after its last checkpoint: the final evaluation is left to do
    small = [a if a != "32" else "64" for a in SMALL]  # --d-model 64 instead of the run's 32
    result = run_cli("train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src",
                     "xx", "--tgt", "yy", "--out", run, "--resume", "--max-steps", "300", "--eval-every", "150",
                     *small)
    assert "ignored: d_model=64 (the run has 32)" in result.stderr
    assert json.loads((run / "config.json").read_text())["model"]["kwargs"]["d_model"] == 32
    # Structural flags too, though they are not model sizes: the output tying and the hidden leak switch.
    (run / "result.json").unlink()
    again = run_cli("train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src",
                    "xx", "--tgt", "yy", "--out", run, "--resume", "--max-steps", "300", "--no-tie-output",
                    "--no-look-ahead-mask", "--no-progress")
    assert "look_ahead_mask=False (the run has True)" in again.stderr and "tie_output=False (the run has" in again.stderr


def test_a_bare_resume_keeps_every_setting_of_the_run(toy, tmp_path):
    """Options left out on --resume are the run's, not the command's defaults, and nothing is called ignored."""
    import shutil

    killed = tmp_path / "killed"
    shutil.copytree(toy["run"], killed, ignore=shutil.ignore_patterns("checkpoint", "*.safetensors", "result.json"))
    result = run_cli("train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid",
                     "--src", "xx", "--tgt", "yy", "--out", killed, "--resume", "--no-progress", "--threads", "1")
    assert "ignored" not in result.stderr and "other training settings" not in result.stderr, result.stderr
    saved, started = (json.loads((run / "config.json").read_text()) for run in (killed, toy["run"]))
    assert saved["train"] == started["train"]  # max_steps 300, lr 1e-2, warmup 20, ... not the recipe's defaults
    # A flag's off switch counts as given: a run started with --bf16 can continue without it.
    started_bf16 = tmp_path / "bf16"
    shutil.copytree(killed, started_bf16)
    config = json.loads((started_bf16 / "config.json").read_text())
    config["train"]["bf16"] = True
    (started_bf16 / "config.json").write_text(json.dumps(config))
    off = run_cli("train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src",
                  "xx", "--tgt", "yy", "--out", started_bf16, "--resume", "--no-bf16", "--no-progress", "--max-steps",
                  "301")
    assert "bf16 True -> False" in off.stderr, off.stderr
    assert json.loads((killed / "result.json").read_text())["steps"] == 300


def test_a_translation_run_the_time_budget_stopped_says_so_on_its_last_line(toy, tmp_path):
    import shutil

    run = tmp_path / "timed"
    shutil.copytree(toy["run"], run)  # 300 steps done; the budget below lets a few more run
    spent = json.loads((run / "checkpoint" / "trainer.json").read_text())["trainer"]["elapsed"]
    args = ["train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
            "--tgt", "yy", "--out", run, "--resume", "--max-steps", "4000", "--no-progress"]
    result = run_cli(*args, "--max-seconds", f"{spent + 0.3:.2f}")
    last = result.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ steps \(stopped by the --max-seconds time budget\)", last), last
    assert json.loads((run / "result.json").read_text())["out_of_time"] is True
    # Its budget spent, a resume without a larger one is refused with the way on, and changes nothing.
    refused = CliRunner().invoke(cli, [str(a) for a in args])
    assert refused.exit_code == 2 and "all of its time budget (--max-seconds" in refused.stderr
    assert "or more (0: no limit)" in refused.stderr


def test_a_new_run_refuses_a_folder_that_holds_one_and_leaves_it_intact(toy):
    run = toy["run"]
    before = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    result = CliRunner().invoke(cli, [str(a) for a in (
        "train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
        "--tgt", "yy", "--out", run, "--max-steps", "5", *SMALL)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds a run; pass --resume" in lines[0], result.stderr
    assert {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_keeps_the_runs_own_seed(toy, tmp_path):
    """A run started with --seed 3 and restarted with plain --resume repeats the seed-3 run, not a seed-0 one."""
    import shutil

    args = ["train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
            "--tgt", "yy", "--max-steps", "40", "--eval-every", "40", *SMALL]
    run_cli(*args, "--out", tmp_path / "seed3", "--seed", "3")
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "seed3", killed, ignore=shutil.ignore_patterns("checkpoint", "*.safetensors",
                                                                              "result.json"))
    result = run_cli(*args, "--out", killed, "--resume", "--seed", "0")
    assert "resume: keeping the run's seed 3 (--seed 0 ignored)" in result.stderr
    report, original = (json.loads((run / "result.json").read_text()) for run in (killed, tmp_path / "seed3"))
    assert report["final_loss"] == pytest.approx(original["final_loss"], abs=1e-5)
    assert json.loads((killed / "config.json").read_text())["train"]["seed"] == 3


def test_a_resume_from_a_damaged_checkpoint_is_one_error_and_changes_nothing(toy, tmp_path):
    import shutil

    run = tmp_path / "damaged"
    shutil.copytree(toy["run"], run)
    weights = run / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    before = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    result = CliRunner().invoke(cli, [str(a) for a in (
        "train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
        "--tgt", "yy", "--out", run, "--resume", "--max-steps", "310", "--eval-every", "150", *SMALL)])
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "is not a readable safetensors file" in result.stderr
    assert {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # config.json too


@pytest.mark.parametrize("command", ["translate", "attention"])
def test_a_sentence_whose_bytes_are_not_utf8_is_one_error_line(toy, tmp_path, command):
    out = ["--out", tmp_path / "a.png"] if command == "attention" else []
    result = CliRunner().invoke(cli, [str(a) for a in (command, toy["run"], "ka \udcff", *out)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    name = "SENTENCE" if command == "attention" else "[SENTENCE]"  # (translate's is optional: --input instead)
    assert result.stderr.startswith(f"error: Invalid value for '{name}': the text is not UTF-8 (see ")


def test_tabs_and_extra_spaces_do_not_change_a_translation(toy, tmp_path):
    """A tab read as <unk> glued the words together, a trailing space made a piece of its own."""
    messy = tmp_path / "messy.xx"
    messy.write_text("ka\tlo\tmi\nka lo mi \n  ka  lo mi\n", encoding="utf-8")
    result = run_cli("translate", toy["run"], "--input", messy, "--beam", "1", "--no-progress")
    assert result.stdout == "red blue green\n" * 3


@pytest.mark.parametrize("beam", ["1", "4"])
def test_weights_holding_nan_are_one_error_line_not_a_translation(toy, tmp_path, beam):
    """Greedy decoding picked the padding id out of NaN scores and blamed the padding; beam search printed a word
    with exit status 0."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    run = tmp_path / "nan"
    shutil.copytree(toy["run"], run, ignore=shutil.ignore_patterns("checkpoint"))
    path = str(run / "model.safetensors")
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    # The shared embedding and output matrix: one tensor under three names in the model, one in the file (the
    # message named a name the file does not hold, and counted the others as "2 more").
    name = next(n for n in tensors if n.endswith("embed.tokens.weight"))
    tensors[name][1, 0] = float("nan")
    save_file(tensors, path, metadata=metadata)
    result = CliRunner().invoke(cli, ["translate", str(run), "ka lo mi", "--beam", beam])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"error: {path} holds NaN or infinite values in {name}: these weights are damaged\n"


def test_check_reads_a_translation_runs_contract(toy):
    result = run_cli("check", toy["run"], "--json", "--seeds", "1")
    report = json.loads(result.stdout)
    kwargs = json.loads((toy["run"] / "config.json").read_text())["model"]["kwargs"]
    assert report["contract"]["kind"] == "seq2seq"
    assert report["contract"]["vocab_size"] == min(kwargs["src_vocab_size"], kwargs["tgt_vocab_size"])
    assert {c["name"]: c["status"] for c in report["checks"]}["causal"] == "pass"


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_run_behind(tmp_path):
    rng = random.Random(1)
    write_corpus(tmp_path / "train", 200, rng)
    write_corpus(tmp_path / "valid", 20, rng)
    args = ["train", "translate", "--train", tmp_path / "train", "--valid", tmp_path / "valid", "--src", "xx", "--tgt",
            "yy", "--out", tmp_path / "run", "--max-steps", "20", "--eval-every", "10", *SMALL]
    failed = CliRunner().invoke(cli, [str(a) for a in (*args, "--lr", "1e30")])
    assert failed.exit_code == 2 and "loss became nan" in failed.stderr
    assert not (tmp_path / "run").exists()  # the fixed command may use the same --out


def test_checkpoint_every_saves_between_validations_and_a_resume_goes_on_from_there(toy, tmp_path, monkeypatch):
    from attnlab.training import engine

    saved_at = []
    save = engine.save_checkpoint
    monkeypatch.setattr(engine, "save_checkpoint", lambda out, model, opt, state, **kw: (
        saved_at.append(state["step"]), save(out, model, opt, state, **kw)))
    run = tmp_path / "often"
    args = ("train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
            "--tgt", "yy", "--out", run, "--eval-every", "1000", *SMALL)
    run_cli(*args, "--max-steps", "6", "--checkpoint-every", "4")
    assert saved_at == [4, 6]  # every 4 steps, and at the validation of the last step
    assert json.loads((run / "config.json").read_text())["train"]["checkpoint_every"] == 4
    longer = run_cli(*args, "--resume", "--max-steps", "9")  # the run's own interval goes on, said nothing of
    assert longer.stdout.strip().splitlines()[-1].startswith("9 steps in ") and "checkpoint_every" not in longer.stderr
    assert saved_at == [4, 6, 8, 9]


def test_a_run_finished_meanwhile_in_the_same_new_folder_is_not_replaced(toy, tmp_path, finished_meanwhile):
    """A run another process started into the same new folder, and finished between this one's first check and
    its lock, is refused again under the lock, not replaced."""
    import attnlab.tasks.translate
    finished_meanwhile(attnlab.tasks.translate, "config.json", '{"task": "translate", "theirs": true}')
    out = tmp_path / "race"
    args = ["train", "translate", "--train", toy["root"] / "train", "--valid", toy["root"] / "valid", "--src", "xx",
            "--tgt", "yy", "--out", out, "--max-steps", "2", *SMALL]
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 2 and "already holds a run" in result.stderr, result.output
    assert [p.name for p in out.iterdir()] == ["config.json"] and "theirs" in (out / "config.json").read_text()


def test_an_output_is_judged_where_it_is_written_a_device_in_place_a_link_at_its_target(toy, tmp_path, monkeypatch):
    """The early check of the output's folder refused /dev/null and /dev/stdout for anyone but root, and a link in
    a folder one cannot write that points into one that one can."""
    import os

    locked, free = tmp_path / "locked", tmp_path / "free"
    locked.mkdir()
    free.mkdir()
    (locked / "link.yy").symlink_to(free / "hyp.yy")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and real_access(path, mode, **kw))
    for output in (os.devnull, locked / "link.yy"):
        result = CliRunner().invoke(cli, [str(a) for a in ("translate", toy["run"], "ka", "--output", output,
                                                           "--beam", "1")])
        assert result.exit_code == 0, result.output
    assert (free / "hyp.yy").read_text(encoding="utf-8").strip()
    refused = CliRunner().invoke(cli, [str(a) for a in ("translate", toy["run"], "ka", "--output", locked / "new.yy")])
    assert refused.exit_code == 2 and f"{locked} is not a folder this command can write in" in refused.stderr
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for output, said in ((tmp_path / "dangling" / "h.yy", f"{tmp_path / 'dangling'} is a link to"),
                         (tmp_path / "loop1", "is a loop of links")):
        refused = CliRunner().invoke(cli, [str(a) for a in ("translate", toy["run"], "ka", "--output", output)])
        assert refused.exit_code == 2 and said in refused.stderr and refused.stderr.count("\n") == 1, refused.output
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not (str(path) == os.devnull and mode & os.W_OK)
                        and real_access(path, mode, **kw))  # (a write-only output: click no longer asks to read it)
    refused = CliRunner().invoke(cli, [str(a) for a in ("translate", toy["run"], "ka", "--output", os.devnull)])
    assert refused.exit_code == 2 and f"--output {os.devnull} cannot be written by this user" in refused.stderr
