"""``attnlab train TASK``: one subcommand per task, all on the shared engine (:mod:`attnlab.training`)."""

from __future__ import annotations

import functools
import os
import re
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
            except RuntimeError as err:
                reason = peer_lost(err)
                if reason is None:
                    raise
                # The process that could have said it (rank 0) may be the one that is gone: the survivors say it.
                _say_what_is_kept(Path(kwargs["out"]), saves_more, any_rank=True)
                from attnlab.errors import AttnlabError

                raise AttnlabError(f"another process of this torchrun run ended ({reason}), so this one cannot go "
                                   "on (torchrun's report names that process)") from err

        return wrapped

    return wrap


#: What torch's process-group backends say when a peer process is gone (gloo, NCCL): its connection closed or reset.
PEER_LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")


def peer_lost(err: RuntimeError) -> str | None:
    """The short reason, if ``err`` is a collective's failure because another process of a torchrun run ended
    (killed, out of memory, its own error): gloo raises a plain RuntimeError holding a 20-line traceback's worth
    of text; None for any other error, which is not dressed up as one."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:  # (torchrun's; the process group is gone by the time it is seen)
        return None
    text = str(err).strip()
    if not any(marker in text for marker in PEER_LOST_MARKERS):
        return None
    return re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]).split(". ")[0]  # (the source path dropped)


def _say_what_is_kept(out: Path, saves_more: str, *, any_rank: bool = False) -> None:
    from attnlab.training.checkpoint import CHECKPOINT, CONFIG, checkpoint_progress, has_checkpoint
    from attnlab.training.distributed import is_main_process

    if not (any_rank or is_main_process()):
        return
    if has_checkpoint(out):
        click.echo(f"the checkpoint of step {checkpoint_progress(out)[0]} is kept in {out / CHECKPOINT}; "
                   "continue with the same command and --resume", err=True)
    elif (out / CONFIG).exists():
        click.echo(f"no checkpoint yet: the same command with --resume starts {out} again from step 0 "
                   f"({saves_more})", err=True)
