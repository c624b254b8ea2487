"""The leak experiment: the unmasked decoder wins on teacher-forced loss, loses when writing, fails the check."""

import json
import random

import torch
from click.testing import CliRunner

from attnlab.checks import Contract, run_checks
from attnlab.cli.main import cli
from attnlab.nn import DecoderLM
from attnlab.tasks.leak import LeakyDecoderLM, future_absent_loss, teacher_forced_loss


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
    assert "verdict: leaky teacher forced lower: yes" in result.output
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
