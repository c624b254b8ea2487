"""The leak experiment: a decoder whose look-ahead mask never reaches attention (seed 000, review question 4).

Two tiny LMs are trained with the same settings, seed and batches: one with the causal mask, one
without (:class:`LeakyDecoderLM`). The leaky one can read the token it is asked to predict, so its
*teacher-forced* loss, training and validation alike, falls far below the honest model's: a held-out loss
does not catch the bug, because teacher-forced evaluation hands the model the future exactly as training
did. Generation does: with nothing after the current position to copy, the leaky model's next-token loss
is bad and its free-running text is useless. The causal check (``attnlab check --kind decoder``) catches it
without any training at all.

The leak is a subclass here, not a switch in the core: the core's :class:`~attnlab.nn.DecoderLM` has no way
to turn its mask off.
"""

from __future__ import annotations

import math
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.checks import Contract, run_checks
from attnlab.checks.report import CheckReport
from attnlab.errors import AttnlabError
from attnlab.files import (
    ensure_writable_dir,
    holding_run_folder,
    write_json_atomic,
    write_text_atomic,
)
from attnlab.nn.models import DecoderLM
from attnlab.tasks.lm import LMData, load_lm_data, random_windows, seeded_generator
from attnlab.tasks.lm_train import LMSettings, train_language_model
from attnlab.tasks.sampling import generate
from attnlab.training.checkpoint import METRICS_FILE, load_run, read_metrics, refuse_bad_run_path, register_model
from attnlab.training.plots import save_figure

#: The short budget both models get (seconds each on two CPU cores). Rotary positions make "attend to the
#: next position" the same pattern at every position, so the unmasked model finds the copy within this budget
#: (with learned positions it must learn it position by position and the leak shows only after longer).
LEAK_SETTINGS = LMSettings(layers=2, heads=4, width=64, context=32, positions="rotary", batch_size=16, steps=300,
                           lr=3e-3, min_lr=3e-4, warmup=20, eval_every=0, eval_iters=20, final_eval_iters=50,
                           log_every=10, seed=0)


#: The ``task`` of the leaky model's run folder: ``attnlab generate`` (which loads ``lm`` runs only) refuses it.
LEAKY_TASK_NAME = "lm-leak"


@register_model
class LeakyDecoderLM(DecoderLM):
    """:class:`DecoderLM` with its causal mask removed: every position attends to the whole window.

    The bug of seed 000's review question 4 (a look-ahead mask passed where it is never applied). Same
    parameters, same forward otherwise; with a KV cache nothing after the newest token exists, so only a
    full-window forward shows the leak.
    """

    def forward(self, ids: Tensor, *, caches: list | None = None,
                return_attention: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """(batch, seq) ids -> logits (batch, seq, vocab); position t sees **all** positions."""
        states, weights = self.body(ids, attend_mask=None, need_weights=return_attention, caches=caches)
        logits = self.lm_head(states)
        return (logits, weights) if return_attention else logits


def load_trained(run: str | Path) -> DecoderLM:
    """The model of one of the experiment's run folders (either class), in eval mode."""
    model, _ = load_run(run)
    if not isinstance(model, DecoderLM):
        raise AttnlabError(f"{run} holds a {type(model).__name__}, not a model of the leak experiment")
    return model


@torch.no_grad()
def future_absent_loss(model: DecoderLM, ids: Tensor, *, context: int, windows: int = 16, seed: int = 0) -> float:
    """Next-token loss (nats) when nothing after the current position exists, as in generation.

    For each of ``windows`` random windows and each position t, the model is run on the prefix 0..t alone
    and its last output scored against token t + 1: one forward per prefix length, batched over windows.
    For a causal model this equals the teacher-forced loss on the same windows; for a leaky one it is
    the loss it really has when it writes.
    """
    x, y = random_windows(ids, context, windows, seeded_generator("future-absent", seed))
    total = 0.0
    for t in range(context):
        logits = model(x[:, : t + 1])[:, -1]  # (windows, vocab)
        total += float(F.cross_entropy(logits.float(), y[:, t], reduction="sum"))
    return total / (windows * context)


@torch.no_grad()
def teacher_forced_loss(model: DecoderLM, ids: Tensor, *, context: int, windows: int = 16, seed: int = 0) -> float:
    """Loss (nats) on the same windows as :func:`future_absent_loss`, all positions in one forward."""
    x, y = random_windows(ids, context, windows, seeded_generator("future-absent", seed))
    return float(F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()))


@dataclass
class LeakRow:
    """One model's line in the table."""

    name: str
    val_loss: float
    same_windows_teacher_forced: float
    future_absent: float
    check_status: str
    check_summary: str
    sample: str


def _plot(out_png: Path, rows: list[LeakRow], curves: dict[str, list[tuple[int, float]]], uniform: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"causal": "#4682B4", "leaky": "#C0504D"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in curves.items():
        if points:
            left.plot(*zip(*points), label=f"{name}: training loss (teacher-forced)", color=colors[name])
    left.axhline(uniform, color="grey", linestyle=":", label=f"uniform guess, ln V = {uniform:.2f}")
    left.set(xlabel="step", ylabel="nats per token", title="Training loss, teacher-forced")
    left.legend(fontsize=8)
    left.grid(linestyle="--", alpha=0.4)
    kinds = ["teacher-forced\n(validation windows)", "future absent, same windows\n(as in generation)"]
    width = 0.38
    for i, row in enumerate(rows):
        values = [row.same_windows_teacher_forced, row.future_absent]
        bars = right.bar([k + (i - 0.5) * width for k in range(2)], values, width, label=row.name,
                         color=colors[row.name])
        right.bar_label(bars, fmt="%.2f", fontsize=8)
    right.axhline(uniform, color="grey", linestyle=":")
    right.set_xticks(range(2), kinds)
    right.set(ylabel="nats per token", title="Validation windows: future present and absent")
    right.legend(fontsize=8)
    right.grid(axis="y", linestyle="--", alpha=0.4)
    fig.tight_layout()
    save_figure(fig, out_png, option="the leak plot", dpi=100)
    plt.close(fig)


def _training_curve(run: Path) -> list[tuple[int, float]]:
    points = []
    for record in read_metrics(run / METRICS_FILE):
        if "loss" in record and "eval" not in record:
            points.append((record["step"], record["loss"]))
    return points


CHECK_FACTORIES = '''"""Factories for `attnlab check`, written by `attnlab experiment leak`: its two trained models."""

from pathlib import Path

from attnlab.tasks.leak import load_trained

HERE = Path(__file__).resolve().parent


def causal():
    return load_trained(HERE / "causal")


def leaky():
    return load_trained(HERE / "leaky")
'''


@dataclass
class LeakResult:
    rows: list[LeakRow]
    reports: dict[str, CheckReport]
    commands: dict[str, str]
    out: Path
    prompt: str


#: What the experiment writes in its ``out`` folder. A folder holding any of them (a finished experiment, or
#: the start of one that stopped) is refused before anything is written: nothing is overwritten or mixed.
CHECK_FILE = "check_models.py"  # the factories `attnlab check` loads the two models with
OUT_ENTRIES = ("causal", "leaky", CHECK_FILE, "leak.json", "leak.png")

#: The causal check's contract needs a vocabulary of at least 4 ids: 3 distinct characters and the padding id.
MIN_DISTINCT_CHARACTERS = 3


def _shortest_text(settings: LMSettings) -> int:
    """The fewest characters whose split leaves both parts longer than the context (character tokenizer)."""
    n = settings.context + 1
    while min(int(n * (1.0 - settings.val_fraction)), n - int(n * (1.0 - settings.val_fraction))) <= settings.context:
        n += 1
    return n


def _refuse_earlier_experiment(out: Path) -> None:
    """Refuse an ``out`` that holds any entry of an experiment (:data:`OUT_ENTRIES`)."""
    found = [name + ("/" if (out / name).is_dir() else "") for name in OUT_ENTRIES if (out / name).exists()]
    if found:
        raise AttnlabError(f"{out} already holds a leak experiment or part of one ({', '.join(found)}); "
                           f"choose another --out, or delete {'it' if len(found) == 1 else 'them'} from {out} to run "
                           "it there again")


def check_leak_experiment(text: str | Path, out: str | Path, settings: LMSettings = LEAK_SETTINGS, *,
                          sample_tokens: int = 200) -> LMData:
    """Check the settings, the ``out`` folder and the text, writing nothing; return the text's data.

    Every refusal is an :class:`AttnlabError` naming the command's option or the file at fault, raised
    before :func:`run_leak_experiment` creates or writes anything.
    """
    if settings.steps < 1:
        raise AttnlabError(f"--steps must be at least 1, got {settings.steps}")
    if sample_tokens < 1:
        raise AttnlabError(f"--sample-tokens must be at least 1, got {sample_tokens}")
    settings.train_config().validate()
    out = Path(out)
    refuse_bad_run_path(out)
    _refuse_earlier_experiment(out)
    data = load_lm_data(text, tokenizer=settings.tokenizer, val_fraction=settings.val_fraction,
                        bpe_vocab_size=settings.bpe_vocab_size)
    distinct = data.tokenizer.vocab_size - 1  # the padding id is no character
    if distinct < MIN_DISTINCT_CHARACTERS:
        raise AttnlabError(f"{text} has only {distinct} distinct character{'s' if distinct != 1 else ''}; "
                           f"the leak experiment needs at least {MIN_DISTINCT_CHARACTERS}")
    if min(len(data.train), len(data.val)) <= settings.context:
        raise AttnlabError(f"{text} is too short for the leak experiment: it holds {len(data.train) + len(data.val)} "
                           f"characters and needs at least {_shortest_text(settings)} (its last "
                           f"{settings.val_fraction:.0%} is held out, and each part must be longer than the "
                           f"context of {settings.context})")
    return data


def run_leak_experiment(text: str | Path, out: str | Path, settings: LMSettings = LEAK_SETTINGS, *,
                        sample_tokens: int = 200, progress: bool = False,
                        on_start: Callable[[LMData], None] | None = None) -> LeakResult:
    """Train both models, measure them, check them, and write ``OUT/leak.png`` and ``OUT/leak.json``.

    Everything is checked first (:func:`check_leak_experiment`): a refused run creates no folder and writes
    no file. ``on_start`` is called once the checks have passed, before training (to print what will run).
    """
    with holding_run_folder(out):  # (locked from the moment ensure_writable_dir makes it, if it is new)
        data = check_leak_experiment(text, out, settings, sample_tokens=sample_tokens)
        where = Path(out).absolute()
        # The highest folder this run creates (--out and any missing parents), None when --out exists.
        made = None if where.exists() else next(p for p in (where, *where.parents) if p.parent.exists())
        out = ensure_writable_dir(out)
        # Again under the lock: another experiment started into the same new folder may have finished meanwhile
        # (refused here, before the clean-up below could remove its files).
        _refuse_earlier_experiment(out)
        return _run_and_clean_up(data, text, out, settings, sample_tokens, progress, on_start, where, made)


def _run_and_clean_up(data: LMData, text: str | Path, out: Path, settings: LMSettings, sample_tokens: int,
                      progress: bool, on_start: Callable[[LMData], None] | None, where: Path,
                      made: Path | None) -> LeakResult:
    """Run the experiment into ``out``; if it fails or is interrupted, remove what it wrote and the folders it made
    (``where`` is ``out`` absolute, ``made`` the highest folder the run created, or None)."""
    try:
        return _run(data, text, out, settings, sample_tokens, progress, on_start)
    except BaseException as err:  # Ctrl-C or a failure: leave no part of an experiment that would refuse the next run
        if isinstance(err, KeyboardInterrupt):
            print(f"what the experiment had written in {out} is removed: the same command runs it again", file=sys.stderr)
        for name in OUT_ENTRIES:  # none of them was there before (check_leak_experiment refuses that)
            path = out / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        if made is not None:  # the folders it made, from --out up to the highest, while they are empty
            for folder in (where, *where.parents):
                if any(folder.iterdir()):
                    break
                folder.rmdir()
                if folder == made:
                    break
        raise


def _run(data: LMData, text: str | Path, out: Path, settings: LMSettings, sample_tokens: int, progress: bool,
         on_start: Callable[[LMData], None] | None) -> LeakResult:
    """The body of :func:`run_leak_experiment`, everything checked and ``out`` made."""
    if on_start is not None:
        on_start(data)
    # A prompt both models continue: the first line of the validation text, cut to half a context.
    tokenizer = data.tokenizer
    prompt_ids = data.val[: settings.context // 2].tolist()
    prompt = tokenizer.decode(prompt_ids)
    uniform = math.log(tokenizer.vocab_size - 1)  # the padding id is never a target
    write_text_atomic(out / CHECK_FILE, CHECK_FACTORIES)
    rows, reports, commands, curves = [], {}, {}, {}
    contract = Contract("decoder", pad_id=None, vocab_size=tokenizer.vocab_size, max_length=settings.context)
    for name, cls in (("causal", DecoderLM), ("leaky", LeakyDecoderLM)):
        run = out / name
        # Same settings, seed, initial weights and batches: the mask is the only difference.
        model, report = train_language_model(text, run, settings, progress=progress, model_class=cls,
                                             task_name="lm" if cls is DecoderLM else LEAKY_TASK_NAME, data=data,
                                             measure_peak=False)
        curves[name] = _training_curve(run)
        check = run_checks(model, contract, seeds=5, spec=f"{out / CHECK_FILE}:{name}")
        reports[name] = check
        commands[name] = (f"attnlab check {shlex.quote(f'{out / CHECK_FILE}:{name}')} --kind decoder --pad-id none "
                          f"--vocab-size {tokenizer.vocab_size} --max-length {settings.context}")
        causal_result = check.result("causal")
        # No cache: a cache would hide the leak (each cached position was computed before its future existed).
        sample_ids = list(generate(model, prompt_ids, sample_tokens, seed=0, use_cache=False,
                                   banned=tokenizer.special_ids))
        rows.append(LeakRow(
            name=name, val_loss=report.val_loss,
            same_windows_teacher_forced=teacher_forced_loss(model, data.val, context=settings.context),
            future_absent=future_absent_loss(model, data.val, context=settings.context),
            check_status=causal_result.status, check_summary=causal_result.summary,
            sample=tokenizer.decode(sample_ids),
        ))
    _plot(out / "leak.png", rows, curves, uniform)
    write_json_atomic(out / "leak.json", {
        "settings": asdict(settings), "prompt": prompt, "uniform_loss": uniform,
        "rows": [asdict(r) for r in rows], "check_commands": commands,
        "checks": {name: rep.as_dict() for name, rep in reports.items()},
    })
    return LeakResult(rows, reports, commands, out, prompt)


#: Two losses count as different only when apart by more than this (nats per token): after a budget too short to
#: learn anything both models sit near ln(vocabulary), a few thousandths apart either way.
LOSS_MARGIN = 0.1


def summary(result: LeakResult) -> dict[str, Any]:
    """The experiment's verdict: whether each expected difference showed (losses by more than :data:`LOSS_MARGIN`)."""
    by = {r.name: r for r in result.rows}
    causal, leaky = by["causal"], by["leaky"]
    return {
        "leaky_teacher_forced_lower": leaky.val_loss < causal.val_loss - LOSS_MARGIN,
        "leaky_worse_when_writing": leaky.future_absent > causal.future_absent + LOSS_MARGIN,
        "check_fails_leaky": leaky.check_status == "fail",
        "check_passes_causal": causal.check_status == "pass",
    }
