"""Language modelling end to end: batches, a tiny training run, generation, and bad input at the command line.

Every text is written here; nothing is read from ../shared.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from attnlab.cli.main import cli
from attnlab.errors import AttnlabError
from attnlab.tasks.lm import LMTask, flops_per_token, load_lm_data
from attnlab.tasks.lm_train import LM_PRESETS, build_lm
from attnlab.training.checkpoint import write_run_config
from attnlab.training.distributed import Place

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 120  # 45 characters a line, 29 distinct
TINY = ["--layers", "1", "--width", "32", "--heads", "2", "--context", "24", "--batch-size", "16", "--steps", "80",
        "--lr", "1e-2", "--min-lr", "1e-3", "--warmup", "5", "--eval-every", "40", "--eval-iters", "4",
        "--final-eval-iters", "8", "--no-progress"]
# What follows is started by a shell with its standard output closed (``>&-``). (Closing it in a preexec_fn, in a
# forked copy of this process and its threads, can deadlock.)
STDOUT_CLOSED = ["sh", "-c", 'exec "$@" >&-', "sh"]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny trained run shared by the tests below (about two seconds of training)."""
    folder = tmp_path_factory.mktemp("lm")
    text = folder / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    result = invoke("train", "lm", "--text", text, "--out", folder / "run", *TINY[:-1])  # progress left on
    assert result.exit_code == 0, result.output
    return folder / "run", result


def test_tiny_training_learns_the_text_and_reports_on_its_last_line(run):
    folder, result = run
    last = result.stdout.strip().splitlines()[-1]
    assert "wall time" in last and "final val loss" in last
    assert "%|" not in result.stderr and "step/s" not in result.stderr  # no bar when stderr is not a terminal
    val = float(last.split("final val loss")[1].split()[0])
    report = json.loads((folder / "result.json").read_text())
    assert val == pytest.approx(report["val_loss"], abs=1e-4)
    assert val < 0.5 < math.log(27)  # a repeated sentence: far below the uniform guess of ln(27) = 3.3 nats
    assert report["steps"] == 80 and report["tokens"] == 80 * 16 * 24
    assert 0 < report["peak_fraction"] < 1
    # log_every 50 over 80 steps: windows at steps 50 and 80; the steady rate is the second alone
    assert "steady (the one logged window after the first)" in result.stdout
    for name in ("config.json", "tokenizer.json", "model.safetensors", "metrics.jsonl", "loss.png"):
        assert (folder / name).is_file(), name


def test_greedy_generation_continues_the_text(run):
    folder, _ = run
    result = invoke("generate", folder, "--prompt", "the quick brown ", "--max-new-tokens", 60, "--greedy")
    assert result.exit_code == 0, result.output
    # 60 characters is past the context of 24, so the window slid at least once on the way.
    assert result.stdout == "the quick brown " + (TEXT * 2)[16 : 16 + 60] + "\n"
    assert "60 tokens in" in result.stderr and "KV cache" in result.stderr
    assert "note:" not in result.stderr
    # Sampling settings given with --greedy are named, not silently dropped (Hugging Face's generate warns too);
    # the text stays the greedy one.
    said = invoke("generate", folder, "--prompt", "the quick brown ", "--max-new-tokens", 60, "--greedy",
                  "--temperature", "0.5", "--top-k", "3", "--seed", "1")
    assert said.exit_code == 0 and said.stdout == result.stdout, said.output
    assert said.stderr.startswith("note: --greedy takes the most likely token; --temperature, --top-k, --seed are "
                                  "not used\n")
    once = invoke("generate", folder, "--prompt", "the", "--max-new-tokens", 1, "--greedy", "--top-p", "0.9")
    assert once.stderr.startswith("note: --greedy takes the most likely token; --top-p is not used\n")


def test_generation_stops_at_the_first_stop_text_it_writes(run):
    folder, _ = run
    args = ("generate", folder, "--prompt", "the quick brown ", "--max-new-tokens", 60, "--greedy")
    result = invoke(*args, "--stop", "lazy", "--stop", "over")  # "over" comes first in the greedy text
    assert result.exit_code == 0, result.output
    assert result.stdout == "the quick brown fox jumps over\n"
    assert "14 tokens in" in result.stderr and "stopped at 'over'" in result.stderr
    # Only the generated text counts: a stop text already in the prompt does not end the sample at once.
    inside = invoke(*args, "--stop", "quick")
    assert inside.stdout == "the quick brown fox jumps over the lazy dog.\nthe quick\n"
    never = invoke(*args, "--stop", "zebra")
    assert never.stdout == invoke(*args).stdout and "stopped" not in never.stderr
    assert "note:" not in never.stderr  # every character of it is one the model writes
    unwritable = invoke(*args, "--stop", "Qx!")
    assert "note: --stop 'Qx!' holds '!', 'Q', which this model never writes: it cannot stop there" in unwritable.stderr
    empty = invoke(*args, "--stop", "")
    assert empty.exit_code == 2 and empty.stderr == "error: --stop is empty: give the text to stop at\n"


def test_several_samples_are_separated_and_sample_i_uses_seed_s_plus_i(run):
    folder, _ = run
    args = ("generate", folder, "--prompt", "the ", "--max-new-tokens", 30)
    three = invoke(*args, "--seed", 1, "--num-samples", 3)
    assert three.exit_code == 0, three.output
    samples = three.stdout.split("---------------\n")
    assert len(samples) == 3 and all(s.startswith("the ") for s in samples)
    assert samples[0] == invoke(*args, "--seed", 1).stdout and samples[2] == invoke(*args, "--seed", 3).stdout
    assert three.stderr.count("tokens/s") == 3


def test_sampled_generation_is_reproducible_with_a_seed(run):
    folder, _ = run
    args = ("generate", folder, "--prompt", "dog", "--max-new-tokens", 40, "--temperature", "3", "--top-k", 8)
    first, again = invoke(*args, "--seed", 1), invoke(*args, "--seed", 1)
    other = invoke(*args, "--seed", 2)
    assert first.exit_code == 0, first.output
    assert first.stdout == again.stdout != other.stdout


@pytest.mark.parametrize("args, message", [
    (["--prompt", "the", "--max-new-tokens", "0"], "'--max-new-tokens': 0 is not in the range x>=1"),
    (["--prompt", "", "--max-new-tokens", "5"], "--prompt is empty"),
    (["--prompt", "Zebra", "--max-new-tokens", "5"], "'Z' is not in this model's vocabulary"),
    (["--prompt", "the", "--temperature", "0"], "'--temperature': 0.0 is not in the range x>0"),
    (["--prompt", "the", "--top-p", "2"], "'--top-p': 2.0 is not in the range 0<x<=1"),
    (["--prompt", "the", "--top-k", "0"], "'--top-k': 0 is not in the range x>=1"),
])
def test_bad_generate_input_is_one_line_and_exit_2(run, args, message):
    folder, _ = run
    result = invoke("generate", folder, *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and message in result.stderr
    assert result.stdout == ""


def test_a_run_of_another_task_or_no_run_is_a_clear_error(tmp_path):
    other = tmp_path / "classifier"
    write_run_config(other, {"task": "classify", "model": {"class": "EncoderClassifier", "kwargs": {}}})
    result = invoke("generate", other, "--prompt", "hi")
    assert result.exit_code == 2 and result.stderr == f"error: {other} is a 'classify' run, not a 'lm' run\n"
    result = invoke("generate", tmp_path / "missing", "--prompt", "hi")
    assert result.exit_code == 2 and result.stderr == f"error: {tmp_path / 'missing'} does not exist: no run there\n"
    (tmp_path / "file").write_text("x")
    result = invoke("generate", tmp_path / "file", "--prompt", "hi")
    assert result.exit_code == 2 and result.stderr == f"error: {tmp_path / 'file'} is not a folder\n"


def test_a_prompt_or_stop_text_whose_bytes_are_not_utf8_is_one_error_line(run):
    """Python reads such bytes as surrogates: a BPE run raised a TypeError, a char run named a character '\\udcff'."""
    for option in ("--prompt", "--stop"):
        text = ["--prompt", "the \udcff"] if option == "--prompt" else ["--prompt", "the ", "--stop", "\udcff"]
        result = invoke("generate", run[0], *text, "--max-new-tokens", 3)
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith(f"error: Invalid value for '{option}': the text is not UTF-8 (see ")


def test_generated_text_is_written_in_utf8_under_the_c_locale(tmp_path):
    """Under LC_ALL=C Python's stdout is ASCII: a prompt holding 'é' ended in a UnicodeEncodeError traceback."""
    import os
    import subprocess
    import sys

    text = tmp_path / "fr.txt"
    text.write_text("un café noir. un café crème.\n" * 100, encoding="utf-8")
    assert invoke("train", "lm", "--text", text, "--out", tmp_path / "run", *TINY).exit_code == 0
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    generate = [sys.executable, "-m", "attnlab.cli.main", "generate", str(tmp_path / "run"), "--prompt", "un café",
                "--max-new-tokens", "3", "--greedy"]
    done = subprocess.run(generate, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode("utf-8").startswith("un café")
    # A path's bytes that the C locale cannot decode are written back as they were (the first version of this
    # wrote UTF-8 strictly, and the run's closing lines ended in a traceback)...
    folder = tmp_path / "dé"
    done = subprocess.run([sys.executable, "-m", "attnlab.cli.main", "train", "lm", "--text", str(text), "--out",
                           str(folder), *TINY], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert f"run folder: {folder} (".encode() in done.stdout
    # ... and an encoding asked for is kept (an error handler alone asks for none).
    done = subprocess.run(generate, env={**env, "PYTHONIOENCODING": "latin-1"}, capture_output=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("un café".encode("latin-1"))
    done = subprocess.run(generate, env={**env, "PYTHONIOENCODING": ":surrogateescape"}, capture_output=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.decode("utf-8").startswith("un café")
    # An encoding asked for that cannot write the text is one line that says how to go on, not a traceback.
    done = subprocess.run(generate, env={**env, "PYTHONIOENCODING": "ascii"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr == (
        "error: standard output's encoding, ascii (as PYTHONIOENCODING or the console sets it), cannot write 'é': "
        "set PYTHONIOENCODING=utf-8, or ascii:backslashreplace to have such characters written as escapes\n")


def test_one_final_evaluation_batch_is_said_in_the_singular(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    args = [a if a != "8" else "1" for a in TINY]  # --final-eval-iters 1
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "r", *args)
    assert result.exit_code == 0 and result.stdout.rstrip().endswith("nats/token (1 batch of 12x24)")  # (evaluation batches of 12)


def test_ctrl_c_before_the_config_is_written_leaves_the_folder_to_the_same_command(tmp_path, monkeypatch):
    """The tokenizer is written, then the config; interrupted between them, the run's own tokenizer.json made the
    same command refuse the folder, and --resume found no run there."""
    import attnlab.tasks.lm_train as lm_train

    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    real = lm_train.write_run_config

    def interrupted(out, config):
        raise KeyboardInterrupt

    monkeypatch.setattr(lm_train, "write_run_config", interrupted)
    first = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", *TINY)
    assert first.exit_code == 130 and not (tmp_path / "run" / "tokenizer.json").exists()
    monkeypatch.setattr(lm_train, "write_run_config", real)
    assert invoke("train", "lm", "--text", text, "--out", tmp_path / "run", *TINY).exit_code == 0


def test_an_out_whose_name_is_not_utf8_is_refused_before_training(tmp_path):
    """safetensors writes no weights under such a path: the run trained to its end, then failed (as did --resume)."""
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "nu\udcff"
    result = invoke("train", "lm", "--text", text, "--out", out, *TINY)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "is not a UTF-8 name, and safetensors reads and writes weights only under UTF-8 paths" in result.stderr
    assert not out.exists()


def test_a_new_run_refuses_another_tasks_run_and_a_checkpoint_left_without_its_config(run, tmp_path):
    """Into another task's run the advice was --resume, which that task then refused. A checkpoint whose
    config.json was deleted was trained over: a failure or Ctrl-C of the new run kept the old checkpoint as its
    own, and --resume went on from the old run's weights."""
    import shutil

    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    csv = tmp_path / "t.csv"
    csv.write_text("text,label\n" + "".join(f"ticket {i},L{i % 2}\n" for i in range(40)))
    other = invoke("train", "classify", "--train", csv, "--out", run[0], "--no-progress")
    assert other.exit_code == 2 and other.stderr == f"error: {run[0]} already holds a 'lm' run; choose another --out\n"
    orphan = tmp_path / "orphan"
    shutil.copytree(run[0], orphan)
    (orphan / "config.json").unlink()
    before = {p: p.read_bytes() for p in orphan.rglob("*") if p.is_file()}
    again = invoke("train", "lm", "--text", text, "--out", orphan, *TINY)
    assert again.exit_code == 2 and again.stderr == (
        f"error: {orphan} holds checkpoint, loss.png, metrics.jsonl, model.safetensors, result.json, tokenizer.json, "
        "by names a new run writes there (and no config.json to resume); choose another --out\n")
    assert {p: p.read_bytes() for p in orphan.rglob("*") if p.is_file()} == before
    # A user's own files by those names (a Hugging Face model's folder) were replaced, or deleted by a failed run.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "tokenizer.json").write_text('{"my": "tokenizer"}')
    (theirs / "notes.txt").write_text("mine")
    (theirs / "tokenizer_config.json").write_text("{}")  # Hugging Face's: no run writes it, it may stay
    failed = invoke("train", "lm", "--text", text, "--out", theirs, *TINY, "--lr", "1e30", "--grad-clip", "0")
    assert failed.exit_code == 2 and failed.stderr.startswith(f"error: {theirs} holds tokenizer.json, by names")
    assert (theirs / "tokenizer.json").read_text() == '{"my": "tokenizer"}'
    (theirs / "tokenizer.json").unlink()
    (theirs / "tokenizer.pt.BR.json").write_text("{}")  # a translation's, for --src pt.BR: refused as well
    dotted = invoke("train", "lm", "--text", text, "--out", theirs, *TINY)
    assert dotted.exit_code == 2 and dotted.stderr.startswith(f"error: {theirs} holds tokenizer.pt.BR.json, by names")
    (theirs / "tokenizer.pt.BR.json").unlink()  # a folder of other files takes a run beside them
    assert invoke("train", "lm", "--text", text, "--out", theirs, *TINY).exit_code == 0
    assert (theirs / "notes.txt").read_text() == "mine" and (theirs / "config.json").is_file()
    assert (theirs / "tokenizer_config.json").read_text() == "{}"


def test_train_lm_bad_input_is_a_clear_error(run, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for path, out, message in ((tmp_path / "nope.txt", tmp_path / "r", "no text file"),
                               (tmp_path, tmp_path / "r", "is a folder, not a text file"),
                               (empty, tmp_path / "r", "is empty"),
                               (empty, run[0], "already holds a run")):
        result = invoke("train", "lm", "--text", path, "--out", out, "--no-progress")
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr
    pipe = tmp_path / "pipe"  # a pipe or a device exists, but cannot be read twice (training, the fingerprint)
    os.mkfifo(pipe)
    for path, kind in ((pipe, "a pipe"), (Path("/dev/null"), "a device")):
        result = invoke("train", "lm", "--text", path, "--out", tmp_path / "r", "--no-progress")
        assert result.exit_code == 2 and result.stderr == (
            f"error: {path} is {kind}, not a text file: the text is read twice (to train, and to record its "
            "fingerprint in the run folder); save it to a file first\n")
    folder = tmp_path / "folder"  # the text in the run folder, under a name the run writes: it would be replaced
    (folder / "checkpoint").mkdir(parents=True)
    for inside in (folder / "metrics.jsonl", folder / "result.json", folder / "checkpoint" / "t.txt"):
        inside.write_text(TEXT, encoding="utf-8")
        result = invoke("train", "lm", "--text", inside, "--out", folder, *TINY)
        assert result.exit_code == 2 and result.stderr == (
            f"error: --text {inside} is a file the run writes in its folder {folder} ({inside.relative_to(folder)}): "
            "training would overwrite it; move it out of the folder or choose another --out\n")
        assert inside.read_text(encoding="utf-8") == TEXT
    # A setting the model refuses leaves no folder behind (the tokenizer used to be written first).
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", tmp_path / "w", *TINY, "--width", "31")
    assert result.exit_code == 2 and "--width 31 is not divisible by --heads 2" in result.stderr
    assert not (tmp_path / "w").exists() and "data:" not in result.stdout  # refused before the text is read
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", tmp_path / "w", *TINY, "--width", "12",
                    "--heads", "4", "--positions", "rotary")  # the options named, not the core's head_dim
    assert result.exit_code == 2 and result.stderr == (
        "error: --positions rotary needs an even head width, and --width 12 / --heads 4 gives 3: rotary turns the "
        "head's dimensions in pairs\n")
    assert not (tmp_path / "w").exists()
    # Settings the run's saved ones overrule are named (the run ends as it was planned).
    import shutil

    # (killed after its last checkpoint, before its report: a resume has the final evaluation left to do)
    shutil.copytree(run[0], tmp_path / "copy", ignore=shutil.ignore_patterns("result.json"))
    shorter = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", tmp_path / "copy", "--resume",
                     "--steps", "40", "--no-progress")  # a length the checkpoint is already past
    assert shorter.stderr == f"error: {tmp_path / 'copy'} has reached step 80, past the 40 steps it is given; to go on, resume with --steps more than 80\n"
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", tmp_path / "copy", "--resume",
                    "--lr", "0.5", "--threads", "1", "--no-progress")
    assert result.exit_code == 0 and "ignored: lr=0.5 (the run has 0.01)" in result.stderr
    assert "threads" not in result.stderr.split("ignored:")[1].splitlines()[0]  # a resume may set the thread count
    # Resuming on another text is named as such, not as an unreadable checkpoint.
    other = tmp_path / "other.txt"
    other.write_text(TEXT.upper(), encoding="utf-8")
    result = invoke("train", "lm", "--text", other, "--out", run[0], "--resume", "--no-progress")
    assert result.exit_code == 2 and "not the text this run started with" in result.stderr


def test_ctrl_c_says_which_checkpoint_is_kept_and_how_to_continue(tmp_path, monkeypatch):
    from attnlab.training.engine import Trainer

    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    step = Trainer._step
    for stop_after, said in ((50, "the checkpoint of step 40 is kept in {out}/checkpoint; continue with the same "
                                  "command and --resume\n\ninterrupted\n"),
                             (10, "no checkpoint yet: the same command with --resume starts {out} again from step 0 "
                                  "(--checkpoint-every N saves one every N steps)\n"
                                  "\ninterrupted\n")):  # (the blank line is Click's, after Ctrl-C's ^C)
        calls = []

        def interrupted(self, micro, stop_after=stop_after, calls=calls):
            calls.append(1)
            if len(calls) > stop_after:
                raise KeyboardInterrupt
            return step(self, micro)

        monkeypatch.setattr(Trainer, "_step", interrupted)
        out = tmp_path / f"stopped{stop_after}"
        result = invoke("train", "lm", "--text", text, "--out", out, *TINY)
        assert result.exit_code == 130 and result.stderr.endswith(said.format(out=out)), result.stderr


def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(run, tmp_path):
    import shutil

    killed = tmp_path / "killed"
    shutil.copytree(run[0], killed, ignore=shutil.ignore_patterns("checkpoint", "model.safetensors", "result.json"))
    again = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", killed, "--no-progress")
    assert again.exit_code == 2 and "already holds a run" in again.stderr  # a new run still refuses the folder
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", killed, "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "has no checkpoint yet: starting the run again from step 0" in result.stderr
    report = json.loads((killed / "result.json").read_text())
    assert report["steps"] == 80 and report["val_loss"] == pytest.approx(json.loads(
        (run[0] / "result.json").read_text())["val_loss"], abs=1e-5)  # the same run as the uninterrupted one


def test_a_resume_without_the_runs_tokenizer_is_refused_unless_the_run_starts_again(run, tmp_path):
    import shutil

    text = run[0].parent / "fox.txt"
    lost = tmp_path / "lost"
    shutil.copytree(run[0], lost, ignore=shutil.ignore_patterns("tokenizer.json", "result.json"))
    result = invoke("train", "lm", "--text", text, "--out", lost, "--resume", "--no-progress")
    assert result.exit_code == 2 and result.stderr == (f"error: {lost / 'tokenizer.json'} is missing: the run cannot "
                                                        "go on without the tokenizer it was trained with\n")
    # Killed before its first checkpoint (and its tokenizer gone, or written by an attnlab that saved no selection
    # windows): it starts again from step 0 with a new tokenizer, choosing on windows of their own.
    fresh = tmp_path / "fresh"
    shutil.copytree(run[0], fresh, ignore=shutil.ignore_patterns("tokenizer.json", "checkpoint", "model.safetensors",
                                                                 "result.json"))
    config = json.loads((fresh / "config.json").read_text())
    del config["selection_windows"]
    (fresh / "config.json").write_text(json.dumps(config))
    result = invoke("train", "lm", "--text", text, "--out", fresh, "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    assert (fresh / "tokenizer.json").read_bytes() == (run[0] / "tokenizer.json").read_bytes()
    assert json.loads((fresh / "config.json").read_text())["selection_windows"] == "select"


def test_a_run_too_short_for_a_steady_window_reports_its_overall_rate_not_nan(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    # A time budget spent within the first step: the run stops before it logs a window.
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "one", *TINY, "--max-seconds", "0.0001")
    assert result.exit_code == 0, result.output
    def refuse(constant):
        raise ValueError(f"{constant} in result.json")
    report = json.loads((tmp_path / "one" / "result.json").read_text(), parse_constant=refuse)  # strict JSON
    assert report["steps"] == 1 and report["steady_tokens_per_second"] == report["tokens_per_second"] > 0
    assert "steady (no window logged: the overall rate)" in result.stdout
    assert "nan " not in result.stdout and "nan%" not in result.stdout and "(1 of 80 steps, stopped by --max-seconds 0.0001)" in result.stdout.strip().splitlines()[-1]


def test_a_warmup_as_long_as_the_run_is_allowed_with_a_note(tmp_path, run):
    assert "note: --warmup" not in run[1].stderr  # 5 warmup steps of 80
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    short = [*TINY[: TINY.index("--steps")], *TINY[TINY.index("--steps") + 2 :], "--steps", "3"]
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "short", *short)
    assert result.exit_code == 0, result.output
    assert "note: --warmup 5 is not shorter than --steps 3: the learning rate never reaches its peak 0.01" in result.stderr


def test_bpe_tokenizer_trains_generates_and_refuses_a_vocabulary_smaller_than_the_alphabet(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    small = invoke("train", "lm", "--text", text, "--out", tmp_path / "small", *TINY, "--tokenizer", "bpe",
                   "--bpe-vocab-size", "20")
    assert small.exit_code == 2 and small.stderr.count("\n") == 1 and "ask for at least" in small.stderr
    assert not (tmp_path / "small").exists()
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "bpe", *TINY, "--tokenizer", "bpe",
                    "--bpe-vocab-size", "60")
    assert result.exit_code == 0, result.output
    assert "bpe vocabulary of 60 ids" in result.stdout
    report = json.loads((tmp_path / "bpe" / "result.json").read_text())
    assert report["val_loss"] < 1.0  # subwords of one repeated sentence: far below ln(60) = 4.1 nats
    greedy = invoke("generate", tmp_path / "bpe", "--prompt", "the quick", "--max-new-tokens", 12, "--greedy")
    assert greedy.exit_code == 0, greedy.output
    assert greedy.stdout.startswith("the quick brown fox jumps")  # subwords decode back to the text's spacing
    assert "note:" not in greedy.stderr
    odd = invoke("generate", tmp_path / "bpe", "--prompt", "the Ü quick", "--max-new-tokens", 3, "--greedy")
    assert odd.exit_code == 0 and "note: 1 piece of the prompt is not in the vocabulary; the model reads <unk>" in odd.stderr


def test_a_byte_order_mark_is_no_character_of_the_text(tmp_path):
    import codecs

    from attnlab.tasks.lm import read_text

    path = tmp_path / "bom.txt"
    path.write_bytes(codecs.BOM_UTF8 + TEXT.encode("utf-8"))
    assert read_text(path) == TEXT  # (it became a character of the vocabulary, which generate printed)
    assert read_text(path, keep_bom=True) == "\ufeff" + TEXT  # for the resumes of runs made before
    result = invoke("train", "lm", "--text", path, "--out", tmp_path / "run", *TINY, "--steps", "4", "--warmup", "0",
                    "--eval-every", "2")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["bom_dropped"] is True and "vocabulary of 30 ids" in result.stdout  # 29 + padding
    resumed = invoke("train", "lm", "--text", path, "--out", tmp_path / "run", "--resume", "--steps", "6")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["bom_dropped"] is True
    # A run made before the mark was dropped: its config does not say, and its vocabulary holds the mark.
    from attnlab.tasks.lm import load_lm_data
    from attnlab.tasks.lm_train import train_language_model

    settings = LM_PRESETS["nanogpt-cpu"].with_overrides(layers=1, width=32, heads=2, context=24, batch_size=16,
                                                         steps=4, warmup=0, eval_every=2, eval_iters=4,
                                                         final_eval_iters=8)
    kept = load_lm_data(path, keep_bom=True)
    train_language_model(path, tmp_path / "old", settings, progress=False, data=kept, measure_peak=False)
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["data"]["bom_dropped"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    old = invoke("train", "lm", "--text", path, "--out", tmp_path / "old", "--resume", "--steps", "6")
    assert old.exit_code == 0, old.output  # (it was refused: the mark was no character of its vocabulary any more)
    assert f"{len(kept.train):,} training and {len(kept.val):,} validation tokens" in old.stdout
    assert json.loads((tmp_path / "old" / "config.json").read_text())["data"]["bom_dropped"] is False


def test_sampling_never_writes_a_special_token(tmp_path, monkeypatch):
    """<unk>, <bos> and <eos> are no training target of a BPE model: sampled hot, they came out (<unk> literally)."""
    import attnlab.cli.generate as generate_cli
    from attnlab.data.tokenizers import SPECIALS, BPETokenizer, CharTokenizer

    assert BPETokenizer.special_ids == tuple(range(len(SPECIALS))) and CharTokenizer.special_ids == (0,)
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert invoke("train", "lm", "--text", text, "--out", tmp_path / "bpe", *TINY, "--tokenizer", "bpe",
                  "--bpe-vocab-size", "60").exit_code == 0
    drawn = []
    sample = generate_cli.generate
    monkeypatch.setattr(generate_cli, "generate", lambda *a, **k: (drawn.append(t) or t for t in sample(*a, **k)))
    hot = invoke("generate", tmp_path / "bpe", "--prompt", "the", "--max-new-tokens", 600, "--temperature", 100,
                 "--seed", 0)
    assert hot.exit_code == 0 and len(drawn) == 600  # near uniform: each special id would come about 10 times
    assert not set(drawn) & set(BPETokenizer.special_ids) and "<unk>" not in hot.stdout


def test_a_resumed_bpe_run_encodes_with_its_saved_tokenizer_and_keeps_the_file(tmp_path, monkeypatch):
    """Trained again on resume, a tokenizer made by another version of the code could give the same pieces other
    ids (or another vocabulary size), and its file would be overwritten under the finished model."""
    from attnlab.data.tokenizers import BPETokenizer

    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "bpe"
    args = ["train", "lm", "--text", text, "--out", out, *TINY, "--tokenizer", "bpe", "--bpe-vocab-size", "60",
            "--steps", "40", "--checkpoint-every", "20"]
    assert invoke(*args).exit_code == 0
    saved = (out / "tokenizer.json").read_bytes()

    def no_training(*args, **kwargs):
        raise AssertionError("a resumed run trained its tokenizer again")

    monkeypatch.setattr(BPETokenizer, "train", no_training)
    (out / "result.json").unlink()  # (killed after its last checkpoint: the final evaluation is left to do)
    resumed = invoke(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert (out / "tokenizer.json").read_bytes() == saved


def test_bpe_learns_the_words_that_encoding_the_whole_text_meets(tmp_path):
    """The text is encoded whole, where a word after a line break carries no word-start mark; trained on lines,
    its merges (learned with the mark) never applied there and every such word fell into pieces."""
    verse = "unto thee I speak\nunto thee I sing\n"
    path = tmp_path / "verse.txt"
    path.write_text(verse * 200, encoding="utf-8")
    data = load_lm_data(path, tokenizer="bpe", bpe_vocab_size=80, val_fraction=0.1)
    train_text = (verse * 200)[: int(len(verse) * 200 * 0.9)]
    pieces = [data.tokenizer.hf.id_to_token(i) for i in data.train.tolist()]
    # A line is three whole words: "▁thee", "▁I" and "▁speak\nunto" (its line break and the next line's first
    # word); trained on lines it took five pieces, "unto" broken into "unt" and "o" after every line break.
    assert "▁speak\nunto" in pieces and len(pieces) <= 3 * train_text.count("\n") + 3
    assert data.tokenizer.decode(data.train.tolist()) == train_text


def test_the_bpe_training_pieces_cut_before_spaces_and_at_a_length_where_there_are_none():
    from attnlab.tasks.lm import _space_cut_chunks

    spaced = "unto thee I speak " * 50
    pieces = list(_space_cut_chunks(spaced, size=40))
    assert "".join(pieces) == spaced and all(p.startswith(" ") for p in pieces[1:])  # words whole, marks alike
    unspaced = "天地玄黄宇宙洪荒" * 40  # one giant word: the trainer's time grows faster than its length
    pieces = list(_space_cut_chunks(unspaced, size=40))
    assert "".join(pieces) == unspaced and max(map(len, pieces)) == 40


def test_batches_are_seeded_by_epoch_and_shard_across_processes(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    data = load_lm_data(path, val_fraction=0.1)
    assert len(data.val) == len(TEXT) - int(len(TEXT) * 0.9)  # the last tenth, as nanoGPT splits
    task = LMTask(data.train, data.val, context=8, batch_size=6, batches_per_epoch=3, seed=5)
    whole = list(task.batches(0, Place()))
    assert len(whole) == 3 and whole[0].data[0].shape == (6, 8) and whole[0].count == 48
    x, y = whole[1].data
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert all(torch.equal(a.data[0], b.data[0]) for a, b in zip(whole, task.batches(0, Place())))
    assert not torch.equal(whole[0].data[0], next(iter(task.batches(1, Place()))).data[0])
    halves = [list(task.batches(0, Place(rank, 2))) for rank in (0, 1)]
    for i, batch in enumerate(whole):
        x0, x1 = halves[0][i].data[0], halves[1][i].data[0]
        assert torch.equal(torch.cat((x0, x1)).sort(0).values, batch.data[0].sort(0).values)
    with pytest.raises(AttnlabError, match="fewer than the context"):
        LMTask(data.train[:5], data.val, context=8, batch_size=2)


def test_the_reported_loss_is_scored_on_other_windows_than_the_kept_weights_were_chosen_on(tmp_path, monkeypatch):
    """Best-weight selection and the run's final figure draw their validation windows from two streams: were they
    the same, the final loss would partly score the windows that chose the weights, and flatter them."""
    import attnlab.tasks.lm as lm

    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    data = load_lm_data(path, val_fraction=0.3)
    drawn, real = [], lm.random_windows

    def spy(*args):
        windows = real(*args)
        drawn.append(windows[0])
        return windows

    monkeypatch.setattr(lm, "random_windows", spy)
    model = build_lm(LM_PRESETS["nanogpt-cpu"], vocab_size=data.tokenizer.vocab_size)
    task = LMTask(data.train, data.val, context=8, batch_size=4, eval_iters=2, eval_batch_size=3, seed=5)
    task.evaluate(model)
    task.evaluate(model)
    lm.evaluate_loss(model, data.val, context=8, batch_size=3, iters=2, seed=5)  # what lm_train reports
    selection, again, final = drawn
    assert torch.equal(selection, again)  # every evaluation during training compares the same windows
    assert not torch.equal(selection, final)


def test_nanogpt_preset_builds_nanogpts_model_and_counts_its_flops():
    model = build_lm(LM_PRESETS["nanogpt-cpu"], vocab_size=65)
    # nanoGPT's model without biases (its default): tied tokens 65 x 128, positions 64 x 128, per layer two
    # norm scales, W_qkv, W_o and the 4x MLP, and the final norm's scale.
    per_layer = 2 * 128 + 128 * 3 * 128 + 128 * 128 + 2 * 128 * 512
    assert model.num_parameters() == 65 * 128 + 64 * 128 + 4 * per_layer + 128 == 804_096
    assert not [name for name, _ in model.named_parameters() if name.endswith("bias")]
    # nanoGPT reports 0.80M parameters (the position table left out); attention adds 12 * 4 layers * 128 * 64
    # FLOPs per token.
    n = model.num_parameters() - 64 * 128
    assert flops_per_token(model, 64) == 6 * n + 12 * 4 * 128 * 64
    with_bias = build_lm(LM_PRESETS["nanogpt-cpu"].with_overrides(bias=True), vocab_size=65)
    assert with_bias.num_parameters() - model.num_parameters() == 4 * (2 * 128 + 3 * 128 + 128 + 512 + 128) + 128
    # `attnlab summary --preset gpt-char`, which its description calls nanoGPT's model, is the same model.
    shown = json.loads(invoke("summary", "--preset", "gpt-char", "--json").stdout)
    assert shown["total"] == 804_096 and "nanoGPT" in shown["source"]


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "none"])
def test_flops_count_every_parameter_when_positions_have_none(positions):
    model = build_lm(LM_PRESETS["nanogpt-cpu"].with_overrides(positions=positions), vocab_size=65)
    assert flops_per_token(model, 64) == 6 * model.num_parameters() + 12 * 4 * 128 * 64


def test_a_run_saved_before_the_bias_setting_resumes_with_its_biases(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    tiny = [*TINY[:TINY.index("--steps")], "--steps", "20", *TINY[TINY.index("--steps") + 2:]]
    killed_at = ["--max-seconds", "1e-9"]  # stops after its first step, with a checkpoint
    assert invoke("train", "lm", "--text", text, "--out", tmp_path / "run", "--bias", *tiny, *killed_at).exit_code == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["lm"].pop("bias") is True  # what a run of an older attnlab holds: no "bias" key, and biases
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", "--resume", "--max-seconds", "0",
                    "--no-progress")
    assert result.exit_code == 0, result.output


def test_a_run_saved_before_selection_had_its_own_windows_keeps_choosing_on_its_old_ones(tmp_path, monkeypatch):
    """Its saved best was scored on the final figure's windows: a resume choosing on others would compare unlike."""
    import attnlab.tasks.lm as lm

    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    tiny = [*TINY[:TINY.index("--steps")], "--steps", "20", *TINY[TINY.index("--steps") + 2:], "--eval-every", "5"]
    args = ["train", "lm", "--text", text, "--out", tmp_path / "run", *tiny]
    assert invoke(*args, "--max-seconds", "1e-9").exit_code == 0  # stops after its first step, with a checkpoint
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config.pop("selection_windows") == "select"  # a new run's; an older attnlab wrote no such key
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    streams, real = [], lm.seeded_generator
    monkeypatch.setattr(lm, "seeded_generator", lambda *parts: streams.append(parts[0]) or real(*parts))
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", "--resume", "--max-seconds", "0",
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert "select" not in streams and streams.count("eval") >= 2  # the evaluations and the final figure
    assert json.loads((tmp_path / "run" / "config.json").read_text())["selection_windows"] == "eval"


def test_a_validation_split_too_short_is_refused_before_training(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", *TINY, "--val-fraction", "0.001")
    assert result.exit_code == 2 and "the validation split holds 6 tokens" in result.stderr
    assert not (tmp_path / "run").exists()  # said before anything was trained or written


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_run_behind(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    diverging = [*TINY, "--lr", "1e30", "--min-lr", "0", "--warmup", "0"]  # the loss is NaN by step 2
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "new", *diverging)
    assert result.exit_code == 2 and "loss became nan" in result.stderr
    assert not (tmp_path / "new").exists()  # a new run with other settings may use the name
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert invoke("train", "lm", "--text", text, "--out", kept, *diverging).exit_code == 2
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # the run's files go, the folder and others stay
    assert invoke("train", "lm", "--text", text, "--out", kept, *TINY).exit_code == 0
    inf = invoke("train", "lm", "--text", text, "--out", tmp_path / "inf", *TINY, "--lr", "inf")
    assert inf.exit_code == 2 and "finite" in inf.stderr and not (tmp_path / "inf").exists()


def test_a_finished_run_can_be_lengthened_on_resume_and_says_its_schedule_changed(tmp_path, run, monkeypatch):
    import shutil

    from attnlab.training.engine import Trainer

    longer = tmp_path / "longer"
    shutil.copytree(run[0], longer)
    args = ("train", "lm", "--text", run[0].parent / "fox.txt", "--out", longer, "--resume", "--no-progress")
    step = Trainer._step

    def interrupted(self, micro):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_step", interrupted)  # Ctrl-C at once: the new length is already the run's
    first = invoke(*args, "--steps", "100")
    assert first.exit_code == 130 and "ignored" not in first.stderr
    # cosine from 1e-2 to 1e-3 over 80 steps is at its end at step 80; over 100 steps it is not yet
    assert ("resume: the run now ends at step 100 instead of 80; its learning-rate schedule is re-planned over 100 "
            "steps (at step 80: 0.001 -> 0.00186)") in first.stderr
    monkeypatch.setattr(Trainer, "_step", step)
    assert json.loads((longer / "config.json").read_text())["lm"]["steps"] == 100
    result = invoke(*args)  # a plain --resume goes on to it
    assert result.exit_code == 0, result.output
    assert json.loads((longer / "result.json").read_text())["steps"] == 100
    assert json.loads((longer / "config.json").read_text())["lm"]["steps"] == 100
    steps = [json.loads(line)["step"] for line in (longer / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 100 and steps == sorted(steps)
    again = invoke(*args)
    assert again.exit_code == 2 and "has finished its 100 steps" in again.stderr


def test_a_time_budget_can_be_raised_on_resume_and_an_ended_run_says_why_it_cannot_resume(tmp_path, run):
    import shutil

    finished = tmp_path / "finished"
    shutil.copytree(run[0], finished)
    before = (finished / "result.json").read_bytes()
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", finished, "--resume", "--no-progress")
    assert result.exit_code == 2 and "has finished its 80 steps" in result.stderr
    assert (finished / "result.json").read_bytes() == before  # its report is not redone
    shutil.rmtree(finished / "checkpoint")  # deleted to save room: a resume must not train it again over its weights
    weights = (finished / "model.safetensors").read_bytes()
    lost = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", finished, "--resume", "--no-progress")
    assert lost.exit_code == 2 and "holds the report of a run that ran (result.json) but no checkpoint/" in lost.stderr
    assert (finished / "model.safetensors").read_bytes() == weights and (finished / "result.json").read_bytes() == before
    # A checkpoint folder without its trainer.json is damaged (it is written whole): named so, with what it holds,
    # not as a missing folder, and not trained over from step 0 when no report is there either.
    (finished / "result.json").unlink()
    (finished / "checkpoint").mkdir()
    (finished / "checkpoint" / "model.safetensors").write_bytes(weights)
    damaged = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", finished, "--resume", "--no-progress")
    assert damaged.exit_code == 2 and damaged.stderr == (
        f"error: checkpoint in {finished / 'checkpoint'} is damaged: trainer.json is missing (the folder holds "
        "model.safetensors); train into another --out, or remove the run's files to start it again\n")
    assert (finished / "checkpoint" / "model.safetensors").read_bytes() == weights
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    timed = tmp_path / "timed"
    first = invoke("train", "lm", "--text", text, "--out", timed, *TINY, "--max-seconds", "0.0001")
    assert first.exit_code == 0 and "stopped by --max-seconds" in first.stdout
    again = invoke("train", "lm", "--text", text, "--out", timed, "--resume", "--no-progress")
    assert again.exit_code == 2 and "all of its time budget (--max-seconds 0.0001), after 1 of 80 steps" in again.stderr
    smaller = invoke("train", "lm", "--text", text, "--out", timed, "--resume", "--max-seconds", "0.00005")
    assert "all of its time budget (--max-seconds 5e-05)" in smaller.stderr  # the budget this resume gives
    spent = json.loads((timed / "checkpoint" / "trainer.json").read_text())["trainer"]["elapsed"]
    enough = (math.floor(spent * 10) + 1) / 10
    assert f"has used {spent:.1f} s of training" in smaller.stderr and f"--max-seconds {enough:.1f} or more" in smaller.stderr
    longer = invoke("train", "lm", "--text", text, "--out", timed, "--resume", "--max-seconds", "0", "--no-progress")
    assert longer.exit_code == 0, longer.output
    assert "ignored" not in longer.stderr and "the run's saved settings" in longer.stdout
    last = longer.stdout.strip().splitlines()[-1]
    assert "of this resume (80 steps)" in last
    # The budget stopped the first start before it logged; the resume's windows are at 50 (its first) and 80.
    assert "steady (the one logged window after the first)" in longer.stdout
    assert json.loads((timed / "config.json").read_text())["lm"]["max_seconds"] == 0
    # The same 80 steps as the uninterrupted run: the budget decided where it stopped, not what it computed.
    assert json.loads((timed / "result.json").read_text())["val_loss"] == pytest.approx(
        json.loads((run[0] / "result.json").read_text())["val_loss"], abs=1e-5)
    # Finished now, under a budget it has spent: it is refused as finished, not as stopped by the budget (whose
    # advice, a larger --max-seconds, would only lead to this refusal)
    budget = invoke("train", "lm", "--text", text, "--out", timed, "--resume", "--max-seconds", "0.0001", "--no-progress")
    assert budget.exit_code == 2 and "has finished its 80 steps" in budget.stderr


def test_a_resume_at_a_checkpoint_where_the_run_now_ends_evaluates_it_and_reports(tmp_path, monkeypatch):
    from attnlab.training.engine import Trainer

    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    tiny = [*TINY[:TINY.index("--eval-every")], "--eval-every", "0", *TINY[TINY.index("--eval-every") + 2:]]
    step, taken = Trainer._step, []

    def interrupted_after_40(self, micro):
        if len(taken) == 40:
            raise KeyboardInterrupt
        taken.append(1)
        return step(self, micro)

    monkeypatch.setattr(Trainer, "_step", interrupted_after_40)  # Ctrl-C after the checkpoint of step 40
    first = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", *tiny, "--checkpoint-every", "20")
    assert first.exit_code == 130 and not (tmp_path / "run" / "model.safetensors").exists()  # never evaluated
    early = invoke("generate", tmp_path / "run", "--prompt", "the", "--max-new-tokens", 3)
    assert early.exit_code == 2 and "the run has not evaluated yet" in early.stderr  # it has a checkpoint
    monkeypatch.setattr(Trainer, "_step", step)
    ended = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", "--resume", "--steps", "40",
                   "--no-progress")  # "end it where it is": no step left, the last step's evaluation still made
    assert ended.exit_code == 0, ended.output
    assert json.loads((tmp_path / "run" / "result.json").read_text())["steps"] == 40
    evals = [r["step"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
             if "eval" in r]
    assert evals == [40] and (tmp_path / "run" / "model.safetensors").is_file()


def test_a_report_of_an_earlier_stop_does_not_end_the_run_and_preset_on_resume_is_named(tmp_path, run):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(run[0], folder)
    report = json.loads((folder / "result.json").read_text())
    (folder / "result.json").write_text(json.dumps({**report, "steps": 30}))  # killed in the last evaluation
    resumed = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", folder, "--resume", "--no-progress",
                     "--preset", "shakespeare-fast")
    assert resumed.exit_code == 0, resumed.output  # let through to write the report of the step it reached
    assert json.loads((folder / "result.json").read_text())["steps"] == 80
    ignored = [line for line in resumed.stderr.splitlines() if "ignored:" in line]
    assert len(ignored) == 1 and "lr=0.02 (the run has 0.01)" in ignored[0]  # the preset's settings, named
    assert "optimizer='muon' (the run has 'adamw')" in ignored[0]
    assert " steps=" not in ignored[0]  # (where the run stops is not a preset's to change)
    own = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", folder, "--resume", "--preset",
                 "nanogpt-cpu", *TINY, "--lr", "0.5")  # the run's own preset and settings, but for --lr
    ignored = [line for line in own.stderr.splitlines() if "ignored:" in line]
    assert len(ignored) == 1 and ignored[0].endswith("ignored: lr=0.5 (the run has 0.01)"), own.stderr
    assert "--bpe-vocab-size" not in own.stderr + resumed.stderr  # (the preset's settings were not typed)
    assert "has finished its 80 steps" in invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", folder,
                                                 "--resume", "--no-progress").stderr


def test_the_steady_rate_leaves_out_the_first_window_of_every_start(tmp_path):
    from attnlab.tasks.lm_train import steady_rate

    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": 10, "tokens_per_second": 50.0, "first_window": True}, {"step": 20, "tokens_per_second": 200.0},
               {"step": 20, "eval": {"loss": 1.0}}, {"step": 30, "tokens_per_second": 300.0},
               {"step": 40, "tokens_per_second": 60.0, "first_window": True},  # a resume's start-up
               {"step": 50, "tokens_per_second": 400.0}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert steady_rate(metrics, 1.0) == (300.0, "median of the 3 logged windows after the first of each of the "
                                                "run's 2 starts")
    metrics.write_text(json.dumps(records[0]) + "\n")
    assert steady_rate(metrics, 1.0) == (50.0, "the only logged window, start-up and compilation included")
    # Three starts (two resumes) that each logged only their first window: all three count, not the first start's.
    firsts = [{"step": 10 * i, "tokens_per_second": rate, "first_window": True} for i, rate in enumerate((50, 80, 90))]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in firsts))
    assert steady_rate(metrics, 1.0) == (80.0, "median of the 3 logged windows, each the first of a start (start-up "
                                               "and compilation included)")
    assert steady_rate(tmp_path / "none.jsonl", 7.0) == (7.0, "no window logged: the overall rate")


def test_generate_into_a_closed_pipe_stops_quietly(run):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "generate", str(run[0]), "--prompt", "the",
                             "--max-new-tokens", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The prompt comes first; then the reader leaves, as `| head -c 3` does, long before a million tokens (far
    # more than a pipe buffers) are written.
    assert proc.stdout.read(3) == b"the"
    proc.stdout.close()
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 128 + signal.SIGPIPE
    assert "error" not in err and "Traceback" not in err, err


def test_notes_name_settings_that_do_not_do_what_they_say_and_follow_the_texts_checks(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    short = [*TINY[: TINY.index("--steps")], *TINY[TINY.index("--steps") + 2 :], "--steps", "3"]
    missing = invoke("train", "lm", "--text", tmp_path / "nope.txt", "--out", tmp_path / "a", *short)
    assert missing.exit_code == 2 and missing.stderr == f"error: no text file {tmp_path / 'nope.txt'}\n"  # no note first
    char = invoke("train", "lm", "--text", text, "--out", tmp_path / "char", *TINY, "--bpe-vocab-size", "500")
    assert char.exit_code == 0 and "note: --bpe-vocab-size is for --tokenizer bpe" in char.stderr
    bpe = invoke("train", "lm", "--text", text, "--out", tmp_path / "bpe", *TINY, "--tokenizer", "bpe",
                 "--bpe-vocab-size", "100000")
    assert bpe.exit_code == 0, bpe.output
    assert re.search(r"note: the text gives a BPE vocabulary of \d+ ids, fewer than the 100000 asked for", bpe.stderr)


def test_checkpoint_every_writes_checkpoints_between_evaluations(tmp_path, monkeypatch):
    from attnlab.training import engine

    saved_at = []
    real = engine.save_checkpoint

    def spy(run_dir, model, optimizer, trainer_state, **kwargs):
        saved_at.append(trainer_state["step"])
        return real(run_dir, model, optimizer, trainer_state, **kwargs)

    monkeypatch.setattr(engine, "save_checkpoint", spy)
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    tiny = [*TINY, "--eval-every", "0", "--checkpoint-every", "30"]  # evaluated only at the end, step 80
    assert invoke("train", "lm", "--text", text, "--out", tmp_path / "run", *tiny).exit_code == 0
    assert saved_at == [30, 60, 80]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["lm"]["checkpoint_every"] == 30 and config["train"]["checkpoint_every"] == 30


def test_check_takes_a_run_folder_and_reads_its_contract_from_it(run, tmp_path):
    result = invoke("check", run[0], "--json", "--seeds", "2")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # An lm run: a decoder without padding, its character vocabulary and its context of 24.
    vocab = json.loads((run[0] / "config.json").read_text())["model"]["kwargs"]["vocab_size"]
    assert report["contract"] == {"kind": "decoder", "pad_id": None, "vocab_size": vocab, "max_length": 24,
                                  "empty_rows": True}
    assert {c["name"]: c["status"] for c in report["checks"]}["causal"] == "pass"
    given = json.loads(invoke("check", run[0], "--json", "--seeds", "1", "--max-length", "8").stdout)
    assert given["contract"]["max_length"] == 8  # an option still overrides the run's own figure
    for option, value in (("--vocab-size", 99999), ("--max-length", 25)):  # but not past what the run can take
        too_big = invoke("check", run[0], option, value)
        assert too_big.exit_code == 2 and f"{value} is more than the run's own" in too_big.stderr
    import shutil

    for key, value, said in (("max_positions", 1, "a context of 1, and the checks need at least 3 (--max-length"),
                             ("vocab_size", 3, "a vocabulary of 3 ids, and the checks need at least 4 (--vocab-size")):
        small = tmp_path / f"small_{key}"  # (a run of context 1 trains; the checks need 3 positions, 4 ids)
        shutil.copytree(run[0], small)
        config = json.loads((small / "config.json").read_text())
        config["model"]["kwargs"][key] = value
        (small / "config.json").write_text(json.dumps(config))
        result = invoke("check", small)  # no option was given: the message says the figure is the run's
        assert result.exit_code == 2 and result.stderr == (
            f"error: {small} has {said} cannot go past the run's own): this run cannot be checked\n")
    (tmp_path / "model.py").write_text("def f():\n    return None\n")
    for spec, message in ((tmp_path / "nope", "is neither a run folder nor path/to/file.py:factory"),
                          (tmp_path / "model.py", "names a file but no factory"),
                          (run[0].parent / "fox.txt", "is a file, not a run folder or path/to/file.py:factory"),
                          (tmp_path, "is not an attnlab run folder (no config.json)")):
        result = invoke("check", spec)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    factory = invoke("check", f"{tmp_path / 'model.py'}:f")
    assert factory.exit_code == 2 and "Missing option '--kind'" in factory.stderr
    empty = invoke("check", "")
    assert empty.exit_code == 2 and "the name is empty" in empty.stderr
    # A hand-edited config.json that does not describe the model is one line too, not a traceback.
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(run[0], edited)
    config = json.loads((edited / "config.json").read_text())
    del config["model"]["kwargs"]["max_positions"]
    (edited / "config.json").write_text(json.dumps(config))
    broken = invoke("check", edited)
    assert broken.exit_code == 2 and broken.stderr.count("\n") == 1
    assert "does not give the model's vocabulary and length (KeyError" in broken.stderr


def test_a_table_into_a_closed_pipe_ends_with_sigpipes_status_not_a_checks_failure(run):
    import signal
    import subprocess
    import sys

    # The reader is gone before the table is written (importing torch alone takes longer than closing).
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "check", str(run[0]), "--seeds", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 128 + signal.SIGPIPE  # not 1, which says that a check failed
    assert "error" not in err and "Traceback" not in err, err


def test_a_training_started_with_stdout_closed_writes_its_run(run, tmp_path):
    # Its results are files: what it prints is a summary, which goes nowhere (it refused before writing anything).
    out = tmp_path / "closed"
    proc = subprocess.run([*STDOUT_CLOSED, sys.executable, "-m", "attnlab.cli.main", "train", "lm", "--text",
                           str(run[0].parent / "fox.txt"), "--out", str(out), *TINY[:-1], "--steps", "4",
                           "--no-progress"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "result.json").read_text())["steps"] == 4


@pytest.mark.parametrize("command", [["generate", "{run}", "--prompt", "the", "--max-new-tokens", "3"],
                                     ["check", "{run}", "--seeds", "1"], ["summary", "--preset", "tiny-router"],
                                     ["--help"], ["train", "lm", "--help"], ["experiment", "--help"]])
def test_a_command_started_with_stdout_closed_says_so_instead_of_exiting_0_with_nothing_shown(run, command):
    # ``attnlab ... >&-``: Python leaves sys.stdout None, and click and rich dropped every line silently.
    args = [arg.format(run=run[0]) for arg in command]
    proc = subprocess.run([*STDOUT_CLOSED, sys.executable, "-m", "attnlab.cli.main", *args], stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr == ("error: standard output is closed (started with '>&-'): this command writes its output "
                           "there\n")


def test_gradient_accumulation_steps_take_that_many_micro_batches(run, tmp_path):
    """--grad-accum 2: each of the 20 steps reads two micro-batches of 16 windows, as nanoGPT's accumulation does."""
    text = run[0].parent / "fox.txt"
    args = [a if a != "80" else "20" for a in TINY]  # 20 steps
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "acc", *args, "--grad-accum", "2")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "acc" / "result.json").read_text())
    assert report["steps"] == 20 and report["tokens"] == 20 * 2 * 16 * 24
    assert json.loads((tmp_path / "acc" / "config.json").read_text())["train"]["grad_accum"] == 2


def test_a_tokenizer_of_another_size_than_the_model_is_one_error(run, tmp_path):
    """A folder mixing files of two runs would decode ids to the wrong characters: refused by name."""
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(run[0], mixed)
    saved = json.loads((mixed / "tokenizer.json").read_text())
    saved["chars"] = saved["chars"][:-1]
    (mixed / "tokenizer.json").write_text(json.dumps(saved))
    result = invoke("generate", mixed, "--prompt", "the", "--max-new-tokens", 5)
    assert result.exit_code == 2 and result.stdout == ""
    assert "tokenizer.json has" in result.stderr and "the run folder mixes files of different runs" in result.stderr


def test_openmp_threads_spin_on_an_idle_machine_and_sleep_on_a_busy_one():
    from attnlab.cli.omp_wait import busy_cores, wait_policy

    def stat(*cpus):  # /proc/stat: the machine's line, then one line per CPU of (user, system, idle) ticks
        rows = [(f"cpu{i}", u, s, idle) for i, (u, s, idle) in enumerate(cpus)]
        total = ("cpu ", *(sum(column) for column in zip(*cpus)))
        return "".join(f"{name} {u} 0 {s} {idle} 10 0 0 0 0 0\n" for name, u, s, idle in [total, *rows])

    start = stat((50, 50, 500), (50, 50, 500), (0, 0, 600))
    quiet = stat((51, 50, 599), (50, 51, 599), (100, 0, 600))  # 2 busy ticks of 200 on CPUs 0 and 1
    loaded = stat((100, 50, 550), (100, 50, 550), (0, 0, 700))  # 100 busy ticks of 200: one core
    assert busy_cores(start, loaded, {0, 1}) == 1.0 and busy_cores(start, quiet, {0, 1}) == pytest.approx(0.02)
    # only the CPUs this process may run on count: CPU 2, busy in "quiet", is another cpuset's
    assert busy_cores(start, quiet, {0, 1, 2}) == pytest.approx(1.02)

    def policy(*readings, cpus=(0, 1)):
        texts = iter(readings)
        return wait_policy(lambda: next(texts), cpus=set(cpus), pause=lambda seconds: None)

    assert policy(start, quiet) == "ACTIVE" and policy(start, loaded) == "PASSIVE"
    assert policy(start, quiet, cpus=(0, 1, 2)) == "PASSIVE"
    # CPUs the file does not number (a container's own /proc/stat counts from 0): all of its CPUs decide
    assert busy_cores(start, quiet, {6, 7}) == pytest.approx(1.02) and policy(start, quiet, cpus=(6, 7)) == "PASSIVE"
    assert policy(start, stat((51, 50, 599), (50, 51, 599), (0, 1, 699)), cpus=(6, 7)) == "ACTIVE"
    assert policy("not a stat file", quiet) == "PASSIVE"  # what cannot be read leaves threads asleep
    assert policy(start, start) == "PASSIVE"  # counters that did not move tell nothing
    assert policy(loaded, start) == "PASSIVE"  # nor do counters that went back

    def unreadable():
        raise OSError("no /proc here")

    assert wait_policy(unreadable, cpus={0, 1}, pause=lambda seconds: None) == "PASSIVE"


@pytest.mark.parametrize("given", ["ACTIVE", "PASSIVE", None])
def test_the_language_model_commands_keep_a_wait_policy_the_user_set(given):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": given} if given else {})
    code = "import os, attnlab.cli.train_lm; print(os.environ['OMP_WAIT_POLICY'])"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          timeout=300)
    assert done.stdout.strip() == given if given else done.stdout.strip() in ("ACTIVE", "PASSIVE")


def test_the_peak_of_processes_trained_together_is_their_rates_timed_at_once_and_summed(monkeypatch):
    import attnlab.training.peak as peak

    calls = []
    monkeypatch.setattr(peak, "barrier", lambda place: calls.append(("barrier", place.world)))
    monkeypatch.setattr(peak, "all_sum", lambda value, place: calls.append(("sum", value)) or value * place.world)
    rate = peak.measure_peak_matmul("cpu", torch.float32, Place(rank=1, world=2), repeats=2)
    assert [c[0] for c in calls] == ["barrier", "sum"]  # started together, then added up
    assert rate == 2 * calls[1][1] > 0
    assert "summed over the 2 processes timing at once" in peak.peak_basis("cpu", torch.float32, 2)
    assert "in this process" in peak.peak_basis("cpu", torch.float32, 1)


def test_a_bfloat16_run_is_measured_against_float32_too_where_that_is_the_faster(monkeypatch):
    import attnlab.training.peak as peak

    timed = []
    def rates(slow_bf16):
        def measure(device, dtype, place):
            timed.append(dtype)
            return {torch.bfloat16: 0.8e9 if slow_bf16 else 400e9, torch.float32: 100e9}[dtype]
        return measure

    monkeypatch.setattr(peak, "measure_peak_matmul", rates(slow_bf16=True))  # bfloat16 emulated (Zen 3)
    rate, basis = peak.machine_peak("cpu", torch.bfloat16)
    assert rate == 100e9 and "1024x1024 float32 matmuls on the CPU" in basis
    assert basis.endswith("(faster than the bfloat16 products training computes in: 0.8 GFLOP/s)")
    monkeypatch.setattr(peak, "measure_peak_matmul", rates(slow_bf16=False))  # bfloat16 units
    rate, basis = peak.machine_peak("cpu", torch.bfloat16)
    assert rate == 400e9 and "1024x1024 bfloat16 matmuls on the CPU" in basis and "faster" not in basis
    timed.clear()
    assert peak.machine_peak("cpu", torch.float32)[0] == 100e9 and timed == [torch.float32]  # timed once


def test_timing_the_peak_leaves_the_training_random_streams_alone_and_stops_after_its_budget(monkeypatch):
    import attnlab.training.peak as peak

    state = torch.get_rng_state()
    peak.measure_peak_matmul("cpu", torch.float32, repeats=2)
    assert torch.equal(torch.get_rng_state(), state)  # a run with dropout draws what it drew without the timing
    products, matmul = [], torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: products.append(1) or matmul(a, b))
    monkeypatch.setattr(peak, "PEAK_SECONDS", 0.0)  # as if each product took seconds (emulated bfloat16)
    assert peak.measure_peak_matmul("cpu", torch.float32) > 0 and len(products) == 2  # the warm-up and one timing


@pytest.mark.parametrize("fast", [True, False])
def test_the_fast_preset_asks_the_training_device_for_bfloat16_and_saves_the_answer(tmp_path, monkeypatch, fast):
    import attnlab.tasks.lm_train as lm_train

    asked = []
    monkeypatch.setattr(lm_train, "has_fast_bf16", lambda device: asked.append(device) or fast)
    rates = {torch.bfloat16: 4e11, torch.float32: 1e11}  # as on a CPU with bfloat16 units (this one may have none)
    monkeypatch.setattr("attnlab.training.peak.measure_peak_matmul", lambda device, dtype, place: rates[dtype])
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    tiny = [*TINY[:TINY.index("--steps")], "--steps", "2", *TINY[TINY.index("--steps") + 2:]]
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "run", "--preset", "shakespeare-fast", *tiny)
    assert result.exit_code == 0, result.output
    assert asked == [torch.device("cpu")]  # the device the engine trains on (no GPU here), not the host CPU as such
    assert json.loads((tmp_path / "run" / "config.json").read_text())["lm"]["bf16"] is fast  # resumes repeat it
    assert json.loads((tmp_path / "run" / "config.json").read_text())["lm"]["optimizer"] == "muon"
    assert result.stdout.splitlines()[1].endswith("bfloat16 autocast" if fast else "float32")  # the throughput line
    # the peak the fraction is taken of is timed in the precision the run computes in
    peak = json.loads((tmp_path / "run" / "result.json").read_text())["peak_basis"]
    assert f"1024x1024 {'bfloat16' if fast else 'float32'} matmuls on the CPU" in peak, peak

    asked.clear()  # the command line overrides the preset, and the device is not asked
    result = invoke("train", "lm", "--text", text, "--out", tmp_path / "off", "--preset", "shakespeare-fast", "--no-bf16", *tiny)
    assert result.exit_code == 0 and not asked, result.output
    assert json.loads((tmp_path / "off" / "config.json").read_text())["lm"]["bf16"] is False
    assert LM_PRESETS["nanogpt-cpu"].bf16 is False  # nanoGPT's configuration stays float32


def test_a_char_prompt_is_never_said_to_hold_unknown_pieces(run):
    """Id 1 is <unk> in a subword vocabulary but a real character in a char one (here the first sorted one)."""
    from attnlab.data import UNK_ID, load_tokenizer

    tokenizer = load_tokenizer(run[0] / "tokenizer.json")
    first = tokenizer.decode([UNK_ID])
    result = invoke("generate", run[0], "--prompt", f"the{first}fox", "--max-new-tokens", "2", "--seed", "0")
    assert result.exit_code == 0 and "not in the vocabulary" not in result.stderr, result.stderr


def test_a_resume_reads_past_damaged_metrics_lines_and_refuses_a_step_that_is_not_a_count(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    for name in ("metrics", "step"):
        first = invoke("train", "lm", "--text", text, "--out", tmp_path / name, *TINY, "--max-seconds", "0.0001")
        assert first.exit_code == 0, first.output
    with open(tmp_path / "metrics" / "metrics.jsonl", "ab") as f:
        f.write(b'\xff\xfe not UTF-8\n{"step": "abc"}\n[1, 2]\n')  # bytes and records no run writes
    resumed = invoke("train", "lm", "--text", text, "--out", tmp_path / "metrics", "--resume", "--max-seconds", "0",
                     "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    steps = [json.loads(line).get("step") for line in (tmp_path / "metrics" / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(s, int) for s in steps) and steps == sorted(steps)  # the damaged lines are gone
    trainer = tmp_path / "step" / "checkpoint" / "trainer.json"
    saved = json.loads(trainer.read_text())
    saved["trainer"]["step"] = "1"
    trainer.write_text(json.dumps(saved))
    refused = invoke("train", "lm", "--text", text, "--out", tmp_path / "step", "--resume", "--no-progress")
    assert refused.exit_code == 2 and "trainer.json's step is '1', not a count of steps" in refused.stderr


def test_a_run_another_process_trains_in_is_refused_and_left_as_it_is(run, tmp_path, held_elsewhere):
    import shutil

    busy = tmp_path / "busy"
    shutil.copytree(run[0], busy)
    before = {p: p.read_bytes() for p in busy.rglob("*") if p.is_file()}
    held_elsewhere(busy)  # a training in progress there (or torchrun workers left behind)
    text = run[0].parent / "fox.txt"
    for extra in (["--resume", "--steps", "120"], []):
        result = invoke("train", "lm", "--text", text, "--out", busy, "--no-progress", *extra)
        assert result.exit_code == 2 and result.stderr == (
            f"error: {busy} is in use: another attnlab process is training into it (after a killed torchrun, its "
            "workers may still be running); let it end or stop it, or choose another --out\n")
    assert {p: p.read_bytes() for p in busy.rglob("*") if p.is_file()} == before


def test_a_run_finished_meanwhile_in_the_same_new_folder_is_not_replaced(run, tmp_path, finished_meanwhile):
    """A run another process started into the same new folder, and finished between this one's first check and
    its lock, is refused again under the lock, not replaced (both ended with status 0, the second run's files in
    the folder)."""
    import attnlab.tasks.lm_train
    finished_meanwhile(attnlab.tasks.lm_train, "config.json", '{"task": "lm", "theirs": true}')
    out = tmp_path / "race"
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", out, *TINY)
    assert result.exit_code == 2 and "already holds a run" in result.stderr, result.output
    assert [p.name for p in out.iterdir()] == ["config.json"] and "theirs" in (out / "config.json").read_text()


def test_a_full_disk_while_saving_is_one_line_naming_the_file(run, tmp_path, monkeypatch):
    """safetensors raises its own error for a failed write, which reached the user as a traceback."""
    from safetensors import SafetensorError

    import attnlab.training.checkpoint

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(attnlab.training.checkpoint, "save_model", full)
    out = tmp_path / "full"
    result = invoke("train", "lm", "--text", run[0].parent / "fox.txt", "--out", out, *TINY)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stderr.splitlines()[-1].startswith(f"error: cannot write {out}/")
    assert result.stderr.splitlines()[-1].endswith("No space left on device (os error 28)")


def test_eval_lm_scores_every_token_of_a_text_exactly(run, tmp_path):
    """`attnlab eval lm`: the loss on every token but the first, in windows of the context read from their starts,
    against a computation written out here one window at a time."""
    import torch.nn.functional as F

    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.training.checkpoint import load_run

    text = tmp_path / "other.txt"
    text.write_text("the lazy dog jumps over the quick brown fox.\n" * 3, encoding="utf-8")  # 135 characters
    result = invoke("eval", "lm", run[0], "--text", text, "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    model, _ = load_run(run[0], task="lm")
    ids = load_tokenizer(run[0] / "tokenizer.json").encode(text.read_text(encoding="utf-8"))
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, 24):  # the run's context: 24
            window = torch.tensor(ids[start : start + 25])
            total += F.cross_entropy(model(window[None, :-1])[0], window[1:], reduction="sum").item()
    assert got["tokens"] == 134 and got["loss"] == pytest.approx(total / 134, rel=1e-5)
    assert got["bits_per_token"] == pytest.approx(got["loss"] / math.log(2))
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]))
    assert json.loads(invoke("eval", "lm", run[0], "--text", text, "--json", "--batch-size", "1").stdout)["loss"] == \
        pytest.approx(got["loss"], rel=1e-6)  # the batch is memory, not the result
    line = invoke("eval", "lm", run[0], "--text", text).stdout
    assert line == f"{text}: 134 tokens scored | loss {got['loss']:.4f} nats/token | perplexity " \
                   f"{got['perplexity']:.3f} | {got['bits_per_token']:.4f} bits per character\n"
    for content, said in (("t", "the text holds 1 token: scoring needs at least 2 (one to read, one to predict)"),
                          ("the fox§", "character '§' is not in this model's vocabulary of 29 characters"),
                          ("", f"{text} is empty")):
        text.write_text(content, encoding="utf-8")
        result = invoke("eval", "lm", run[0], "--text", text)
        assert result.exit_code == 2 and result.stderr == f"error: {said}\n"
    text.write_text(TEXT, encoding="utf-8")
    result = invoke("eval", "lm", text.parent, "--text", text)  # not a run folder
    assert result.exit_code == 2 and result.stderr == f"error: {text.parent} is not an attnlab run folder (no config.json)\n"
    # The text is read once here, so a pipe will do (`--text <(zcat t.gz)`); a device will not.
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_text(TEXT[:135], encoding="utf-8"))
    writer.start()
    piped = invoke("eval", "lm", run[0], "--text", pipe, "--json")
    if writer.is_alive():  # refused without reading: open the reading end so that the writer can finish
        os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
    writer.join(timeout=30)
    assert piped.exit_code == 0 and json.loads(piped.stdout)["tokens"] == 134, piped.output
    result = invoke("eval", "lm", run[0], "--text", "/dev/null")
    assert result.exit_code == 2 and result.stderr == "error: /dev/null is a device, not a text file: save it to a file first\n"
