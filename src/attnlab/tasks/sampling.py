"""Writing text with a decoder LM: choosing the next token (temperature, top-k, top-p) and the decoding loop.

**Choosing a token.** Logits are divided by the temperature, then top-k keeps the ``k`` highest logits
and top-p (nucleus sampling) keeps the smallest set of tokens, most likely first, whose probabilities
add up to at least ``p``; everything else gets probability zero before one token is drawn. Greedy
decoding takes the arg-max and ignores all three. Draws come from an explicit ``torch.Generator``, so a
seed gives the same text every time.

**The loop.** :func:`generate` feeds the prompt once (the *prefill*), then one token per step through the
model's key/value caches (:meth:`DecoderLM.new_caches`): each step costs one position instead of the
whole prefix. ``use_cache=False`` recomputes the whole window every step (nanoGPT's ``generate``); within
the context the two give the same logits up to float rounding, hence the same greedy text.

**Past the context.** The position table (learned, sinusoidal or rotary) has ``max_positions`` rows. When
the cache is full the window slides: the caches are dropped and the last ``keep`` tokens (default half
a context) are fed afresh, after which single steps resume. Every token is thus predicted from at least
``keep`` tokens of context, and the re-encoding is paid once per ``max_positions - keep`` tokens rather
than on every step. Without the cache the window is always the last ``max_positions`` tokens.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from attnlab.errors import AttnlabError
from attnlab.nn.models import DecoderLM


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise :class:`AttnlabError` on settings that cannot be sampled with."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise AttnlabError(f"temperature must be a positive number, got {temperature} (use --greedy for arg-max)")
    if top_k is not None and top_k < 1:
        raise AttnlabError(f"top-k must be at least 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise AttnlabError(f"top-p must be in (0, 1], got {top_p}")


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` highest logits of each row, ``-inf`` elsewhere: (batch, vocab) -> (batch, vocab).

    Exactly ``k`` survive even when several logits tie at the boundary (a threshold would keep them all).
    """
    k = min(k, logits.shape[-1])
    values, index = logits.topk(k, dim=-1)
    return torch.full_like(logits, -math.inf).scatter(-1, index, values)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filter: keep the most likely tokens until their probability reaches ``p``, ``-inf`` elsewhere.

    (batch, vocab) -> (batch, vocab). A token is dropped when the tokens ranked above it already hold
    at least ``p`` of the probability, so the most likely token always survives.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = before >= p
    drop_sorted[..., 0] = False  # (a p below float32's smallest number compares as 0, and 0 >= 0 would drop it too)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def refuse_broken_scores(logits: Tensor) -> None:
    """Refuse logits holding NaN or +inf (-inf is a token ruled out): the weights of a run that diverged, finite but
    huge, give them, and the arg-max of NaN scores is token 0, the padding id, which decoding then refused for
    a reason that was not the model's."""
    if not bool((logits < math.inf).all()):  # (NaN compares False)
        raise AttnlabError("the model's scores for the next token are NaN or infinite: its weights have diverged "
                           "(trained with too high a learning rate, say) or overflow their dtype")


def next_token(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose one token per row: (batch, vocab) logits -> (batch,) ids."""
    refuse_broken_scores(logits)
    if greedy:
        return logits.argmax(dim=-1)
    check_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature != 1.0:  # (1 leaves the probabilities as they are: six operations saved at every token)
        # Shift each row's largest logit to 0 before dividing: a tiny temperature then drives the others to -inf
        # (the arg-max limit, ties shared) instead of overflowing to inf or dividing 0 by a temperature that
        # rounds to 0 in float32, both of which end in NaN probabilities. Banned tokens (-inf) are left as they
        # are: a temperature past float32's range is inf there, and -inf / inf is NaN.
        shifted = logits - logits.amax(dim=-1, keepdim=True)
        logits = torch.where((shifted == 0) | shifted.isinf(), shifted, shifted / temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(
    model: DecoderLM,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int | None = None,
    use_cache: bool = True,
    keep: int | None = None,
    banned: Sequence[int] = (),
) -> Iterator[int]:
    """Yield ``max_new_tokens`` ids continuing ``prompt``, one at a time (so that a caller can stream them).

    Args:
        model: the LM, in eval mode.
        prompt: at least one id; only its last ``max_positions`` are read.
        max_new_tokens: how many ids to yield.
        temperature, top_k, top_p, greedy: see :func:`next_token`.
        seed: seeds the sampling generator (None: a fresh random seed).
        use_cache: one position per step through the KV caches (else the whole window every step).
        keep: tokens kept when the window slides (default half the context, at least 1).
        banned: ids never produced (the tokenizer's special ids, which no training target holds).

    Raises:
        AttnlabError: on a bad argument, when called (not at the first token), so that nothing is printed first.
    """
    if not prompt:
        raise AttnlabError("the prompt is empty: give at least one token to continue")
    if max_new_tokens < 1:
        raise AttnlabError(f"max new tokens must be at least 1, got {max_new_tokens}")
    if not greedy:
        check_sampling(temperature, top_k, top_p)
    span = model.max_positions
    keep = max(1, span // 2) if keep is None else keep
    if not 1 <= keep <= span:  # keep == span re-reads a whole window at each slide (a context of 1 can only do that)
        raise AttnlabError(f"keep must be between 1 and {span}, got {keep}")
    return _tokens(model, list(prompt), max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   greedy=greedy, seed=seed, use_cache=use_cache, keep=keep, banned=banned)


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    """torch's oneDNN kernels off inside, as they were after: for a float32 step of one position on the CPU.

    There torch sends the exact GELU to oneDNN, which costs 10-35 us a call whatever the size, where torch's own
    kernel takes 2 us for the 512 numbers of the ``nanogpt-cpu`` model; oneDNN is the faster only from about 32
    positions. The step's other float32 kernels (matrix products, attention, layer norms) took the same time either
    way; in bfloat16 the matrix products go through oneDNN too, so it stays on there (issue 6).
    """
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


@torch.inference_mode()
def _tokens(model: DecoderLM, context: list[int], max_new_tokens: int, *, temperature: float, top_k: int | None,
            top_p: float | None, greedy: bool, seed: int | None, use_cache: bool, keep: int,
            banned: Sequence[int]) -> Iterator[int]:
    """The generator behind :func:`generate`, its arguments checked; ``context`` (the prompt) grows in place."""
    span = model.max_positions
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    ban = torch.tensor(list(banned), dtype=torch.long, device=device)
    float32_cpu = device.type == "cpu" and next(model.parameters()).dtype == torch.float32

    def run(ids: Sequence[int], caches: list | None) -> Tensor:
        x = torch.tensor([list(ids)], dtype=torch.long, device=device)
        with _without_onednn() if float32_cpu and len(ids) == 1 else contextlib.nullcontext():
            return model(x, caches=caches)[:, -1].float()  # (1, vocab): logits of the next token

    caches = model.new_caches() if use_cache else None
    logits = run(context[-span:], caches)
    for step in range(max_new_tokens):
        if len(ban):
            logits[:, ban] = -math.inf
        token = int(next_token(logits, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                               generator=generator))
        yield token
        context.append(token)
        if step == max_new_tokens - 1:
            break  # the last token needs no forward pass of its own
        if caches is None:
            logits = run(context[-span:], None)
        elif len(caches[0]) < span:
            logits = run([token], caches)
        else:  # the cache holds a whole context: slide the window and re-encode its last `keep` tokens
            caches = model.new_caches()
            logits = run(context[-keep:], caches)
