"""A trained translation run put to use: translating, its cross-attention, and the teacher-forcing experiment.

:func:`load_translator` reads a ``translate`` run folder (see :mod:`attnlab.tasks.translate`, which trains it)
into a :class:`Translator`: the model in eval mode, its tokenizers and settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.data import BOS_ID, EOS_ID, BPETokenizer
from attnlab.errors import AttnlabError
from attnlab.nn import Transformer
from attnlab.tasks.decoding import DecodeSettings, max_lengths, translate_ids
from attnlab.tasks.parallel_data import check_nonempty, pair_sources, read_lines, read_parallel, source_ids
from attnlab.tasks.translate import (
    TASK,
    LeakyTransformer,
    TranslateSettings,
    corpus_scores,
    load_tokenizers,
    teacher_forced_nll,
)
from attnlab.training.checkpoint import load_run


@dataclass
class Translator:
    """A trained run ready to translate: model (eval mode), tokenizers and settings."""

    model: Transformer
    src_tokenizer: BPETokenizer
    tgt_tokenizer: BPETokenizer
    settings: TranslateSettings
    config: dict[str, Any]

    @property
    def max_src_positions(self) -> int:
        return self.model.encoder.embed.max_positions

    def encode_sources(self, lines: Sequence[str]) -> list[list[int]]:
        """Encoder inputs for raw lines (the length rule truncates, with one warning)."""
        return source_ids(self.src_tokenizer.encode_batch(list(lines)), self.max_src_positions)

    def translate(self, lines: Sequence[str], decode: DecodeSettings | None = None, *, max_tokens: int = 6000,
                  on_batch: Callable[[int], None] | None = None) -> list[str]:
        """Detokenized translations of ``lines``, in order."""
        return self.translate_sources(self.encode_sources(lines), decode, max_tokens=max_tokens, on_batch=on_batch)

    def translate_sources(self, sources: Sequence[list[int]], decode: DecodeSettings | None = None, *,
                          max_tokens: int = 6000, on_batch: Callable[[int], None] | None = None) -> list[str]:
        """Detokenized translations of encoder inputs made by :meth:`encode_sources`, in order."""
        hyps = translate_ids(self.model, list(sources), decode or DecodeSettings(), max_tokens=max_tokens,
                             on_batch=on_batch)
        return [self.tgt_tokenizer.decode(h) for h in hyps]


def load_translator(run: str | Path) -> Translator:
    """Read a translation run folder; a run of another task is a clear :class:`AttnlabError`."""
    run = Path(run)
    model, config = load_run(run, TASK)
    if not isinstance(model, Transformer):
        raise AttnlabError(f"{run} holds a {type(model).__name__}, not an encoder-decoder Transformer")
    settings = TranslateSettings.from_dict(config.get("settings", {}), run)
    src_tok, tgt_tok = load_tokenizers(run, settings, (model.encoder.embed.vocab_size, model.decoder.embed.vocab_size))
    return Translator(model, src_tok, tgt_tok, settings, config)


def read_sentences(path: str | Path) -> list[str]:
    """A one-sentence-a-line file (``.gz`` allowed; ``-``: standard input), empty lines reported with their
    numbers (dropping them would shift every later translation against its source line)."""
    lines = read_lines(path)
    name = "standard input" if str(path) == "-" else path
    if not lines:
        raise AttnlabError(f"{name} holds no sentences")
    check_nonempty(lines, name)
    return lines


@dataclass
class CrossAttention:
    """One sentence's translation and the cross-attention of one decoder layer, averaged over heads.

    Attributes:
        src_pieces: source subword pieces (S,), ending in ``<eos>``.
        out_pieces: output pieces (T,), ending in ``<eos>`` when the search ended there (not when its length
            limit cut it).
        weights: (T, S); row ``t`` is where the decoder looked while predicting output piece ``t``.
        translation: the detokenized output.
        layer: the decoder layer (from 1) and ``layers`` how many there are; ``heads`` averaged.
    """

    src_pieces: list[str]
    out_pieces: list[str]
    weights: Tensor
    translation: str
    layer: int
    layers: int
    heads: int


def cross_attention(translator: Translator, sentence: str, *, layer: int | None = None,
                    decode: DecodeSettings | None = None) -> CrossAttention:
    """Translate one sentence and return the cross-attention weights of one decoder layer (default: the last).

    The translation is fed back through the decoder at once, with its key/value caches: that is the causal path
    decoding takes, so the weights are the very ones the free-running decoder used step by step (no step sees a
    later one), also for a model whose plain ``decode`` leaks (:class:`LeakyTransformer`).
    """
    model = translator.model
    layers = len(model.decoder.layers)
    layer = layers if layer is None else layer
    if not 1 <= layer <= layers:
        raise AttnlabError(f"--layer must be between 1 and {layers}, got {layer}")
    src = torch.tensor(translator.encode_sources([sentence]))
    decode = decode or DecodeSettings()
    hyp = translate_ids(model, src.tolist(), decode)[0]
    # The search stops on <eos> or at its length limit (the position table included); only in the first case
    # did the decoder write an <eos> row, so a hypothesis the limit cut gets no row for it.
    ended = len(hyp) < int(max_lengths(src, model, decode.max_len_a, decode.max_len_b)[0])
    out_ids = [*hyp, EOS_ID] if ended else hyp
    tgt_in = [BOS_ID, *out_ids[:-1]]
    with torch.inference_mode():  # through the caches, as decoding ran (a leaky model's plain decode sees ahead)
        memory, memory_mask = model.encode(src)
        _, weights = model.decode(torch.tensor([tgt_in]), memory, memory_attend_mask=memory_mask, need_weights=True,
                                  caches=model.new_caches())
    att = weights[f"decoder_layer{layer}_block2_decenc_att"][0]  # (heads, T, S)
    return CrossAttention(
        src_pieces=[translator.src_tokenizer.hf.id_to_token(i) for i in src[0].tolist()],
        out_pieces=[translator.tgt_tokenizer.hf.id_to_token(i) for i in out_ids],
        weights=att.mean(0), translation=translator.tgt_tokenizer.decode(hyp), layer=layer, layers=layers,
        heads=att.shape[0],
    )


# --------------------------------------------------------------------------------------------------
# teacher forcing versus free running


def teacher_forcing_rows(runs: dict[str, str | Path], valid: str | Path, decode: DecodeSettings | None = None,
                         ) -> list[dict[str, Any]]:
    """Per run: validation loss under teacher forcing next to BLEU/chrF of free-running decoding.

    Teacher forcing feeds the reference prefix and asks only for the next token, so a model that can
    peek at that token (no look-ahead mask) scores a near-zero loss. Free running feeds the model its own
    outputs, where there is nothing to peek at, and shows what it really learned.
    """
    rows = []
    for name, run in runs.items():
        tr = load_translator(run)
        src_lines, ref_lines = read_parallel(valid, tr.settings.src, tr.settings.tgt)
        sources = tr.encode_sources(src_lines)  # (truncated, and said so, once for the loss and the translations)
        pairs = pair_sources(sources, tr.tgt_tokenizer.encode_batch(ref_lines), tr.model.config["max_tgt_positions"],
                             "validation")
        nll = teacher_forced_nll(tr.model, pairs)
        scores = corpus_scores(tr.translate_sources(sources, decode or DecodeSettings(beam_size=1)), ref_lines)
        rows.append({"model": name, "run": str(run), "look_ahead_mask": not isinstance(tr.model, LeakyTransformer),
                     "teacher_forced_loss": nll, "teacher_forced_ppl": math.exp(min(nll, 50.0)),
                     "free_running_bleu": scores["bleu"], "free_running_chrf": scores["chrf"],
                     "signature": scores["signature"]})
    return rows
