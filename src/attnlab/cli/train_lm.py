"""``attnlab train lm``: a decoder-only language model on random windows of a text file."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from attnlab.cli import SEED, omp_wait  # noqa: F401  (omp_wait: before torch is imported)
from attnlab.cli.params import BPE_VOCAB, FiniteFloat, PathParam, Threads, WholeNumber, progress_option
from attnlab.cli.train import says_how_to_continue
from attnlab.tasks.lm import LMData
from attnlab.tasks.lm_train import LM_PRESETS, RESUME_MAY_CHANGE, LMReport, train_language_model
from attnlab.training.optimizers import OPTIMIZERS


def describe_report(report: LMReport, out: Path) -> list[str]:
    """The closing lines of a run; the last one holds throughput, peak fraction, wall time and final loss."""
    settings = report.settings
    peak = (f"{report.peak_fraction:.1%} of the measured peak {report.peak_flops / 1e9:.1f} GFLOP/s"
            if report.peak_flops else "peak not measured")
    return [
        f"throughput: {report.steady_tokens_per_second:,.0f} training tokens/s steady ({report.steady_basis}), "
        f"{report.tokens_per_second:,.0f} overall ({report.tokens:,} tokens in "
        f"{report.train_seconds:.1f} s, compilation and evaluations included), "
        f"{'bfloat16 autocast' if settings['bf16'] else 'float32'}",
        f"compute: {report.flops_per_token / 1e6:.2f} MFLOP per token (6N + 12LdT) x steady rate = "
        f"{report.model_flops / 1e9:.1f} GFLOP/s; peak = {report.peak_basis or 'not measured'}",
        f"run folder: {out} (model.safetensors, config.json, tokenizer.json, metrics.jsonl, loss.png, result.json)",
        f"{report.steady_tokens_per_second:,.0f} tokens/s | {peak} | wall time {report.wall_seconds:.1f} s"
        f"{' of this resume' if report.resumed else ''} ({_steps(report)}) | final val loss {report.val_loss:.4f} nats/token "
        f"({settings['final_eval_iters']} batch{'es' if settings['final_eval_iters'] != 1 else ''} of "
        f"{settings['eval_batch_size']}x{settings['context']})",
    ]


def _steps(report: LMReport) -> str:
    """``450 steps``, or ``36 of 300 steps, stopped by --max-seconds 3`` for a run its time budget ended."""
    planned, budget = report.settings["steps"], report.settings["max_seconds"]
    done = f"{report.steps} step{'s' if report.steps != 1 else ''}"
    if report.steps < planned:
        return f"{report.steps} of {planned} steps, stopped by --max-seconds {budget:g}" if budget else f"{done} of {planned}"
    return done


def _preset(field: str, text: str = "") -> str:
    """``text`` and what the presets set ``field`` to: ``[preset: 4]`` when they agree, else each one's value."""

    def shown(value: object) -> str:
        if value is None:  # (bf16: where it pays)
            return "on where the CPU or GPU computes in bfloat16 natively"
        if isinstance(value, bool):
            return "on" if value else "off"
        return f"{value:g}" if isinstance(value, float) else str(value)

    values = {name: shown(getattr(preset, field)) for name, preset in LM_PRESETS.items()}
    if len(set(values.values())) == 1:
        return f"{text} [preset: {next(iter(values.values()))}]".strip()
    return f"{text} [{'; '.join(f'{name}: {value}' for name, value in values.items())}]".strip()


@click.command("lm")
@click.option("--text", "text", type=PathParam(path_type=Path), required=True, help="A UTF-8 text file.")
@click.option("--out", "out", type=PathParam(path_type=Path), required=True, help="The run folder to write.")
@click.option("--preset", type=click.Choice(list(LM_PRESETS)), default="nanogpt-cpu", show_default=True,
              help="Starting settings; the options below override them.")
@click.option("--tokenizer", type=click.Choice(["char", "bpe"]), default=None, help=_preset("tokenizer"))
@click.option("--bpe-vocab-size", type=BPE_VOCAB, default=None, help=_preset("bpe_vocab_size", "BPE vocabulary size."))
@click.option("--val-fraction", "--valid-fraction", "val_fraction", type=FiniteFloat(0, 1, min_open=True, max_open=True),
              default=None, help=_preset("val_fraction", "Last fraction of the file held out."))
@click.option("--layers", type=WholeNumber(min=1), default=None, help=_preset("layers"))
@click.option("--heads", type=WholeNumber(min=1), default=None, help=_preset("heads"))
@click.option("--width", "--d-model", "width", type=WholeNumber(min=1), default=None,
              help=_preset("width", "Model width d_model."))
@click.option("--context", "--max-positions", "context", type=WholeNumber(min=1), default=None,
              help=_preset("context", "Context length (position table size)."))
@click.option("--positions", type=click.Choice(["learned", "sinusoidal", "rotary"]), default=None,
              help=_preset("positions"))
@click.option("--bias/--no-bias", default=None,
              help=_preset("bias", "Biases in the linear layers and layer norms (nanoGPT's CPU recipe has none)."))
@click.option("--dropout", type=FiniteFloat(0, 1, max_open=True), default=None, help=_preset("dropout"))
@click.option("--batch-size", type=WholeNumber(min=1), default=None,
              help=_preset("batch_size", "Windows per micro-batch."))
@click.option("--grad-accum", type=WholeNumber(min=1, max=2**16), default=None,
              help=_preset("grad_accum", "Micro-batches per optimizer step (a batch of batch-size x grad-accum "
                                         "windows; at most 65,536, drawn before the step)."))
@click.option("--steps", type=WholeNumber(min=1), default=None,
              help=_preset("steps", "Optimizer steps; may be changed on --resume (the schedule is re-planned)."))
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None, help=_preset("lr", "Peak learning rate."))
@click.option("--min-lr", type=FiniteFloat(min=0), default=None, help=_preset("min_lr", "End of the cosine decay."))
@click.option("--warmup", type=WholeNumber(min=0), default=None, help=_preset("warmup", "Linear warmup steps."))
@click.option("--weight-decay", type=FiniteFloat(min=0), default=None, help=_preset("weight_decay"))
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None,
              help=_preset("optimizer", "muon: Muon for the attention and feed-forward matrices, AdamW for the rest "
                                        "(one --lr and --weight-decay for both)."))
@click.option("--grad-clip", type=FiniteFloat(min=0), default=None,
              help=_preset("grad_clip", "Gradient norm clip (0: off)."))
@click.option("--ema", "ema_decay", type=FiniteFloat(0, 1, max_open=True), default=None,
              help=_preset("ema_decay", "Evaluate and keep a moving average of the weights with this decay per step "
                                        "(0: off)."))
@click.option("--eval-every", type=WholeNumber(min=0), default=None,
              help=_preset("eval_every", "Evaluate every N steps (0: only at the end)."))
@click.option("--checkpoint-every", type=WholeNumber(min=0), default=None,
              help=_preset("checkpoint_every", "Also write the resume checkpoint every N steps (0: at evaluations "
                                               "only)."))
@click.option("--eval-iters", type=WholeNumber(min=1), default=None,
              help=_preset("eval_iters", "Validation batches per evaluation during training."))
@click.option("--final-eval-iters", type=WholeNumber(min=1), default=None,
              help=_preset("final_eval_iters", "Validation batches of the final loss."))
@click.option("--bf16/--no-bf16", default=None, help=_preset("bf16", "bfloat16 autocast."))
@click.option("--compile/--no-compile", "compile_", default=None, help=_preset("compile", "torch.compile the model."))
@click.option("--threads", type=Threads(), default=None, help=_preset("threads", "torch threads (0: one per core)."))
@click.option("--seed", type=SEED, default=None, help=_preset("seed"))
@click.option("--max-seconds", type=FiniteFloat(min=0), default=None,
              help=_preset("max_seconds", "Stop training after this many seconds in all (0: no limit); may be raised "
                                          "on --resume."))
@click.option("--resume", is_flag=True, help="Continue from RUN/checkpoint.")
@progress_option()
@says_how_to_continue("--checkpoint-every N saves one every N steps")
def train_lm(text: Path, out: Path, preset: str, compile_: bool | None, resume: bool, progress: bool,
             **overrides: object) -> None:
    """Train a decoder-only LM (GPT-like) on random windows of TEXT; validation is the file's last fraction.

    Loss is in nats per token (as nanoGPT reports it). The last line printed holds the wall time and the
    final validation loss.
    """
    settings = LM_PRESETS[preset].with_overrides(compile=compile_, **overrides)

    def on_data(data: LMData) -> None:
        click.echo(f"data: {len(data.train):,} training and {len(data.val):,} validation tokens, "
                   f"{data.tokenizer.kind} vocabulary of {data.tokenizer.vocab_size} ids (padding included) | "
                   + ("the run's saved settings" if resume else f"preset {preset}"))

    requested = {k: v for k, v in {"compile": compile_, **overrides}.items() if v is not None}  # given here
    preset_asks = None
    if resume and click.get_current_context().get_parameter_source("preset") == click.core.ParameterSource.COMMANDLINE:
        # A preset asks for its settings: those the run saved otherwise are named with the others in the one
        # "ignored" line (none for the run's own preset and flags). Where the run stops is not a preset's to change.
        preset_asks = {k: v for k, v in asdict(LM_PRESETS[preset]).items()
                       if v is not None and k not in RESUME_MAY_CHANGE}
    _, report = train_language_model(text, out, settings, progress=progress, resume=resume, on_data=on_data,
                                     requested=requested, preset_asks=preset_asks)
    for line in describe_report(report, out):
        click.echo(line)
