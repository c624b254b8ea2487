"""``attnlab train translate``: the encoder-decoder on parallel text (defaults: the Multi30k benchmark recipe)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from attnlab.cli import SEED
from attnlab.cli.params import BPE_VOCAB, FiniteFloat, PathParam, Threads, WholeNumber, progress_option
from attnlab.cli.train import says_how_to_continue
from attnlab.cli.translate import report_warnings
from attnlab.errors import AttnlabError
from attnlab.nn.attention import check_heads_option
from attnlab.tasks.translate import RECIPE_MODEL, RECIPE_TRAIN, TranslateSettings, train_translation
from attnlab.training import TrainConfig
from attnlab.training.engine import config_dict

_M, _T = RECIPE_MODEL, RECIPE_TRAIN
# The settings each option sets, where their names differ (the others set the setting of their own name).
_SETTING_KEYS = {"layers": ("num_layers",), "heads": ("num_heads",), "warmup": ("warmup_steps",),
                 "max_positions": ("max_src_positions", "max_tgt_positions"), "leak": ("look_ahead_mask",)}


@click.command(name="translate")
@click.option("--train", "train", required=True, help="Training corpus prefix: PREFIX.SRC and PREFIX.TGT (.gz allowed).")
@click.option("--valid", "valid", required=True, help="Validation corpus prefix (model selection).")
@click.option("--src", "src", default="de", show_default=True, help="Source language suffix.")
@click.option("--tgt", "tgt", default="en", show_default=True, help="Target language suffix.")
@click.option("--out", "out", required=True, type=PathParam(path_type=Path), help="Run folder to create (or resume).")
@click.option("--joint-vocab/--separate-vocab", default=True, show_default=True,
              help="One BPE vocabulary for both languages, or one each.")
@click.option("--vocab-size", type=BPE_VOCAB, default=TranslateSettings.vocab_size, show_default=True, help="BPE vocabulary size (each).")
@click.option("--share-embeddings/--no-share-embeddings", default=True, show_default=True,
              help="One embedding table for source and target (only with --joint-vocab).")
@click.option("--tie-output/--no-tie-output", default=True, show_default=True,
              help="Output projection reuses the target embedding matrix.")
@click.option("--d-model", type=WholeNumber(min=1), default=_M["d_model"], show_default=True)
@click.option("--layers", type=WholeNumber(min=1), default=_M["num_layers"], show_default=True, help="Encoder and decoder layers each.")
@click.option("--heads", type=WholeNumber(min=1), default=_M["num_heads"], show_default=True)
@click.option("--d-ff", type=WholeNumber(min=1), default=_M["d_ff"], show_default=True)
@click.option("--dropout", type=FiniteFloat(0, 1, max_open=True), default=_M["dropout"], show_default=True)
@click.option("--max-positions", type=WholeNumber(min=1), default=_M["max_src_positions"], show_default=True,
              help="Position table size of each side. Longer sources are truncated (with a warning); training "
                   "pairs with longer targets are left out (with a warning).")
@click.option("--max-tokens", type=WholeNumber(min=1), default=TranslateSettings.max_tokens, show_default=True,
              help="Padded positions per side in one training batch (length-bucketed).")
@click.option("--label-smoothing", type=FiniteFloat(0, 1, max_open=True), default=TranslateSettings.label_smoothing, show_default=True)
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=_T["lr"], show_default=True, help="Peak learning rate.")
@click.option("--warmup", type=WholeNumber(min=0), default=_T["warmup_steps"], show_default=True, help="Linear warmup steps.")
@click.option("--schedule", type=click.Choice(["inverse_sqrt", "cosine", "constant"]), default=_T["schedule"],
              show_default=True)
@click.option("--max-steps", "--steps", "max_steps", type=WholeNumber(min=1), default=_T["max_steps"],
              show_default=True)
@click.option("--max-seconds", type=FiniteFloat(min=0), default=_T["max_seconds"], show_default=True,
              help="Time budget (training plus validation); 0 = none.")
@click.option("--ema", "ema_decay", type=FiniteFloat(0, 1, max_open=True), default=0.0, show_default=True,
              help="Validate and keep a moving average of the weights with this decay per step (0: off).")
@click.option("--eval-every", type=WholeNumber(min=0), default=_T["eval_every"], show_default=True, help="Validate every N steps (0: only at the end), and at the end.")
@click.option("--checkpoint-every", type=WholeNumber(min=0), default=0, show_default=True,
              help="Also write the resume checkpoint every N steps (0: at validations only).")
@click.option("--select", type=click.Choice(["bleu", "loss"]), default="bleu", show_default=True,
              help="Keep the weights with the best validation BLEU (greedy) or the lowest validation loss.")
@click.option("--valid-sentences", type=WholeNumber(min=0), default=0, show_default=True, help="Validate on the first N pairs only (0 = all).")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--bf16/--no-bf16", default=False, help="bfloat16 autocast (fast only on CPUs and GPUs with bf16 units).")
@click.option("--threads", type=Threads(), default=None, help="torch CPU threads (default or 0: torch's choice).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its checkpoint.")
@click.option("--no-look-ahead-mask", "leak", is_flag=True, hidden=True,
              help="Train without the decoder's look-ahead mask (the teacher-forcing experiment's broken model).")
@progress_option()
@says_how_to_continue("checkpoints are saved at each validation, --eval-every N, and every --checkpoint-every N steps")
def train_translate(train: str, valid: str, src: str, tgt: str, out: Path, joint_vocab: bool, vocab_size: int,
                    share_embeddings: bool, tie_output: bool, d_model: int, layers: int, heads: int, d_ff: int,
                    dropout: float, max_positions: int, max_tokens: int, label_smoothing: float, lr: float,
                    warmup: int, schedule: str, max_steps: int, max_seconds: float, ema_decay: float, eval_every: int,
                    checkpoint_every: int, select: str, valid_sentences: int, seed: int, bf16: bool, threads: int | None, resume: bool, leak: bool,
                    progress: bool) -> None:
    """Train a translation model from PREFIX.SRC/PREFIX.TGT line-aligned files into the run folder --out.

    BPE is trained on the training side only. Loss: label-smoothed cross-entropy over real target tokens;
    validation: teacher-forced loss and greedy BLEU (sacreBLEU) on --valid.
    """
    import torch

    explicit = click.get_current_context().get_parameter_source("share_embeddings")
    if share_embeddings and not joint_vocab and explicit == click.core.ParameterSource.COMMANDLINE:
        raise AttnlabError("--share-embeddings needs the joint vocabulary; drop --separate-vocab or the sharing")
    check_heads_option(d_model, heads, width_option="--d-model")  # before the BPE training that would come first
    if threads:
        torch.set_num_threads(threads)
    settings = TranslateSettings(src=src, tgt=tgt, joint_vocab=joint_vocab, vocab_size=vocab_size,
                                 max_tokens=max_tokens, label_smoothing=label_smoothing, look_ahead_mask=not leak,
                                 select=select, valid_sentences=valid_sentences)
    model_kwargs = dict(d_model=d_model, num_layers=layers, num_heads=heads, d_ff=d_ff, dropout=dropout,
                        max_src_positions=max_positions, max_tgt_positions=max_positions)
    config = TrainConfig(**{**_T, "lr": lr, "warmup_steps": warmup, "schedule": schedule, "max_steps": max_steps,
                            "max_seconds": max_seconds, "ema_decay": ema_decay, "eval_every": eval_every,
                            "checkpoint_every": checkpoint_every, "seed": seed,
                            "bf16": bf16, "progress": progress})
    # On --resume only the options given on this command line count: the run keeps its own for the rest.
    ctx = click.get_current_context()
    given = [name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    values = ({k: v for k, v in asdict(settings).items() if k != "tokenizers"} | model_kwargs | config_dict(config)
              | {"share_embeddings": share_embeddings and joint_vocab, "tie_output": tie_output})
    requested = {key: values[key] for name in given for key in _SETTING_KEYS.get(name, (name,)) if key in values}
    with report_warnings():
        result = train_translation(train=train, valid=valid, out=out, settings=settings, model_kwargs=model_kwargs,
                                   share_embeddings=share_embeddings and joint_vocab, tie_output=tie_output,
                                   train_config=config, resume=resume, requested=requested,
                                   log=lambda m: click.echo(m, err=True), on_note=click.echo)
    best = result.best
    chosen = (f"best at step {best['step']}: validation BLEU {best['bleu']:.2f}, chrF {best['chrf']:.1f}, "
              f"loss {best['loss']:.3f}" if best else "no validation ran")
    tokenizers = ", ".join(sorted(p.name for p in out.glob("tokenizer*.json")))  # one joint, or one a side
    click.echo(f"run folder: {out} (model.safetensors, config.json, {tokenizers}, metrics.jsonl, loss.png, result.json)")
    stopped = " (stopped by the --max-seconds time budget)" if result.out_of_time else ""
    click.echo(f"{result.steps} steps{stopped} in {result.elapsed:.1f} s ({result.tokens_per_second:,.0f} source and "
               f"target tokens/s) | {chosen}")
