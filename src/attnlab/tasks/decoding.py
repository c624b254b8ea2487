"""Free-running decoding for the encoder-decoder: greedy search and beam search, batched.

Both run the encoder once per batch and then the decoder one position at a time. With the cache (the
default) each step feeds only the newest token: the decoder's self-attention keys and values of earlier
positions come from its :class:`~attnlab.nn.KVCache`, and the cross-attention keys and values, a
function of the encoder output alone, are projected on the first step and reused on every later one
(``Transformer.new_caches``). ``use_cache=False`` re-runs the decoder over the whole prefix each step;
it gives the same tokens and exists to prove that.

Beam search keeps ``beam_size`` hypotheses per sentence. Its first step runs on one row per sentence
(there is only ``<bos>`` to extend), then :meth:`KVCache.reorder` copies each sentence's caches to its
beams, so even the beams never recompute the cross-attention keys and values; after every step the
caches follow the surviving hypotheses the same way. Sentences that are done leave the batch.

Every search stops a sentence at ``max_len_a * source_length + max_len_b`` generated tokens (the source
length counts its ``<eos>``), and never past the decoder's position table. The returned ids exclude
``<bos>`` and ``<eos>``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.data import BOS_ID, EOS_ID, PAD_ID, pad_batch
from attnlab.errors import AttnlabError
from attnlab.nn import KVCache, Transformer
from attnlab.tasks.parallel_data import sorted_chunks
from attnlab.tasks.sampling import refuse_broken_scores


@dataclass(frozen=True)
class DecodeSettings:
    """How to search.

    Attributes:
        beam_size: 1 is greedy search; more is beam search.
        length_penalty: GNMT's ``alpha``: a finished hypothesis scores ``log p / ((5 + len) / 6) ** alpha``
            (0 = raw log-probability, which favours short outputs).
        max_len_a, max_len_b: at most ``a * source_length + b`` generated tokens.
    """

    beam_size: int = 1
    # alpha 1.0 was chosen on Multi30k's validation set (beam 4: 35.6 BLEU at GNMT's 0.6, 36.4 at 1.0, 36.4 at 1.2;
    # 0.6 made the outputs 4% shorter than the references)
    length_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: int = 10

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise AttnlabError(f"beam size must be >= 1, got {self.beam_size}")
        if not (isinstance(self.max_len_a, numbers.Real) and math.isfinite(self.max_len_a) and self.max_len_a >= 0):
            raise AttnlabError(f"max_len_a (--max-len-a) must be a finite number >= 0, got {self.max_len_a!r}")
        if isinstance(self.max_len_b, bool) or not isinstance(self.max_len_b, numbers.Integral) or self.max_len_b < 0:
            raise AttnlabError(f"max_len_b (--max-len-b) must be a whole number >= 0, got {self.max_len_b!r}")
        if self.max_len_a + min(self.max_len_b, 1) < 1:  # the shortest source is 1 id (its eos)
            raise AttnlabError(f"max_len_a {self.max_len_a:g} and max_len_b {self.max_len_b} (--max-len-a, --max-len-b) "
                               "allow no token for the shortest source, one id (its <eos> alone): the "
                               "longest output is a * source ids + b tokens, rounded down; give a + b >= 1")


def max_lengths(src: Tensor, model: Transformer, a: float, b: int) -> Tensor:
    """(batch, src) ids -> (batch,) most tokens each sentence may generate, eos included."""
    table = model.decoder.embed.max_positions
    real = (src != PAD_ID).sum(1).double()
    # Clamped while still a float (and b before it becomes one): a huge a or b would overflow int64, to a negative
    # limit clamped to 1 token, or not fit a float at all.
    return torch.floor(real * a + float(min(b, table))).clamp(1, table).long()


def _step_log_probs(model: Transformer, prefix: Tensor, memory: Tensor, *, memory_attend_mask: Tensor,
                    caches: list[tuple[KVCache, KVCache]] | None) -> Tensor:
    """Log-probabilities (rows, vocab) of the token after ``prefix`` (rows, t), float32; ``memory`` is
    (rows, src, d_model) and ``memory_attend_mask`` its (rows, 1, 1, src) padding mask.

    With ``caches`` only the last column of ``prefix`` is fed. ``<pad>`` and ``<bos>`` are never targets in
    training, so they are ruled out here rather than left to chance.
    """
    if caches is not None:
        logits, _ = model.decode(prefix[:, -1:], memory, memory_attend_mask=memory_attend_mask, caches=caches)
    else:
        logits, _ = model.decode(prefix, memory, memory_attend_mask=memory_attend_mask)
    logits = logits[:, -1].float()
    refuse_broken_scores(logits)
    logits[:, PAD_ID] = -math.inf
    logits[:, BOS_ID] = -math.inf
    return torch.log_softmax(logits, dim=-1)


def _keep_rows(index: Tensor, memory: Tensor, *, memory_attend_mask: Tensor,
               caches: list[tuple[KVCache, KVCache]] | None) -> tuple[Tensor, Tensor]:
    """Keep (or repeat) rows ``index``, (rows,) long, of the memory, its mask and every cache."""
    if caches is not None:
        for self_cache, cross_cache in caches:
            self_cache.reorder(index)
            cross_cache.reorder(index)
    return memory.index_select(0, index), memory_attend_mask.index_select(0, index)


@torch.inference_mode()
def greedy_search(model: Transformer, src: Tensor, *, max_len_a: float = 1.5, max_len_b: int = 10,
                  use_cache: bool = True) -> list[list[int]]:
    """The most likely next token at every step, for a batch of sources.

    Args:
        model: the encoder-decoder (in eval mode).
        src: (batch, src_len) ids, ``tokens + [eos]``, right-padded.
        max_len_a, max_len_b: length limit ``a * source_length + b``.
        use_cache: feed one token a step through the KV caches (else the whole prefix).

    Returns:
        per sentence the generated ids, without ``<bos>``/``<eos>``.
    """
    memory, memory_mask = model.encode(src)
    limit = max_lengths(src, model, max_len_a, max_len_b)
    caches = model.new_caches() if use_cache else None
    out: list[list[int]] = [[] for _ in range(src.shape[0])]
    rows = torch.arange(src.shape[0], device=src.device)  # the sentence behind each live row
    prefix = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=src.device)
    for step in range(int(limit.max())):
        next_ids = _step_log_probs(model, prefix, memory, memory_attend_mask=memory_mask, caches=caches).argmax(-1)  # (rows,)
        ended = (next_ids == EOS_ID) | (limit[rows] <= step + 1)
        for row, token in zip(rows.tolist(), next_ids.tolist()):
            if token != EOS_ID:
                out[row].append(token)
        if bool(ended.all()):
            break
        if bool(ended.any()):  # finished sentences leave the batch: no work is spent on them
            keep = (~ended).nonzero().squeeze(1)
            memory, memory_mask = _keep_rows(keep, memory, memory_attend_mask=memory_mask, caches=caches)
            rows, prefix, next_ids = rows[keep], prefix[keep], next_ids[keep]
        prefix = torch.cat((prefix, next_ids[:, None]), dim=1)
    return out


def length_normalised(score: float, length: int, alpha: float) -> float:
    """GNMT's length penalty: ``score / ((5 + length) / 6) ** alpha``."""
    return score / ((5.0 + length) / 6.0) ** alpha


def _keep_best(group: list[tuple[float, list[int]]], k: int, score: float, hyp: list[int]) -> None:
    """Add a finished hypothesis to ``group``, which holds at most the ``k`` best."""
    if len(group) < k:
        group.append((score, hyp))
        return
    worst = min(range(k), key=lambda i: group[i][0])
    if score > group[worst][0]:
        group[worst] = (score, hyp)


@torch.inference_mode()
def beam_search(model: Transformer, src: Tensor, *, beam_size: int = 4, length_penalty: float = 1.0,
                max_len_a: float = 1.5, max_len_b: int = 10, use_cache: bool = True) -> list[list[int]]:
    """Beam search for a batch of sources (arguments as in :func:`greedy_search`).

    Each step ranks the ``2 * beam_size`` best extensions of a sentence's live hypotheses by summed
    log-probability. An extension by ``<eos>`` that ranks among the first ``beam_size`` is finished and
    scored with the length penalty (the ``beam_size`` best finished ones are kept); the best
    ``beam_size`` other extensions live on. A sentence is done when it holds ``beam_size`` finished
    hypotheses and the best live one, scored at its current length, would not beat the worst of them
    (the stopping rule of Hugging Face's ``early_stopping=False``), or when it reaches its length limit,
    where the live hypotheses are finished as they stand. With ``beam_size=1`` this is greedy search.
    """
    k = beam_size
    extensions = model.output.out_features - 3  # every id but <pad>, <bos> (ruled out) and <eos> (finishes)
    if k > extensions:  # the first step would keep -inf candidates (<pad>, <bos>) as live beams
        raise AttnlabError(f"beam size {k} is larger than the {extensions} tokens that can extend a hypothesis "
                           f"(a vocabulary of {model.output.out_features} ids, 3 of them special); use a smaller beam")
    memory, memory_mask = model.encode(src)
    limit = max_lengths(src, model, max_len_a, max_len_b)
    caches = model.new_caches() if use_cache else None
    device = src.device
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(src.shape[0])]
    sent = torch.arange(src.shape[0], device=device)  # the sentence of each live group of beams
    live = 1  # beams per sentence: one (just <bos>) until the first step has been ranked
    scores = torch.zeros(src.shape[0], 1, device=device)  # (sentences, live) summed log-probabilities
    tokens = torch.zeros(src.shape[0], 1, 0, dtype=torch.long, device=device)  # (sentences, live, step)
    prefix = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=device)  # (sentences * live, 1 + step)
    for step in range(int(limit.max())):
        n = sent.shape[0]
        log_probs = _step_log_probs(model, prefix, memory, memory_attend_mask=memory_mask, caches=caches)  # (n * live, vocab)
        vocab = log_probs.shape[-1]
        candidates = (scores[:, :, None] + log_probs.view(n, live, vocab)).view(n, live * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, live * vocab), dim=1)  # (n, 2k), best first
        origin, token = top_index // vocab, top_index % vocab
        rank = torch.arange(top_index.shape[1], device=device).expand_as(token)
        is_eos = token == EOS_ID
        for i, j in (is_eos & (rank < k)).nonzero().tolist():
            _keep_best(finished[int(sent[i])], k, length_normalised(float(top_scores[i, j]), step + 1, length_penalty),
                       tokens[i, origin[i, j]].tolist())
        # The k best extensions that are not <eos> live on (a stable sort puts them first, in score order).
        order = (is_eos.long() * top_index.shape[1] + rank).argsort(dim=1, stable=True)[:, :k]
        origin, token, new_scores = origin.gather(1, order), token.gather(1, order), top_scores.gather(1, order)
        tokens = torch.cat((tokens.gather(1, origin[:, :, None].expand(-1, -1, step)), token[:, :, None]), dim=2)
        at_limit = (limit[sent] <= step + 1).tolist()
        done = []
        for i, b in enumerate(sent.tolist()):
            group = finished[b]
            if at_limit[i]:
                for j in range(k):
                    _keep_best(group, k, length_normalised(float(new_scores[i, j]), step + 1, length_penalty),
                               tokens[i, j].tolist())
            best_live = length_normalised(float(new_scores[i, 0]), step + 1, length_penalty)
            done.append(at_limit[i] or (len(group) == k and min(g[0] for g in group) >= best_live))
        if all(done):
            break
        keep = (~torch.tensor(done, device=device)).nonzero().squeeze(1)  # sentences still searching
        rows = (keep[:, None] * live + origin[keep]).reshape(-1)  # their beams' source rows, in beam order
        memory, memory_mask = _keep_rows(rows, memory, memory_attend_mask=memory_mask, caches=caches)
        prefix = torch.cat((prefix.index_select(0, rows), token[keep].reshape(-1, 1)), dim=1)
        sent, scores, tokens, live = sent[keep], new_scores[keep], tokens[keep], k
    return [max(group, key=lambda h: h[0])[1] if group else [] for group in finished]


def decode_batch(model: Transformer, src: Tensor, settings: DecodeSettings, *, use_cache: bool = True) -> list[list[int]]:
    """Greedy search for ``beam_size == 1``, else beam search."""
    common = dict(max_len_a=settings.max_len_a, max_len_b=settings.max_len_b, use_cache=use_cache)
    if settings.beam_size == 1:
        return greedy_search(model, src, **common)
    return beam_search(model, src, beam_size=settings.beam_size, length_penalty=settings.length_penalty, **common)


def translate_ids(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    settings: DecodeSettings,
    *,
    max_tokens: int = 6000,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Decode many sources in length-sorted batches; return hypotheses in the input order.

    ``max_tokens`` bounds padded source positions times beams per batch; ``on_batch(n)`` is called after
    each batch of ``n`` sentences (a progress bar).
    """
    device = next(model.parameters()).device
    results: list[list[int]] = [[] for _ in sources]
    lengths = [len(s) for s in sources]
    for chunk in sorted_chunks(lengths, max(max_tokens // settings.beam_size, 1)):
        src = pad_batch([sources[i] for i in chunk], PAD_ID).to(device)
        for i, hyp in zip(chunk, decode_batch(model, src, settings)):
            results[i] = hyp
        if on_batch is not None:
            on_batch(len(chunk))
    return results
