"""Translation: the core encoder-decoder trained on parallel text with the shared engine.

The task gives the :class:`~attnlab.training.Trainer` three things (its ``Task`` protocol):

* **batches**: sentence pairs grouped by length into batches of at most ``max_tokens`` padded positions
  a side (:mod:`attnlab.tasks.parallel_data`), each with ``count`` = its real target tokens, so the engine
  divides the summed loss by the number of predicted tokens over the whole global batch;
* **loss**: label-smoothed cross-entropy (0.1 by default), summed, padding ignored;
* **evaluate**: teacher-forced loss on the validation pairs and BLEU of greedy free-running translations
  of the validation sources; the best BLEU is kept (``select="bleu"``), or the lowest loss.

A run folder holds ``config.json`` (task ``"translate"``, the model, the optimisation, :class:`TranslateSettings`),
the BPE tokenizer(s), and the engine's weights and checkpoint. :func:`attnlab.tasks.translator.load_translator`
reads it back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data import PAD_ID, BPETokenizer, load_tokenizer
from attnlab.errors import AttnlabError
from attnlab.files import ensure_writable_dir, refuse_changed, write_json_atomic
from attnlab.nn import Transformer, padding_mask
from attnlab.nn.attention import KVCache
from attnlab.tasks.decoding import DecodeSettings, translate_ids
from attnlab.tasks.parallel_data import (
    Pairs,
    collate,
    encode_pairs,
    file_record,
    holds_recorded_data,
    pair_sources,
    read_parallel,
    real_tokens,
    side_path,
    sorted_chunks,
    source_ids,
    token_batches,
)
from attnlab.training import Batch, TrainConfig, TrainResult, distributed, seed_everything
from attnlab.training.checkpoint import (
    RESULT,
    TOKENIZER,
    build_model,
    first_files,
    has_checkpoint,
    ignored_on_resume,
    model_config,
    read_run_config,
    refuse_bad_run_path,
    refuse_ended,
    refuse_existing_run,
    refuse_restart_over_a_report,
    register_model,
    write_run_config,
)
from attnlab.training.distributed import Place, is_main_process, shard
from attnlab.training.engine import config_dict, holds_run_folder, refuse_run_taken_meanwhile, train_or_forget
from attnlab.training.schedules import length_changed

TASK = "translate"

#: The benchmark recipe (bench/multi30k.sh), also the defaults of ``attnlab train translate``.
RECIPE_MODEL: dict[str, Any] = dict(
    d_model=256, num_layers=3, num_heads=4, d_ff=1024, dropout=0.1, max_src_positions=256, max_tgt_positions=256,
)
RECIPE_TRAIN: dict[str, Any] = dict(
    lr=1e-3, warmup_steps=800, schedule="inverse_sqrt", betas=(0.9, 0.98), weight_decay=1e-4, grad_clip=1.0,
    max_steps=1_000_000, max_seconds=3600.0, eval_every=500,
)


@register_model  # run configs name their model class: a leaky run loads like any other
class LeakyTransformer(Transformer):
    """The encoder-decoder **without the look-ahead mask** in teacher-forced training: a deliberate bug.

    Under teacher forcing its decoder self-attention hides only padding, so position ``t`` can read the
    token it is asked to predict from position ``t + 1`` of its own input. The loss drops far below a
    correct model's; free-running decoding has no future to read and the translations collapse (the
    teacher-forcing report). Incremental decoding with caches is unchanged: a cache holds only the past.
    """

    def decode(self, tgt: Tensor, memory: Tensor, *, memory_attend_mask: Tensor, need_weights: bool = False,
               caches: list[tuple[KVCache, KVCache]] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        if caches is not None:
            return super().decode(tgt, memory, memory_attend_mask=memory_attend_mask, need_weights=need_weights,
                                  caches=caches)
        self_mask = padding_mask(tgt, self.pad_id)  # (batch, 1, 1, tgt): padding only, every position sees all
        states, weights = self.decoder(tgt, memory, self_attend_mask=self_mask, memory_attend_mask=memory_attend_mask,
                                       need_weights=need_weights)
        return self.output(states), weights


@dataclass
class TranslateSettings:
    """Task settings stored in ``config.json`` (everything but the model shape and the optimiser).

    Attributes:
        src, tgt: language suffixes of the corpus files (``PREFIX.src``, ``PREFIX.tgt``).
        joint_vocab: one BPE vocabulary trained on both sides (allows shared embeddings), else one a side.
        vocab_size: BPE vocabulary size (each, when separate).
        max_tokens: padded positions a side per training batch.
        label_smoothing: probability mass spread over the vocabulary in the training loss.
        look_ahead_mask: False trains :class:`LeakyTransformer` (the teacher-forcing experiment only).
        select: ``"bleu"`` keeps the weights with the best validation BLEU, ``"loss"`` the lowest loss.
        valid_sentences: validate on the first N validation pairs only (0 = all).
        tokenizers: file names of the source and target tokenizers inside the run folder.
    """

    src: str = "de"
    tgt: str = "en"
    joint_vocab: bool = True
    vocab_size: int = 10000
    max_tokens: int = 3000
    label_smoothing: float = 0.1
    look_ahead_mask: bool = True
    select: str = "bleu"
    valid_sentences: int = 0
    tokenizers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any], run: str | Path) -> TranslateSettings:
        """The settings a run folder's ``config.json`` holds under ``"settings"``; a hand-edited file that broke
        them is named, not a KeyError deep inside."""
        tokenizers = data.get("tokenizers") if isinstance(data, dict) else None
        if not isinstance(data, dict) or tokenizers and (
                not isinstance(tokenizers, dict) or not {"src", "tgt"} <= tokenizers.keys()
                or not all(isinstance(tokenizers[side], str) for side in ("src", "tgt"))):
            raise AttnlabError(f"{Path(run) / 'config.json'} holds broken settings (\"settings\" must be an object "
                               "whose \"tokenizers\", if any, names a \"src\" and a \"tgt\" file)")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# --------------------------------------------------------------------------------------------------
# scores


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """sacreBLEU's BLEU (cased, 13a tokenization, on detokenized text) and chrF, with their signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    if not references:
        raise AttnlabError("nothing to score: no sentences")
    if len(hypotheses) != len(references):
        raise AttnlabError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": b.score, "chrf": c.score, "signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b), "sentences": len(hypotheses)}


def teacher_forced_nll(model: nn.Module, pairs: Pairs, *, max_tokens: int = 8000) -> float:
    """Mean negative log-likelihood per target token (eos included) with the reference as decoder input.

    No label smoothing: this is the plain loss that perplexity is ``exp`` of.
    """
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.inference_mode():
        for chunk in sorted_chunks(pairs.lengths(), max_tokens):
            data = {k: v.to(device) for k, v in collate(pairs, chunk).items()}
            logits = model(data["src"], data["tgt_in"])
            total += float(F.cross_entropy(logits.flatten(0, 1).float(), data["tgt_out"].flatten(),
                                           ignore_index=PAD_ID, reduction="sum"))
            count += real_tokens(data["tgt_out"])
    return total / max(count, 1)


# --------------------------------------------------------------------------------------------------
# the task


class TranslationTask:
    """Batches, loss and evaluation of translation for :class:`~attnlab.training.Trainer`.

    Args:
        train: encoded training pairs.
        valid: encoded validation pairs (teacher-forced loss).
        valid_sources: validation sources as encoder inputs, and ``valid_refs`` their reference texts
            (BLEU; every line, even one whose target was too long for the loss).
        tgt_tokenizer: turns generated ids back into text.
        settings: task settings.
        seed: batch order seed.
    """

    def __init__(self, train: Pairs, valid: Pairs, valid_sources: list[list[int]], valid_refs: list[str],
                 tgt_tokenizer: BPETokenizer, settings: TranslateSettings, seed: int = 0) -> None:
        self.train, self.valid = train, valid
        self.valid_sources, self.valid_refs = valid_sources, valid_refs
        self.tgt_tokenizer, self.settings, self.seed = tgt_tokenizer, settings, seed

    def batches(self, epoch: int, place: Place) -> Iterator[Batch]:
        """Length-bucketed token batches; under DDP each process takes every ``world``-th pair of a batch."""
        for index in token_batches(self.train, max_tokens=self.settings.max_tokens, seed=self.seed, epoch=epoch):
            mine = shard(index, place)
            if not mine:
                # A batch of fewer pairs than processes leaves this one none. It runs the batch's first pair with
                # every target token ignored (a loss and gradient of exactly 0, through the layers the others
                # run), so that N processes train on what one process does; skipping the batch would not.
                data = collate(self.train, index[:1])
                data["tgt_out"] = torch.full_like(data["tgt_out"], PAD_ID)
                yield Batch(data, count=0, tokens=0)
                continue
            data = collate(self.train, mine)
            yield Batch(data, count=real_tokens(data["tgt_out"]),
                        tokens=real_tokens(data["src"]) + real_tokens(data["tgt_out"]))

    def loss(self, model: nn.Module, data: dict[str, Tensor]) -> Tensor:
        """Summed label-smoothed cross-entropy over the real target tokens (padding ignored)."""
        logits = model(data["src"], data["tgt_in"])  # (batch, tgt, vocab)
        return F.cross_entropy(logits.flatten(0, 1).float(), data["tgt_out"].flatten(), ignore_index=PAD_ID,
                               label_smoothing=self.settings.label_smoothing, reduction="sum")

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Teacher-forced loss and greedy BLEU/chrF on the validation set; ``score`` by ``settings.select``."""
        nll = teacher_forced_nll(model, self.valid)
        if not math.isfinite(nll):  # the engine says so; decoding NaN scores would fail on another account first
            return {"loss": nll, "score": math.nan}
        hyps = translate_ids(model, self.valid_sources, DecodeSettings(beam_size=1))
        scores = corpus_scores([self.tgt_tokenizer.decode(h) for h in hyps], self.valid_refs)
        metrics = {"loss": nll, "ppl": math.exp(min(nll, 50.0)), "bleu": scores["bleu"], "chrf": scores["chrf"]}
        metrics["score"] = -nll if self.settings.select == "loss" else scores["bleu"]
        return metrics


# --------------------------------------------------------------------------------------------------
# tokenizers and data


def train_tokenizers(src_lines: Sequence[str], tgt_lines: Sequence[str], settings: TranslateSettings
                     ) -> tuple[BPETokenizer, BPETokenizer]:
    """BPE on the training side only: one joint vocabulary, or one per language."""
    if settings.joint_vocab:
        joint = BPETokenizer.train([*src_lines, *tgt_lines], vocab_size=settings.vocab_size)
        return joint, joint
    return (BPETokenizer.train(src_lines, vocab_size=settings.vocab_size),
            BPETokenizer.train(tgt_lines, vocab_size=settings.vocab_size))


def save_tokenizers(run: Path, src_tok: BPETokenizer, tgt_tok: BPETokenizer, settings: TranslateSettings) -> None:
    """Write ``tokenizer.json`` (joint) or ``tokenizer.SRC.json`` and ``tokenizer.TGT.json``; record the names."""
    if src_tok is tgt_tok:
        settings.tokenizers = {"src": TOKENIZER, "tgt": TOKENIZER}
        src_tok.save(run / TOKENIZER)
        return
    settings.tokenizers = {"src": f"tokenizer.{settings.src}.json", "tgt": f"tokenizer.{settings.tgt}.json"}
    src_tok.save(run / settings.tokenizers["src"])
    tgt_tok.save(run / settings.tokenizers["tgt"])


def load_tokenizers(run: Path, settings: TranslateSettings,
                    vocab_sizes: tuple[int, int] | None = None) -> tuple[BPETokenizer, BPETokenizer]:
    """The run's source and target tokenizers (one object when the vocabulary is joint); ``vocab_sizes``, the
    model's (source, target) vocabularies, which they must match."""
    names = settings.tokenizers or {"src": TOKENIZER, "tgt": TOKENIZER}
    src_size, tgt_size = vocab_sizes or (None, None)
    src_tok = load_tokenizer(run / names["src"], src_size)
    tgt_tok = (load_tokenizer(run / names["tgt"], tgt_size) if names["tgt"] != names["src"] or tgt_size != src_size
               else src_tok)
    if not isinstance(src_tok, BPETokenizer) or not isinstance(tgt_tok, BPETokenizer):
        raise AttnlabError(f"{run} holds no BPE tokenizer for translation")
    return src_tok, tgt_tok


def _encode_corpus(prefix: str | Path, src_tok: BPETokenizer, tgt_tok: BPETokenizer, settings: TranslateSettings,
                   model_kwargs: dict[str, Any], what: str) -> Pairs:
    src_lines, tgt_lines = read_parallel(prefix, settings.src, settings.tgt)
    return encode_pairs(src_tok.encode_batch(src_lines), tgt_tok.encode_batch(tgt_lines),
                        model_kwargs["max_src_positions"], model_kwargs["max_tgt_positions"], what)


# --------------------------------------------------------------------------------------------------
# training


def build_translation_model(vocab: tuple[int, int], model_kwargs: dict[str, Any], *, share_embeddings: bool,
                            tie_output: bool, look_ahead_mask: bool = True) -> Transformer:
    """The core encoder-decoder (or its leaky variant) for these vocabulary sizes."""
    cls = Transformer if look_ahead_mask else LeakyTransformer
    model = cls(vocab[0], vocab[1], pad_id=PAD_ID, share_embeddings=share_embeddings, tie_output=tie_output,
                **model_kwargs)
    _init_embeddings(model)
    return model


def _init_embeddings(model: Transformer) -> None:
    """Draw the token tables (one when shared) from N(0, 1/d_model), in place.

    nn.Embedding draws from N(0, 1). Times sqrt(d) at the input that is loud but harmless; as the tied
    output matrix it makes the first logits ~sqrt(d) wide and the softmax nearly one-hot, and training
    stalls. N(0, 1/d) (fairseq, tensor2tensor) gives unit-scale logits and the same input scale as the paper.
    """
    for table in {id(t): t for t in (model.encoder.embed.tokens, model.decoder.embed.tokens)}.values():
        nn.init.normal_(table.weight, std=table.embedding_dim ** -0.5)


def _silent(_line: str) -> None:
    """The log of a process other than rank 0."""


def _data_record(settings: TranslateSettings, **given: str | Path) -> dict[str, Any]:
    """What ``config.json`` keeps of the data: each prefix, and each of its two files (:func:`file_record`)."""
    files = {f"{split}.{lang}": side_path(prefix, lang) for split, prefix in given.items()
             for lang in (settings.src, settings.tgt)}
    return {**{split: str(Path(prefix).resolve()) for split, prefix in given.items()},
            "files": {key: file_record(path) for key, path in files.items()}}


def _same_data(saved: dict[str, Any], **given: str | Path) -> None:
    """Refuse a resume on other training or validation data than the run's (its batches would not repeat, and its
    best weights were chosen on the validation data), checked on the files this resume reads, by content: the
    same files under another name or path are the same data (:func:`holds_recorded_data`)."""
    if "files" not in saved:  # a run from before the digests: its prefixes are all there is to compare
        for split, path in given.items():
            if split in saved and Path(saved[split]).resolve() != Path(path).resolve():
                raise AttnlabError(f"--{split} {path} is not the {split} data this run started with "
                                   f"({saved[split]}); resume needs the same data")
    for key, file in saved.get("files", {}).items():
        split, lang = key.split(".", 1)
        now = side_path(given[split], lang)
        if not holds_recorded_data(now, file):
            refuse_changed(now, file["sha256"], what=f"{split} data", started_with=file["path"])


def _resumed_config(out: Path, run_cfg: dict[str, Any], saved: TranslateSettings, requested: dict[str, Any],
                    config: TrainConfig, log: Callable[[str], None]) -> TrainConfig:
    """The engine settings a resumed run continues with, saying aloud what differs from how it started.

    The data, tokenizer and model settings are the run's: a requested one that differs is named as ignored.
    The engine settings are the run's too, except those requested (a run may be given more steps or time);
    a change is said aloud, since a resumed run equals an uninterrupted one only with the same settings.
    The seed stays the run's: it drew the first weights and orders every epoch's batches.
    """
    ignored = ignored_on_resume(requested, {**asdict(saved), **run_cfg["model"]["kwargs"]},
                                "data, tokenizer and model settings")
    if ignored is not None:
        log(ignored)
    started = run_cfg.get("train", {})
    if "seed" in requested and "seed" in started and requested["seed"] != started["seed"]:
        log(f"resume: keeping the run's seed {started['seed']} (--seed {requested['seed']} ignored)")
    # (where it runs and how, device, compile and the progress bar, are this process's, not the run's)
    engine = {f.name for f in fields(TrainConfig)} - {"seed", "progress", "device", "compile"}
    kept = {k: tuple(v) if isinstance(v, list) else v for k, v in started.items() if k in engine | {"seed"}}
    before = replace(config, **kept)
    resumed = replace(before, **{k: v for k, v in requested.items() if k in engine})
    resumed.validate()
    if has_checkpoint(out):  # said before anything else: a length the run is past, or a run that has ended
        reached = refuse_ended(out, steps=resumed.max_steps, max_seconds=resumed.max_seconds,
                               steps_option="--max-steps", lengthened=resumed.max_steps != before.max_steps)
    now = json.loads(json.dumps(config_dict(resumed)))  # as config.json holds it (tuples become lists)
    changed = {k: v for k, v in now.items() if k in engine and k in started and started[k] != v}
    if changed:
        log("resume: continuing with other training settings than before: "
            + ", ".join(f"{k} {started[k]!r} -> {v!r}" for k, v in sorted(changed.items())))
    if resumed.max_steps != before.max_steps and has_checkpoint(out):
        log(length_changed(before.learning_rates(), resumed.learning_rates(), reached))
    return resumed


@holds_run_folder
def train_translation(
    *,
    train: str | Path,
    valid: str | Path,
    out: str | Path,
    settings: TranslateSettings,
    model_kwargs: dict[str, Any] | None = None,
    share_embeddings: bool = True,
    tie_output: bool = True,
    train_config: TrainConfig | None = None,
    resume: bool = False,
    requested: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    on_note: Callable[[str], None] = print,
) -> TrainResult:
    """Train (or resume) a translation run in ``out`` and return the engine's summary.

    A fresh run trains the tokenizer(s) on the training side, writes them and ``config.json``, then
    trains; ``resume=True`` reads both back from ``out`` and continues from its checkpoint, with the
    run's settings except the engine settings named in ``requested`` (by field name: what a command line
    gave; ``None`` counts every field of ``settings``, ``model_kwargs`` and ``train_config`` as given).
    ``on_note`` receives the line on the data and the model (the command prints it on stdout, as ``train lm``
    and ``train classify`` print theirs), ``log`` what the run does on the way (its BPE training, what a
    resume keeps and changes: stderr).
    """
    out = Path(out)
    config = train_config or TrainConfig(**RECIPE_TRAIN)
    config.validate()  # before anything is written: a bad setting leaves no half-made run
    main = is_main_process()
    if not main:  # under torchrun rank 0 reports; the others would repeat it
        log = on_note = _silent
    existed = out.exists()  # a run that fails before its first checkpoint removes the folder only if it made it
    refuse_bad_run_path(out)
    if resume:
        run_cfg = read_run_config(out, TASK)
        refuse_restart_over_a_report(out)  # (before anything is read or said)
        saved = TranslateSettings.from_dict(run_cfg["settings"], out)
        _same_data(run_cfg.get("data", {}), train=train, valid=valid)
        if requested is None:
            requested = ({k: v for k, v in asdict(settings).items() if k != "tokenizers"} | (model_kwargs or {})
                         | config_dict(config))
        config = _resumed_config(out, run_cfg, saved, requested, config, log)
        settings = saved
        saved_model = run_cfg["model"]["kwargs"]
        model_kwargs = {k: saved_model[k] for k in ("max_src_positions", "max_tgt_positions")}
        sizes = (saved_model.get("src_vocab_size"), saved_model.get("tgt_vocab_size"))
        src_tok, tgt_tok = load_tokenizers(out, settings, None if None in sizes else sizes)
    else:
        refuse_existing_run(out, TASK)  # every process checks, before the barrier below lets rank 0 write
        model_kwargs = {**RECIPE_MODEL, **(model_kwargs or {})}
        if share_embeddings and not settings.joint_vocab:
            raise AttnlabError("shared embeddings need the joint vocabulary (--joint-vocab) or --no-share-embeddings")
        src_lines, tgt_lines = read_parallel(train, settings.src, settings.tgt)
        read_parallel(valid, settings.src, settings.tgt)  # a missing or broken one is said now, not after the BPE
        log(f"training BPE ({'joint' if settings.joint_vocab else 'separate'}, {settings.vocab_size}) "
            f"on {len(src_lines)} training pairs")
        src_tok, tgt_tok = train_tokenizers(src_lines, tgt_lines, settings)
    train_pairs = _encode_corpus(train, src_tok, tgt_tok, settings, model_kwargs, "training")
    valid_src, valid_ref = read_parallel(valid, settings.src, settings.tgt)
    if settings.valid_sentences:  # the same first lines for the loss and for BLEU, whichever pairs are left out
        valid_src, valid_ref = valid_src[: settings.valid_sentences], valid_ref[: settings.valid_sentences]
    # Every line is translated for BLEU; the pairs whose target fits also give the loss.
    valid_sources = source_ids(src_tok.encode_batch(valid_src), model_kwargs["max_src_positions"], "validation source")
    valid_pairs = pair_sources(valid_sources, tgt_tok.encode_batch(valid_ref), model_kwargs["max_tgt_positions"],
                               "validation")
    seed_everything(config.seed)
    # Killed before its first checkpoint: build the weights the run started from (the same seed and saved
    # model settings) and start again from step 0, which repeats it exactly, as classify and lm do.
    restart = resume and not has_checkpoint(out)
    if restart:
        log(f"{out} has no checkpoint yet: starting the run again from step 0")
    if resume:
        model = build_model(run_cfg["model"])
        if restart:
            _init_embeddings(model)
    else:
        model = build_translation_model((src_tok.vocab_size, tgt_tok.vocab_size), model_kwargs,
                                        share_embeddings=share_embeddings, tie_output=tie_output,
                                        look_ahead_mask=settings.look_ahead_mask)
        place = distributed.checked_by_all(config.device)
        if main:
            ensure_writable_dir(out)  # (and locked now, before the first file is written)
        refuse_run_taken_meanwhile(out, TASK, place, new_run=True)  # again, now that the folder is locked
        if main:
            data_record = _data_record(settings, train=train, valid=valid)  # (first: it reads the data again)
            with first_files(out, writer=True):
                save_tokenizers(out, src_tok, tgt_tok, settings)
                write_run_config(out, {"task": TASK, "model": model_config(model), "train": config_dict(config),
                                       "settings": asdict(settings), "data": data_record})
    task = TranslationTask(train_pairs, valid_pairs, valid_sources, valid_ref, tgt_tok, settings, seed=config.seed)
    on_note(f"{len(train_pairs)} training pairs, {len(valid_pairs)} validation pairs; model {type(model).__name__} "
            f"with {model.num_parameters():,} parameters")

    def record() -> None:  # what the run now is, once its checkpoint has loaded: an interrupted lengthening goes on
        if main:  # with a plain --resume, and a resume that fails before changes nothing
            write_run_config(out, {**run_cfg, "train": config_dict(config)})

    if restart:  # no checkpoint to load: it starts again from step 0 with what it now is
        record()
    result = train_or_forget(model, task, config, out, resume=resume and not restart,
                             existed=existed, task_files=set(settings.tokenizers.values()),
                             on_resumed=record if resume else None)
    if main:
        write_json_atomic(out / RESULT, {"steps": result.steps, "seconds": round(result.elapsed, 1),
                                         "tokens_per_second": round(result.tokens_per_second), "best": result.best,
                                         "final_loss": result.final_loss, "stopped_early": result.stopped_early,
                                         "out_of_time": result.out_of_time})
    return result
