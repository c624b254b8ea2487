"""The leak experiment: the unmasked decoder wins on teacher-forced loss, loses when writing, fails the check."""

import json
import random
import re

import pytest
import torch
from click.testing import CliRunner

from attnlab.checks import Contract, run_checks
from attnlab.cli.main import cli
from attnlab.errors import AttnlabError
from attnlab.nn import DecoderLM
from attnlab.tasks.leak import (
    LEAK_SETTINGS,
    LeakyDecoderLM,
    future_absent_loss,
    run_leak_experiment,
    teacher_forced_loss,
)


def test_leak_experiment_shows_the_leak_three_ways(tmp_path):
    # Uniformly random letters: no causal model can beat ln(10) = 2.30 nats, while a model that sees the next
    # letter can copy it, so the leak shows after a hundred steps.
    rng = random.Random(0)
    text = tmp_path / "letters.txt"
    text.write_text("".join(rng.choice("abcdefghij") for _ in range(20000)))
    out = tmp_path / "leak"
    result = CliRunner().invoke(cli, ["experiment", "leak", "--text", str(text), "--out", str(out), "--steps", "100",
                                      "--sample-tokens", "40"])
    assert result.exit_code == 0, result.output
    numbers = json.loads((out / "leak.json").read_text())
    rows = {row["name"]: row for row in numbers["rows"]}
    causal, leaky = rows["causal"], rows["leaky"]
    assert leaky["val_loss"] < causal["val_loss"] - 0.3  # teacher-forced: the leaky model looks better
    assert causal["val_loss"] > 2.2  # ... than any honest model can be
    assert leaky["future_absent"] > causal["future_absent"]  # writing: it is worse
    # A causal model's loss is the same whether or not the later tokens are present; the leaky one's is not.
    assert abs(causal["future_absent"] - causal["same_windows_teacher_forced"]) < 1e-4
    assert leaky["future_absent"] > leaky["same_windows_teacher_forced"] + 0.5
    assert (causal["check_status"], leaky["check_status"]) == ("pass", "fail")
    assert "changing tokens after position" in leaky["check_summary"]
    assert (out / "leak.png").stat().st_size > 10_000
    assert "verdict (losses apart by more than 0.1 nats): leaky teacher forced lower: yes" in " ".join(result.output.split())
    flat = " ".join(result.output.split())  # the table's title wraps at the terminal's width
    assert "teacher-forced loss says it is better; writing and the causal check say it is broken" in flat
    assert "check of the leaky model: seed" in flat
    # The command printed for `attnlab check` runs the same check on the saved model, and fails it.
    check = CliRunner().invoke(cli, numbers["check_commands"]["leaky"].split()[1:])
    assert check.exit_code == 1 and "FAIL" in check.output


def test_leaky_model_differs_from_the_core_model_only_in_its_mask():
    torch.manual_seed(0)
    honest = DecoderLM(12, 16, 1, 2, max_positions=8).eval()
    leaky = LeakyDecoderLM(12, 16, 1, 2, max_positions=8).eval()
    leaky.load_state_dict(honest.state_dict())
    ids = torch.randint(0, 12, (3, 8))
    with torch.no_grad():
        torch.testing.assert_close(leaky(ids)[:, -1], honest(ids)[:, -1])  # the last position has no future
        assert not torch.allclose(leaky(ids)[:, 0], honest(ids)[:, 0])
    contract = Contract("decoder", pad_id=None, vocab_size=12, max_length=8)
    assert not run_checks(honest, contract, seeds=3).failed
    assert run_checks(leaky, contract, seeds=3, only=["causal"]).failed
    stream = torch.randint(0, 12, (200,))
    assert abs(future_absent_loss(honest, stream, context=8) - teacher_forced_loss(honest, stream, context=8)) < 1e-5


# ------------------------------------------------------------------------------------------------------
# bad input: one `error:` line, exit status 2, and nothing written


def _letters(path, count=400, alphabet="abcdefghij"):
    """A text of ``count`` random letters: long and varied enough for the experiment (it needs 321 characters)."""
    rng = random.Random(0)
    path.write_text("".join(rng.choice(alphabet) for _ in range(count)))
    return path


def _leak(*args):
    return CliRunner().invoke(cli, ["experiment", "leak", *map(str, args)], prog_name="attnlab")


def _one_error_line(result):
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)  # handled: no traceback
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "training two models" not in result.output  # refused before the banner
    return lines[0]


@pytest.mark.parametrize("args, option", [
    (["--steps", "0"], "--steps"),
    (["--steps", "-5"], "--steps"),
    (["--sample-tokens", "0"], "--sample-tokens"),
    (["--steps", "2", "--sample-tokens", "0"], "--sample-tokens"),  # refused before the causal model is trained
])
def test_leak_refuses_steps_and_sample_tokens_below_one_before_writing(tmp_path, args, option):
    out = tmp_path / "leak"
    line = _one_error_line(_leak("--text", _letters(tmp_path / "t.txt"), "--out", out, *args))
    assert f"'{option}'" in line and "x>=1" in line and "see 'attnlab experiment leak --help'" in line
    assert not out.exists()


@pytest.mark.parametrize("overrides, sample_tokens, message", [
    ({"steps": 0}, 200, "--steps must be at least 1, got 0"),
    ({}, 0, "--sample-tokens must be at least 1, got 0"),
])
def test_leak_experiment_function_checks_settings_by_option_name_before_writing(tmp_path, overrides, sample_tokens,
                                                                                 message):
    out = tmp_path / "leak"
    with pytest.raises(AttnlabError) as err:
        run_leak_experiment(_letters(tmp_path / "t.txt"), out, LEAK_SETTINGS.with_overrides(**overrides),
                            sample_tokens=sample_tokens)
    assert str(err.value) == message  # the command's option, not max_steps or "max new tokens"
    assert not out.exists()


@pytest.mark.parametrize("content, message", [
    ("ab" * 300, "has only 2 distinct characters; the leak experiment needs at least 3"),
    ("a" * 400, "has only 1 distinct character; the leak experiment needs at least 3"),
    (b"\xff\xfe not text", "is not UTF-8 text"),
    ("abcdefg", "is too short for the leak experiment: it holds 7 characters and needs at least 321"),
    ("", "is empty"),
])
def test_leak_refuses_an_unusable_text_before_creating_out(tmp_path, content, message):
    text = tmp_path / "t.txt"
    if isinstance(content, bytes):
        text.write_bytes(content)
    else:
        text.write_text(content)
    out = tmp_path / "leak"
    line = _one_error_line(_leak("--text", text, "--out", out, "--steps", "2"))
    assert line == f"error: {text} {message}" or line.startswith(f"error: {text} {message}"), line
    assert not out.exists()


def test_leak_refuses_a_missing_text_and_an_out_that_is_a_file(tmp_path):
    text = _letters(tmp_path / "t.txt")
    assert _one_error_line(_leak("--text", tmp_path / "nope.txt", "--out", tmp_path / "leak")) == \
        f"error: no text file {tmp_path / 'nope.txt'}"
    assert not (tmp_path / "leak").exists()
    (tmp_path / "file").write_text("keep me")
    assert _one_error_line(_leak("--text", text, "--out", tmp_path / "file")) == \
        f"error: {tmp_path / 'file'} exists and is not a folder; --out names a folder"
    assert (tmp_path / "file").read_text() == "keep me"


def _snapshot(folder):
    return {p.relative_to(folder): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def test_leak_refuses_an_out_holding_an_experiment_or_part_of_one_and_changes_nothing(tmp_path):
    text = _letters(tmp_path / "t.txt")
    out = tmp_path / "leak"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a folder holding other files is used, and they are kept
    first = _leak("--text", text, "--out", out, "--steps", "2", "--sample-tokens", "5")
    assert first.exit_code == 0, (first.output, first.exception)
    assert {p.name for p in out.iterdir()} == {"notes.txt", "causal", "leaky", "check_models.py", "leak.json",
                                                "leak.png"}
    assert (out / "notes.txt").read_text() == "mine"
    # Again into the same folder: refused before anything is written; check_models.py is not rewritten.
    before = _snapshot(out)
    line = _one_error_line(_leak("--text", text, "--out", out, "--steps", "2", "--sample-tokens", "5"))
    assert line == (f"error: {out} already holds a leak experiment or part of one (causal/, leaky/, check_models.py, "
                    f"leak.json, leak.png); choose another --out, or delete them from {out} to run it there again")
    assert "--resume" not in line  # the command has no --resume
    assert _snapshot(out) == before
    # What a run stopped after its first model leaves behind is refused the same way, and left as it is.
    partial = tmp_path / "partial"
    (partial / "causal").mkdir(parents=True)
    (partial / "causal" / "config.json").write_text("{}")
    before = _snapshot(partial)
    line = _one_error_line(_leak("--text", text, "--out", partial, "--steps", "2"))
    assert line == (f"error: {partial} already holds a leak experiment or part of one (causal/); "
                    f"choose another --out, or delete it from {partial} to run it there again")
    assert _snapshot(partial) == before


@pytest.mark.parametrize("existed", [False, True])
def test_an_interrupted_experiment_leaves_nothing_that_would_refuse_the_next_run(tmp_path, monkeypatch, existed):
    import attnlab.tasks.leak as leak

    text = _letters(tmp_path / "t.txt")
    out = tmp_path / "leak" if existed else tmp_path / "new" / "deep" / "leak"  # parents it makes go too
    if existed:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    checked = []

    def interrupted(*args, **kwargs):  # Ctrl-C once the first model is trained and written
        checked.append(kwargs.get("spec"))
        raise KeyboardInterrupt

    monkeypatch.setattr(leak, "run_checks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_leak_experiment(text, out, leak.LEAK_SETTINGS.with_overrides(steps=2), sample_tokens=5)
    assert checked and checked[0].endswith("check_models.py:causal")  # causal/ and check_models.py had been written
    assert ({p.name for p in out.iterdir()} == {"notes.txt"}) if existed else not (tmp_path / "new").exists()
    monkeypatch.undo()
    again = _leak("--text", text, "--out", out, "--steps", "2", "--sample-tokens", "5")
    assert again.exit_code == 0, (again.output, again.exception)


def test_a_short_budget_warms_up_for_a_tenth_and_the_title_follows_the_verdict(tmp_path):
    text = tmp_path / "abc.txt"
    text.write_text("abc" * 400)
    result = CliRunner().invoke(cli, ["experiment", "leak", "--text", str(text), "--out", str(tmp_path / "leak"),
                                      "--steps", "15", "--sample-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert "note: --warmup" not in result.stderr  # experiment leak has no --warmup to blame
    assert json.loads((tmp_path / "leak" / "causal" / "config.json").read_text())["lm"]["warmup"] == 1  # 15 // 10
    flat = " ".join(result.output.split())
    verdict = re.search(r"verdict \(losses apart by more than 0.1 nats\): (.*?) plot:", flat).group(1)
    told = "teacher-forced loss says it is better" in flat
    assert told == ("NO" not in verdict) and told != ("did not show every expected difference" in flat)


def test_an_experiment_finished_meanwhile_in_the_same_new_folder_is_refused_not_removed(tmp_path, finished_meanwhile):
    """Two experiments started into one new --out: the one that reached the folder second was refused by its
    first model's training, and its clean-up removed the other's finished experiment."""
    import attnlab.tasks.leak as leak
    finished_meanwhile(leak, "leak.json", '{"theirs": true}')
    out = tmp_path / "leak"
    with pytest.raises(AttnlabError, match="already holds a leak experiment or part of one"):
        run_leak_experiment(_letters(tmp_path / "t.txt"), out, LEAK_SETTINGS.with_overrides(steps=2), sample_tokens=5)
    assert [p.name for p in out.iterdir()] == ["leak.json"] and "theirs" in (out / "leak.json").read_text()


def test_losses_a_few_thousandths_apart_do_not_count_as_a_difference():
    """After 2 steps both models sat at 3.43-3.44 nats, and the verdict said the leaky one was better when teacher
    forced and worse when writing, on differences of 0.004."""
    from pathlib import Path

    from attnlab.tasks.leak import LeakResult, LeakRow, summary

    def verdict(causal, leaky):
        rows = [LeakRow(name, tf, tf, absent, status, "", "") for name, (tf, absent), status in
                (("causal", causal, "pass"), ("leaky", leaky, "fail"))]
        return summary(LeakResult(rows, {}, {}, Path("."), ""))

    close = verdict(causal=(3.435, 3.435), leaky=(3.431, 3.439))
    assert not close["leaky_teacher_forced_lower"] and not close["leaky_worse_when_writing"]
    apart = verdict(causal=(2.233, 2.188), leaky=(0.191, 3.777))  # the README's run
    assert apart["leaky_teacher_forced_lower"] and apart["leaky_worse_when_writing"]
