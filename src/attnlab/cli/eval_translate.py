"""``attnlab eval translate RUN --src-file F --ref-file F``: sacreBLEU and chrF of a run's translations."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from attnlab.cli.params import PathParam, default_output, progress_option
from attnlab.cli.translate import decode_options, decode_settings, report_warnings, translate_with_progress
from attnlab.errors import AttnlabError


@click.command(name="translate")
@click.argument("run", type=PathParam(path_type=Path))
@click.option("--src-file", required=True, type=PathParam(path_type=Path), help="Source sentences, one a line (.gz ok).")
@click.option("--ref-file", required=True, type=PathParam(path_type=Path), help="Reference translations, line-aligned.")
@click.option("--hyp-out", type=PathParam(path_type=Path, readable=False), default=None,
              help="Where to write the hypotheses (default: RUN/hyp.<src-file name>.beam<B>.lp<L>.txt, one file "
                   "per beam size and length penalty; hyp.<src-file name>.beam1.txt for greedy search).")
@decode_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (bleu, chrf, signature, ...).")
@progress_option()
def eval_translate(run: Path, src_file: Path, ref_file: Path, hyp_out: Path | None, beam: int, length_penalty: float,
                   max_len_a: float, max_len_b: int, threads: int | None, as_json: bool, progress: bool) -> None:
    """Translate --src-file with RUN and score it against --ref-file.

    sacreBLEU on detokenized output: cased BLEU with the default 13a tokenization, and chrF; both
    signatures are printed so the numbers can be compared with published ones.
    """
    from attnlab.files import write_text_atomic
    from attnlab.tasks.parallel_data import check_aligned
    from attnlab.tasks.translate import corpus_scores
    from attnlab.tasks.translator import load_translator, read_sentences
    from attnlab.training.checkpoint import read_run_config, refuse_overwriting

    read_run_config(run, "translate")  # first: a RUN that is no run would be blamed on the --hyp-out put in it

    for option, path in (("--src-file", src_file), ("--ref-file", ref_file)):
        if str(path) == "-":  # two files cannot share one stdin, and the hypotheses are named after the source
            raise AttnlabError(f"{option} names a file; standard input (-) is read by `attnlab translate --input -`")
    # Named after the decoding too, so that scoring beam 1 and beam 5 keeps both sets of hypotheses; greedy
    # search (beam 1) has no length penalty to name.
    penalty = f".lp{length_penalty!r}" if beam > 1 else ""  # repr: the exact value
    name = f"hyp.{Path(src_file).name.removesuffix('.gz')}.beam{beam}{penalty}.txt"
    hyp_out = hyp_out or default_output(Path(run) / name, "--hyp-out")
    refuse_overwriting(hyp_out, "--hyp-out", run=run, reads=(("--src-file", src_file), ("--ref-file", ref_file)))
    settings = decode_settings(beam, length_penalty, max_len_a, max_len_b, threads)
    translator = load_translator(run)
    sources, references = read_sentences(src_file), read_sentences(ref_file)
    check_aligned(sources, references, src_file, ref_file)
    start = time.perf_counter()
    with report_warnings():
        hyps = translate_with_progress(translator, sources, settings, progress)
    seconds = time.perf_counter() - start
    write_text_atomic(hyp_out, "".join(h + "\n" for h in hyps))
    scores = corpus_scores(hyps, references)
    result = {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2), "signature": scores["signature"],
              "chrf_signature": scores["chrf_signature"], "bleu_detail": scores["bleu_detail"],
              "sentences": len(hyps), "beam": beam, "length_penalty": length_penalty, "hypotheses": str(hyp_out),
              "decode_seconds": round(seconds, 1)}
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{scores['bleu_detail']}")
    click.echo(f"BLEU  {scores['bleu']:.2f}  ({scores['signature']})")
    click.echo(f"chrF  {scores['chrf']:.2f}  ({scores['chrf_signature']})")
    click.echo(f"{len(hyps)} sentences, beam {beam}, {seconds:.1f} s; hypotheses in {hyp_out}")
