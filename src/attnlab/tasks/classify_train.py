"""Training a text classifier from a labelled table: the settings (whose defaults are the BANKING77 recipe),
the model builder, and the one run function behind ``attnlab train classify``.

The run folder is the engine's layout (:mod:`attnlab.training.checkpoint`) plus ``tokenizer.json``,
``result.json`` and a ``config.json`` holding ``task: "classify"``, the label list, the tokenizer kind, the
model's class and keyword arguments, the data files (with a SHA-256 of the training file) and every
setting. ``--resume`` rebuilds everything from that folder, so a resumed run cannot drift from the
interrupted one: it refuses training data that changed, and the settings saved at the start win.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data import UNK_ID, BPETokenizer, WordTokenizer, load_tokenizer, word_tokens
from attnlab.errors import AttnlabError
from attnlab.files import ensure_writable_dir, fingerprint, refuse_changed, write_json_atomic
from attnlab.nn.attention import check_heads_option
from attnlab.nn.models import EncoderClassifier
from attnlab.tasks.classify import TASK_NAME, ClassifyTask, encode_texts
from attnlab.tasks.classify_features import (
    common_words,
    join_tables,
    ngram_table,
    pretrained_table,
    token_strings,
    wordllama_table,
)
from attnlab.tasks.classify_models import TextClassifier
from attnlab.tasks.tables import Table, check_classes, read_table, refuse_a_number_written_twice, split_off
from attnlab.training import TrainConfig, Trainer, distributed, seed_everything
from attnlab.training.checkpoint import (
    RESULT,
    TOKENIZER,
    WEIGHTS,
    build_model,
    checkpoint_progress,
    first_files,
    has_checkpoint,
    ignored_on_resume,
    load_weights,
    model_config,
    read_run_config,
    refuse_bad_run_path,
    refuse_ended,
    refuse_existing_run,
    refuse_input_in_run,
    refuse_restart_over_a_report,
    rng_state,
    save_checkpoint,
    save_weights,
    write_run_config,
)
from attnlab.training.distributed import is_main_process
from attnlab.training.engine import (
    config_dict,
    holds_run_folder,
    refuse_run_taken_meanwhile,
    to_device,
    torch_threads,
    train_or_forget,
)
from attnlab.training.schedules import length_changed

MODEL_KINDS = ("transformer", "tiny", "bow")


@dataclass(frozen=True)
class ClassifySettings:
    """Everything a classification run is made of. The defaults are the BANKING77 recipe (notes/issue5.md).

    Attributes:
        model: ``transformer`` (:class:`TextClassifier`: seed 004's router with word, GloVe and n-gram
            token vectors), ``tiny`` (the core :class:`~attnlab.nn.EncoderClassifier`, seed 004 exactly) or
            ``bow`` (the bag-of-words baseline: the same token vectors, mean-pooled, then an MLP).
        tokenizer, min_freq, bpe_vocab_size: ``word`` (seed 004's vocabulary, words seen ``min_freq`` times)
            or ``bpe`` (subwords trained on the training texts).
        glove: ``auto`` (the packaged GloVe 6B 50d), ``none`` or a GloVe text file.
        glove_words: most frequent GloVe words added to a word vocabulary (frozen vectors, no trained row).
        wordllama: also the WordLlama vectors (256d, the ``wordllama`` package) beside GloVe's, frozen and
            projected like them (``transformer`` and ``bow`` models).
        ngrams: character n-gram vectors in the token vectors.
        ngrams_per_token: n-gram ids kept per token.
        d_model, layers, heads, d_ff, max_positions, dropout, positions, layer_heads, wide: the transformer
            (:class:`~attnlab.tasks.classify_models.TextClassifier`).
        bow_hidden: hidden width of the bag-of-words MLP.
        batch_size: examples per optimizer step (all processes together).
        epochs, steps: length of the run (``steps`` > 0 wins over ``epochs``). ``epochs=0`` (the default) fits
            the run to ``max_seconds``: a few timed steps on a copy of the model give the time per epoch, and the
            run gets as many whole epochs as fit (at most ``max_epochs``), so the cosine schedule ends on time
            on a fast machine and a slow one alike instead of being cut off half-way.
        lr, min_lr, warmup_epochs, weight_decay, grad_clip, label_smoothing: AdamW, linear warmup, cosine decay.
        ema_decay: keep, evaluate and save an exponential moving average of the weights (0 = off; the engine's
            :class:`~attnlab.training.TrainConfig`).
        eval_every: evaluate (and keep the best weights) every N steps; 0 = once per epoch.
        patience: stop after this many evaluations without improvement (0 = never).
        checkpoint_every: also write the resume checkpoint every N steps (0 = at evaluations only).
        max_seconds: stop training after this many seconds (0 = no limit); the best weights so far are kept.
        bf16: bfloat16 autocast. seed: everything random.
        threads: torch threads (0 = torch's default, one per core). The default is 1: this model's matrices are
            small, and on a machine whose cores are busy with other work two spinning threads were measured at
            1.7x the median step time of one and 18x its 90th percentile (notes/issue5.md).
        valid_fraction: share of the training file held out when no validation file is given.
        text_column, label_column: the table's columns (None: ``label``, or the one other column).
    """

    model: str = "transformer"
    tokenizer: str = "word"
    min_freq: int = 1
    bpe_vocab_size: int = 4000
    glove: str = "auto"
    glove_words: int = 30000
    wordllama: bool = True
    ngrams: bool = True
    ngrams_per_token: int = 16
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    d_ff: int = 256
    max_positions: int = 120
    dropout: float = 0.1
    positions: str = "learned"
    layer_heads: bool = True
    wide: bool = True
    bow_hidden: int = 256
    batch_size: int = 64
    epochs: int = 0
    max_epochs: int = 40
    steps: int = 0
    lr: float = 2e-3
    min_lr: float = 0.0
    warmup_epochs: float = 1.0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    label_smoothing: float = 0.1
    ema_decay: float = 0.0
    eval_every: int = 0
    patience: int = 0
    checkpoint_every: int = 0
    max_seconds: float = 280.0
    bf16: bool = False
    threads: int = 1
    seed: int = 0
    valid_fraction: float = 0.1
    text_column: str = "text"
    label_column: str | None = None

    def with_overrides(self, **overrides: Any) -> ClassifySettings:
        """A copy with the given fields replaced; ``None`` values are options left unset."""
        unknown = set(overrides) - {f.name for f in fields(self)}
        if unknown:
            raise AttnlabError(f"unknown classification settings: {', '.join(sorted(unknown))}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def check(self, *, new_run: bool = True) -> None:
        """Refuse settings no run can use; ``new_run=False`` for a resumed run, whose length is already planned."""
        if self.model not in MODEL_KINDS:
            raise AttnlabError(f"unknown model {self.model!r}; choose one of {', '.join(MODEL_KINDS)}")
        if self.tokenizer not in ("word", "bpe"):
            raise AttnlabError(f"unknown tokenizer {self.tokenizer!r}; choose word or bpe")
        if not self.glove.strip():  # Path("") would be the current folder
            raise AttnlabError("--glove is empty: give auto, none or a GloVe text file")
        if self.batch_size < 1 or self.epochs < 0 or self.max_positions < 1 or self.max_epochs < 1:
            raise AttnlabError("batch size, max epochs and max positions must be at least 1, epochs at least 0")
        if new_run and not self.epochs and not self.steps and not self.max_seconds:
            raise AttnlabError("--epochs 0 fits the run to --max-seconds, and --max-seconds 0 sets no limit to fit "
                               "it to; give --epochs or --steps, or a time budget")
        check_heads_option(self.d_model, self.heads, width_option="--d-model", rotary=self.positions == "rotary")
        self.train_config(1, 1, progress=False).validate()  # the engine's own checks (EMA decay, learning rate)
        distributed.check_batch_size(self.batch_size)

    def train_config(self, steps: int, steps_per_epoch: int, progress: bool) -> TrainConfig:
        return TrainConfig(
            max_steps=steps, lr=self.lr, min_lr=self.min_lr, warmup_steps=round(self.warmup_epochs * steps_per_epoch),
            schedule="cosine", weight_decay=self.weight_decay, grad_clip=self.grad_clip, ema_decay=self.ema_decay,
            eval_every=self.eval_every or steps_per_epoch, patience=self.patience,
            checkpoint_every=self.checkpoint_every, log_every=10, bf16=self.bf16, seed=self.seed,
            max_seconds=self.max_seconds, progress=progress,
        )


@dataclass
class ClassifyData:
    """The two splits, read and checked.

    Attributes:
        train, valid: the tables (the validation one possibly carved from the training file).
        labels: the classes, sorted (index = model output).
        notes: lines to show the user (validation rows with labels unseen in training, say).
    """

    train: Table
    valid: Table
    labels: list[str]
    notes: list[str] = field(default_factory=list)


def load_data(train_path: str | Path, valid_path: str | Path | None, settings: ClassifySettings,
              labels: list[str] | None = None) -> ClassifyData:
    """Read the training table and the validation table (a file, or a seeded share of the training one).

    ``labels`` (on resume) fixes the classes instead of taking them from the training table.
    """
    columns = dict(text_column=settings.text_column, label_column=settings.label_column)
    train = read_table(train_path, **columns)
    if valid_path is not None:
        valid = read_table(valid_path, **columns)
    else:
        train, valid = split_off(train, settings.valid_fraction, settings.seed)
    labels = labels or check_classes(train)
    notes = []
    if valid_path is not None and Path(valid_path).resolve() == Path(train_path).resolve():
        notes.append(f"validation: {valid_path} is the training file too; its accuracy measures memory, not what the "
                     "model makes of texts it has not seen (without --valid, --valid-fraction holds rows out)")
    known = set(labels)
    assert valid.labels is not None
    unseen = [i for i, lab in enumerate(valid.labels) if lab not in known]
    # (1 in training and 1.0 in validation: the validation rows would all count as errors)
    refuse_a_number_written_twice({**train.label_numbers, **valid.label_numbers}, f"{train_path} and {valid_path}" if valid_path else str(train_path))
    if unseen and len(unseen) == len(valid.labels):  # validation would measure nothing: said before training
        kinds = sorted(set(valid.labels))
        own = (f" (the training rows' column {train.label_column!r} holds a different value in each row: is it the "
               "column of labels? --label-column)" if len(set(train.labels or [])) == len(train) else "")
        raise AttnlabError(f"none of the {len(unseen)} validation rows has a label the training data holds "
                           f"({', '.join(kinds[:5])}{', ...' if len(kinds) > 5 else ''}); validation would "
                           f"measure nothing{own}")
    if unseen:
        kinds = sorted({valid.labels[i] for i in unseen})
        notes.append(f"validation: {len(unseen)} rows have labels not in the training data ({', '.join(kinds[:5])}"
                     f"{', ...' if len(kinds) > 5 else ''}); they count as errors")
    return ClassifyData(train, valid, labels, notes)


def build_tokenizer(texts: list[str], settings: ClassifySettings) -> tuple[WordTokenizer | BPETokenizer, int]:
    """The tokenizer and how many of its ids were seen in training (the rest are GloVe-only words)."""
    if settings.tokenizer == "bpe":
        tok = BPETokenizer.train(texts, vocab_size=settings.bpe_vocab_size)
        return tok, tok.vocab_size
    base = WordTokenizer.train(texts, min_freq=settings.min_freq)
    known = set(base.itos)
    # Only words the word splitter can produce are worth a row ("u.s." never comes out of it).
    count = 0 if settings.model == "tiny" else settings.glove_words  # the core model has no frozen-vector path
    extra = [w for w in common_words(count, settings.glove) if w not in known and word_tokens(w) == [w]]
    return WordTokenizer(base.itos + extra), base.vocab_size


#: The settings each model kind does not read (``tiny`` is the seed's router, ``bow`` the bag of vectors).
UNUSED_BY_MODEL = {
    "tiny": ("wordllama", "ngrams", "ngrams_per_token", "layer_heads", "wide", "bow_hidden", "glove_words"),
    "bow": ("layers", "heads", "d_ff", "positions", "layer_heads", "wide"),
    "transformer": ("bow_hidden",),
}


def unused_options(settings: ClassifySettings, requested: dict[str, Any], valid_given: bool) -> list[str]:
    """One note for each option the command line gave that these settings do not read."""
    said = [name for name in UNUSED_BY_MODEL[settings.model] if name in requested]
    notes = [f"--{name.replace('_', '-')} is not used by --model {settings.model}; ignored" for name in said]
    if valid_given and "valid_fraction" in requested:
        notes.append("--valid-fraction is for a run without --valid (it holds out part of --train); ignored")
    if settings.tokenizer == "word" and "bpe_vocab_size" in requested:
        notes.append("--bpe-vocab-size is for --tokenizer bpe; ignored")
    for name in ("min_freq", "glove_words"):
        if settings.tokenizer == "bpe" and name in requested and name not in said:
            notes.append(f"--{name.replace('_', '-')} is for --tokenizer word; ignored")
    return notes


def build_classifier(tokenizer, trained: int, num_classes: int, settings: ClassifySettings,
                     train_ids: list[list[int]], on_note: Callable[[str], None] = print) -> nn.Module:
    """A freshly initialised model of ``settings`` (seeded), its feature tables filled from the training ids."""
    seed_everything(settings.seed)
    vocab = tokenizer.vocab_size
    if settings.model == "tiny":
        model = EncoderClassifier(vocab, num_classes, settings.d_model, settings.layers, settings.heads, settings.d_ff,
                                  max_positions=settings.max_positions, dropout=settings.dropout,
                                  positions=settings.positions)
        vectors = pretrained_table(token_strings(tokenizer), settings.glove)
        if vectors is not None:  # GloVe into the first columns of the embedding, the rest stays random
            width = min(vectors.table.shape[1], settings.d_model)
            with torch.no_grad():
                model.encoder.embed.tokens.weight[:, :width] = vectors.table[:, :width]
            on_note(f"embeddings: {vectors.found} of {vocab} tokens start from {vectors.source}")
        return model
    strings = token_strings(tokenizer)
    ngram_ids, num_ngrams = ngram_table(strings, trained, settings.ngrams_per_token) if settings.ngrams else (None, 0)
    vectors = join_tables(pretrained_table(strings, settings.glove),
                          wordllama_table(strings) if settings.wordllama else None)
    bow = settings.model == "bow"
    model = TextClassifier(
        vocab, num_classes, settings.d_model, 0 if bow else settings.layers, settings.heads, settings.d_ff,
        max_positions=settings.max_positions, dropout=settings.dropout,
        positions="none" if bow else settings.positions, trained_words=trained, num_ngrams=num_ngrams,
        ngrams_per_word=settings.ngrams_per_token, vector_dim=0 if vectors is None else vectors.table.shape[1],
        layer_heads=settings.layer_heads and not bow, head_hidden=settings.bow_hidden if bow else 0,
        wide=settings.wide and not bow,
    )
    model.set_features(ngram_ids, None if vectors is None else vectors.table)
    model.fit_idf(train_ids)
    parts = [f"{trained} trained word vectors" + (f" (+{vocab - trained} GloVe-only words)" if vocab > trained else "")]
    if vectors is not None:
        parts.append(f"pretrained vectors for up to {vectors.found} of them from {vectors.source}")
    if num_ngrams:
        parts.append(f"{num_ngrams} character n-grams")
    on_note("token vectors: " + ", ".join(parts))
    return model


@dataclass
class ClassifyReport:
    """What a finished run measured.

    Attributes:
        accuracy: validation accuracy of the kept (best) weights.
        correct, total: its numerator and denominator.
        best_step: the step those weights come from.
        steps, planned_steps: steps taken and planned (fewer when stopped early or by the time budget).
        epochs: epochs trained (fractional).
        wall_seconds: from reading the data to the end (what the command's last line reports); after a resume,
            of this invocation only.
        train_seconds: the engine's training time over the whole run, the parts before a resume included (so
            after a resume it can exceed ``wall_seconds``).
        stopped_by: ``"steps"``, ``"time"`` or ``"patience"``.
        parameters: trainable parameters.
        resumed: the run continued from a checkpoint (its last line says the wall time is of this resume).
    """

    accuracy: float
    correct: int
    total: int
    best_step: int
    steps: int
    planned_steps: int
    epochs: float
    wall_seconds: float
    train_seconds: float
    stopped_by: str
    parameters: int
    settings: dict[str, Any] = field(default_factory=dict)
    is_main: bool = True
    resumed: bool = False

    def last_line(self) -> str:
        return (f"final validation accuracy {self.accuracy:.2%} ({self.correct}/{self.total}, best at step "
                f"{self.best_step} of {self.steps}) | wall time {self.wall_seconds:.1f} s"
                f"{' of this resume' if self.resumed else ''}")


#: Share of ``max_seconds`` a fitted run plans for: the rest absorbs checkpoint writes and timing noise.
FIT_SHARE = 0.92


def time_one_epoch(model: nn.Module, task: ClassifyTask, settings: ClassifySettings, steps: int = 10) -> float:
    """Seconds one epoch takes here: timed optimizer steps and one evaluation, on a copy of ``model``.

    The copy gets the engine's own optimizer (a throw-away :class:`~attnlab.training.Trainer`, which writes
    nothing until it trains), so the timing follows whatever the engine does. Batches are bucketed by length,
    so their padded sizes vary manyfold and are skewed (most batches short, a few long): on BANKING77 the
    median of ten batches held 1.1 to 1.5 times fewer padded tokens than the average batch, so "median step
    x steps" planned too many epochs and the time budget cut the schedule short. So ``steps`` batches spread
    from the epoch's smallest to its largest are timed, a robust line ``seconds = a + b * padded tokens``
    goes through them (Theil-Sen: one step slowed by another program does not move it), and the epoch is
    that line summed over the epoch's real batches. Two untimed steps first pay for allocation and lazy initialisation, and an untimed evaluation for
    the imports of the first one. Torch's random streams (CPU and GPU) are put back, so the run itself is the
    same as without the measurement. Under torchrun each process times its own share of the batches through the DDP-wrapped
    model (the gradient all-reduce included), and every process takes the slowest one's training time plus rank
    0's evaluation (they must agree on the number of steps).
    """
    # The timed steps draw dropout masks: every random stream they use (CPU, and the run's GPU) is put back after.
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
        return _time_one_epoch(model, task, settings, steps)


def _time_one_epoch(model: nn.Module, task: ClassifyTask, settings: ClassifySettings, steps: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:  # (where the probe's checkpoint is written, and timed)
        return _time_in(model, task, settings, steps, Path(scratch))


def _time_in(model: nn.Module, task: ClassifyTask, settings: ClassifySettings, steps: int, scratch: Path) -> float:
    """The measurement of :func:`time_one_epoch`; the probe's weights and checkpoint are written in ``scratch``."""
    from scipy.stats import theilslopes

    probe = copy.deepcopy(model)
    trainer = Trainer(probe, task, settings.train_config(1, 1, progress=False), scratch)
    optimizer, place = trainer.optimizer, trainer.place
    device = place.device
    epoch = list(task.batches(0, place))  # this process's share of each global batch
    if not epoch:
        raise AttnlabError("the training data produced no batches")
    sizes = [b.data["ids"].numel() for b in epoch]
    by_size = sorted(range(len(epoch)), key=sizes.__getitem__)
    # `steps` batches evenly spread over the sizes, smallest to largest (one step: the median-sized batch)
    picked = ([by_size[round(i * (len(epoch) - 1) / (steps - 1))] for i in range(steps)] if steps > 1
              else [by_size[len(epoch) // 2]])

    def clock() -> float:  # on a GPU the work is asynchronous: wait for it before reading the clock
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    times = []
    probe.train()
    for i in picked[-1:] * 2 + picked:  # the largest batch first, untimed, twice
        begin = clock()
        with trainer.autocast():  # bf16 steps cost what they will cost in the run
            loss = task.loss(trainer.net, to_device(epoch[i].data, device))  # through DDP under torchrun
        loss.float().backward()
        nn.utils.clip_grad_norm_(probe.parameters(), settings.grad_clip or math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        distributed.broadcast_flag(False, place)  # the run's per-step word on its time budget (under torchrun)
        times.append(clock() - begin)
    timed, timed_sizes = times[2:], [sizes[i] for i in picked]
    train_seconds = statistics.median(timed) * len(epoch)  # all batches of one size: no line to fit
    if len(set(timed_sizes)) > 1:
        slope, intercept, _, _ = theilslopes(timed, timed_sizes)
        fitted = sum(max(intercept + slope * n, 0.0) for n in sizes)
        train_seconds = fitted if fitted > 0 else train_seconds
    probe.eval()
    with torch.no_grad():
        task.evaluate(probe)  # untimed: the first evaluation imports what it needs
        begin = clock()
        task.evaluate(probe)
        eval_seconds = clock() - begin
    # What follows each evaluation in the run: the best weights and the checkpoint written (rank 0), which a short
    # epoch's plan left out, and the time budget then stopped the cosine schedule before its end.
    begin = clock()
    if place.is_main:
        save_weights(probe, scratch / WEIGHTS)
        save_checkpoint(scratch, probe, optimizer, trainer.state, rng_states=[rng_state()])
    eval_seconds += clock() - begin
    timings = distributed.all_gather((train_seconds, eval_seconds), place)  # (train, eval) of every process
    return max(train for train, _ in timings) + timings[0][1]


def _resumed_settings(out: Path, train_path: str | Path, valid_path: str | Path | None, requested: dict[str, Any],
                      aside: Callable[[str], None]) -> tuple[dict[str, Any], ClassifySettings, dict[str, int]]:
    """What ``--resume`` continues: the run's saved config, its settings, and the new length asked. ``aside``
    (stderr) receives the line naming the settings given that the run's overrule.

    A new length (``steps``, else ``epochs``: returned, re-planned once the data gives an epoch's steps), a
    new time budget, checkpoint interval and thread count (where the run stops, what it saves and how many
    threads share its kernels, not what its steps compute) are taken; the other settings are the run's, and those the command line asked are named.
    Refuses data that changed, other validation data, and a run that has already reached its length.
    """
    saved = read_run_config(out, TASK_NAME)
    refuse_restart_over_a_report(out)  # (before anything is read or said)
    settings = ClassifySettings(**{"wordllama": False, **saved["classify"]})  # older runs had GloVe only
    length = {k: v for k, v in requested.items() if k in ("steps", "epochs") and v}
    budget = {k: v for k, v in requested.items() if k in ("max_seconds", "checkpoint_every", "threads")}
    ignored = ignored_on_resume({k: v for k, v in requested.items() if k not in length | budget},
                                asdict(settings))
    settings = replace(settings, **budget)
    if ignored:
        aside(ignored)
    data = saved["data"]
    refuse_changed(train_path, data["train_sha256"], what="training file", started_with=data["train"])
    # A validation file is checked by content below (the same file named from another folder is the same
    # data); one that replaces or drops the split, and any other file of a run from before the digests, by name.
    unsigned = data.get("valid_sha256") is None
    if (data["valid"] is None) != (valid_path is None) or unsigned and valid_path is not None and \
            Path(data["valid"]).resolve() != Path(valid_path).resolve():
        validated = (f"--valid {data['valid']}" if data["valid"] else
                     f"--valid-fraction {data['valid_fraction']} of the training file")
        raise AttnlabError(f"this run was validated on {validated}; resume it with the same validation data")
    if valid_path is not None:  # the best weights were chosen on it: another file would compare apples and pears
        refuse_changed(valid_path, data.get("valid_sha256"), what="validation file", started_with=data["valid"])
    if has_checkpoint(out) and "epochs" not in length:  # said before the data is read (epochs need it)
        steps = length.get("steps", int(saved["train"]["max_steps"]))
        refuse_ended(out, steps=steps, max_seconds=settings.max_seconds, steps_option="--steps",
                     lengthened=steps != int(saved["train"]["max_steps"]))
    return saved, settings, length


def _planned_steps(out: Path, model: nn.Module, task: ClassifyTask, settings: ClassifySettings, *,
                   saved: dict[str, Any] | None, length: dict[str, int], resume: bool,
                   note: Callable[[str], None], aside: Callable[[str], None]) -> tuple[ClassifySettings, int]:
    """The run's length in optimizer steps (and its settings, holding a new length a resume asked).

    A new run takes ``--steps``, else ``--epochs``, else as many epochs as fit in ``--max-seconds`` (an epoch
    timed here); a saved run keeps its planned length unless ``length`` asks another.
    """
    per_epoch = task.batches_per_epoch()
    if saved is not None:
        planned = int(saved["train"]["max_steps"])  # as planned at the start, even if it was fitted to the time
        asked = length.get("steps") or length.get("epochs", 0) * per_epoch
        if resume and "epochs" in length:  # the check before the data had no length in steps to judge by
            refuse_ended(out, steps=asked, max_seconds=settings.max_seconds, steps_option="--steps",
                         lengthened=asked != planned)
        if not asked or asked == planned:
            return settings, planned
        settings = replace(settings, steps=asked)
        if resume:  # (a run with no checkpoint yet starts again from step 0, with its new length)
            before, after = (settings.train_config(n, per_epoch, False).learning_rates() for n in (planned, asked))
            aside(length_changed(before, after, checkpoint_progress(out)[0]))
        else:
            aside(f"resume: the run starts again with {asked} steps instead of {planned}")
        return settings, asked
    if settings.steps or settings.epochs:
        return settings, settings.steps or settings.epochs * per_epoch
    epoch_seconds = time_one_epoch(model, task, settings)
    epochs = max(1, min(settings.max_epochs, int(settings.max_seconds * FIT_SHARE // epoch_seconds)))
    measured = f"about {epoch_seconds:.1f} s an epoch, measured"
    if settings.max_seconds < epoch_seconds:
        note(f"schedule: 1 epoch of {per_epoch} steps, though it does not fit in {settings.max_seconds:g} s "
             f"({measured}): the time budget will stop the run before its end")
    else:
        many = "1 epoch of {} steps fits" if epochs == 1 else f"{epochs} epochs of {{}} steps fit"
        note(f"schedule: {many.format(per_epoch)} in {settings.max_seconds:g} s ({measured})")
    return settings, epochs * per_epoch


def _new_run_config(model: nn.Module, tokenizer: WordTokenizer | BPETokenizer, trained: int, data: ClassifyData,
                    settings: ClassifySettings, config: TrainConfig, train_path: str | Path,
                    valid_path: str | Path | None, *, truncated: dict[str, int]) -> dict[str, Any]:
    """A new run's ``config.json``: what ``--resume``, ``eval``, ``predict`` and ``probe`` rebuild it from."""
    return {
        "task": TASK_NAME,
        "model": model_config(model),
        "tokenizer": TOKENIZER,
        "tokenizer_kind": tokenizer.kind,
        "trained_tokens": trained,
        "labels": data.labels,
        "max_positions": settings.max_positions,
        "text_column": data.train.text_column,
        "label_column": data.train.label_column,
        "data": {"train": str(train_path), "train_sha256": fingerprint(train_path),
                 "valid": None if valid_path is None else str(valid_path),
                 "valid_sha256": None if valid_path is None else fingerprint(valid_path),
                 "valid_fraction": None if valid_path is not None else settings.valid_fraction,
                 "train_rows": len(data.train), "valid_rows": len(data.valid), "truncated": truncated},
        "classify": asdict(settings),
        "train": config_dict(config),
        UNSEEN_COUNTED: True,
    }


#: In a run's config.json: its validation accuracy counts the rows whose label training never saw, as errors
#: (runs from before 2026-12-01 took it over the other rows; a resume of one keeps doing so, since its saved
#: best score was taken that way and a new evaluation must be compared with it alike).
UNSEEN_COUNTED = "accuracy_counts_unseen_labels"


def print_to_stderr(line: str) -> None:
    """The default ``on_warning`` of :func:`train_classifier`."""
    print(line, file=sys.stderr)


@holds_run_folder
def train_classifier(
    train_path: str | Path,
    out: str | Path,
    settings: ClassifySettings,
    *,
    valid_path: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    on_note: Callable[[str], None] = print,
    on_warning: Callable[[str], None] = print_to_stderr,
    requested: dict[str, Any] | None = None,
) -> ClassifyReport:
    """Train a classifier on a labelled table into run folder ``out`` (see the module docstring).

    Args:
        train_path: CSV or JSON-lines training table.
        out: the run folder.
        settings: the run's settings (ignored on resume: the saved ones are used).
        valid_path: a validation table; None carves ``settings.valid_fraction`` off the training table.
        resume: continue the run in ``out`` from its last checkpoint.
        requested: the settings the command line gave; on resume, those the saved ones overrule are named.
        progress: show the engine's progress bar.
        on_note: receives the lines worth showing (data sizes, truncation, token vectors).
        on_warning: receives the ``note: ...`` lines on settings that will not do what they say (options the
            model does not read, a warmup as long as the run) and, on resume, what the resume does (the settings
            given that the run's own overrule, a new length, a start again from step 0): the command writes them
            to stderr, as ``train lm`` and ``train translate`` do.

    Returns:
        the report; its :meth:`~ClassifyReport.last_line` is what the command prints last.
    """
    started = time.perf_counter()
    out = Path(out)
    refuse_bad_run_path(out)
    refuse_input_in_run(train_path, "--train", run=out)
    refuse_input_in_run(valid_path, "--valid", run=out)
    main = is_main_process()
    note = on_note if main else (lambda _line: None)
    aside = on_warning if main else (lambda _line: None)

    def warn(line: str) -> None:
        aside(f"note: {line}")

    requested = requested or {}
    saved: dict[str, Any] | None = None
    length: dict[str, int] = {}
    if resume:
        saved, settings, length = _resumed_settings(out, train_path, valid_path, requested, aside)
    else:  # every process checks, before the barrier below lets rank 0 write
        refuse_existing_run(out, TASK_NAME)
    settings.check(new_run=saved is None)
    if saved is None:
        for line in unused_options(settings, requested, valid_path is not None):
            warn(line)
    with torch_threads(settings.threads):  # restored afterwards: callers in the same process keep theirs
        data = load_data(train_path, valid_path, settings, labels=None if saved is None else saved["labels"])
        for line in data.notes:
            note(line)
        if saved is None:
            tokenizer, trained = build_tokenizer(data.train.texts, settings)
            if trained <= UNK_ID + 1:  # only <pad> and <unk>: every text would be unknown words
                raise AttnlabError(f"no word occurs at least --min-freq {settings.min_freq} times in the training "
                                   "texts; lower --min-freq")
        else:
            tokenizer, trained = load_tokenizer(out / TOKENIZER), saved["trained_tokens"]
        index = {lab: i for i, lab in enumerate(data.labels)}
        train_enc = encode_texts(tokenizer, data.train.texts, settings.max_positions)
        valid_rows = [i for i, lab in enumerate(data.valid.labels or []) if lab in index]
        valid_enc = encode_texts(tokenizer, [data.valid.texts[i] for i in valid_rows], settings.max_positions)
        # (the validation rows whose label training never saw are not encoded: the count is of the others)
        valid_what = "validation" if len(valid_rows) == len(data.valid) else "validation (rows with a label training saw)"
        for enc, what in ((train_enc, "training"), (valid_enc, valid_what)):
            if enc.note(what):
                note(enc.note(what))
        note(f"data: {len(data.train)} training and {len(data.valid)} validation rows, {len(data.labels)} classes, "
             f"{settings.tokenizer} vocabulary of {tokenizer.vocab_size}")
        if saved is not None and not has_checkpoint(out):
            # Killed before its first checkpoint: start again from step 0 with the saved settings and tokenizer,
            # which is exactly what the uninterrupted run did.
            aside(f"{out} has no checkpoint yet: starting the run again from step 0")
            resume = False
        if saved is None or not resume:
            model = build_classifier(tokenizer, trained, len(data.labels), settings, train_enc.ids, note)
        else:
            seed_everything(settings.seed)
            model = build_model(saved["model"])  # weights, features and all come from the checkpoint
        task = ClassifyTask(train_enc.ids, [index[lab] for lab in data.train.labels or []], valid_enc.ids,
                            [index[data.valid.labels[i]] for i in valid_rows] if data.valid.labels else [],
                            batch_size=settings.batch_size, seed=settings.seed,
                            label_smoothing=settings.label_smoothing,
                            each_head=getattr(model, "num_heads_out", 1) > 1,
                            unpredictable=len(data.valid) - len(valid_rows) if data.valid.labels and (
                                saved is None or saved.get(UNSEEN_COUNTED, False)) else 0)
        per_epoch = task.batches_per_epoch()
        settings, planned = _planned_steps(out, model, task, settings, saved=saved, length=length, resume=resume,
                                           note=note, aside=aside)
        config = settings.train_config(planned, per_epoch, progress and main)
        if saved is None and config.warmup_steps >= planned:  # (train lm says the same of its --warmup)
            never = "" if config.warmup_steps == planned else f", never reaching its peak {settings.lr:g}"
            warn(f"--warmup-epochs {settings.warmup_epochs:g} is {config.warmup_steps} steps, not fewer than the run's "
                 f"{planned}: the learning rate warms up for the whole run (no cosine decay{never})")
        place = distributed.checked_by_all(config.device)
        existed = Path(out).exists()
        if saved is None and main:
            ensure_writable_dir(out)
        refuse_run_taken_meanwhile(out, TASK_NAME, place, new_run=saved is None)  # again, now that the folder is locked
        if saved is None and main:
            new_config = _new_run_config(model, tokenizer, trained, data, settings, config, train_path, valid_path,
                                         truncated={"train": train_enc.truncated, "valid": valid_enc.truncated})
            with first_files(out, writer=True):  # (the config made first: it reads the data files again)
                tokenizer.save(out / TOKENIZER)
                write_run_config(out, new_config)
        def record() -> None:  # a new length, time budget or thread count, once the checkpoint has loaded: an
            changed = [k for k in ("max_steps", "max_seconds", "checkpoint_every")  # interrupted lengthening goes
                       if getattr(config, k) != saved["train"][k]]  # on with a plain --resume
            if main and (changed or settings.threads != saved["classify"].get("threads")):
                write_run_config(out, {**saved, "classify": asdict(settings), "train": config_dict(config)})

        if saved is not None and not resume:  # no checkpoint to load: it starts again from step 0 with what it now is
            record()
        result = train_or_forget(model, task, config, Path(out), resume=resume, existed=existed,
                                 task_files=[TOKENIZER], on_resumed=record if saved is not None else None)
        load_weights(model, out / WEIGHTS)
        best = result.best
        total = len(data.valid)  # rows with unseen labels count as wrong (the task's accuracy): they cannot be predicted
        judged = len(valid_rows) + task.unpredictable  # the rows the accuracy was taken over
        correct = round(best.get("accuracy", math.nan) * judged) if best else 0
        stopped_by = "patience" if result.stopped_early else "steps" if result.steps >= planned else "time"
        report = ClassifyReport(
            accuracy=correct / total if total else math.nan, correct=correct, total=total,
            best_step=int(best.get("step", 0)), steps=result.steps, planned_steps=planned,
            epochs=result.steps / per_epoch, wall_seconds=time.perf_counter() - started, train_seconds=result.elapsed,
            stopped_by=stopped_by, parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
            settings=asdict(settings), is_main=main, resumed=resume,
        )
        if main:
            write_json_atomic(out / RESULT, asdict(report))
        return report
