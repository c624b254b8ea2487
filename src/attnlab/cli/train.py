"""``attnlab train TASK``: one subcommand per task, all on the shared engine (:mod:`attnlab.training`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from attnlab.cli.lazy import LazyGroup

#: task name -> "module:attribute" of its click command.
TRAIN_COMMANDS: dict[str, str] = {
    "translate": "attnlab.cli.train_translate:train_translate",
    "lm": "attnlab.cli.train_lm:train_lm",
    "classify": "attnlab.cli.train_classify:train_classify",
}


@click.group(cls=LazyGroup, lazy_commands=TRAIN_COMMANDS)
def train() -> None:
    """Train a model. Runs unchanged under `torchrun --nproc_per_node N -m attnlab.cli.main train ...` (DDP)."""


def says_how_to_continue(saves_more: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a train command so that Ctrl-C (or ``kill``) says, before ``interrupted``, what its ``out`` folder
    kept and how to continue it, as a long training run's user needs to know; ``saves_more`` says how the
    command checkpoints more often."""
    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt:
                _say_what_is_kept(Path(kwargs["out"]), saves_more)
                raise

        return wrapped

    return wrap


def _say_what_is_kept(out: Path, saves_more: str) -> None:
    from attnlab.training.checkpoint import CHECKPOINT, CONFIG, checkpoint_progress, has_checkpoint
    from attnlab.training.distributed import is_main_process

    if is_main_process() and has_checkpoint(out):
        click.echo(f"the checkpoint of step {checkpoint_progress(out)[0]} is kept in {out / CHECKPOINT}; "
                   "continue with the same command and --resume", err=True)
    elif is_main_process() and (out / CONFIG).exists():
        click.echo(f"no checkpoint yet: the same command with --resume starts {out} again from step 0 "
                   f"({saves_more})", err=True)
