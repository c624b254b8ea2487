"""Training a decoder-only language model on a text file: the settings, the presets and the one run function.

``attnlab train lm``, the leak experiment and ``bench/lm_shakespeare.py`` all go through
:func:`train_language_model`, so the figures they print are measured the same way.

Presets:

* ``nanogpt-cpu``: nanoGPT's CPU recipe for character-level Shakespeare (its README's command): 4 layers,
  4 heads, width 128, context 64, no biases (nanoGPT's ``bias=False``), batch 12, 2,000 iterations, lr 1e-3 with 100 warmup steps and cosine
  decay to 1e-4, dropout 0, AdamW betas (0.9, 0.99), weight decay 0.1, gradient clip 1.0, evaluation every
  250 steps on 20 batches.
* ``shakespeare-fast``: the same width and context, 3 layers instead of 4, rotary positions, biases, trained with
  Muon on the layers' matrices and AdamW on the rest (:mod:`~attnlab.training.optimizers`), batch 32 at learning
  rate 2e-2 (20 warmup steps, cosine to 2e-3) for 200 steps, in bfloat16 autocast on a device (CPU or GPU) that
  computes in bfloat16 itself (:func:`~attnlab.training.engine.has_fast_bf16`), and evaluated only at the end:
  validation loss 1.78 (<= 1.88 asked) from 0.27x nanoGPT's tokens at 0.8x its FLOPs per token
  (``notes/issue6.md`` has the measurements behind each choice).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.files import ensure_writable_dir, fingerprint, refuse_changed, write_json_atomic
from attnlab.nn.attention import check_heads_option
from attnlab.nn.models import DecoderLM
from attnlab.tasks.lm import (
    TASK_NAME,
    LMData,
    LMTask,
    evaluate_loss,
    flops_per_token,
    load_lm_data,
)
from attnlab.training import TrainConfig, distributed, seed_everything
from attnlab.training.checkpoint import (
    METRICS_FILE,
    RESULT,
    TOKENIZER,
    WEIGHTS,
    first_files,
    has_checkpoint,
    ignored_on_resume,
    load_weights,
    model_config,
    read_metrics,
    read_run_config,
    refuse_bad_run_path,
    refuse_ended,
    refuse_existing_run,
    refuse_input_in_run,
    refuse_restart_over_a_report,
    write_run_config,
)
from attnlab.training.distributed import is_main_process
from attnlab.training.engine import (
    config_dict,
    has_fast_bf16,
    holds_run_folder,
    refuse_run_taken_meanwhile,
    torch_threads,
    train_or_forget,
)
from attnlab.training.peak import machine_peak
from attnlab.training.schedules import length_changed


@dataclass(frozen=True)
class LMSettings:
    """Everything a language-model run is made of; the defaults are the ``nanogpt-cpu`` preset.

    Attributes:
        layers, heads, width, context, dropout, positions, bias: the :class:`~attnlab.nn.DecoderLM` (no biases,
            as nanoGPT's default).
        batch_size: windows per micro-batch; ``grad_accum`` micro-batches make one optimizer step (nanoGPT's
            ``gradient_accumulation_steps``: a larger batch in the memory of a smaller one).
        steps, lr, min_lr, warmup, weight_decay, betas, grad_clip: the optimizer's, with linear warmup and cosine
            decay.
        optimizer: ``"adamw"``, or ``"muon"``: Muon for the layers' matrices beside AdamW for the rest, one
            learning rate and weight decay for both (:mod:`attnlab.training.optimizers`).
        ema_decay: evaluate and keep a moving average of the weights (0 = off; the engine's ``TrainConfig``).
        eval_every, eval_iters: evaluation during training (0 = only at the end), on how many batches.
        checkpoint_every: also write the resume checkpoint every N steps (0 = at evaluations only).
        final_eval_iters: batches of the final validation loss, the figure the run reports.
        eval_batch_size: windows per evaluation batch (nanoGPT's 12 whatever the training batch, so that
            every preset's loss is the mean over the same number of windows).
        bf16, compile: bfloat16 autocast and ``torch.compile``. ``bf16=None``: autocast if the device the run
            trains on computes in bfloat16 natively (:func:`~attnlab.training.engine.has_fast_bf16`), decided
            when the run starts and saved as True or False, so that a resume repeats it.
        threads: torch intra-op threads (0 = torch's default, one per core).
        seed, max_seconds, log_every: as in :class:`~attnlab.training.TrainConfig`.
        tokenizer, val_fraction, bpe_vocab_size: the data.
    """

    layers: int = 4
    heads: int = 4
    width: int = 128
    context: int = 64
    dropout: float = 0.0
    positions: str = "learned"
    bias: bool = False
    batch_size: int = 12
    grad_accum: int = 1
    steps: int = 2000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    optimizer: str = "adamw"
    grad_clip: float = 1.0
    ema_decay: float = 0.0
    eval_every: int = 250
    eval_iters: int = 20
    final_eval_iters: int = 200
    eval_batch_size: int = 12
    checkpoint_every: int = 0
    bf16: bool | None = False
    compile: bool = False
    threads: int = 0
    seed: int = 1337
    max_seconds: float = 0.0
    log_every: int = 50
    tokenizer: str = "char"
    val_fraction: float = 0.1
    bpe_vocab_size: int = 2000

    def model_kwargs(self, vocab_size: int) -> dict[str, Any]:
        return dict(vocab_size=vocab_size, d_model=self.width, num_layers=self.layers, num_heads=self.heads,
                    max_positions=self.context, dropout=self.dropout, positions=self.positions,
                    bias=self.bias)

    def train_config(self, progress: bool = True) -> TrainConfig:
        return TrainConfig(
            max_steps=self.steps, lr=self.lr, min_lr=self.min_lr, warmup_steps=self.warmup, schedule="cosine",
            weight_decay=self.weight_decay, betas=self.betas, optimizer=self.optimizer, grad_clip=self.grad_clip,
            ema_decay=self.ema_decay,
            eval_every=self.eval_every, log_every=self.log_every, bf16=self.bf16, compile=self.compile, seed=self.seed,
            max_seconds=self.max_seconds, checkpoint_every=self.checkpoint_every, grad_accum=self.grad_accum,
            progress=progress,
        )

    def with_overrides(self, **overrides: Any) -> LMSettings:
        """A copy with the given fields replaced; ``None`` values are ignored (an option left unset)."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise AttnlabError(f"unknown language-model settings: {', '.join(sorted(unknown))}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


LM_PRESETS: dict[str, LMSettings] = {
    "nanogpt-cpu": LMSettings(),
    # Same width, context and data; one layer fewer (it reached the same loss as four in this budget), rotary
    # positions, GPT-2's biases, a 2.7x larger batch and no evaluation until the end, in bfloat16 autocast where
    # the device computes in bfloat16 itself. Muon on the matrices: 200 steps (410k tokens, 0.27x nanoGPT's) reach
    # 1.78, where AdamW needed 480 for 1.87 (Muon's steps cost 25% more). notes/issue6.md has the runs behind it.
    "shakespeare-fast": LMSettings(layers=3, positions="rotary", bias=True, batch_size=32, optimizer="muon",
                                   lr=2e-2, min_lr=2e-3, warmup=20, steps=200, eval_every=0, bf16=None),
}


@dataclass
class LMReport:
    """What a finished run measured.

    Attributes:
        val_loss: final validation loss (nats per token) of the kept weights, on ``final_eval_iters`` batches.
        wall_seconds: from reading the text to the end of the final evaluation (compilation included).
        train_seconds: the engine's training time (steps and in-training evaluations, compilation included).
        tokens_per_second: training tokens over ``train_seconds``.
        steady_tokens_per_second: median of the logged windows after the first (no warm-up or compilation);
            the only window or the overall rate when the run logged fewer (``steady_basis`` says which).
        flops_per_token: model training FLOPs per token (nanoGPT's count).
        steps, tokens: optimizer steps taken and training tokens seen.
        parameters: trainable parameters.
        peak_flops: the matmul rate of what the run trained on, in its compute precision (0 if not measured).
        peak_basis: how the peak was measured, in words ("" if it was not).
        resumed: the run continued from a checkpoint, so ``wall_seconds`` covers this invocation only, while
            ``train_seconds`` and the token counts cover the whole run.
    """

    val_loss: float
    wall_seconds: float
    train_seconds: float
    tokens_per_second: float
    steady_tokens_per_second: float
    flops_per_token: float
    steps: int
    tokens: int
    parameters: int
    peak_flops: float = 0.0
    peak_basis: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    steady_basis: str = "median of the logged windows after the first"

    @property
    def model_flops(self) -> float:
        """Model FLOP/s achieved at the steady training rate."""
        return self.flops_per_token * self.steady_tokens_per_second

    @property
    def peak_fraction(self) -> float:
        """Achieved model FLOP/s over the measured peak (nanoGPT's "MFU", against this machine's own peak)."""
        return self.model_flops / self.peak_flops if self.peak_flops else math.nan

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types; the peak fraction of a run whose peak was not measured is null (JSON has no NaN)."""
        fraction = self.peak_fraction if self.peak_flops else None
        return {**asdict(self), "model_flops": self.model_flops, "peak_fraction": fraction}


def steady_rate(metrics_path: Path, overall: float) -> tuple[float, str]:
    """Median tokens/s of the logged windows but the first of each start (which holds start-up and
    compilation: the engine marks it), and how it was found, in words for the report.

    A run that logged no other window has no steady rate: its first window stands in, or when it logged
    none (stopped by its time budget first) ``overall``, its tokens over its training time, so that no figure
    of the report is NaN; the words say so.
    """
    windows = [(record["tokens_per_second"], record.get("first_window", False))
               for record in read_metrics(metrics_path) if "tokens_per_second" in record]
    steady = [rate for rate, first in windows if not first]
    starts = sum(first for _, first in windows)
    after = "after the first" if starts <= 1 else f"after the first of each of the run's {starts} starts"
    if len(steady) > 1:
        return statistics.median(steady), f"median of the {len(steady)} logged windows {after}"
    if steady:
        return steady[0], f"the one logged window {after}"
    if len(windows) > 1:  # every one the first of its start (a resumed run's: not the first start's alone)
        return (statistics.median(rate for rate, _ in windows),
                f"median of the {len(windows)} logged windows, each the first of a start (start-up and compilation "
                "included)")
    if windows:
        return windows[0][0], "the only logged window, start-up and compilation included"
    return overall, "no window logged: the overall rate"


def build_lm(settings: LMSettings, vocab_size: int, model_class: type[DecoderLM] = DecoderLM) -> DecoderLM:
    """A freshly initialised model of ``settings`` (GPT-2's initialisation), seeded by ``settings.seed``."""
    seed_everything(settings.seed)
    return model_class(**settings.model_kwargs(vocab_size))


#: The settings a ``--resume`` may change (the others are the run's own: its steps must repeat). A new
#: number of steps lengthens (or shortens) the run, its schedule re-planned, and is said aloud.
RESUME_MAY_CHANGE = ("max_seconds", "checkpoint_every", "steps", "threads")


def _notes(settings: LMSettings, data: LMData, requested: dict[str, Any]) -> list[str]:
    """Settings that are allowed but rarely what was meant, each said in one line."""
    notes = []
    if settings.warmup >= settings.steps:
        notes.append(f"--warmup {settings.warmup} is not shorter than --steps {settings.steps}: the learning rate "
                     f"never reaches its peak {settings.lr:g}")
    if settings.tokenizer == "char" and "bpe_vocab_size" in requested:
        notes.append("--bpe-vocab-size is for --tokenizer bpe; the char tokenizer ignores it")
    if settings.tokenizer == "bpe" and data.tokenizer.vocab_size < settings.bpe_vocab_size:
        notes.append(f"the text gives a BPE vocabulary of {data.tokenizer.vocab_size} ids, fewer than the "
                     f"{settings.bpe_vocab_size} asked for: no further pair of pieces occurs twice")
    return notes


def _resumed_settings(out: str | Path, text: str | Path | None, requested: dict[str, Any],
                      task_name: str, preset_asks: dict[str, Any]) -> tuple[dict[str, Any], LMSettings, bool]:
    """What ``--resume`` continues: the run's saved config, its settings, and whether a checkpoint is there.

    The saved settings win, except those of :data:`RESUME_MAY_CHANGE` (where the run stops, what it saves on
    the way and how many threads share its kernels, not what any of its steps compute); the others the command line asked are named. Refuses a
    ``text`` (None: the caller's data) that changed and a run that has already reached its length. A run
    killed before its first checkpoint starts again from step 0 with the saved settings, exactly what the
    uninterrupted run did: the third value is then False.
    """
    run_config = read_run_config(out, task_name)
    refuse_restart_over_a_report(out)  # (before anything is read or said)
    saved = run_config["lm"]
    # (runs saved before ``bias`` was a setting had biases)
    before = LMSettings(**{"bias": True, **saved, "betas": tuple(saved["betas"])})
    settings = replace(before, **{k: v for k, v in requested.items() if k in RESUME_MAY_CHANGE})
    main = is_main_process()
    ignored = ignored_on_resume({**preset_asks, **requested}, asdict(settings))
    if ignored and main:
        print(ignored, file=sys.stderr)
    if text is not None:
        run_data = run_config.get("data", {})
        refuse_changed(text, run_data.get("text_sha256"), what="text", started_with=run_data.get("text", text))
    lengthened = settings.steps != before.steps
    reached = refuse_ended(out, steps=settings.steps, max_seconds=settings.max_seconds, steps_option="--steps",
                           lengthened=lengthened)
    if lengthened and reached and main:  # (no checkpoint, reached 0: it starts again, said below)
        print(length_changed(before.train_config(progress=False).learning_rates(),
                             settings.train_config(progress=False).learning_rates(), reached), file=sys.stderr)
    if has_checkpoint(out):
        return run_config, settings, True
    if main:
        again = "" if not lengthened else f", with {settings.steps} steps instead of {before.steps}"
        print(f"{out} has no checkpoint yet: starting the run again from step 0{again}", file=sys.stderr)
    return run_config, settings, False


def _run_config(task_name: str, model: nn.Module, text: str | Path, data: LMData, settings: LMSettings,
                config: TrainConfig, *, selection: str, bom_dropped: bool) -> dict[str, Any]:
    """The run's ``config.json``: what ``--resume`` and ``attnlab generate`` rebuild it from."""
    return {
        "task": task_name,
        # A subclass (the leak experiment's) is recorded under its own name: no loader mistakes it for DecoderLM.
        "model": model_config(model),
        "tokenizer": TOKENIZER,
        "data": {"text": str(text), "text_sha256": fingerprint(text), "val_fraction": settings.val_fraction,
                 "train_tokens": len(data.train), "val_tokens": len(data.val), "bom_dropped": bom_dropped},
        "lm": asdict(settings),
        "train": config_dict(config),
        "selection_windows": selection,
    }


@holds_run_folder
def train_language_model(
    text: str | Path,
    out: str | Path,
    settings: LMSettings,
    *,
    progress: bool = True,
    resume: bool = False,
    model_class: type[DecoderLM] = DecoderLM,
    task_name: str = TASK_NAME,
    data: LMData | None = None,
    on_data: Callable[[LMData], None] | None = None,
    requested: dict[str, Any] | None = None,
    preset_asks: dict[str, Any] | None = None,
    measure_peak: bool = True,
) -> tuple[nn.Module, LMReport]:
    """Train a decoder LM on ``text`` into run folder ``out`` and measure it; see the module docstring.

    Args:
        text: the text file (ignored when ``data`` is given).
        out: the run folder (config.json, tokenizer.json, model.safetensors, checkpoint/, metrics, result.json).
        settings: the run's settings (a preset with overrides).
        progress: show the engine's progress bar.
        resume: continue from ``out/checkpoint`` with the settings saved in ``out/config.json`` (``settings``
            is then ignored); without it, a folder that already holds a run is refused.
        model_class: :class:`DecoderLM` or a subclass (the leak experiment's unmasked model).
        task_name: the ``task`` recorded in config.json (``attnlab generate`` loads only ``lm`` runs).
        data: already loaded data (to train several models on one split).
        on_data: called once the data is ready (to print its size).
        requested: the settings the command line gave; on resume, those the saved ones overrule are named.
        preset_asks: on resume, the settings of a preset the command line named, named too where the run saved others.
        measure_peak: time large matmuls before training (about a second, left out of the wall time).

    Returns:
        the model holding the kept (best) weights, in eval mode, and the report.
    """
    started = time.perf_counter()
    refuse_bad_run_path(out)
    refuse_input_in_run(None if data is not None else text, "--text", run=out)
    run_config: dict[str, Any] | None = None
    if resume:  # the saved settings win: a resumed run must repeat the steps of the one it continues
        run_config, settings, resume = _resumed_settings(out, None if data is not None else text, requested or {},
                                                         task_name, preset_asks or {})
    else:  # every process checks, before the barrier below lets rank 0 write
        refuse_existing_run(out, task_name)
    if settings.bf16 is None:  # (a preset's "where it is fast"; a resumed run has its saved True or False)
        settings = replace(settings, bf16=has_fast_bf16(distributed.choose_device()))
    config = settings.train_config(progress)
    config.validate()  # before anything is written: a bad setting leaves no half-made run
    distributed.check_batch_size(settings.batch_size)
    # (before the text is read)
    check_heads_option(settings.width, settings.heads, width_option="--width", rotary=settings.positions == "rotary")
    with torch_threads(settings.threads):  # restored afterwards: callers in the same process keep theirs
        # A resumed run encodes with the tokenizer it saved (and leaves that file as it is); one that starts again
        # from step 0 does too when the file is there.
        tokenizer_file = Path(out) / TOKENIZER
        saved_tokenizer = tokenizer_file if run_config is not None and tokenizer_file.is_file() else None
        if resume and saved_tokenizer is None:
            raise AttnlabError(f"{tokenizer_file} is missing: the run cannot go on without the tokenizer it was "
                               "trained with")
        # Runs saved before the selection had windows of its own chose their weights on the final figure's: a
        # resume compares its evaluations with the saved best on those same windows.
        selection = run_config.get("selection_windows", "eval") if resume else "select"
        # Runs saved before a byte-order mark was dropped (their config has no bom_dropped) split the text with
        # it: so do their resumes.
        keep_bom = resume and not run_config.get("data", {}).get("bom_dropped", False)
        if data is None:
            data = load_lm_data(text, tokenizer=settings.tokenizer, val_fraction=settings.val_fraction,
                                bpe_vocab_size=settings.bpe_vocab_size, saved_tokenizer=saved_tokenizer,
                                keep_bom=keep_bom)
        if on_data is not None:
            on_data(data)
        model = build_lm(settings, data.tokenizer.vocab_size, model_class)
        task = LMTask(data.train, data.val, context=settings.context, batch_size=settings.batch_size,
                      seed=settings.seed, eval_iters=settings.eval_iters, eval_batch_size=settings.eval_batch_size,
                      selection_windows=selection)
        main = is_main_process()
        if main:  # once the text and the settings have been accepted
            for note in _notes(settings, data, requested or {}):
                print(f"note: {note}", file=sys.stderr)
        existed = Path(out).exists()  # read before any process can have made it
        place = distributed.checked_by_all(config.device)
        # only now: a setting the model or the data refuse leaves no folder behind
        out = ensure_writable_dir(out) if main else Path(out)
        refuse_run_taken_meanwhile(out, task_name, place, new_run=run_config is None)  # again, now that the folder is locked
        run_config = _run_config(task_name, model, text, data, settings, config, selection=selection,
                                 bom_dropped=not keep_bom)  # (before the files: it reads the whole text again)
        with first_files(out, writer=main):
            if main and saved_tokenizer is None:
                data.tokenizer.save(out / TOKENIZER)
            if not resume and main:  # a resume records its settings once its checkpoint has loaded (record, below)
                write_run_config(out, run_config)

        def record() -> None:  # once the checkpoint has loaded: an interrupted lengthening goes on with a plain
            if main:  # --resume, and a resume that fails before changes nothing
                write_run_config(out, run_config)

        # The peak, in the precision training computes in (see machine_peak), by every process at once
        # (see measure_peak_matmul); before training, while the processes are joined, and left out of the wall time.
        peak_started = time.perf_counter()
        dtype = torch.bfloat16 if settings.bf16 else torch.float32
        peak, peak_words = machine_peak(place.device, dtype, place) if measure_peak else (0.0, "")
        peak_seconds = time.perf_counter() - peak_started
        result = train_or_forget(model, task, config, out, resume=resume, existed=existed,
                                 task_files=[TOKENIZER], on_resumed=record)
        load_weights(model, out / WEIGHTS)  # the kept (best) weights: what generate will use
        model.eval()
        # Rank 0 evaluates and reports.
        val_loss = evaluate_loss(model, data.val, context=settings.context, batch_size=settings.eval_batch_size,
                                 iters=settings.final_eval_iters, seed=settings.seed) if main else math.nan
        wall = time.perf_counter() - started - peak_seconds
        steady, basis = steady_rate(out / METRICS_FILE, result.tokens_per_second)
        report = LMReport(
            val_loss=val_loss, wall_seconds=wall, train_seconds=result.elapsed,
            tokens_per_second=result.tokens_per_second,
            steady_tokens_per_second=steady, steady_basis=basis,
            flops_per_token=flops_per_token(model, settings.context), steps=result.steps,
            tokens=result.tokens, parameters=model.num_parameters(),
            settings=asdict(settings), peak_flops=peak,
            peak_basis=peak_words,
            resumed=resume,
        )
        if main:
            write_json_atomic(out / RESULT, report.as_dict())
        return model, report
