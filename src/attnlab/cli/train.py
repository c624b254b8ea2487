"""``attnlab train TASK``: one subcommand per task, all on the shared engine (:mod:`attnlab.training`)."""

from __future__ import annotations

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
