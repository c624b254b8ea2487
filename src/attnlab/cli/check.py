"""``attnlab check SPEC --kind KIND``: behavioural checks on any model a factory builds.

Python warnings raised while the model is built and checked (torch's "nested tensors are a prototype"
from ``nn.TransformerEncoder`` with a padding mask, deprecations in the user's file) would otherwise
break into the table, once per call. They are collected instead and each distinct one is printed once,
as a ``warning: ...`` line on stderr after the report, so stdout stays the table (or the JSON) alone; what
the factory or the model prints goes to stderr for the same reason.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections.abc import Iterable
from dataclasses import fields, replace
from pathlib import Path

import click

from attnlab.checks.adapters import hidden_pad_id, is_attnlab_model, pad_id_holder
from attnlab.checks.contract import KINDS, MAX_VOCAB_SIZE, MIN_MAX_LENGTH, MIN_VOCAB_SIZE, Contract
from attnlab.checks.loading import load_model
from attnlab.checks.runner import run_checks
from attnlab.cli.console import console as stdout_console
from attnlab.cli.params import WholeNumber
from attnlab.errors import AttnlabError, in_one_line
from attnlab.training.checkpoint import CONFIG, load_run, read_run_config

_UNSET = object()  # an option left out (None is a value of --pad-id)


def _run_kinds() -> dict[str, str]:
    """A run folder's task -> the kind of model it holds (imported when a run is checked, not for --help)."""
    from attnlab.tasks.classify import TASK_NAME as CLASSIFY
    from attnlab.tasks.leak import LEAKY_TASK_NAME
    from attnlab.tasks.lm import TASK_NAME as LM
    from attnlab.tasks.translate import TASK as TRANSLATE

    return {LM: "decoder", LEAKY_TASK_NAME: "decoder", CLASSIFY: "encoder", TRANSLATE: "seq2seq"}


def _factory_defaults() -> dict[str, object]:
    """The contract of a factory SPEC when no option says otherwise: :class:`Contract`'s own defaults."""
    defaults = {f.name: f.default for f in fields(Contract)}
    return {"kind": None, **{k: defaults[k] for k in ("pad_id", "vocab_size", "max_length")}}


def _pad_id(ctx: click.Context, param: click.Parameter, value: str | None) -> object:
    if value is None:
        return _UNSET
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an integer or 'none'") from None


def warning_lines(caught: Iterable[warnings.WarningMessage]) -> list[str]:
    """Each distinct warning once, in the order first seen: ``Category: first line of the message``."""
    lines: dict[str, None] = {}  # a dict keeps the order and drops repeats
    for w in caught:
        lines[in_one_line(w.message)] = None
    return list(lines)


def run_contract(config: dict) -> dict:
    """The contract options a run folder's ``config.json`` implies: its kind, padding id, vocabulary, length.

    For a translation model the smaller of the two vocabularies and of the two position tables.
    """
    kinds = _run_kinds()
    task = config.get("task")
    if task not in kinds:
        raise AttnlabError(f"a {task!r} run is not one attnlab check knows how to call; use a factory SPEC")
    try:
        kwargs = config["model"]["kwargs"]
        vocab = kwargs.get("vocab_size") or min(kwargs["src_vocab_size"], kwargs["tgt_vocab_size"])
        length = kwargs.get("max_positions") or min(kwargs["max_src_positions"], kwargs["max_tgt_positions"])
    except (KeyError, TypeError, AttributeError) as err:  # a config.json edited by hand, or from elsewhere
        raise AttnlabError(f"the run's {CONFIG} does not give the model's vocabulary and length "
                           f"({type(err).__name__}: {err})") from err
    contract = {"kind": kinds[task], "pad_id": kwargs.get("pad_id"), "vocab_size": vocab, "max_length": length}
    for key, value in list(contract.items())[1:]:  # (a bool is an int to Python, and no size)
        if not (isinstance(value, int) and not isinstance(value, bool)) and not (key == "pad_id" and value is None):
            raise AttnlabError(f"the run's {CONFIG} gives {key} {value!r}, not a whole number")
    return contract


@click.command()
@click.argument("spec")
@click.option("--kind", type=click.Choice(KINDS), default=None,
              help="encoder/decoder: model(ids); seq2seq: model(src, tgt). [factory: required; a run: its task's]")
@click.option("--pad-id", default=None, callback=_pad_id,
              help="Padding id (right padding), or 'none' for a model without padding. [factory: 0, or the pad id of an adapter or of attnlab's model; a run: its own]")
@click.option("--vocab-size", type=WholeNumber(min=MIN_VOCAB_SIZE, max=MAX_VOCAB_SIZE), default=None,
              help="Ids are drawn below this (for seq2seq: the smaller vocabulary). [factory: 32; a run: its own]")
@click.option("--max-length", type=WholeNumber(min=MIN_MAX_LENGTH), default=None,
              help="Longest sequence the model accepts. [factory: 16; a run: its context]")
@click.option("--seeds", type=WholeNumber(min=1), default=5, show_default=True, help="Random seeds per check.")
@click.option("--no-empty-rows", is_flag=True, help="The model does not accept a row made only of padding.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def check(spec: str, kind: str | None, pad_id: object, vocab_size: int | None, max_length: int | None, seeds: int,
          no_empty_rows: bool, as_json: bool) -> None:
    """Run behavioural checks on the model that SPEC names.

    SPEC is a run folder written by `attnlab train` (its kind, padding id, vocabulary and context are the
    defaults), or path/to/file.py:factory or package.module:factory (looked up from the current directory
    too), a factory taking no arguments (or a model built at module level). Exit status 1 when a check fails,
    0 otherwise, 2 when the model cannot be loaded. Python warnings come once each, as 'warning:' lines on stderr after the report.
    """
    if not spec.strip():  # Path("") is the current folder
        raise click.BadParameter("the name is empty; give a run folder or path/to/file.py:factory",
                                 param_hint="'SPEC'")
    run = Path(spec) if ":" not in spec or Path(spec).is_dir() else None
    if run is not None and not (run / CONFIG).is_file():
        if not run.exists():
            raise AttnlabError(f"SPEC {spec!r} is neither a run folder nor path/to/file.py:factory or "
                               "package.module:factory")
        if run.suffix == ".py":
            raise AttnlabError(f"SPEC {spec!r} names a file but no factory: write {spec}:factory")
        if run.is_file():
            raise AttnlabError(f"SPEC {spec!r} is a file, not a run folder or path/to/file.py:factory")
        raise AttnlabError(f"{run} is not an attnlab run folder (no {CONFIG})")
    defaults = run_contract(read_run_config(run)) if run is not None else _factory_defaults()
    kind = kind or defaults["kind"]
    if kind is None:
        raise click.UsageError(f"Missing option '--kind' (choose from {', '.join(KINDS)}): a factory SPEC does not "
                               "say what kind of model it builds")
    pad_given, pad_id = pad_id is not _UNSET, defaults["pad_id"] if pad_id is _UNSET else pad_id
    if run is not None:  # ids or lengths past the run's own would fail every check for the wrong reason
        for option, given, limit, least, what in (
                ("--vocab-size", vocab_size, defaults["vocab_size"], MIN_VOCAB_SIZE, "a vocabulary of {} ids"),
                ("--max-length", max_length, defaults["max_length"], MIN_MAX_LENGTH, "a context of {}")):
            if limit < least:  # no option can help: they may only go below the run's own
                raise AttnlabError(f"{run} has {what.format(limit)}, and the checks need at least {least} ({option} "
                                   "cannot go past the run's own): this run cannot be checked")
            if given is not None and given > limit:
                raise click.BadParameter(f"{given} is more than the run's own {limit}", param_hint=f"'{option}'")
    vocab_size = vocab_size or defaults["vocab_size"]
    max_length = max_length or defaults["max_length"]
    if pad_id is not None and not 0 <= pad_id < vocab_size and not pad_given:  # the run's own, edited or damaged
        raise AttnlabError(f"the run's {CONFIG} gives pad_id {pad_id}, outside its vocabulary 0..{vocab_size - 1}; "
                           "give --pad-id")
    if pad_id is not None and not 0 <= pad_id < vocab_size:
        raise click.BadParameter(f"{pad_id} is outside the vocabulary 0..{vocab_size - 1} (--vocab-size {vocab_size})",
                                 param_hint="'--pad-id'")
    contract = Contract(kind, pad_id=pad_id, vocab_size=vocab_size, max_length=max_length,  # type: ignore[arg-type]
                        empty_rows=not no_empty_rows)
    with warnings.catch_warnings(record=True) as caught:
        # "always": the filters would otherwise show a warning raised on every call only the first time
        # per place, and we want to know each one was seen; the user's own filters still come first.
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(sys.stderr):  # the model's own prints must not mix into the report
            model = load_run(run)[0] if run is not None else load_model(spec)
            hidden = hidden_pad_id(model)
            if hidden is not None and hidden != contract.pad_id:
                # The adapter (or one of attnlab's models, by its pad_id) says which id the model is told
                # to hide: padding with another would fail the padding checks for a model that is only never
                # told where its padding is. An explicit other --pad-id is kept (the checks warn that the two
                # differ); an adapter that hides nothing is checked with padding all the same, since a
                # forgotten mask is what the padding checks catch.
                if not pad_given:
                    if not 0 <= hidden < vocab_size:
                        raise AttnlabError(f"{pad_id_holder(model)}'s pad id {hidden} is outside the vocabulary "
                                           f"0..{vocab_size - 1} the checks draw ids from: give --vocab-size "
                                           f"above {hidden}, or --pad-id")
                    contract = replace(contract, pad_id=hidden)
            elif hidden is None and is_attnlab_model(model) and not pad_given:  # built to take no padding
                contract = replace(contract, pad_id=None)
            report = run_checks(model, contract, seeds=seeds, spec=spec)
    if as_json:
        click.echo(json.dumps(report.as_dict(), allow_nan=False))
    else:
        report.print(stdout_console())
    for line in warning_lines(caught):
        click.echo(f"warning: {line}", err=True)
    if report.failed:
        click.get_current_context().exit(1)
