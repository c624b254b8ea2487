"""``attnlab eval lm RUN --text FILE``: the language model's loss on a text, in nats per token."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from attnlab.cli import omp_wait  # noqa: F401  (before torch is imported)
from attnlab.cli.params import PathParam, Threads, WholeNumber


@click.command("lm")
@click.argument("run", type=PathParam(path_type=Path))
@click.option("--text", "text", type=PathParam(path_type=Path), required=True, help="A UTF-8 text file to score.")
@click.option("--batch-size", type=WholeNumber(min=1), default=64, show_default=True,
              help="Windows of one context scored at a time (memory, not the result).")
@click.option("--threads", type=Threads(), default=0, show_default=True, help="torch threads (0: one per core).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a line.")
def eval_lm(run: Path, text: Path, batch_size: int, threads: int, as_json: bool) -> None:
    """Score the language model in RUN on the text file --text: its loss on every token (nats per token, as
    training reports it), perplexity and bits per token.

    The text is cut into consecutive windows of the model's context, each read from its own start: exact and the
    same every time, where training's validation loss is an estimate over random windows.
    """
    import torch

    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.tasks.lm import TASK_NAME, read_text, text_loss
    from attnlab.training.checkpoint import TOKENIZER, load_run
    from attnlab.training.engine import torch_threads

    with torch_threads(threads):
        model, _ = load_run(run, task=TASK_NAME)
        tokenizer = load_tokenizer(run / TOKENIZER, model.lm_head.out_features)
        ids = torch.tensor(tokenizer.encode(read_text(text, once=True)), dtype=torch.long)
        loss = text_loss(model, ids, context=model.config["max_positions"], batch_size=batch_size)
    result = {"text": str(text), "tokens": len(ids) - 1, "loss": loss, "perplexity": math.exp(min(loss, 700.0)),
              "bits_per_token": loss / math.log(2), "tokenizer": tokenizer.kind}
    if as_json:
        click.echo(json.dumps(result))
        return
    unit = "character" if tokenizer.kind == "char" else "token"
    click.echo(f"{text}: {result['tokens']:,} tokens scored | loss {loss:.4f} nats/token | perplexity "
               f"{result['perplexity']:.3f} | {result['bits_per_token']:.4f} bits per {unit}")
