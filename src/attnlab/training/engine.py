"""The training engine every task shares.

A task (classification, language modelling, translation) supplies its batches, its loss and its
evaluation through the small :class:`Task` protocol; :class:`Trainer` does the rest, the same way for
all of them: AdamW (or Muon beside it, :mod:`attnlab.training.optimizers`), a step-indexed learning-rate
schedule, gradient clipping and accumulation, optional bfloat16 autocast, an exponential moving average of
the weights, evaluation every N steps with the best weights kept, early stopping, atomic safetensors
checkpoints with exact resume, DDP under torchrun, a progress bar, JSON-lines metrics and a loss-curve PNG.

**Weight averaging.** With ``ema_decay`` > 0 the engine keeps an exponential moving average of the
weights (torch's :class:`~torch.optim.swa_utils.AveragedModel`, updated after every optimizer step), and
evaluation, model selection and ``model.safetensors`` use the averaged weights, not the raw ones: the
average smooths the step-to-step noise of the last epochs, as checkpoint averaging does for translation
models. The average is part of the checkpoint, so resume stays exact.

**Exact resume.** Batches are a deterministic function of (seed, epoch); the learning rate a function
of the step; dropout draws from torch's global RNG, whose state is saved in every checkpoint. A run
killed at any moment and resumed from its last checkpoint therefore repeats the same steps and ends
with the same weights as a run that was never interrupted.

**Loss normalisation.** A task's loss returns a *sum* and each batch says how many terms it sums
(examples, or target tokens). The engine divides by the count over the whole global batch (all
micro-batches, all processes), so accumulation and DDP give the gradient of one big batch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import numbers
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from attnlab.errors import AttnlabError
from attnlab.files import holding_run_folder, refuse_non_folder, said_by_path, write_text_atomic
from attnlab.training import distributed
from attnlab.training.checkpoint import (
    CHECKPOINT,
    CONFIG,
    LOSS_PLOT,
    METRICS_FILE,
    WEIGHTS,
    has_checkpoint,
    load_checkpoint,
    read_metrics,
    refuse_shorter,
    rng_state,
    save_checkpoint,
    save_weights,
    why_run_folder_taken,
)
from attnlab.training.optimizers import OPTIMIZERS, build_optimizer
from attnlab.training.schedules import Schedule


class TrainingError(AttnlabError):
    """Training cannot go on (a NaN loss, say); the message says what was kept."""


@dataclass
class Batch:
    """One micro-batch: whatever the task's loss needs, and how much it holds.

    Attributes:
        data: tensors (or a dict/tuple of them) handed to :meth:`Task.loss`; moved to the device.
        count: number of terms the loss sums over (examples, or real target tokens).
        tokens: number of input tokens, for tokens-per-second.
    """

    data: Any
    count: int
    tokens: int


class Task(Protocol):
    """What a task gives the engine."""

    def batches(self, epoch: int, place: distributed.Place) -> Iterable[Batch]:
        """This process's micro-batches of one epoch, in order, the same for the same epoch every time.

        Under DDP every process must yield the same number of batches.
        """
        ...

    def loss(self, model: nn.Module, data: Any) -> Tensor:
        """Summed loss over the batch (a 0-d tensor); the engine divides by the global count."""
        ...

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation metrics; must include ``"score"`` (higher is better) for model selection."""
        ...


@dataclass
class TrainConfig:
    """Settings of the optimisation, independent of the task."""

    max_steps: int = 1000
    lr: float = 1e-3
    min_lr: float = 0.0
    warmup_steps: int = 0
    schedule: str = "cosine"
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    optimizer: str = "adamw"
    grad_clip: float = 1.0
    grad_accum: int = 1
    ema_decay: float = 0.0
    eval_every: int = 0
    patience: int = 0
    checkpoint_every: int = 0
    log_every: int = 10
    bf16: bool = False
    compile: bool = False
    seed: int = 0
    max_seconds: float = 0.0
    device: str = "auto"
    progress: bool = True

    def learning_rates(self) -> Schedule:
        """The learning rate at each step these settings give."""
        return Schedule(self.schedule, self.lr, self.warmup_steps, self.max_steps, self.min_lr)

    def validate(self) -> None:
        counts = ("max_steps", "grad_accum", "warmup_steps", "eval_every", "patience", "checkpoint_every", "log_every")
        for name in counts:  # 2.5 steps would run 3; inf warmup steps would train at a learning rate of 0
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise AttnlabError(f"{name} must be a whole number, got {value!r}")
            setattr(self, name, int(value))  # numpy's integers too, as Python's (JSON, range())
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "ema_decay", "max_seconds"):
            if not math.isfinite(getattr(self, name)):  # NaN passes every comparison below
                raise AttnlabError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if self.optimizer not in OPTIMIZERS:
            raise AttnlabError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise AttnlabError(f"AdamW's betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.device not in ("auto", "cpu") and not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise AttnlabError(f"device must be 'auto', 'cpu' or 'cuda' (with a GPU torch can use), got {self.device!r}")
        if self.max_steps < 1:
            raise AttnlabError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.grad_accum < 1:
            raise AttnlabError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise AttnlabError(f"the EMA decay must be in [0, 1) (0 = off), got {self.ema_decay}")
        if not 0 < self.lr < math.inf:
            raise AttnlabError(f"learning rate must be a finite number > 0, got {self.lr}")
        if not 0.0 <= self.min_lr <= self.lr:
            raise AttnlabError(f"the final learning rate (min_lr, --min-lr) must be between 0 and the peak (lr, --lr) "
                               f"{self.lr}, got {self.min_lr}")
        for name, value in (("warmup steps", self.warmup_steps), ("weight decay", self.weight_decay),
                            ("gradient clip", self.grad_clip), ("evaluation interval", self.eval_every),
                            ("patience", self.patience), ("checkpoint interval", self.checkpoint_every),
                            ("time budget (seconds)", self.max_seconds)):
            if value < 0:  # 0 means "off" for each of them
                raise AttnlabError(f"{name} must be >= 0, got {value}")
        if self.log_every < 1:
            raise AttnlabError(f"log interval must be >= 1, got {self.log_every}")
        Schedule(self.schedule)  # raises on an unknown kind


@dataclass
class TrainResult:
    """What a finished run reports."""

    steps: int
    elapsed: float
    tokens_per_second: float
    tokens: int = 0
    best: dict[str, float] = field(default_factory=dict)
    final_loss: float = math.nan
    stopped_early: bool = False
    out_of_time: bool = False  # stopped by the time budget (max_seconds) before max_steps


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` torch threads (0: leave the setting alone), and restore the previous count after:
    a caller in the same process (a test, a notebook) keeps its own."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def seed_everything(seed: int) -> None:
    """Seed torch (model initialisation, dropout) so that runs repeat exactly."""
    torch.manual_seed(seed)


def to_device(data: Any, device: torch.device) -> Any:
    """Move every tensor inside ``data`` (nested dicts, lists, tuples) to ``device``."""
    if torch.is_tensor(data):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {k: to_device(v, device) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(to_device(v, device) for v in data)
    return data


def has_fast_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively (autocast elsewhere emulates it, many times slower)."""
    if device.type == "cuda":  # Ampere (compute capability 8.0) on; every GPU ROCm runs on. This GPU, not GPU 0.
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        try:  # oneDNN's own test: AVX-512 BF16 or AMX. Zen 1's AVX2 ran a bf16 matmul at 1/25 of float32's rate.
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):  # a build without oneDNN: no fast bf16 kernels either
            return False
    return True  # other devices: no test to ask, and no note to give


class Trainer:
    """Trains ``model`` on ``task`` into the run folder ``out``.

    Args:
        model: the freshly built (or resumed) model.
        task: batches, loss and evaluation.
        config: optimisation settings.
        out: the run folder; the caller writes its ``config.json`` and tokenizer first.
    """

    def __init__(self, model: nn.Module, task: Task, config: TrainConfig, out: str | Path) -> None:
        config.validate()
        refuse_non_folder(out)
        self.config, self.task, self.out = config, task, Path(out)
        self.place = distributed.setup(config.device)
        if self.place.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        self.model = model.to(self.place.device)
        self.optimizer = build_optimizer(self.model, config.optimizer, lr=config.lr, weight_decay=config.weight_decay,
                                         betas=config.betas, fused=self.place.device.type in ("cpu", "cuda"))
        self.schedule = config.learning_rates()
        # The average copies the model as it is now, buffers included (a task fills its buffers before this).
        self.averaged: AveragedModel | None = None
        if config.ema_decay:
            self.averaged = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(config.ema_decay))
        self.net: nn.Module = self.model
        if self.place.distributed:
            self.net = DistributedDataParallel(self.model)
        if config.compile:
            self.net = torch.compile(self.net)
        self.state: dict[str, Any] = {
            "step": 0, "epoch": 0, "batch_in_epoch": 0, "best_score": -math.inf, "best": {},
            "evals_without_improvement": 0, "tokens": 0, "elapsed": 0.0, "last_loss": math.nan,
            "stopped_early": False,
        }
        self.checkpoint_step: int | None = None

    # ----------------------------------------------------------------------------------------------
    # bookkeeping

    @property
    def eval_model(self) -> nn.Module:
        """The weights that are evaluated and kept: the moving average if there is one, else the model."""
        return self.model if self.averaged is None else self.averaged.module

    @property
    def metrics_path(self) -> Path:
        return self.out / METRICS_FILE

    def _log(self, record: dict[str, Any]) -> None:
        if self.place.is_main:
            with said_by_path(self.metrics_path), open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def _trim_metrics(self, step: int) -> None:
        """On resume, forget what was logged after the checkpoint: those steps will be run again."""
        if not self.place.is_main or not self.metrics_path.exists():
            return
        kept = [record for record in read_metrics(self.metrics_path) if record["step"] <= step]
        # (a kill now keeps the old log whole)
        write_text_atomic(self.metrics_path, "".join(json.dumps(record) + "\n" for record in kept))

    def _checkpoint(self) -> None:
        rng_states = distributed.all_gather(rng_state(), self.place)  # each process's stream, for an exact resume
        if self.place.is_main:
            self.state["world"] = self.place.world
            self.state["threads"] = torch.get_num_threads()
            save_checkpoint(self.out, self.model, self.optimizer, self.state, averaged=self.averaged,
                            rng_states=rng_states)
        self.checkpoint_step = self.state["step"]
        distributed.barrier(self.place)

    def resume(self) -> None:
        """Continue from ``out/checkpoint`` (weights, optimizer, RNG, counters)."""
        if not has_checkpoint(self.out):
            raise AttnlabError(f"nothing to resume in {self.out}: no checkpoint/ folder")
        refuse_shorter(self.out, self.config.max_steps, "max_steps")  # it would take no step, and record a length
        counters = load_checkpoint(self.out, self.model, self.optimizer, averaged=self.averaged, rank=self.place.rank)
        for key, value in counters.items():  # what the engine computes with must be of its own kinds
            own = self.state.get(key)
            if own is not None and not _same_kind(own, value):
                raise AttnlabError(f"checkpoint in {self.out / CHECKPOINT} is damaged: trainer.json's {key} is "
                                   f"{value!r}, not {type(own).__name__}")
            # Counts and seconds cannot be negative or endless (a training time of -1e9 s reached result.json)
            if key in COUNTERS and not (value >= 0 and math.isfinite(value) and (key == "elapsed" or value % 1 == 0)):
                raise AttnlabError(f"checkpoint in {self.out / CHECKPOINT} is damaged: trainer.json's {key} is "
                                   f"{value!r}, not {'a number of seconds' if key == 'elapsed' else 'a count'}")
        self.state.update(counters)
        saved_world = self.state.get("world")  # None: written before checkpoints recorded it
        if self.place.is_main and saved_world is None and self.place.distributed:
            print("note: the checkpoint was written by an older attnlab, which kept the first process's random stream "
                  "only: the others continue from it, so the run goes on validly but not exactly as the "
                  "uninterrupted one would have", file=sys.stderr)
        elif self.place.is_main and saved_world is not None and saved_world != self.place.world:
            print(f"note: the checkpoint was saved by {saved_world} process{'es' if saved_world > 1 else ''}, this run "
                  f"has {self.place.world}: each global batch is split otherwise and the random streams of processes "
                  "past the first start again from the first's, so the run goes on validly but not as the "
                  "uninterrupted one would have", file=sys.stderr)
        saved_threads = self.state.get("threads")  # None: written before checkpoints recorded it
        if (self.place.is_main and self.place.device.type == "cpu" and saved_threads is not None
                and saved_threads != torch.get_num_threads()):
            print(f"note: the checkpoint was saved by a process of {saved_threads} torch thread"
                  f"{'s' if saved_threads > 1 else ''}, this one has {torch.get_num_threads()} (--threads): kernels "
                  "split their sums otherwise, so the run goes on validly but its results differ in the last bits "
                  "from the uninterrupted one's (give --threads to match)", file=sys.stderr)
        if math.isfinite(self.state["best_score"]) and not (self.out / WEIGHTS).is_file():
            # Deleted since: without this, no later evaluation below the lost best would write them again, and
            # the run would end without the weights every command loads.
            if self.place.is_main:
                print(f"note: {self.out / WEIGHTS}, the best weights so far (step {self.state['best'].get('step')}), "
                      "is missing: the next evaluation's weights are kept, whatever their score", file=sys.stderr)
            self.state.update(best_score=-math.inf, best={})
        self.checkpoint_step = self.state["step"]
        self._trim_metrics(self.state["step"])

    # ----------------------------------------------------------------------------------------------
    # the loop

    def _micro_batches(self) -> Iterator[Batch]:
        """Micro-batches from the saved position on, epoch after epoch."""
        while True:
            epoch, skip = self.state["epoch"], self.state["batch_in_epoch"]
            produced = 0
            for i, batch in enumerate(self.task.batches(epoch, self.place)):
                produced = i + 1
                if i < skip:
                    continue
                self.state["batch_in_epoch"] = i + 1
                yield batch
            if not produced:
                raise AttnlabError("the training data produced no batches")
            if skip > produced:  # (a resume would silently start the next epoch: not the run it continues)
                raise AttnlabError(f"checkpoint in {self.out / CHECKPOINT} is damaged: trainer.json's batch_in_epoch "
                                   f"is {skip}, but epoch {epoch} of the training data has {produced} batches (or "
                                   "the data has changed since it was saved)")
            self.state["epoch"], self.state["batch_in_epoch"] = epoch + 1, 0

    def autocast(self) -> contextlib.AbstractContextManager:
        """bfloat16 autocast on this run's device when the run asks for it, else nothing."""
        if not self.config.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.place.device.type, dtype=torch.bfloat16)

    def _accumulate(self, micro: list[Batch]) -> tuple[float, int]:
        """Forward and backward over ``micro``, leaving the global-batch mean gradient in ``.grad``.

        Returns the mean loss per term over the global batch and the tokens it held.
        """
        local_count = sum(b.count for b in micro)
        global_count = distributed.all_sum(float(local_count), self.place)
        if global_count <= 0:
            raise AttnlabError("a training batch holds no loss terms (all padding?)")
        # DDP averages gradients over processes, so scale by world / global count to get the big-batch mean.
        scale = self.place.world / global_count
        total = 0.0
        self.net.train()
        for i, batch in enumerate(micro):
            sync = i == len(micro) - 1
            ctx = self.net.no_sync() if self.place.distributed and not sync else contextlib.nullcontext()
            with ctx:
                with self.autocast():
                    loss_sum = self.task.loss(self.net, to_device(batch.data, self.place.device))
                (loss_sum.float() * scale).backward()
            total += float(loss_sum.detach())
        tokens = int(distributed.all_sum(float(sum(b.tokens for b in micro)), self.place))
        return distributed.all_sum(total, self.place) / global_count, tokens

    def _step(self, micro: list[Batch]) -> tuple[float, int]:
        """One optimizer step over ``micro``; returns the mean loss per term and the tokens seen."""
        mean_loss, tokens = self._accumulate(micro)
        if not math.isfinite(mean_loss):
            self.optimizer.zero_grad(set_to_none=True)
            kept = (f"the last good checkpoint (step {self.checkpoint_step}) is in {self.out / CHECKPOINT}"
                    if self.checkpoint_step is not None else "no checkpoint had been written yet")
            raise TrainingError(f"loss became {mean_loss} at step {self.state['step'] + 1}; training stopped, {kept}")
        if self.config.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        lr = self.schedule(self.state["step"])
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.averaged is not None:
            self.averaged.update_parameters(self.model)
        return mean_loss, tokens

    def _evaluate(self) -> bool:
        """Evaluate on rank 0, keep the best weights, and decide whether to stop early."""
        stop = False
        self.state["evaluated_step"] = self.state["step"]  # (in the checkpoint: a resume at this step needs no other)
        if self.place.is_main:
            model = self.eval_model.eval()
            with torch.no_grad(), self.autocast():
                metrics = {k: float(v) for k, v in self.task.evaluate(model).items()}
            if "score" not in metrics:
                raise AttnlabError("the task's evaluate() must return a 'score'")
            # Any figure, not the score alone: an accuracy stays finite over NaN outputs (argmax picks a class),
            # and such weights were kept as the best. (No weights would count as the best after a NaN score.)
            broken = next((name for name, value in metrics.items() if not math.isfinite(value)), None)
            if broken is not None:
                raise TrainingError(f"the evaluation at step {self.state['step']} gave a {broken} of "
                                    f"{metrics[broken]}: the model's outputs are no longer finite")
            improved = _better(metrics, self.state["best_score"], self.state["best"])
            if improved:
                self.state.update(best_score=metrics["score"], best={**metrics, "step": self.state["step"]},
                                  evals_without_improvement=0)
                save_weights(model, self.out / WEIGHTS)
            else:
                self.state["evals_without_improvement"] += 1
            self._log({"step": self.state["step"], "eval": metrics, "best": improved})
            patience = self.config.patience
            stop = bool(patience and self.state["evals_without_improvement"] >= patience)
        return distributed.broadcast_flag(stop, self.place)

    def _progress_bar(self) -> Any:
        """A tqdm bar over the steps on rank 0 when the run asks for progress, else None."""
        if not (self.place.is_main and self.config.progress):
            return None
        from tqdm.auto import tqdm

        # disable=None: no bar when stderr is not a terminal (a log file, CI), whose lines it would fill
        return tqdm(total=self.config.max_steps, initial=self.state["step"], unit="step", dynamic_ncols=True,
                    disable=None)

    def _settle_resumed_end(self) -> tuple[bool, bool]:
        """Whether a (resumed) run has already spent its time budget, and whether early stopping ended it.

        Decided once, from the counters every process loaded from the checkpoint: in the loop each process's
        clock differs a little, and the broadcast out_of_time flag is what stops them all at the same step. A run
        that reached max_steps with its patience spent at the last evaluation was not stopped early, and may be
        given more steps. A run resumed where it ends, at a checkpoint no evaluation was made at (written every
        N steps, the run then given exactly that many, or a smaller budget), gets here the evaluation of its last
        step that the loop would have made, so that it keeps evaluated weights and reports them.
        """
        step = self.state["step"]
        spent = bool(self.config.max_seconds and self.state["elapsed"] >= self.config.max_seconds
                     and step < self.config.max_steps)
        stopped_early = bool(self.state.get("stopped_early"))
        # (checkpoints from before "evaluated_step": an evaluation that kept the weights of this step says so)
        evaluated = self.state.get("evaluated_step", self.state["best"].get("step"))
        if (spent or step >= self.config.max_steps) and not stopped_early and evaluated != step:
            self._evaluate()
            self._checkpoint()
        return spent, stopped_early

    def _log_window(self, loss: float, rate: float, first_window: bool, bar: Any) -> None:
        """Log the step just taken with the tokens/s of the window of steps it ends (and show it on the bar)."""
        lr = self.schedule(self.state["step"] - 1)
        self._log({"step": self.state["step"], "loss": loss, "lr": lr, "tokens_per_second": rate,
                   "elapsed": self.state["elapsed"], **({"first_window": True} if first_window else {})})
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}")

    def fit(self, resume: bool = False, on_resumed: Callable[[], None] | None = None) -> TrainResult:
        """Train until ``max_steps``, the time budget or early stopping; return the summary.

        ``on_resumed`` is called once the checkpoint has loaded, before the first step (a task records there
        what the resumed run now is: a resume that fails earlier changes nothing).
        """
        cfg = self.config
        if cfg.bf16 and self.place.is_main and not has_fast_bf16(self.place.device):
            print(f"note: this {self.place.device.type.upper()} has no native bfloat16 arithmetic; bf16 autocast "
                  "will run slower than float32 here", file=sys.stderr)
        recorded, resumed_at = None, None  # config.json before ``on_resumed`` rewrote it (rank 0), and the step
        if resume:
            self.resume()
            resumed_at = self.checkpoint_step
            if on_resumed is not None:
                if self.place.is_main and (self.out / CONFIG).is_file():
                    recorded = (self.out / CONFIG).read_text(encoding="utf-8")
                on_resumed()
        elif self.place.is_main:
            self.metrics_path.unlink(missing_ok=True)
        bar = self._progress_bar()
        batches = self._micro_batches()
        started = time.perf_counter() - self.state["elapsed"]
        window_start, window_tokens = time.perf_counter(), 0
        first_window = True  # holds this start's warm-up (and compilation): rates leave it out
        try:
            spent, stopped_early = self._settle_resumed_end()
            while not spent and not stopped_early and self.state["step"] < cfg.max_steps:
                micro = [next(batches) for _ in range(cfg.grad_accum)]
                loss, tokens = self._step(micro)
                self.state["step"] += 1
                self.state["tokens"] += tokens
                self.state["last_loss"] = loss
                self.state["elapsed"] = time.perf_counter() - started
                window_tokens += tokens
                step = self.state["step"]
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    now = time.perf_counter()
                    self._log_window(loss, window_tokens / max(now - window_start, 1e-9), first_window, bar)
                    window_start, window_tokens, first_window = now, 0, False
                if bar is not None:
                    bar.update(1)
                out_of_time = bool(cfg.max_seconds and self.state["elapsed"] >= cfg.max_seconds)
                out_of_time = distributed.broadcast_flag(out_of_time, self.place)
                spent = out_of_time and step < cfg.max_steps
                last = step == cfg.max_steps or out_of_time
                evaluated = False
                if (cfg.eval_every and step % cfg.eval_every == 0) or last:
                    stopped_early = self._evaluate() and not last
                    self.state["stopped_early"] = stopped_early  # saved with the checkpoint below
                    evaluated = True
                if evaluated or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or stopped_early:
                    self._checkpoint()
                if last or stopped_early:
                    break
        except Exception:
            # A resume that failed before its checkpoint moved (its loss gone NaN under a learning rate it was
            # given, say) leaves the run as it was: the settings it recorded did not take, and kept in config.json
            # they would be the next plain --resume's without its "resume: ... ->" line. (Ctrl-C is no failure:
            # an interrupted lengthening goes on with a plain --resume.)
            if recorded is not None and self.checkpoint_step == resumed_at:
                with contextlib.suppress(OSError):  # (the failure's own error is the one to see)
                    write_text_atomic(self.out / CONFIG, recorded)
            raise
        finally:
            if bar is not None:
                bar.close()
        if self.place.is_main:
            from attnlab.training.plots import plot_loss_curve

            plot_loss_curve(self.metrics_path, self.out / LOSS_PLOT)
        distributed.barrier(self.place)
        elapsed = self.state["elapsed"]
        return TrainResult(
            steps=self.state["step"], elapsed=elapsed, tokens_per_second=self.state["tokens"] / max(elapsed, 1e-9),
            tokens=self.state["tokens"],
            best=dict(self.state["best"]), final_loss=self.state["last_loss"], stopped_early=stopped_early,
            out_of_time=spent,
        )

    def close(self) -> None:
        """Leave the process group."""
        distributed.teardown(self.place)


#: The checkpoint's counters that are counts, or (``elapsed``) seconds: none of them is negative. (``step`` is
#: refused earlier, by the checkpoint's own reading.)
COUNTERS = ("epoch", "batch_in_epoch", "evals_without_improvement", "tokens", "elapsed")


def _better(metrics: dict[str, float], best_score: float, best: dict[str, Any]) -> bool:
    """Whether an evaluation beats the best so far: a higher score, or the same score at a lower loss. A BLEU or
    an accuracy ties often (0 at every evaluation of a run's start), and the first of the tied was kept over
    later, better-trained weights."""
    if metrics["score"] != best_score or "loss" not in metrics or "loss" not in best:
        return metrics["score"] > best_score
    return metrics["loss"] < best["loss"]


def _same_kind(own: Any, value: Any) -> bool:
    """Whether a saved counter ``value`` is of the kind of the engine's ``own``: a number (not a flag), a flag, a dict."""
    if isinstance(own, bool) or isinstance(value, bool):
        return isinstance(own, bool) and isinstance(value, bool)
    if isinstance(own, numbers.Real):
        return isinstance(value, numbers.Real)
    return isinstance(value, type(own))


def run_training(model: nn.Module, task: Task, config: TrainConfig, out: str | Path, *, resume: bool = False,
                 on_resumed: Callable[[], None] | None = None) -> TrainResult:
    """Build a :class:`Trainer`, run it (see :meth:`Trainer.fit`), and leave the process group whatever happens."""
    trainer = Trainer(model, task, config, out)
    try:
        return trainer.fit(resume=resume, on_resumed=on_resumed)
    finally:
        trainer.close()


def refuse_run_taken_meanwhile(out: str | Path, task: str, place: distributed.Place, *, new_run: bool) -> None:
    """:func:`~attnlab.training.checkpoint.refuse_existing_run` again, once rank 0 holds the folder's lock
    (:func:`~attnlab.files.ensure_writable_dir`): a run that another process started into the same new folder,
    and finished meanwhile, is not replaced. Rank 0 looks; every process says it, in one line each (the others
    without rank 0's reason, which stays on its machine)."""
    reason = why_run_folder_taken(out, task) if place.is_main and new_run else None
    if distributed.broadcast_flag(reason is not None, place):
        raise AttnlabError(reason or f"{out} was taken by another run meanwhile (rank 0 says how); choose another --out")


def train_or_forget(model: nn.Module, task: Task, config: TrainConfig, out: Path, *, resume: bool, existed: bool,
                    task_files: Iterable[str], on_resumed: Callable[[], None] | None = None) -> TrainResult:
    """:func:`run_training`; if it fails before its first checkpoint, the run's own files go with it.

    Nothing of such a run can be resumed, and its ``config.json`` would make the folder refuse a new run while
    ``--resume`` repeated the failure (a loss gone NaN, say). What goes: ``config.json``, the best weights, the
    metrics and their plot, and ``task_files`` (its tokenizers); the folder too when the run created it
    (``existed`` False) and nothing else is in it. Ctrl-C is not a failure: a resume restarts such a run.
    """
    # Held around the training (a folder made since the task's first check is locked now), and entered before the
    # try: a run refused because another process trains in the folder must not delete that run's files.
    with holding_run_folder(out, writer=distributed.is_main_process()):
        try:
            return run_training(model, task, config, out, resume=resume, on_resumed=on_resumed)
        except Exception:
            if not has_checkpoint(out) and distributed.is_main_process():
                for name in (CONFIG, WEIGHTS, METRICS_FILE, LOSS_PLOT, *task_files):
                    (out / name).unlink(missing_ok=True)
                if not existed and out.is_dir() and not any(out.iterdir()):
                    out.rmdir()
            raise


def holds_run_folder(train: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a task's training function, whose ``out`` argument is its run folder, to hold the folder's lock
    (:func:`~attnlab.files.holding_run_folder`) from its first check to its return: a second training in the
    folder is refused before it reads or writes anything there."""
    signature = inspect.signature(train)

    @functools.wraps(train)
    def holding(*args: Any, **kwargs: Any) -> Any:
        out = signature.bind(*args, **kwargs).arguments["out"]
        with holding_run_folder(out, writer=distributed.is_main_process()):
            return train(*args, **kwargs)

    return holding


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The settings as plain JSON types, for the run's config.json."""
    return asdict(config)
