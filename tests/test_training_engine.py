"""The shared training engine: exact resume, accumulation, DDP equivalence, NaN handling, schedules."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.errors import AttnlabError
from attnlab.files import holding_run_folder
from attnlab.nn import DecoderLM
from attnlab.training import Schedule, TrainConfig, Trainer, TrainingError, seed_everything
from attnlab.training.checkpoint import (
    build_model,
    load_checkpoint,
    load_run,
    load_weights,
    model_config,
    register_model,
    save_checkpoint,
    save_weights,
    write_run_config,
)
from attnlab.training.distributed import Place
from attnlab.training.engine import train_or_forget
from launch import TWO_LOCAL_PROCESSES
from toy_task import ToyTask

HERE = Path(__file__).parent


def train(out, steps=12, resume=False, fail_at_batch=-1, dropout=0.1, batch_size=8, **cfg):
    seed_everything(0)
    task = ToyTask(batch_size=batch_size, fail_at_batch=fail_at_batch)
    model = task.model(dropout)
    config = TrainConfig(max_steps=steps, lr=3e-3, warmup_steps=3, eval_every=4, progress=False, **cfg)
    trainer = Trainer(model, task, config, out)
    return trainer.fit(resume=resume), model


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])  # muon: Muon's momenta and AdamW's moments in one checkpoint
def test_interrupted_run_resumes_to_identical_weights(tmp_path, optimizer):
    _, straight = train(tmp_path / "a", optimizer=optimizer)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "b", fail_at_batch=11, optimizer=optimizer)  # dies during step 11, after the step-8 checkpoint
    assert json.loads((tmp_path / "b/checkpoint/trainer.json").read_text())["trainer"]["step"] == 8
    result, resumed = train(tmp_path / "b", resume=True, optimizer=optimizer)
    assert result.steps == 12
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    steps_logged = [json.loads(x)["step"] for x in (tmp_path / "b/metrics.jsonl").read_text().splitlines()]
    assert steps_logged == sorted(steps_logged)  # no duplicate steps from before the crash
    assert (tmp_path / "b/loss.png").stat().st_size > 1000


def test_a_resume_on_another_thread_count_says_its_results_will_differ_in_the_last_bits(tmp_path, capsys):
    from attnlab.training.engine import torch_threads

    with torch_threads(1):
        with pytest.raises(KeyboardInterrupt):
            train(tmp_path / "b", fail_at_batch=11)
        assert json.loads((tmp_path / "b/checkpoint/trainer.json").read_text())["trainer"]["threads"] == 1
        capsys.readouterr()
        train(tmp_path / "b", resume=True, steps=13)  # the same count: nothing to say
        assert "torch thread" not in capsys.readouterr().err
    with torch_threads(2):
        train(tmp_path / "b", resume=True, steps=14)
    assert ("note: the checkpoint was saved by a process of 1 torch thread, this one has 2 (--threads)"
            in capsys.readouterr().err)


def test_gradient_accumulation_gives_the_gradient_of_one_big_batch(tmp_path):
    def gradients(batch_size, accum):
        seed_everything(0)
        task = ToyTask(batch_size=batch_size)
        trainer = Trainer(task.model(0.0), task, TrainConfig(progress=False), tmp_path)
        batches = trainer._micro_batches()
        loss, tokens = trainer._accumulate([next(batches) for _ in range(accum)])
        return loss, tokens, [p.grad.clone() for p in trainer.model.parameters()]

    loss_big, tokens_big, big = gradients(8, 1)
    loss_acc, tokens_acc, accumulated = gradients(4, 2)
    assert loss_big == pytest.approx(loss_acc, rel=1e-6) and tokens_big == tokens_acc == 80
    for a, b in zip(big, accumulated):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


def test_two_process_ddp_matches_one_process(tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(HERE)!r})
        from toy_task import ToyTask
        from attnlab.training import TrainConfig, Trainer, seed_everything
        seed_everything(0)
        task = ToyTask(batch_size=8)
        model = task.model(dropout=0.0)
        trainer = Trainer(model, task, TrainConfig(max_steps=6, lr=3e-3, eval_every=3, progress=False,
                                                   device="cpu"), sys.argv[1])
        trainer.fit()
        trainer.close()
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", *TWO_LOCAL_PROCESSES,
                    str(script), str(tmp_path / "ddp")], check=True, env=env, capture_output=True, timeout=240)
    subprocess.run([sys.executable, str(script), str(tmp_path / "single")], check=True, env=env, timeout=240,
                   capture_output=True)
    task = ToyTask()
    ddp, single = task.model(0.0), task.model(0.0)
    load_weights(ddp, tmp_path / "ddp/checkpoint/model.safetensors")
    load_weights(single, tmp_path / "single/checkpoint/model.safetensors")
    for (name, a), (_, b) in zip(ddp.state_dict().items(), single.state_dict().items()):
        # Adam divides by sqrt(v): rounding differences in near-zero gradients grow, hence 1e-4, far below a
        # wrong shard or normalisation, which moves weights by the learning rate (3e-3) per step.
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3, msg=name)
    assert not torch.equal(ddp.out.weight, task.model(0.0).out.weight)  # it did train


def test_two_process_resume_with_dropout_repeats_the_uninterrupted_run(tmp_path):
    """Each process's random stream is saved: with shares of unequal size (7 = 4 + 3) the two draw different
    amounts of dropout, so rank 1 resuming with rank 0's stream would end elsewhere."""
    script = tmp_path / "ddp_resume.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(HERE)!r})
        from toy_task import ToyTask
        from attnlab.training import TrainConfig, seed_everything
        from attnlab.training.engine import run_training

        out, fail_at_batch, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume"
        seed_everything(0)
        task = ToyTask(batch_size=7, fail_at_batch=fail_at_batch)
        config = TrainConfig(max_steps=10, lr=3e-3, eval_every=4, progress=False, device="cpu")
        run_training(task.model(dropout=0.3), task, config, out, resume=resume)
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def torchrun(*args):  # one launch each: a process group joined again in the same processes is not reliable
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", *TWO_LOCAL_PROCESSES, str(script),
                               *map(str, args)], env=env, capture_output=True, timeout=240)

    for args in ((tmp_path / "straight", -1, "new"), (tmp_path / "resumed", 7, "new")):  # the second dies in step 7
        torchrun(*args)
    assert json.loads((tmp_path / "resumed/checkpoint/trainer.json").read_text())["trainer"]["step"] == 4
    done = torchrun(tmp_path / "resumed", -1, "resume")
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    task = ToyTask()
    straight, resumed = task.model(0.0), task.model(0.0)
    load_weights(straight, tmp_path / "straight/checkpoint/model.safetensors")
    load_weights(resumed, tmp_path / "resumed/checkpoint/model.safetensors")
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert json.loads((tmp_path / "resumed/checkpoint/trainer.json").read_text())["trainer"]["world"] == 2
    saved = load_file(str(tmp_path / "resumed/checkpoint/optimizer.safetensors"))
    assert not torch.equal(saved["rng.torch"], saved["rng.torch.rank1"])  # the streams did part

def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    class Exploding(ToyTask):
        def loss(self, model, data):
            loss = super().loss(model, data)
            return loss * math.nan if self.calls >= 6 else loss

    seed_everything(0)
    task = Exploding()
    trainer = Trainer(task.model(), task, TrainConfig(max_steps=10, eval_every=4, progress=False), tmp_path)
    with pytest.raises(TrainingError, match=r"loss became nan at step 6.*step 4"):
        trainer.fit()
    assert json.loads((tmp_path / "checkpoint/trainer.json").read_text())["trainer"]["step"] == 4


def test_early_stopping_and_best_weights(tmp_path):
    class Plateau(ToyTask):
        def evaluate(self, model):
            return {"score": 1.0}  # never improves after the first evaluation

    seed_everything(0)
    task = Plateau()
    trainer = Trainer(task.model(), task, TrainConfig(max_steps=50, eval_every=2, patience=2, progress=False), tmp_path)
    result = trainer.fit()
    assert result.stopped_early and result.steps == 6 and result.best["step"] == 2
    assert (tmp_path / "model.safetensors").is_file()
    # Resumed, a run that early stopping ended stays ended: no step more, the same best.
    again = Trainer(task.model(), task, TrainConfig(max_steps=50, eval_every=2, patience=2, progress=False), tmp_path)
    resumed = again.fit(resume=True)
    assert resumed.stopped_early and resumed.steps == 6 and resumed.best["step"] == 2
    # A run that reached max_steps with its patience spent at the last evaluation was not stopped early: given more
    # steps, it takes them.
    seed_everything(0)
    ended = Trainer(task.model(), task, TrainConfig(max_steps=6, eval_every=2, patience=2, progress=False),
                    tmp_path / "ended").fit()
    assert not ended.stopped_early and ended.steps == 6
    longer = Trainer(task.model(), task, TrainConfig(max_steps=8, eval_every=2, patience=2, progress=False),
                     tmp_path / "ended").fit(resume=True)
    assert longer.steps == 8


def test_schedules():
    cosine = Schedule("cosine", lr=1.0, warmup_steps=10, total_steps=110, min_lr=0.1)
    assert cosine(0) == pytest.approx(0.1) and cosine(9) == pytest.approx(1.0)
    assert cosine(59) == pytest.approx(0.55) and cosine(109) == pytest.approx(0.1)
    inv = Schedule("inverse_sqrt", lr=1.0, warmup_steps=100)
    assert inv(99) == pytest.approx(1.0) and inv(399) == pytest.approx(0.5)
    with pytest.raises(AttnlabError, match="unknown schedule"):
        Schedule("linear")


def test_corrupt_weights_and_missing_checkpoint_are_clear_errors(tmp_path):
    model = ToyTask().model()
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"this is not a safetensors file")
    with pytest.raises(AttnlabError, match="not a readable safetensors"):
        load_weights(model, bad)
    with pytest.raises(AttnlabError, match="no checkpoint"):
        load_checkpoint(tmp_path, model, torch.optim.AdamW(model.parameters()))


def test_a_checkpoint_without_its_random_state_is_named_damaged(tmp_path):
    train(tmp_path / "run", steps=4)
    path = tmp_path / "run/checkpoint/optimizer.safetensors"
    save_file({k: v for k, v in load_file(str(path)).items() if not k.startswith("rng.")}, str(path))
    with pytest.raises(AttnlabError, match="damaged: it holds no random generator state"):
        train(tmp_path / "run", steps=8, resume=True)


def test_a_resume_whose_best_weights_were_deleted_keeps_the_next_evaluations(tmp_path, capsys):
    train(tmp_path / "run", steps=4)
    (tmp_path / "run/model.safetensors").unlink()
    path = tmp_path / "run/checkpoint/trainer.json"  # a best that no later evaluation beats
    meta = json.loads(path.read_text())
    meta["trainer"]["best_score"] = 1e9
    path.write_text(json.dumps(meta))
    train(tmp_path / "run", steps=8, resume=True)
    assert (tmp_path / "run/model.safetensors").is_file()  # (never written again: every command that loads failed)
    assert "the best weights so far (step 4), is missing: the next evaluation's weights are kept" in capsys.readouterr().err


def _damage_optimizer(tensors):
    shape = tensors["state.0.exp_avg"].shape
    return {**tensors, "state.0.exp_avg": torch.zeros(7, 3)}, re.escape(f"state.0.exp_avg is (7, 3), its parameter {tuple(shape)}")


@pytest.mark.parametrize("damage", [
    _damage_optimizer,  # fused AdamW computed with it
    lambda t: ({k: v for k, v in t.items() if k != "state.1.exp_avg"}, "its parameters' states hold different entries"),
    lambda t: ({k: v for k, v in t.items() if not k.endswith(".exp_avg")}, "the optimizer's state lacks exp_avg"),
    # a parameter's whole state gone: its moments would restart at zero, silently
    lambda t: ({k: v for k, v in t.items() if not k.startswith("state.1.")},
               re.escape("the state of parameter 1 is missing (saved with state, none found)")),
    lambda t: ({k: v for k, v in t.items() if not k.startswith(("state.0.", "state.2."))}, "the states of parameters 0, 2 are missing"),
    lambda t: ({**t, "state.0": torch.zeros(1)}, "state.0 is no state of this optimizer's"),
    lambda t: ({**t, "state.x.exp_avg": torch.zeros(1)}, "state.x.exp_avg is no state of this optimizer's"),
    lambda t: ({**t, "rng.torch": torch.zeros(10, dtype=torch.uint8)}, "its random generator state: Expected a"),
    lambda t: ({**t, "rng.torch": torch.zeros(5056)}, "its random generator state: RNG state must be a torch.ByteTensor"),
])
def test_a_checkpoint_whose_optimizer_or_random_state_does_not_fit_is_named_damaged(tmp_path, damage):
    train(tmp_path / "run", steps=4)
    path = tmp_path / "run/checkpoint/optimizer.safetensors"
    tensors, message = damage(load_file(str(path)))
    save_file(tensors, str(path))
    with pytest.raises(AttnlabError, match="checkpoint in .* is damaged: " + message):
        train(tmp_path / "run", steps=8, resume=True)


def _resume_with_trainer_json(run, edit):
    path = run / "checkpoint/trainer.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    train(run, steps=8, resume=True)


def test_which_parameters_have_optimizer_state_is_checked_where_saved(tmp_path):
    train(tmp_path / "run", steps=4)
    saved = json.loads((tmp_path / "run/checkpoint/trainer.json").read_text())["params_with_state"]
    assert saved == list(range(len(list(ToyTask().model().parameters()))))
    with pytest.raises(AttnlabError, match=re.escape("damaged: trainer.json's params_with_state is 'x', not a list")):
        _resume_with_trainer_json(tmp_path / "run", lambda meta: meta.update(params_with_state="x"))
    with pytest.raises(AttnlabError, match="damaged: it holds state for parameter 0, saved as having none"):
        _resume_with_trainer_json(tmp_path / "run", lambda meta: meta.update(params_with_state=saved[1:]))


def test_a_checkpoint_from_before_params_with_state_was_kept_still_resumes(tmp_path):
    train(tmp_path / "run", steps=4)
    _resume_with_trainer_json(tmp_path / "run", lambda meta: meta.pop("params_with_state"))
    assert json.loads((tmp_path / "run/checkpoint/trainer.json").read_text())["trainer"]["step"] == 8


@pytest.mark.parametrize("key, value", [("best_score", "x"), ("tokens", None), ("stopped_early", 1), ("best", []),
                                        # (and of the right kind, but no count or time: -1e9 s reached result.json)
                                        ("elapsed", -999999999.8), ("elapsed", math.inf), ("tokens", -5),
                                        ("epoch", 2.5), ("batch_in_epoch", -3), ("evals_without_improvement", -1)])
def test_a_checkpoint_whose_counters_are_of_other_kinds_is_named_damaged(tmp_path, key, value):
    train(tmp_path / "run", steps=4)
    path = tmp_path / "run/checkpoint/trainer.json"
    meta = json.loads(path.read_text())
    meta["trainer"][key] = value
    path.write_text(json.dumps(meta))
    with pytest.raises(AttnlabError, match=re.escape(f"damaged: trainer.json's {key} is {value!r}")):
        train(tmp_path / "run", steps=8, resume=True)

def test_a_checkpoint_past_the_end_of_its_epoch_is_named_damaged(tmp_path):
    """A resume that skipped every batch of the epoch went on from the next one, without a word."""
    train(tmp_path / "run", steps=4)
    path = tmp_path / "run/checkpoint/trainer.json"
    meta = json.loads(path.read_text())
    batches = len(list(ToyTask(batch_size=8).batches(meta["trainer"]["epoch"], Place())))
    meta["trainer"]["batch_in_epoch"] = batches + 1
    path.write_text(json.dumps(meta))
    with pytest.raises(AttnlabError, match=re.escape(f"damaged: trainer.json's batch_in_epoch is {batches + 1}, but "
                                                     f"epoch {meta['trainer']['epoch']} of the training data has "
                                                     f"{batches} batches")):
        train(tmp_path / "run", steps=8, resume=True)


@pytest.mark.parametrize("key", ["trainer", "elapsed"])
def test_a_checkpoint_whose_counters_lack_an_entry_names_it(tmp_path, key):
    """The bare KeyError text, "'trainer'", was the whole reason given."""
    from attnlab.training.checkpoint import checkpoint_progress

    train(tmp_path / "run", steps=4)
    path = tmp_path / "run/checkpoint/trainer.json"
    meta = json.loads(path.read_text())
    meta.pop(key, None) if key == "trainer" else meta["trainer"].pop(key)
    path.write_text(json.dumps(meta))
    with pytest.raises(AttnlabError, match=re.escape(f"damaged: trainer.json has no '{key}' entry")):
        checkpoint_progress(tmp_path / "run")


def test_checkpoint_round_trip_restores_optimizer_and_rng(tmp_path):
    model = ToyTask().model()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 20, (2, 5))).sum().backward()
    opt.step()
    torch.manual_seed(123)
    save_checkpoint(tmp_path, model, opt, {"step": 1})
    expected = torch.rand(3)
    other = ToyTask().model()
    other_opt = torch.optim.AdamW(other.parameters())
    assert load_checkpoint(tmp_path, other, other_opt)["step"] == 1
    assert torch.equal(torch.rand(3), expected)
    saved, loaded = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for index in saved:
        assert torch.equal(saved[index]["exp_avg_sq"], loaded[index]["exp_avg_sq"])


def test_a_resume_trains_with_its_own_weight_decay_and_betas_not_the_checkpoint_s(tmp_path):
    train(tmp_path, steps=8, weight_decay=0.0, betas=(0.9, 0.999))
    seed_everything(0)
    task = ToyTask(batch_size=8)
    config = TrainConfig(max_steps=12, lr=3e-3, warmup_steps=3, eval_every=4, progress=False, weight_decay=0.5,
                         betas=(0.5, 0.6))
    trainer = Trainer(task.model(0.1), task, config, tmp_path)
    trainer.fit(resume=True)
    decayed = [g for g in trainer.optimizer.param_groups if g["weight_decay"]]
    assert decayed and all(g["weight_decay"] == 0.5 for g in decayed)
    assert all(tuple(g["betas"]) == (0.5, 0.6) for g in trainer.optimizer.param_groups)


def test_model_classes_must_be_registered_and_registered_ones_round_trip(tmp_path):
    class Unregistered(DecoderLM):
        pass

    with pytest.raises(AttnlabError, match="not registered"):
        model_config(Unregistered(20, 16, 1, 2, max_positions=8))
    with pytest.raises(AttnlabError, match="'Nowhere', which no loaded module registers"):
        build_model({"class": "Nowhere", "kwargs": {}})
    with pytest.raises(AttnlabError, match="needs 'class' and 'kwargs'"):
        build_model({"class": "DecoderLM"})

    @register_model
    class RegisteredLM(DecoderLM):
        pass

    with pytest.raises(AttnlabError, match="a model class named DecoderLM is already registered"):
        register_model(type("DecoderLM", (torch.nn.Module,), {}))  # would take over every saved language model
    model = RegisteredLM(20, 16, 1, 2, max_positions=8).eval()
    write_run_config(tmp_path, {"task": "lm", "model": model_config(model)})
    save_weights(model, tmp_path / "model.safetensors")
    loaded, config = load_run(tmp_path, "lm")
    assert type(loaded) is RegisteredLM and config["model"]["class"] == "RegisteredLM"
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(loaded(ids), model(ids))


class WeightRecordingTask(ToyTask):
    """The toy task, noting the weights each step starts from (the weights after the step before)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen: list[list[torch.Tensor]] = []

    def loss(self, model, data):
        self.seen.append([p.detach().clone() for p in model.parameters()])
        return super().loss(model, data)


def ema_run(out, decay, steps=8, resume=False, fail_at_batch=-1):
    seed_everything(0)
    task = WeightRecordingTask(fail_at_batch=fail_at_batch)
    model = task.model(dropout=0.1)
    config = TrainConfig(max_steps=steps, lr=3e-3, warmup_steps=3, eval_every=4, progress=False, ema_decay=decay)
    trainer = Trainer(model, task, config, out)
    trainer.fit(resume=resume)
    return trainer, task


def test_ema_averages_the_weights_and_is_what_evaluation_keeps(tmp_path):
    decay = 0.6
    plain, task = ema_run(tmp_path / "plain", 0.0)
    averaged, _ = ema_run(tmp_path / "ema", decay)
    # The average does not change training: the raw weights end the same.
    for a, b in zip(plain.model.parameters(), averaged.model.parameters()):
        assert torch.equal(a, b)
    # Weights after steps 1..8: what steps 2..8 started from, then the final ones.
    after = task.seen[1:] + [[p.detach() for p in plain.model.parameters()]]
    expected, at_eval = None, {}
    for step, weights in enumerate(after, start=1):
        expected = weights if expected is None else [decay * e + (1 - decay) * w for e, w in zip(expected, weights)]
        at_eval[step] = expected
    for got, want in zip(averaged.averaged.module.parameters(), at_eval[8]):
        torch.testing.assert_close(got, want)
    assert not all(torch.equal(a, b) for a, b in zip(averaged.model.parameters(), averaged.averaged.module.parameters()))
    # model.safetensors holds the average at the best evaluation, not the raw weights.
    evals = [json.loads(x) for x in (tmp_path / "ema/metrics.jsonl").read_text().splitlines() if "eval" in x]
    best_step = [e["step"] for e in evals if e["best"]][-1]
    kept = ToyTask().model(dropout=0.1)
    load_weights(kept, tmp_path / "ema/model.safetensors")
    for got, want in zip(kept.parameters(), at_eval[best_step]):
        torch.testing.assert_close(got, want)


def test_ema_run_resumes_to_the_identical_average(tmp_path):
    straight, _ = ema_run(tmp_path / "a", 0.9, steps=12)
    with pytest.raises(KeyboardInterrupt):
        ema_run(tmp_path / "b", 0.9, steps=12, fail_at_batch=11)  # dies after the step-8 checkpoint
    assert (tmp_path / "b/checkpoint/averaged.safetensors").is_file()
    resumed, _ = ema_run(tmp_path / "b", 0.9, steps=12, resume=True)
    assert int(resumed.averaged.n_averaged) == 12
    for a, b in zip(straight.averaged.module.state_dict().values(), resumed.averaged.module.state_dict().values()):
        assert torch.equal(a, b)
    # A checkpoint without an average cannot resume a run that keeps one.
    plain_run = tmp_path / "c"
    train(plain_run, steps=4)
    with pytest.raises(AttnlabError, match="moving average"):
        ema_run(plain_run, 0.9, steps=8, resume=True)
    # ... nor the other way round: dropping the average on resume would change what the run keeps.
    with pytest.raises(AttnlabError, match="keeps none"):
        train(tmp_path / "b", steps=12, resume=True)


def test_ema_decay_outside_zero_one_is_rejected_before_a_run_folder_is_made(tmp_path):
    from click.testing import CliRunner

    from attnlab.cli.main import cli

    with pytest.raises(AttnlabError, match="EMA decay"):
        TrainConfig(ema_decay=1.0).validate()
    for bad, message in (({"grad_clip": -1.0}, "gradient clip"),
                         ({"min_lr": 1.0, "lr": 0.1}, r"final learning rate \(min_lr, --min-lr\) must be between 0 and "
                                                      r"the peak \(lr, --lr\) 0.1, got 1.0"),
                         ({"max_seconds": -1.0}, "time budget"), ({"warmup_steps": -5}, "warmup")):
        with pytest.raises(AttnlabError, match=message):
            TrainConfig(**bad).validate()
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n" * 50, encoding="utf-8")
    for side, line in (("de", "ein mann"), ("en", "a man")):
        (tmp_path / f"p.{side}").write_text(f"{line}\n" * 4, encoding="utf-8")
    commands = {
        "lm": ["train", "lm", "--text", text, "--steps", "2"],
        "translate": ["train", "translate", "--train", tmp_path / "p", "--valid", tmp_path / "p", "--max-steps", "2"],
    }
    for name, args in commands.items():
        out = tmp_path / name
        result = CliRunner().invoke(cli, [str(a) for a in [*args, "--out", out, "--ema", "-0.5", "--no-progress"]])
        assert result.exit_code == 2, result.output
        assert "'--ema': -0.5 is not in the range 0<=x<1" in result.output.strip().splitlines()[-1], result.output
        assert not out.exists()  # nothing half-made to trip over on the next try


def test_weights_of_another_shape_name_the_tensor_and_both_shapes(tmp_path):
    save_weights(DecoderLM(20, 16, 1, 2, max_positions=8), tmp_path / "w.safetensors")
    wider = DecoderLM(20, 32, 1, 2, max_positions=8)
    with pytest.raises(AttnlabError, match=r"does not match the model: body\.embed\.\w+\.(\w+\.)?weight is \(\d+, 16\) "
                                           r"in the file, \(\d+, 32\) in the model \(and \d+ more\)"):
        load_weights(wider, tmp_path / "w.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(AttnlabError, match="is not a readable safetensors file"):
        load_weights(wider, tmp_path / "junk.safetensors")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_holding_nan_or_infinity_are_refused_by_name(tmp_path, value):
    save_weights(DecoderLM(20, 16, 1, 2, max_positions=8), tmp_path / "w.safetensors")
    tensors = load_file(str(tmp_path / "w.safetensors"))
    name = next(n for n in tensors if n.endswith("self_attn.in_proj.weight"))
    tensors[name][0, 0] = value
    save_file(tensors, str(tmp_path / "w.safetensors"))
    with pytest.raises(AttnlabError, match=rf"w\.safetensors holds NaN or infinite values in {re.escape(name)}: "
                                           "these weights are damaged$"):
        load_weights(DecoderLM(20, 16, 1, 2, max_positions=8), tmp_path / "w.safetensors")


def test_every_model_class_a_task_registers_is_listed_where_load_run_finds_it():
    import importlib
    import pkgutil

    import attnlab.tasks
    from attnlab.training.checkpoint import MODEL_CLASSES, MODEL_MODULES

    for module in pkgutil.iter_modules(attnlab.tasks.__path__):
        importlib.import_module(f"attnlab.tasks.{module.name}")
    registered = {name: cls.__module__ for name, cls in MODEL_CLASSES.items() if cls.__module__.startswith("attnlab.tasks")}
    assert registered == MODEL_MODULES


@pytest.mark.parametrize("bad, message", [
    ({"max_steps": 2.5}, "max_steps must be a whole number, got 2.5"),
    ({"warmup_steps": math.inf}, "warmup_steps must be a whole number, got inf"),
    ({"grad_clip": math.nan}, "grad_clip must be a finite number, got nan"),
    ({"weight_decay": math.nan}, "weight_decay must be a finite number"),
    ({"betas": (1.5, 0.9)}, r"betas must be two numbers in \[0, 1\), got \(1.5, 0.9\)"),
    ({"device": "mps"}, "device must be 'auto', 'cpu' or 'cuda'"),
])
def test_settings_the_engine_cannot_honour_are_refused_by_name(bad, message, tmp_path):
    with pytest.raises(AttnlabError, match=message):
        TrainConfig(**bad).validate()


def test_numpy_integers_are_whole_numbers_too():
    import numpy as np

    config = TrainConfig(max_steps=np.int64(100), eval_every=np.int32(10))
    config.validate()
    assert type(config.max_steps) is int and config.max_steps == 100


def test_a_run_folder_that_is_a_file_is_one_error(tmp_path):
    (tmp_path / "file").write_text("x")
    task = ToyTask()
    with pytest.raises(AttnlabError, match="exists and is not a folder"):
        Trainer(task.model(), task, TrainConfig(max_steps=2, progress=False), tmp_path / "file")


def test_a_score_that_is_not_finite_stops_training_instead_of_never_keeping_weights(tmp_path):
    class Diverged(ToyTask):
        def evaluate(self, model):
            return {"score": math.nan}

    task = Diverged()
    trainer = Trainer(task.model(), task, TrainConfig(max_steps=4, eval_every=2, progress=False), tmp_path)
    with pytest.raises(TrainingError, match="the evaluation at step 2 gave a score of nan"):
        trainer.fit()

    class FiniteScore(ToyTask):  # an accuracy over NaN outputs is finite: those weights were kept as the best
        def evaluate(self, model):
            return {"loss": math.nan, "score": 0.25, "accuracy": 0.25}

    task = FiniteScore()
    out = tmp_path / "finite_score"
    trainer = Trainer(task.model(), task, TrainConfig(max_steps=4, eval_every=2, progress=False), out)
    with pytest.raises(TrainingError, match="the evaluation at step 2 gave a loss of nan: the model's outputs are "
                                            "no longer finite"):
        trainer.fit()
    assert not (out / "model.safetensors").exists()  # nothing was kept as the best


def test_a_run_the_time_budget_stops_says_so(tmp_path, monkeypatch):
    import attnlab.training.engine as engine

    def run(out):
        ticks = iter(range(10**6))  # a clock that moves 0.1 s each time it is read: no real time involved
        monkeypatch.setattr(engine.time, "perf_counter", lambda: next(ticks) * 0.1)
        task = ToyTask()
        return Trainer(task.model(), task, TrainConfig(max_steps=10_000, max_seconds=2.0, progress=False), out).fit()

    result = run(tmp_path / "a")
    assert result.out_of_time and 0 < result.steps < 40 and result.elapsed >= 2.0
    assert run(tmp_path / "b").steps == result.steps  # where the budget stops it follows from the clock alone
    monkeypatch.undo()
    task = ToyTask()
    full = Trainer(task.model(), task, TrainConfig(max_steps=3, progress=False), tmp_path / "full").fit()
    assert not full.out_of_time and full.steps == 3


def test_models_that_cannot_be_described_or_rebuilt_are_named(tmp_path):
    plain = type("NoConfig", (torch.nn.Module,), {})
    register_model(plain)
    with pytest.raises(AttnlabError, match="keeps no .config dict"):
        model_config(plain())
    with pytest.raises(AttnlabError, match="model description in the config is not usable"):
        build_model({"class": "DecoderLM", "kwargs": {"vocab_size": -1, "d_model": 8, "num_layers": 1,
                                                      "num_heads": 2}})


@pytest.mark.parametrize("fast", [False, True])
def test_bf16_on_hardware_without_bfloat16_units_gets_a_note(fast, tmp_path, monkeypatch, capsys):
    import attnlab.training.engine as engine

    monkeypatch.setattr(engine, "has_fast_bf16", lambda device: fast)
    task = ToyTask()
    trainer = Trainer(task.model(), task, TrainConfig(max_steps=1, bf16=True, device="cpu", progress=False),
                      tmp_path / "run")
    assert "bfloat16" not in capsys.readouterr().err  # said once, when it trains: a throw-away Trainer says nothing
    trainer.fit()
    note = "no native bfloat16 arithmetic" in capsys.readouterr().err
    assert note is not fast
    Trainer(task.model(), task, TrainConfig(max_steps=1, bf16=False, device="cpu", progress=False),
            tmp_path / "run2").fit()
    assert "bfloat16" not in capsys.readouterr().err  # float32 runs say nothing



def test_a_gpu_computes_bfloat16_natively_from_ampere_on_and_each_gpu_answers_for_itself(monkeypatch):
    from attnlab.training.engine import has_fast_bf16

    capability = {0: (7, 5), 1: (8, 0)}  # a Turing GPU 0 beside an Ampere GPU 1 (torchrun's LOCAL_RANK 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability[torch.device(device).index])
    monkeypatch.setattr(torch.version, "hip", None)
    assert not has_fast_bf16(torch.device("cuda:0")) and has_fast_bf16(torch.device("cuda:1"))


def test_a_new_length_is_said_as_a_re_planned_rate_only_where_the_length_enters_the_rate():
    from attnlab.training.schedules import Schedule, length_changed

    cosine = length_changed(Schedule("cosine", 1e-3, 10, 100, 1e-4), Schedule("cosine", 1e-3, 10, 200, 1e-4), 100)
    assert cosine == ("resume: the run now ends at step 200 instead of 100; its learning-rate schedule is re-planned "
                      "over 200 steps (at step 100: 0.0001 -> 0.00058), so it is not the run a fresh one of 200 steps "
                      "would make")
    for kind in ("inverse_sqrt", "constant"):
        before, after = Schedule(kind, 1e-3, 10, 100), Schedule(kind, 1e-3, 10, 200)
        assert all(before(s) == after(s) for s in range(300))  # the length does not enter the rate
        assert length_changed(before, after, 100).endswith(
            f"its {kind} learning-rate schedule does not depend on the length, so it goes on as a fresh run of 200 "
            "steps would")


def test_a_folder_another_process_trains_in_is_refused_and_its_run_left_whole(tmp_path, held_elsewhere):
    out = tmp_path / "run"
    out.mkdir()
    write_run_config(out, {"task": "toy"})  # that process's run, before its first checkpoint
    held_elsewhere(out)
    task = ToyTask(batch_size=8)
    with pytest.raises(AttnlabError, match=f"^{out} is in use: another attnlab process is training into it"):
        train_or_forget(task.model(0.0), task, TrainConfig(max_steps=2, progress=False), out, resume=False,
                        existed=True, task_files=[])
    # A run that fails before its first checkpoint removes its files: not the other process's.
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]



def test_a_folder_made_during_the_hold_is_locked_before_the_run_writes_into_it(tmp_path, held_elsewhere):
    from attnlab.files import ensure_writable_dir

    out = tmp_path / "run"
    with holding_run_folder(out):  # not there at the task's first check
        ensure_writable_dir(out)  # made: locked at once, before the run's first file
        assert not lockable_by_another_process(out)
    other = tmp_path / "other"
    with holding_run_folder(other):  # another process makes it and trains there first
        other.mkdir()
        held_elsewhere(other)
        with pytest.raises(AttnlabError, match="is in use: another attnlab process is training into it"):
            ensure_writable_dir(other)


def test_a_folder_that_cannot_be_locked_is_trained_in_unlocked(tmp_path, monkeypatch):
    import errno

    import attnlab.files as files

    def no_locks(fd, operation):  # NFS without a lock service
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(files.fcntl, "flock", no_locks)
    (tmp_path / "run").mkdir()
    task = ToyTask(batch_size=8)
    result = train_or_forget(task.model(0.0), task, TrainConfig(max_steps=4, eval_every=4, progress=False),
                             tmp_path / "run", resume=False, existed=True, task_files=[])
    assert result.steps == 4 and (tmp_path / "run" / "checkpoint").is_dir()


def lockable_by_another_process(folder) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), "
                            "fcntl.LOCK_EX | fcntl.LOCK_NB)", str(folder)], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 or "BlockingIOError" in probe.stderr, probe.stderr
    return probe.returncode == 0


def test_holds_of_one_process_share_the_folder_lock_and_the_last_one_out_lets_it_go(tmp_path):
    out = tmp_path / "run"
    with holding_run_folder(out):  # not made yet: nothing to lock
        out.mkdir()
        assert lockable_by_another_process(out)
        with holding_run_folder(out):  # made since: locked now, and this process's own hold is no refusal
            with holding_run_folder(out):
                pass
            assert not lockable_by_another_process(out)  # still held after the inner hold ended
        assert not lockable_by_another_process(out)  # the outer hold keeps it from the inner one's take on
    assert lockable_by_another_process(out)  # let go


def test_a_new_runs_first_files_go_again_when_it_stops_before_its_config(tmp_path):
    """Ctrl-C between the tokenizer and config.json left a folder that the same command refused (a file by a run's
    name) and --resume refused too (no config)."""
    from attnlab.training.checkpoint import first_files

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(KeyboardInterrupt), first_files(out, writer=True):
        (out / "tokenizer.json").write_text("{}")
        raise KeyboardInterrupt
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    with pytest.raises(OSError), first_files(out, writer=True):  # the config written: a run, kept as it is
        (out / "tokenizer.json").write_text("{}")
        write_run_config(out, {"task": "lm", "model": {}})
        raise OSError("disk full after the config")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.txt", "tokenizer.json"]
    (out / "config.json").unlink()
    with pytest.raises(KeyboardInterrupt), first_files(out, writer=False):  # another rank deletes nothing
        raise KeyboardInterrupt
    assert (out / "tokenizer.json").exists()


def test_a_run_without_kept_weights_is_told_what_to_do_by_its_state_and_kind(tmp_path, held_elsewhere):
    """The hint told a run still training that it had stopped (and to resume it, which its lock then refused), and a
    leak experiment's run to go on with --resume, which no command does for it."""
    model = DecoderLM(vocab_size=11, d_model=8, num_layers=1, num_heads=2, max_positions=8)

    def said(task, *, checkpoint=False):
        run = tmp_path / task / str(checkpoint)
        write_run_config(run, {"task": task, "model": model_config(model)})
        if checkpoint:
            save_checkpoint(run, model, torch.optim.AdamW(model.parameters()), {"step": 1})
        with pytest.raises(AttnlabError) as caught:
            load_weights(model, run / "model.safetensors")
        return str(caught.value).removeprefix(f"no weights file {run / 'model.safetensors'} "), run

    assert said("lm")[0] == "(the run stopped before its first checkpoint: attnlab train lm --resume)"
    assert said("translate", checkpoint=True)[0] == (
        "(the run has not evaluated yet: its kept weights are written at its first evaluation; attnlab train "
        "translate --resume)")
    assert said("lm-leak")[0] == ("(the run stopped before its first checkpoint: make it again (--resume continues "
                                  "runs of attnlab train only))")
    _, run = said("classify")
    held_elsewhere(run)  # training there now
    with pytest.raises(AttnlabError, match=r"\(the run is still training: its kept weights are written at its first "
                                           r"evaluation; wait for it\)$"):
        load_weights(model, run / "model.safetensors")


@pytest.mark.parametrize("fails_at_call, restored", [(3, True), (5, False)])
def test_a_resume_that_fails_before_its_checkpoint_moves_leaves_config_json_as_it_was(tmp_path, fails_at_call,
                                                                                       restored):
    """A resume given a learning rate that makes the loss NaN recorded it in config.json once the checkpoint had
    loaded, and kept it there after failing: the next plain --resume took it without a word. Once a checkpoint
    under the new settings is written (step 8 here), they are the run's."""
    seed_everything(0)
    task = ToyTask()
    Trainer(task.model(), task, TrainConfig(max_steps=4, eval_every=2, progress=False), tmp_path).fit()
    (tmp_path / "config.json").write_text('{"lr": 0.001}')

    class Exploding(ToyTask):
        def loss(self, model, data):
            loss = super().loss(model, data)
            return loss * math.nan if self.calls >= fails_at_call else loss

    def record():
        (tmp_path / "config.json").write_text('{"lr": 1e30}')

    task = Exploding()
    trainer = Trainer(task.model(), task, TrainConfig(max_steps=12, eval_every=4, progress=False), tmp_path)
    with pytest.raises(TrainingError, match="loss became nan"):
        trainer.fit(resume=True, on_resumed=record)
    assert json.loads((tmp_path / "checkpoint/trainer.json").read_text())["trainer"]["step"] == (4 if restored else 8)
    assert (tmp_path / "config.json").read_text() == ('{"lr": 0.001}' if restored else '{"lr": 1e30}')


def test_a_tied_score_keeps_the_weights_of_the_lower_loss():
    """--select bleu at a run's start: BLEU 0 at every evaluation kept the first, worst-trained weights."""
    from attnlab.training.engine import _better

    best = {"score": 0.0, "loss": 5.6, "step": 100}
    assert _better({"score": 0.0, "loss": 4.8}, 0.0, best)  # tied score, lower loss
    assert not _better({"score": 0.0, "loss": 5.9}, 0.0, best)
    assert not _better({"score": -0.1, "loss": 1.0}, 0.0, best)  # the score decides first
    assert _better({"score": 0.1, "loss": 9.0}, 0.0, best)
    assert not _better({"score": 0.0}, 0.0, {"score": 0.0})  # no loss to compare: the first is kept
    assert _better({"score": 0.0, "loss": 9.0}, -math.inf, {})  # the first evaluation


def test_evaluations_tied_on_the_score_keep_the_later_weights_of_lower_loss(tmp_path):
    class Tied(ToyTask):
        def evaluate(self, model):
            return {**super().evaluate(model), "score": 0.0}  # the loss still falls

    seed_everything(0)
    task = Tied()
    result = Trainer(task.model(), task, TrainConfig(max_steps=6, eval_every=2, lr=3e-3, progress=False),
                     tmp_path).fit()
    losses = [line["eval"]["loss"] for line in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
              if "eval" in line]
    assert result.best["step"] == 2 * (1 + losses.index(min(losses))) and losses[-1] < losses[0]
