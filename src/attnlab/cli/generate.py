"""``attnlab generate RUN``: continue a prompt with a trained language model, streaming the text."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import click
from click.core import ParameterSource

from attnlab.cli import SEED, omp_wait  # noqa: F401  (omp_wait: before torch is imported)
from attnlab.cli.params import FiniteFloat, PathParam, Threads, Utf8Text, WholeNumber
from attnlab.data.tokenizers import UNK_ID, CharTokenizer, Tokenizer, load_tokenizer
from attnlab.errors import AttnlabError
from attnlab.nn.models import DecoderLM
from attnlab.tasks.lm import TASK_NAME
from attnlab.tasks.sampling import check_sampling, generate
from attnlab.training.checkpoint import TOKENIZER, load_run
from attnlab.training.engine import torch_threads


@click.command("generate")
@click.argument("run", type=PathParam(path_type=Path))
@click.option("--prompt", required=True, type=Utf8Text(), help="Text to continue (at least one token; characters the model knows).")
@click.option("--max-new-tokens", type=WholeNumber(min=1), default=200, show_default=True, help="Tokens to generate (>= 1).")
@click.option("--temperature", type=FiniteFloat(min=0, min_open=True), default=1.0, show_default=True, help="Divides the logits (> 0; --greedy takes the arg-max).")
@click.option("--top-k", type=WholeNumber(min=1), default=None, help="Sample among the K most likely tokens only.")
@click.option("--top-p", type=FiniteFloat(0, 1, min_open=True), default=None, help="Sample among the most likely tokens holding P of the mass.")
@click.option("--seed", type=SEED, default=None, help="Seed of the sampling; the same seed gives the same text.")
@click.option("--num-samples", type=WholeNumber(min=1), default=1, show_default=True,
              help="Samples to write, one after another with a separator line; sample i uses seed S + i (modulo 2**32).")
@click.option("--stop", "stops", multiple=True, metavar="TEXT", type=Utf8Text(),
              help="Stop a sample once its generated text contains TEXT (printed with it; may be repeated).")
@click.option("--greedy", is_flag=True, help="Always take the most likely token (ignores temperature, top-k, top-p).")
@click.option("--no-cache", is_flag=True, help="Recompute the whole window every step instead of using the KV cache (the same greedy "
              "text within the context; past it this window slides one token a step, the cache's half a context at a "
              "time, so the texts may differ there).")
@click.option("--threads", type=Threads(), default=1, show_default=True,
              help="torch threads (0: one per core). A cached step computes one position, too little to share: "
                   "one thread was 10-15% faster than two on 2 cores.")
def generate_cmd(run: Path, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None,
                 top_p: float | None, seed: int | None, num_samples: int, stops: tuple[str, ...], greedy: bool,
                 no_cache: bool, threads: int) -> None:
    """Continue PROMPT with the language model in RUN (a folder written by `attnlab train lm`).

    The prompt is printed, then each token as soon as it is chosen; a line on stderr gives the rate.
    Past the model's context the window slides (the last half context is re-read), so any length works.
    """
    if max_new_tokens < 1:
        raise AttnlabError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if not prompt:
        raise AttnlabError("--prompt is empty: give at least one character to continue")
    if "" in stops:
        raise AttnlabError("--stop is empty: give the text to stop at")
    if not greedy:
        check_sampling(temperature, top_k, top_p)
    else:  # (said, as Hugging Face's generate warns of sampling settings under do_sample=False)
        ctx = click.get_current_context()
        unused = [f"--{name.replace('_', '-')}" for name in ("temperature", "top_k", "top_p", "seed")
                  if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
        if unused:
            click.echo(f"note: --greedy takes the most likely token; {', '.join(unused)} "
                       f"{'is' if len(unused) == 1 else 'are'} not used", err=True)
    with torch_threads(threads):
        model, _ = load_run(run, task=TASK_NAME)
        tokenizer = load_tokenizer(run / TOKENIZER, model.lm_head.out_features)
        prompt_ids = tokenizer.encode(prompt)
        if not prompt_ids:
            raise AttnlabError(f"--prompt {prompt!r} encodes to no tokens; give some text the model knows")
        if isinstance(tokenizer, CharTokenizer):  # a stop text the model cannot write would never end a sample
            for stop in stops:
                missing = sorted(set(stop) - set(tokenizer.chars))
                if missing:
                    click.echo(f"note: --stop {stop!r} holds {', '.join(map(repr, missing))}, which this model never "
                               "writes: it cannot stop there", err=True)
        if greedy and num_samples > 1:
            click.echo("note: --greedy takes the most likely token every time: the samples are all the same", err=True)
        # Only a subword vocabulary has an <unk> to let through; in a char vocabulary id 1 is a real character
        # (the char tokenizer refuses an unknown one instead).
        unknown = 0 if isinstance(tokenizer, CharTokenizer) else prompt_ids.count(UNK_ID)
        if unknown:
            click.echo(f"note: {unknown} piece{'s' if unknown != 1 else ''} of the prompt "
                       f"{'are' if unknown != 1 else 'is'} not in the vocabulary; the model reads <unk> there", err=True)
        for sample in range(num_samples):
            if sample:
                click.echo(SEPARATOR)
            _generate(model, tokenizer, prompt, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                      top_p=top_p, seed=None if seed is None else (seed + sample) % 2**32, greedy=greedy,
                      use_cache=not no_cache, stops=stops)


#: Printed between two samples (nanoGPT's sample.py writes the same line).
SEPARATOR = "---------------"


def _pieces(tokenizer: Tokenizer, prompt_ids: list[int], tokens: Iterable[int]) -> Iterator[str]:
    """The text each new token adds to the prompt, token by token."""
    if isinstance(tokenizer, CharTokenizer):
        for token in tokens:  # one character per token: decode it alone
            yield tokenizer.decode([token])
        return
    # Subword pieces carry their spaces as markers that only decode right in context: decode the whole text
    # each time and give what is new.
    base = tokenizer.decode(prompt_ids)
    generated: list[int] = []
    given = 0
    for token in tokens:
        generated.append(token)
        text = tokenizer.decode(prompt_ids + generated)
        new = text[len(base):] if text.startswith(base) else tokenizer.decode(generated)
        yield new[given:]
        given = len(new)


def _generate(model: DecoderLM, tokenizer: Tokenizer, prompt: str, prompt_ids: list[int], max_new_tokens: int, *,
              temperature: float, top_k: int | None, top_p: float | None, seed: int | None, greedy: bool,
              use_cache: bool, stops: tuple[str, ...] = ()) -> None:
    """Write the prompt and then each new token as it comes, until ``max_new_tokens`` or a stop text; the rate
    goes to stderr."""
    started = time.perf_counter()
    # Called before the prompt is printed: it refuses bad arguments when called, so a refusal prints nothing.
    tokens = generate(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                      greedy=greedy, seed=seed, use_cache=use_cache, banned=tokenizer.special_ids)
    out = sys.stdout
    out.write(prompt)
    out.flush()
    count, written, stopped = 0, "", None
    for piece in _pieces(tokenizer, prompt_ids, tokens):
        out.write(piece)
        out.flush()
        count += 1
        if stops:
            written += piece
            # A stop text that has just appeared ends within this piece: look no further back than that.
            stopped = next((stop for stop in stops if stop in written[-(len(piece) + len(stop) - 1):]), None)
            if stopped is not None:
                break  # leaving the loop ends the generator: no token is computed past the stop
    out.write("\n")
    seconds = time.perf_counter() - started
    mode = "KV cache" if use_cache else "no cache"
    why = f", stopped at {stopped!r}" if stopped is not None else ""
    click.echo(f"{count} token{'s' if count != 1 else ''} in {seconds:.2f} s ({count / max(seconds, 1e-9):,.0f} tokens/s, {mode}{why})", err=True)
