"""``attnlab translate RUN "Ein Mann fährt Fahrrad."``, or a file with ``--input FILE --output FILE``."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from attnlab.cli.params import FiniteFloat, PathParam, Threads, Utf8Text, WholeNumber, progress_option
from attnlab.errors import AttnlabError


@contextlib.contextmanager
def report_warnings() -> Iterator[None]:
    """Show Python warnings raised inside as one ``warning: ...`` line each on stderr (no source lines), when
    they are raised: a training run's warning about its data comes before its hour of training, not after.
    Under torchrun rank 0 alone shows them: every process reads the same data and would warn alike."""
    def show(message: Warning | str, *_: object, **__: object) -> None:
        from tqdm import tqdm

        from attnlab.training.distributed import is_main_process

        if not is_main_process():
            return

        # through tqdm: a bar on the terminal (translation's, training's) is cleared, the line written, the bar
        # drawn again below it; with no bar this is a plain line on stderr
        tqdm.write(f"warning: {message}", file=sys.stderr)
        sys.stderr.flush()  # (before the next line on stdout, where stderr is a buffered file)

    with warnings.catch_warnings():  # (restores the filters and showwarning on the way out)
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield


def decode_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The search options shared by ``translate``, ``eval translate`` and ``attention``."""
    for option in reversed([
        click.option("--beam", "beam", type=WholeNumber(min=1), default=4, show_default=True, help="Beam size (1 = greedy search)."),
        click.option("--length-penalty", type=FiniteFloat(0, 5), default=1.0, show_default=True,
                     help="GNMT alpha, 0 to 5: scores are log p / ((5 + len) / 6) ** alpha."),
        click.option("--max-len-a", type=FiniteFloat(min=0), default=1.5, show_default=True, help="At most a * source length + b tokens."),
        click.option("--max-len-b", type=WholeNumber(min=0), default=10, show_default=True),
        click.option("--threads", type=Threads(), default=None,
                     help="torch CPU threads (0 or unset: torch's choice)."),
    ]):
        fn = option(fn)
    return fn


def decode_settings(beam: int, length_penalty: float, max_len_a: float, max_len_b: int, threads: int | None):
    """DecodeSettings from the shared options (and the thread count applied)."""
    import torch

    from attnlab.tasks.decoding import DecodeSettings

    if threads:
        torch.set_num_threads(threads)
    return DecodeSettings(beam_size=beam, length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b)


def translate_with_progress(translator: Any, lines: list[str], settings: Any, progress: bool) -> list[str]:
    """Translate ``lines`` with a tqdm bar on stderr (sentences done / total)."""
    from tqdm.auto import tqdm

    # disable=None: no bar when stderr is not a terminal (a log file, CI), whose lines it would fill
    with tqdm(total=len(lines), unit="sent", disable=None if progress else True, dynamic_ncols=True) as bar:
        return translator.translate(lines, settings, on_batch=bar.update)


@click.command(name="translate")
@click.argument("run", type=PathParam(path_type=Path))
@click.argument("sentence", required=False, type=Utf8Text())
@click.option("--input", "input_path", type=PathParam(path_type=Path), default=None,
              help="Translate this file, one sentence a line (.gz allowed; - reads standard input).")
@click.option("--output", "output_path", type=PathParam(path_type=Path, readable=False), default=None,
              help="Write the translations here, one a line (written atomically; .gz: compressed); - or left "
                   "out: standard output.")
@decode_options
@progress_option(what=" in file mode (--input)")
def translate(run: Path, sentence: str | None, input_path: Path | None, output_path: Path | None, beam: int,
              length_penalty: float, max_len_a: float, max_len_b: int, threads: int | None, progress: bool) -> None:
    """Translate SENTENCE (or the --input file) with the trained run RUN."""
    from attnlab.files import write_text_atomic
    from attnlab.tasks.translator import load_translator, read_sentences
    from attnlab.training.checkpoint import refuse_overwriting

    if (sentence is None) == (input_path is None):
        raise AttnlabError("give either a SENTENCE or --input FILE")
    if sentence is not None and not sentence.strip():
        raise AttnlabError("the sentence is empty")
    if output_path is not None and str(output_path) == "-":  # as --input -: the standard stream
        output_path = None
    if output_path is not None:
        refuse_overwriting(output_path, "--output", run=run, reads=(("--input", input_path),))
    settings = decode_settings(beam, length_penalty, max_len_a, max_len_b, threads)
    translator = load_translator(run)
    with report_warnings():
        if sentence is not None:
            hyps = translator.translate([sentence], settings)
        else:
            hyps = translate_with_progress(translator, read_sentences(input_path), settings, progress)
    text = "".join(h + "\n" for h in hyps)
    if output_path is None:
        click.echo(text, nl=False)
    else:
        write_text_atomic(output_path, text)
        click.echo(f"wrote {len(hyps)} translation{'s' if len(hyps) != 1 else ''} to {output_path}", err=True)
