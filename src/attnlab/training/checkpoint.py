"""Run folders and checkpoints: safetensors weights, JSON config, never a pickle.

A run folder holds::

    RUN/config.json          task name, model class and its keyword arguments, task settings
    RUN/tokenizer.json       the tokenizer (written by the task)
    RUN/model.safetensors    the best weights so far (what eval, predict and generate load)
    RUN/checkpoint/          the latest training state, for --resume:
        model.safetensors, optimizer.safetensors (AdamW moments, RNG state), trainer.json (step, ...),
        averaged.safetensors (the weights' moving average, when training keeps one)
    RUN/metrics.jsonl        one JSON object per logged step or evaluation
    RUN/loss.png             the loss curve, drawn at the end

Every file and the checkpoint folder are written under a temporary name and renamed into place
(:mod:`attnlab.files`), so a run killed at any moment leaves the previous good checkpoint intact.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.files import (
    atomic_dir,
    atomic_path,
    folder_in_use,
    recover_dir,
    refuse_non_folder,
    refuse_unwritable,
    said_by_path,
    write_json_atomic,
)
from attnlab.nn.models import DecoderLM, EncoderClassifier, Transformer
from attnlab.training.optimizers import Chain, needed_state

#: Model classes a run config may name, by class name: the core models, plus whatever a task module
#: registers with :func:`register_model` when it is imported (its own models, the experiments' subclasses).
MODEL_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in (Transformer, EncoderClassifier, DecoderLM)}

ModelClass = TypeVar("ModelClass", bound=type[nn.Module])


#: Where the registered classes that the core does not define live: a run config names the class, and a fresh
#: process that calls :func:`load_run` may not have imported the task that defines it yet.
MODEL_MODULES = {
    "TextClassifier": "attnlab.tasks.classify_models",
    "LeakyDecoderLM": "attnlab.tasks.leak",
    "LeakyTransformer": "attnlab.tasks.translate",
}


def register_model(cls: ModelClass) -> ModelClass:
    """Class decorator: let run configs name ``cls`` (it must keep its constructor arguments in ``.config``).

    Run configs name a class by its bare name, so a second class of a name already taken is refused: it would
    take over every run saved with the first (``Transformer``, say). The same class registered again (a module
    reloaded) replaces itself.
    """
    held = MODEL_CLASSES.get(cls.__name__)
    if held is not None and (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
        raise AttnlabError(f"a model class named {cls.__name__} is already registered (from {held.__module__}); "
                           "give yours another name")
    MODEL_CLASSES[cls.__name__] = cls
    return cls

CONFIG, WEIGHTS, CHECKPOINT = "config.json", "model.safetensors", "checkpoint"
TOKENIZER = "tokenizer.json"  # as Hugging Face tokenizers writes it (a translation run: "tokenizers" in CONFIG)
METRICS_FILE, LOSS_PLOT = "metrics.jsonl", "loss.png"
RESULT = "result.json"  # the report of a run that ended (or stopped)
AVERAGED = "averaged.safetensors"  # in CHECKPOINT/, when training keeps a moving average of the weights


#: What a run folder holds that its commands read back: settings, weights, tokenizers (JSON), the metrics
#: log and the resume checkpoint. A file a command writes on request may go beside them, never over them.
RUN_OWNED_SUFFIXES = (".json", ".jsonl", ".safetensors")
#: ... and the training curve, which nothing but training can draw again.
RUN_OWNED_NAMES = (LOSS_PLOT,)


def refuse_overwriting(path: str | Path, option: str, *, run: str | Path,
                       reads: tuple[tuple[str, str | Path | None], ...] = ()) -> None:
    """Refuse ``path`` as the output of ``option`` when writing it would destroy what the command or the run
    needs: a file the command reads (``reads``: (option, path) pairs; ``-`` is standard input) or a file that
    the run folder ``run`` holds for itself (its settings, weights, tokenizers, metrics, loss plot, checkpoint),
    or ``-``, which the commands that write a file do not take for standard output, or a folder.

    Raises:
        AttnlabError: naming the option and what the file is.
    """
    out = Path(path)
    if str(out) == "-":
        raise AttnlabError(f"{option} names a file; - (standard output) is not one here")
    if out.is_dir():  # said before the work, not when its result is written
        raise AttnlabError(f"{option} {out} is a folder; give a file name to write")
    refuse_unwritable(out, f"{option} {out}")  # (said before the work, not when its result is written)
    for name, source in reads:
        if source is None or str(source) == "-" or not out.exists() or not Path(source).exists():
            continue
        if out.samefile(source):
            raise AttnlabError(f"{option} {out} is the {name} file this command reads; writing there would replace "
                               "it: choose another name")
    inside = _inside_run(out, run)  # (links resolved: a link to the run's config is the config)
    if inside is not None and (inside.parts[0] == CHECKPOINT or (
            len(inside.parts) == 1 and out.resolve().exists()
            and (inside.suffix in RUN_OWNED_SUFFIXES or inside.name in RUN_OWNED_NAMES))):
        raise AttnlabError(f"{option} {out} is a file of the run {run} itself (its settings, weights, tokenizer, "
                           "metrics, loss plot or checkpoint); writing there would break the run: choose another name")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics log (``METRICS_FILE``) in order; none if it is missing.

    A line that is not a JSON object with a whole-number ``step`` (one cut short by a kill, bytes that are not
    UTF-8) is skipped: it spoils itself, not the log.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    records = []
    for raw in data.splitlines():
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            records.append(record)
    return records


#: The files a training writes into its run folder by these names (and CHECKPOINT/, written whole).
RUN_FILES = (CONFIG, WEIGHTS, TOKENIZER, METRICS_FILE, LOSS_PLOT, RESULT)


def refuse_input_in_run(path: str | Path | None, option: str, *, run: str | Path) -> None:
    """Refuse an input file of a training that the training would overwrite: a file of its run folder ``run``
    named as one the run writes (:data:`RUN_FILES`), or one in its checkpoint.

    Raises:
        AttnlabError: naming the option, the file and what the run writes there.
    """
    inside = None if path is None else _inside_run(path, run)
    if inside is not None and (inside.parts[0] == CHECKPOINT or (len(inside.parts) == 1 and inside.name in RUN_FILES)):
        raise AttnlabError(f"{option} {path} is a file the run writes in its folder {run} ({inside}): training would "
                           "overwrite it; move it out of the folder or choose another --out")


def _inside_run(path: str | Path, run: str | Path) -> Path | None:
    """Where ``path`` lies in the run folder ``run`` (links resolved), relative to it; None when outside it."""
    run_dir, target = Path(run).resolve(), Path(path).resolve()
    return target.relative_to(run_dir) if run_dir in target.parents else None


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel (or compiled) wrapper."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def save_weights(model: nn.Module, path: str | Path) -> None:
    """Write the model's weights as safetensors, atomically. Tied weights are stored once."""
    with said_by_path(path, also=(SafetensorError,)), atomic_path(path) as tmp:  # (safetensors' own error type)
        save_model(unwrap(model), str(tmp))


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load safetensors weights into ``model``; a missing or corrupt file is an :class:`AttnlabError`."""
    _load_into(unwrap(model), Path(path))


#: The run kinds ``attnlab train KIND --resume`` continues (the leak experiment's runs are made again instead).
RESUMABLE = ("lm", "classify", "translate")


def _missing_weights_hint(run: Path) -> str:
    """Why a run folder holds no kept weights yet, and what to do, for the error that says so."""
    if folder_in_use(run):
        return " (the run is still training: its kept weights are written at its first evaluation; wait for it)"
    try:
        task = json.loads((run / CONFIG).read_text(encoding="utf-8")).get("task")
    except (OSError, ValueError, AttributeError):  # (its own error comes when the run is read as a run)
        task = None
    if task in RESUMABLE:
        go_on = f"attnlab train {task} --resume"
    else:
        go_on = "make it again (--resume continues runs of attnlab train only)"
    if has_checkpoint(run):
        return f" (the run has not evaluated yet: its kept weights are written at its first evaluation; {go_on})"
    return f" (the run stopped before its first checkpoint: {go_on})"


def _load_into(model: nn.Module, path: Path) -> None:
    """Load ``path`` into exactly this module (no unwrapping: an ``AveragedModel`` keeps its counter)."""
    if not path.is_file():
        hint = ""
        if path.name == WEIGHTS and (path.parent / CONFIG).is_file():
            hint = _missing_weights_hint(path.parent)
        raise AttnlabError(f"no weights file {path}{hint}")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        mismatch = _shape_mismatch(model, path)
        if mismatch:  # torch's own message starts with a header line that names nothing
            raise AttnlabError(f"{path} does not match the model: {mismatch}") from err
        raise AttnlabError(f"{path} is not a readable safetensors file for this model ({str(err).splitlines()[0]})") from err
    if missing or unexpected:
        raise AttnlabError(f"{path} does not match the model: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    _refuse_not_finite(model, path)


def _refuse_not_finite(model: nn.Module, path: Path) -> None:
    """Weights holding NaN or infinity are damaged: training stops at a loss that is not finite before it keeps
    such weights, so they come from a damaged or edited file. Served anyway, greedy decoding picked the padding
    id out of NaN scores and blamed the padding, and beam search printed a word with exit status 0."""
    with safe_open(str(path), framework="pt") as f:  # named as the file stores them: tied names are one tensor
        stored = set(f.keys())
    bad = [name for name, t in model.state_dict().items()
           if name in stored and t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise AttnlabError(f"{path} holds NaN or infinite values in {bad[0]}{more}: these weights are damaged")


def _shape_mismatch(model: nn.Module, path: Path) -> str:
    """The first tensor whose shape differs between the file and ``model`` ("" if none, or unreadable)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            in_file = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError):
        return ""
    differ = [f"{name} is {in_file[name]} in the file, {tuple(t.shape)} in the model"
              for name, t in model.state_dict().items() if name in in_file and in_file[name] != tuple(t.shape)]
    return differ[0] + (f" (and {len(differ) - 1} more)" if len(differ) > 1 else "") if differ else ""


def model_config(model: nn.Module) -> dict[str, Any]:
    """``{"class": ..., "kwargs": ...}`` for a registered model, enough to rebuild it."""
    inner = unwrap(model)
    name = type(inner).__name__
    if name not in MODEL_CLASSES:
        raise AttnlabError(f"cannot save a model of class {name}: it is not registered (register_model)")
    if not isinstance(getattr(inner, "config", None), dict):
        raise AttnlabError(f"cannot save a model of class {name}: it keeps no .config dict of its constructor "
                           "arguments, which rebuilding it needs")
    return {"class": name, "kwargs": dict(inner.config)}


def build_model(spec: dict[str, Any]) -> nn.Module:
    """Rebuild a model from :func:`model_config`'s output."""
    if not isinstance(spec, dict) or not isinstance(spec.get("kwargs"), dict):
        raise AttnlabError("model description in the config is not usable: it needs 'class' and 'kwargs'")
    name = spec.get("class")
    if not isinstance(name, str):
        raise AttnlabError(f"model description in the config is not usable: its class is {name!r}, not a name")
    if name not in MODEL_CLASSES and name in MODEL_MODULES:
        importlib.import_module(MODEL_MODULES[name])  # registers it
    cls = MODEL_CLASSES.get(name)
    if cls is None:
        raise AttnlabError(f"the config names the model class {spec.get('class')!r}, which no loaded module registers")
    try:
        return cls(**spec["kwargs"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:  # RuntimeError: torch refusing a size
        raise AttnlabError(f"model description in the config is not usable: {err}") from err


#: A run's tokenizer: ``tokenizer.json``, or a translation's ``tokenizer.de.json`` (``tokenizer.pt.BR.json`` for
#: ``--src pt.BR``), not Hugging Face's ``tokenizer_config.json``, which may stay beside a run.
_TOKENIZER_NAME = re.compile(r"tokenizer(\..+)?\.json")


def why_run_folder_taken(out: str | Path, task: str) -> str | None:
    """Why a new ``task`` run cannot start in ``out`` (the line to say), or None when it can.

    A folder holds a run when it holds a ``config.json``; otherwise a new run still refuses one that holds a file
    by a name it writes (:data:`RUN_FILES`, a tokenizer, a checkpoint): those were replaced without a word, deleted
    when the new run failed, and a checkpoint left without its config was resumed as the new run's own. Only a
    run of the same task can be resumed, so only then is ``--resume`` suggested."""
    out = Path(out)
    config = out / CONFIG
    if config.exists():
        try:
            other = json.loads(config.read_text(encoding="utf-8")).get("task")
        except (OSError, ValueError, AttributeError):  # unreadable or not an object: a run's file all the same
            other = None
        if isinstance(other, str) and other != task:
            return f"{out} already holds a '{other}' run; choose another --out"
        return f"{out} already holds a run; pass --resume to continue it or choose another --out"
    has_checkpoint(out)  # (puts back a checkpoint whose replacement was interrupted, to be seen below)
    names = [p.name for p in out.iterdir()] if out.is_dir() else []
    written = sorted(n for n in names if n in RUN_FILES or n == CHECKPOINT or _TOKENIZER_NAME.fullmatch(n))
    if written:
        return (f"{out} holds {', '.join(written)}, by names a new run writes there (and no {CONFIG} to resume); "
                "choose another --out")
    return None


def refuse_bad_run_path(out: str | Path) -> None:
    """Refuse an ``--out`` that cannot be a run folder, before the data is read: one that exists and is not a
    folder (see :func:`~attnlab.files.refuse_non_folder`), or a name that is not UTF-8, under which safetensors
    writes no weights: such a run trained to its end and then failed, as did every --resume and generate; or a
    place where no folder can be made or written (checked before a tokenizer is trained, say, not after)."""
    refuse_non_folder(out, "--out")
    refuse_unwritable(Path(out) / CONFIG, f"--out {out}")  # (a file in it: the folder, or where it will be made)
    try:
        os.fsencode(out).decode("utf-8")
    except UnicodeError:
        raise AttnlabError(f"--out {out} is not a UTF-8 name, and safetensors reads and writes weights only under "
                           "UTF-8 paths; choose another name") from None


def refuse_existing_run(out: str | Path, task: str) -> None:
    """Refuse to start a new ``task`` run in ``out`` if it holds one (see :func:`why_run_folder_taken`). A task
    checks before it reads anything, and again once it holds the folder's lock
    (:func:`~attnlab.training.engine.refuse_run_taken_meanwhile`)."""
    reason = why_run_folder_taken(out, task)
    if reason:
        raise AttnlabError(reason)


def write_run_config(run_dir: str | Path, config: dict[str, Any]) -> None:
    """Write ``RUN/config.json`` (must hold ``task`` and ``model``)."""
    write_json_atomic(Path(run_dir) / CONFIG, config)


@contextmanager
def first_files(out: Path, *, writer: bool) -> Iterator[None]:
    """Around a new run's first files, its tokenizers and then ``config.json``: if the block does not get to the
    config (Ctrl-C, a full disk), the files it made go again, so that the same command can start over. A folder
    left holding a tokenizer without a config was refused by that command (a file by a run's name) and by
    ``--resume`` (no run). ``writer``: the process that writes (rank 0); the others only run the block."""
    before = {p.name for p in out.iterdir()} if writer and out.is_dir() else set()
    try:
        yield
    except BaseException:
        if writer and not (out / CONFIG).exists():
            for made in [p for p in out.iterdir() if p.name not in before and p.is_file()]:
                made.unlink(missing_ok=True)
        raise


def ignored_on_resume(requested: dict[str, Any], saved: dict[str, Any], what: str = "settings") -> str | None:
    """The line a resumed run prints when the command line asks for settings the run's saved ones overrule.

    Args:
        requested: the settings the command line gave (only those it gave, where it can tell).
        saved: the run's settings from ``config.json``.
        what: how to call them in the line.

    Returns:
        ``resume: the run's saved settings are used; ignored: lr=0.01 (the run has 0.001), ...`` or None.
    """
    requested, saved = json.loads(json.dumps(requested)), json.loads(json.dumps(saved))  # tuples as lists
    ignored = {k: v for k, v in requested.items() if k in saved and saved[k] != v}
    if not ignored:
        return None
    return (f"resume: the run's saved {what} are used; ignored: "
            + ", ".join(f"{k}={v!r} (the run has {saved[k]!r})" for k, v in sorted(ignored.items())))


def read_run_config(run_dir: str | Path, task: str | None = None) -> dict[str, Any]:
    """Read ``RUN/config.json``; check that the folder is a run of ``task`` when given."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    if not run_dir.exists():
        raise AttnlabError(f"{run_dir} does not exist: no run there")
    if not run_dir.is_dir():
        raise AttnlabError(f"{run_dir} is not a folder")
    if path.is_dir():
        raise AttnlabError(f"{path} is a folder, not a run's config file")
    if not path.is_file():
        raise AttnlabError(f"{run_dir} is not an attnlab run folder (no {CONFIG})")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AttnlabError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict) or "task" not in config or "model" not in config:
        raise AttnlabError(f"{path} is not an attnlab run config (no 'task' or 'model')")
    if task is not None and config["task"] != task:
        raise AttnlabError(f"{run_dir} is a '{config['task']}' run, not a '{task}' run")
    return config


def load_run(run_dir: str | Path, task: str | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The trained model of a run folder (best weights, eval mode) and its config."""
    config = read_run_config(run_dir, task)
    model = build_model(config["model"])
    load_weights(model, Path(run_dir) / WEIGHTS)
    return model.eval(), config


def rng_state() -> dict[str, torch.Tensor]:
    """This process's random generators: torch's CPU one and, where there is one, the current GPU's."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _rng_key(kind: str, rank: int) -> str:
    return f"rng.{kind}" if rank == 0 else f"rng.{kind}.rank{rank}"


def save_checkpoint(
    run_dir: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | Chain, trainer_state: dict[str, Any], *,
    averaged: nn.Module | None = None, rng_states: list[dict[str, torch.Tensor]] | None = None,
) -> None:
    """Write ``RUN/checkpoint/`` whole: weights, optimizer moments, RNG states, the trainer's counters and, if
    given, the averaged model (its weights and how many steps it has averaged).

    ``rng_states`` holds each process's :func:`rng_state` in rank order (under DDP every process starts from the
    same seed, and the streams part once the shares of a batch differ in size, as each process draws dropout for
    its own share); None means this process's alone.
    """
    tensors: dict[str, torch.Tensor] = {}
    for rank, generators in enumerate(rng_states or [rng_state()]):
        tensors |= {_rng_key(kind, rank): value for kind, value in generators.items()}
    state = optimizer.state_dict()
    for index, per_param in state["state"].items():
        for key, value in per_param.items():
            tensors[f"state.{index}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    folder = Path(run_dir) / CHECKPOINT
    with said_by_path(folder, also=(SafetensorError,)), atomic_dir(folder) as tmp:
        save_model(unwrap(model), str(tmp / WEIGHTS))
        if averaged is not None:
            save_model(averaged, str(tmp / AVERAGED))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer.json").write_text(
            json.dumps({"trainer": trainer_state, "param_groups": state["param_groups"],
                        # (which parameters have state, kept apart from the moments: a parameter that never had a
                        # gradient has none, so a file lacking one's whole state could not be told from it)
                        "params_with_state": sorted(state["state"])}, indent=2), encoding="utf-8"
        )


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``RUN/checkpoint/`` exists (after repairing an interrupted replacement)."""
    recover_dir(Path(run_dir) / CHECKPOINT)
    return (Path(run_dir) / CHECKPOINT / "trainer.json").is_file()


def _step_count(trainer: Any) -> int:
    """The step of a checkpoint's counters; ValueError unless it is a count (a schedule at step "5" or -5 is no run's)."""
    step = trainer.get("step") if isinstance(trainer, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"trainer.json's step is {step!r}, not a count of steps")
    return step


def checkpoint_progress(run_dir: str | Path) -> tuple[int, float, bool]:
    """(step, training seconds, stopped early) of ``RUN/checkpoint/``: how far the run had got when it was last
    saved, and whether early stopping had ended it there."""
    path = Path(run_dir) / CHECKPOINT / "trainer.json"
    try:
        trainer = json.loads(path.read_text(encoding="utf-8"))["trainer"]
        return _step_count(trainer), float(trainer["elapsed"]), bool(trainer.get("stopped_early", False))
    except KeyError as err:  # (its text alone, "'trainer'", named nothing)
        raise AttnlabError(f"checkpoint in {path.parent} is damaged: trainer.json has no {err} entry") from err
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as err:
        raise AttnlabError(f"checkpoint in {path.parent} is damaged: {err}") from err


def refuse_shorter(run_dir: str | Path, steps: int, option: str) -> int:
    """The step ``RUN/checkpoint/`` has reached, refused if it is past ``steps``, the length the run is given
    (``option`` names the setting to raise)."""
    reached = checkpoint_progress(run_dir)[0]
    if reached > steps:
        raise AttnlabError(f"{run_dir} has reached step {reached}, past the {steps} step{'s' if steps != 1 else ''} it "
                           f"is given; to go on, resume with {option} more than {reached}")
    return reached


def _reported_step(run_dir: Path) -> int | None:
    """The step the run's report (``result.json``, every task's has ``steps``) describes; None without one."""
    try:
        return int(json.loads((run_dir / RESULT).read_text(encoding="utf-8"))["steps"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def refuse_restart_over_a_report(run_dir: str | Path) -> None:
    """Refuse to start a run again from step 0 (a resume without a checkpoint) over the report of one that ran:
    a run killed before its first checkpoint has written none, so a ``result.json`` without ``checkpoint/``
    means the checkpoint was deleted, and a restart would train its weights and report over again. A
    ``checkpoint/`` without its ``trainer.json`` is refused as damaged (the folder is written whole, under a
    temporary name): a restart would have trained over it from step 0."""
    run_dir = Path(run_dir)
    if has_checkpoint(run_dir):
        return
    folder = run_dir / CHECKPOINT
    if folder.exists() or folder.is_symlink():
        if folder.is_dir():
            held = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
            damage = f"trainer.json is missing (the folder holds {held})"
        else:
            damage = "it is not a folder"
        raise AttnlabError(f"checkpoint in {folder} is damaged: {damage}; train into another --out, or remove the "
                           "run's files to start it again")
    if (run_dir / RESULT).exists():
        raise AttnlabError(f"{run_dir} holds the report of a run that ran ({RESULT}) but no {CHECKPOINT}/ to resume "
                           "from: resuming would train it again from step 0 over its weights; train into another "
                           "--out, or remove the run's files to start it again")


def refuse_ended(run_dir: str | Path, *, steps: int, max_seconds: float, steps_option: str,
                 lengthened: bool = False) -> int:
    """Refuse to resume a run that has ended, or whose checkpoint is past ``steps`` (:func:`refuse_shorter`), saying
    what ended it and how it could go on, instead of redoing its final evaluation and report (and taking no step).
    Returns the step the checkpoint has reached (0 without one).

    A run has ended when its checkpoint was ended by early stopping, spent its time budget (``max_seconds``, 0:
    none) or reached its last step (``steps``), and it wrote its report of that step. Without it (killed before
    it, the report of an earlier stop left in the folder) a plain resume is let through to write it; one ``lengthened`` to more steps is still refused if early stopping
    or the budget would keep it from taking them. The checkpoint, not the report, says how far the run got: a
    later resume may have gone further before it was interrupted, leaving the earlier report.
    """
    run_dir = Path(run_dir)
    if not has_checkpoint(run_dir):
        return 0
    refuse_shorter(run_dir, steps, steps_option)
    reached, seconds, stopped_early = checkpoint_progress(run_dir)
    reported = _reported_step(run_dir) == reached  # a report of an earlier stop does not count
    if stopped_early and (reported or lengthened):
        raise AttnlabError(f"{run_dir} was ended by early stopping at step {reached}, which is part of the run: it "
                           "takes no further step; train a new run with a larger --patience (0: none)")
    # (a run that has reached its last step has finished, whatever its time: the budget did not stop it)
    if max_seconds and seconds >= max_seconds and reached < steps and (reported or lengthened):
        # (the budget in force: the run's own, or the one this resume gives, which may be smaller than it was; the
        # advice rounded up, past what it has used)
        enough = (math.floor(seconds * 10) + 1) / 10
        raise AttnlabError(f"{run_dir} has used {seconds:.1f} s of training, all of its time budget (--max-seconds "
                           f"{max_seconds:g}), after {reached} of {steps} steps; resume with --max-seconds {enough:.1f} "
                           "or more (0: no limit)")
    if reported and reached >= steps:
        raise AttnlabError(f"{run_dir} has finished its {reached} steps (its report is in {RESULT}); nothing to "
                           f"resume, unless with {steps_option} more than {reached} to take it further")
    return reached


def _optimizer_state(tensors: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer | Chain,
                     with_state: Any = None) -> dict[int, dict[str, Any]]:
    """The per-parameter state of ``optimizer.state_dict()`` from its saved ``state.INDEX.KEY`` tensors, checked
    against the optimizer's parameters: torch would take moments of another shape (and its fused kernel compute
    with them), fail later deep inside a step on a missing one, or start a parameter whose whole state is gone from
    zero moments. ``with_state`` lists the indices saved with state (None: a checkpoint from before it was kept).
    ValueError names what does not fit."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        parts = name.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit() or int(parts[1]) >= len(params):
            raise ValueError(f"{name} is no state of this optimizer's {len(params)} parameters")
        per_param.setdefault(int(parts[1]), {})[parts[2]] = value
    if with_state is not None:
        if not isinstance(with_state, list) or not all(type(i) is int for i in with_state):
            raise ValueError(f"trainer.json's params_with_state is {with_state!r}, not a list of indices")
        if missing := sorted(set(with_state) - set(per_param)):
            many = len(missing) > 1
            raise ValueError(f"the state{'s' if many else ''} of parameter{'s' if many else ''} "
                             f"{', '.join(map(str, missing))} {'are' if many else 'is'} missing (saved with state, "
                             "none found)")
        if extra := sorted(set(per_param) - set(with_state)):
            raise ValueError(f"it holds state for parameter{'s' if len(extra) > 1 else ''} "
                             f"{', '.join(map(str, extra))}, saved as having none")
    needed = needed_state(optimizer)
    found: dict[frozenset[str], set[frozenset[str]]] = {}  # what each kind of parameter's state holds
    for index, state in per_param.items():
        found.setdefault(needed[index], set()).add(frozenset(state))
    for need, keys in found.items():  # (Muon's matrices and AdamW's other parameters hold different entries)
        if len(keys) > 1:
            raise ValueError(f"its parameters' states hold different entries: {sorted(sorted(k) for k in keys)}")
        if not need <= next(iter(keys)):
            raise ValueError(f"the optimizer's state lacks {', '.join(sorted(need - next(iter(keys))))}")
    for index, state in per_param.items():
        for key, value in state.items():
            if value.dim() and value.shape != params[index].shape:
                raise ValueError(f"state.{index}.{key} is {tuple(value.shape)}, its parameter "
                                 f"{tuple(params[index].shape)}")
    return per_param


def load_checkpoint(run_dir: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | Chain, *,
                    averaged: nn.Module | None = None, rank: int = 0) -> dict[str, Any]:
    """Restore weights, optimizer, RNG and the averaged model from ``RUN/checkpoint/``; return the counters.

    Process ``rank`` takes the random generators saved for it, or rank 0's when the run was saved by fewer
    processes (the counters hold ``world``, the number that saved it).
    """
    folder = Path(run_dir) / CHECKPOINT
    if not has_checkpoint(run_dir):
        raise AttnlabError(f"nothing to resume: {folder} holds no checkpoint")
    load_weights(model, folder / WEIGHTS)
    kept = (folder / AVERAGED).is_file()
    if kept != (averaged is not None):  # resuming with other settings would drop or invent the average silently
        raise AttnlabError(f"checkpoint in {folder} {'holds a' if kept else 'holds no'} moving average of the weights, "
                           f"but this run {'keeps none (resume with the same --ema)' if kept else 'keeps one'}")
    if averaged is not None:
        _load_into(averaged, folder / AVERAGED)
    try:
        tensors = load_file(str(folder / "optimizer.safetensors"))
        meta = json.loads((folder / "trainer.json").read_text(encoding="utf-8"))
    except (SafetensorError, OSError, json.JSONDecodeError) as err:
        raise AttnlabError(f"checkpoint in {folder} is damaged: {err}") from err
    rng = {name: tensors.pop(name) for name in [n for n in tensors if n.startswith("rng.")]}
    if "rng.torch" not in rng:
        raise AttnlabError(f"checkpoint in {folder} is damaged: it holds no random generator state")
    try:  # checked before anything is set: a damaged checkpoint leaves the model's optimizer and streams alone
        per_param = _optimizer_state(tensors, optimizer, meta.get("params_with_state") if isinstance(meta, dict) else None)
    except ValueError as err:
        raise AttnlabError(f"checkpoint in {folder} is damaged: {err}") from err
    try:
        torch.set_rng_state(rng.get(_rng_key("torch", rank), rng["rng.torch"]))
        cuda = rng.get(_rng_key("cuda", rank), rng.get("rng.cuda"))
        if cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda)
    except (RuntimeError, TypeError) as err:  # a state of another size or type
        raise AttnlabError(f"checkpoint in {folder} is damaged: its random generator state: {err}") from err
    # The optimizer was built from this run's settings: it takes the saved moments, but keeps its own weight
    # decay, betas and the rest (load_state_dict would put back the saved ones under settings that say otherwise).
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict({"state": per_param, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError) as err:
        raise AttnlabError(f"checkpoint in {folder} does not fit this optimizer: {err}") from err
    for group, own in zip(optimizer.param_groups, settings, strict=True):
        group.update(own)
    counters = meta.get("trainer")
    try:
        _step_count(counters)
    except ValueError as err:
        raise AttnlabError(f"checkpoint in {folder} is damaged: {err}") from err
    return counters
