"""Teacher-forced loss versus free-running BLEU, for a correct model and one without the look-ahead mask.

Seed 000's review question 4: a decoder trained without its look-ahead mask reads the token it must
predict from its own input. Its teacher-forced validation loss looks *better* than a correct model's;
decoding freely, with only its own past to read, it collapses. This command trains both (same data,
settings and seed; the weights with the lowest validation loss kept, as a loss-watching user would)
and prints the two numbers side by side. ``--correct RUN --leaky RUN`` reports on runs trained before.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from attnlab.cli import SEED
from attnlab.cli.params import BPE_VOCAB, FiniteFloat, PathParam, Threads, WholeNumber, progress_option
from attnlab.cli.translate import report_warnings
from attnlab.tasks.translate import TranslateSettings


def _markdown(rows: list[dict]) -> str:
    lines = ["| model | look-ahead mask | teacher-forced loss (ppl) | free-running BLEU | chrF |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {'yes' if r['look_ahead_mask'] else 'no'} | {r['teacher_forced_loss']:.3f} "
                     f"({r['teacher_forced_ppl']:.2f}) | {r['free_running_bleu']:.2f} | {r['free_running_chrf']:.2f} |")
    return "\n".join(lines) + "\n"


def _refuse_unlike(runs: dict[str, Path]) -> None:
    """The table compares the two models on one validation text in one unit, the loss per target token: runs of
    other languages, or whose target tokenizers differ, cannot be compared, and are refused. Models that differ in
    more than the mask are compared with a note that says how."""
    from attnlab.errors import AttnlabError
    from attnlab.training.checkpoint import TOKENIZER, read_run_config

    (a, run_a), (b, run_b) = runs.items()
    config_a, config_b = read_run_config(run_a, "translate"), read_run_config(run_b, "translate")
    pair_a, pair_b = ((c.get("settings", {}).get("src"), c.get("settings", {}).get("tgt")) for c in (config_a, config_b))
    if pair_a != pair_b:
        raise AttnlabError(f"the {a} run {run_a} translates {pair_a[0]} to {pair_a[1]} but the {b} run {run_b} "
                           f"{pair_b[0]} to {pair_b[1]}: the table compares the two on one validation text")

    def target_tokenizer(run: Path, config: dict) -> bytes:
        path = run / config.get("settings", {}).get("tokenizers", {}).get("tgt", TOKENIZER)
        try:
            return path.read_bytes()
        except OSError as err:  # said as loading the run would say it, not as tokenizers that differ
            raise AttnlabError(f"no tokenizer file {path}" if not path.exists() else
                               f"cannot read {path}: {err.strerror or err}") from err

    if target_tokenizer(run_a, config_a) != target_tokenizer(run_b, config_b):
        raise AttnlabError(f"the {a} run {run_a} and the {b} run {run_b} cut target text into different tokens (their "
                           "tokenizers differ), so their losses per token cannot be compared; train both on the same "
                           "--train with the same --vocab-size")
    kwargs_a, kwargs_b = (c.get("model", {}).get("kwargs", {}) for c in (config_a, config_b))
    differ = [f"{k} {kwargs_a.get(k)} vs {kwargs_b.get(k)}" for k in sorted(kwargs_a.keys() | kwargs_b.keys())
              if kwargs_a.get(k) != kwargs_b.get(k)]
    if differ:
        click.echo(f"note: the {a} and {b} models differ in more than the look-ahead mask ({', '.join(differ)})",
                   err=True)


def _refuse_other_training_data(name: str, given: Path, run_config: dict, train: str, pair: tuple) -> None:
    """Refuse, before anything trains, a --train other than the reused run's: the model trained beside it would
    learn other tokens (and from other text), and the two could not be compared."""
    from attnlab.errors import AttnlabError
    from attnlab.tasks.parallel_data import holds_recorded_data, side_path

    saved = run_config.get("data", {}).get("files", {})  # (runs from before the digests have none)
    for lang in pair:
        record = saved.get(f"train.{lang}")
        if record and not holds_recorded_data(side_path(train, lang), record):
            raise AttnlabError(f"--train {train} is not the training data of --{name} {given} (its {lang} side was "
                               f"{record['path']}): the model trained beside it must learn the same tokens from the "
                               "same text")


@click.command(name="teacher-forcing")
@click.option("--train", "train", default=None, help="Training corpus prefix (to train both models).")
@click.option("--valid", "valid", required=True, help="Validation corpus prefix: both measurements use it.")
@click.option("--src", default=TranslateSettings.src, show_default=True, help="Source language suffix.")
@click.option("--tgt", default=TranslateSettings.tgt, show_default=True, help="Target language suffix.")
@click.option("--out", "out", required=True, type=PathParam(path_type=Path),
              help="Folder for the two runs (correct/, leaky/) and report.json, report.md.")
@click.option("--correct", type=PathParam(path_type=Path), default=None, help="Use this trained run instead of training.")
@click.option("--leaky", type=PathParam(path_type=Path), default=None, help="Use this trained leaky run.")
@click.option("--max-seconds", type=FiniteFloat(min=0), default=300.0, show_default=True,
              help="Training budget of each model (0: none).")
@click.option("--max-steps", type=WholeNumber(min=1), default=1_000_000, show_default=True)
@click.option("--eval-every", type=WholeNumber(min=0), default=500, show_default=True,
              help="Validate every N steps (0: only at the end), and at the end.")
@click.option("--vocab-size", type=BPE_VOCAB, default=TranslateSettings.vocab_size, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True, help="The seed of both models (the same weights to start).")
@click.option("--threads", type=Threads(), default=None, help="torch CPU threads (default or 0: torch's choice).")
@progress_option(what=" while training")
def teacher_forcing(train: str | None, valid: str, src: str, tgt: str, out: Path, correct: Path | None,
                    leaky: Path | None, max_seconds: float, max_steps: int, eval_every: int, vocab_size: int,
                    seed: int, threads: int | None, progress: bool) -> None:
    """Report validation loss under teacher forcing next to free-running BLEU, with and without the look-ahead mask."""
    import torch

    from attnlab.errors import AttnlabError
    from attnlab.files import refuse_non_folder, refuse_unwritable, write_json_atomic, write_text_atomic
    from attnlab.tasks.translate import RECIPE_TRAIN, train_translation
    from attnlab.tasks.translator import teacher_forcing_rows
    from attnlab.training import TrainConfig
    from attnlab.training.checkpoint import read_run_config, refuse_bad_run_path, why_run_folder_taken

    refuse_non_folder(out, "--out")
    if threads:
        torch.set_num_threads(threads)
    runs: dict[str, Path] = {}
    ctx = click.get_current_context()

    def asked(option: str) -> bool:
        return ctx.get_parameter_source(option) == click.core.ParameterSource.COMMANDLINE

    reused: dict[str, object] = {}  # the settings of a reused run, which the model trained beside it takes
    reused_tables: dict[str, bool] = {}  # and its model's token tables (shared or not, output tied or not)
    for name, given in (("correct", correct), ("leaky", leaky)):  # checked before anything is trained
        if given is None and (out / name / "config.json").exists():
            raise AttnlabError(f"{out / name} already holds a run; measure it again with --{name} {out / name}, "
                               "or choose another --out")
        if given is None:  # where it will train: said now, not after the other model's training
            folder = out / name
            if folder.exists() and not folder.is_dir():
                raise AttnlabError(f"{folder} exists and is not a folder; the experiment trains its {name} run there: "
                                   "move it or choose another --out")
            refuse_bad_run_path(folder)
            why = why_run_folder_taken(folder, "translate")
            if why is not None:
                raise AttnlabError(why)
        if given is not None:  # a run of another task, or no run, or the wrong one of the two, is named now
            run_config = read_run_config(given, "translate")
            run_settings = run_config.get("settings", {})
            TranslateSettings.from_dict(run_settings, given)  # a hand-broken settings block is named here
            masked = run_settings.get("look_ahead_mask", True)
            if masked != (name == "correct"):
                other = "leaky" if name == "correct" else "correct"
                raise AttnlabError(f"--{name} {given} was trained {'with' if masked else 'without'} the look-ahead "
                                   f"mask: it is a {other} run; pass it as --{other}")
            pair = (run_settings.get("src"), run_settings.get("tgt"))
            # A reused run reads --valid in its own languages: only the sides given can contradict them.
            differs = [f"--{option} {value}" for option, value, own in (("src", src, pair[0]), ("tgt", tgt, pair[1]))
                       if asked(option) and value != own]
            if differs:
                raise AttnlabError(f"--{name} {given} translates {pair[0]} to {pair[1]}, not as {' '.join(differs)} "
                                   "says")
            if asked("vocab_size") and run_settings.get("vocab_size") != vocab_size and None in (correct, leaky):
                raise AttnlabError(f"--{name} {given} has a vocabulary of {run_settings.get('vocab_size')}: the model "
                                   f"trained beside it needs the same tokens to compare losses per token, not "
                                   f"--vocab-size {vocab_size}")
            reused = {k: run_settings[k] for k in ("src", "tgt", "vocab_size", "joint_vocab") if k in run_settings}
            # and its embedding layout: separate vocabularies cannot share one table
            kwargs = run_config.get("model", {}).get("kwargs", {})
            reused_tables = {k: kwargs[k] for k in ("share_embeddings", "tie_output") if k in kwargs}
            if train is not None and None in (correct, leaky):
                _refuse_other_training_data(name, given, run_config, train, pair)
    for report in (out / "report.json", out / "report.md"):  # written last, after the training: checked first
        if report.is_dir():
            raise AttnlabError(f"{report} is a folder, where the report goes; move it or choose another --out")
        refuse_unwritable(report, str(report))
    if correct is not None and leaky is not None:  # nothing is trained: options for training would go unheard
        unused = [f"--{o.replace('_', '-')}" for o in ("train", "max_seconds", "max_steps", "eval_every", "vocab_size",
                                                        "seed") if asked(o)]
        if unused:
            click.echo(f"note: {', '.join(unused)} unused: both runs are reused, and nothing is trained", err=True)
    with report_warnings():
        for name, given, mask in (("correct", correct, True), ("leaky", leaky, False)):
            if given is not None:
                runs[name] = given
                continue
            if train is None:
                raise AttnlabError(f"give --train to train the {name} model, or --{name} RUN")
            # Beside a reused run: its languages and vocabulary, so that both cut the text into the same tokens.
            settings = TranslateSettings(**{"src": src, "tgt": tgt, "vocab_size": vocab_size, **reused},
                                         look_ahead_mask=mask, select="loss")
            config = TrainConfig(**{**RECIPE_TRAIN, "max_seconds": max_seconds, "max_steps": max_steps,
                                    "eval_every": eval_every, "seed": seed, "progress": progress})
            beside = (f", with the {'correct' if name == 'leaky' else 'leaky'} run's languages ({settings.src} to "
                      f"{settings.tgt}) and vocabulary ({settings.vocab_size})" if reused else "")
            click.echo(f"training the {name} model ({'with' if mask else 'WITHOUT'} the look-ahead mask){beside}",
                       err=True)
            train_translation(train=train, valid=valid, out=out / name, settings=settings, train_config=config,
                              log=lambda m: click.echo(m, err=True), on_note=lambda m: click.echo(m, err=True),
                              **reused_tables)
            runs[name] = out / name
        _refuse_unlike(runs)
        rows = teacher_forcing_rows(runs, valid)
    table = _markdown(rows)
    if (out / "report.json").exists():  # measuring reused runs again is what the report is for; say it
        click.echo(f"replacing the report in {out} (report.json, report.md)", err=True)
    write_json_atomic(out / "report.json", rows)
    write_text_atomic(out / "report.md", "# Teacher-forced loss versus free-running BLEU\n\n" + table)
    click.echo(table, nl=False)
    click.echo(f"sacreBLEU signature: {rows[0]['signature']}")
    click.echo(json.dumps({"report": str(out / "report.json")}))
