"""``attnlab eval TASK RUN``: evaluate a trained run on a data set."""

from __future__ import annotations

import click

from attnlab.cli.lazy import LazyGroup

#: task name -> "module:attribute" of its click command.
EVAL_COMMANDS: dict[str, str] = {
    "classify": "attnlab.cli.eval_classify:eval_classify",
    "lm": "attnlab.cli.eval_lm:eval_lm",
    "translate": "attnlab.cli.eval_translate:eval_translate",
}


@click.group(cls=LazyGroup, lazy_commands=EVAL_COMMANDS)
def evaluate() -> None:
    """Evaluate a trained run."""
