"""KV cache: decoding with the model's key/value cache gives what the full forward pass gives.

Generation reads the prompt once and then feeds one token a step, reusing the keys and values of the
positions already seen. A bug on that path is silent: training, and every other check, call only the full
forward pass, and the generated text is merely worse. The usual ones: new tokens whose positions restart at
0 (the cache's length never reaches the position table or the rotary angles), keys appended to the cache
twice or not at all, and a look-ahead mask built for the new tokens alone. A model whose full pass reads
later tokens (a missing look-ahead mask) fails here too, since a cache holds only the past; ``causal``
names that bug.

Per seed, a batch of two unpadded rows (with a padded source for seq2seq) is run whole, then through the cache: a prefix at once, then the rest
in chunks (with the first seed one token at a time, as generation feeds them, over the longest rows up to
:data:`LONGEST`; with the others chunks of one to three tokens over rows of random width, which a mask built
without the cached positions in mind gets wrong). Every position must agree. The two paths run different
kernels, so the tolerance is that of ``inference-path``.

The check drives the caches it knows (:func:`cache_protocol`): attnlab's, which a model of any author can
offer (``new_caches()``, and ``forward(ids, *, caches)`` taking the new positions only, the cached ones
counted by the caches; for seq2seq ``encode(src)``, giving the memory or (memory, its mask), and ``decode(tgt,
memory, memory_attend_mask=..., caches=...)``), and Hugging Face's ``cache`` (``past_key_values`` before transformers
5): a decoder's, the model itself or inside :class:`~attnlab.checks.adapters.HFAdapter`, and an encoder-decoder's inside
:class:`~attnlab.checks.adapters.HFSeq2SeqAdapter` (one passed bare is refused before any check runs). An
encoder-decoder is decoded as ``generate`` decodes it: the source encoded once by ``model.get_encoder()``, then every
step given those ``encoder_outputs``, the source's ``attention_mask`` (for the cross-attention) and the cache. A
Hugging Face decoder that can ``generate`` is also generated from greedily, with and without the cache: ``generate``
prepares each step's inputs with the model's own ``prepare_inputs_for_generation``, a path the calls above do not
take (a model's own may restart the position ids at 0). Any other model skips, with the reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.checks.adapters import HFAdapter, HFSeq2SeqAdapter, accepts_keyword, hf_attention_mask
from attnlab.checks.calling import ModelRaised, ModelUnderTest, OutputError
from attnlab.checks.compare import EPS_FACTOR, TOLERANCE, Tally
from attnlab.checks.contract import Contract
from attnlab.checks.inputs import generator, padded_rows, randint, random_tokens
from attnlab.checks.result import CheckResult, shown

NAME = "kv-cache"
#: The first seed decodes rows of the longest length (``--max-length``), one call per token, up to this many positions.
LONGEST = 1024
#: New tokens of the Hugging Face ``generate`` comparison, after a prompt of at most twice as many.
GENERATED = 16
#: After the prefix, the other seeds feed chunks of 1 to this many tokens.
CHUNK = 3

#: ``start(src)`` begins one decoding (``src`` is None but for seq2seq) and returns ``step(ids)``, which feeds
#: the next positions (batch, new) and returns what the model returned for them. Only ``step`` calls the model
#: (the first one makes the caches), so that the check can catch whatever the model raises.
Start = Callable[[Tensor | None], Callable[[Tensor], Any]]


class _NoCache(Exception):
    """The model offers a cache argument but keeps nothing in it: there is no cached path to check."""


def _attnlab_decoder(model: Any) -> Start | None:
    if not (callable(getattr(model, "new_caches", None)) and accepts_keyword(getattr(model, "forward", None), "caches")):
        return None

    def start(src: Tensor | None) -> Callable[[Tensor], Any]:
        caches: list[Any] = []

        def step(ids: Tensor) -> Any:
            if not caches:  # made inside the first step, where the check catches what the model raises
                caches.append(model.new_caches())
            return model(ids, caches=caches[0])
        return step
    return start


def _attnlab_seq2seq(model: Any) -> Start | None:
    if not (callable(getattr(model, "new_caches", None)) and callable(getattr(model, "encode", None))
            and accepts_keyword(getattr(model, "decode", None), "caches")):
        return None

    def start(src: Tensor | None) -> Callable[[Tensor], Any]:
        state: list[Any] = []  # memory, its mask and the caches, made inside the first step

        def step(tgt: Tensor) -> Any:
            if not state:  # encode gives (memory, its mask), as attnlab's Transformer does, or the memory alone
                encoded = model.encode(src)
                memory, memory_mask = encoded if isinstance(encoded, tuple | list) else (encoded, None)
                state.extend((memory, memory_mask, model.new_caches()))
            memory, memory_mask, caches = state
            return model.decode(tgt, memory, memory_attend_mask=memory_mask, caches=caches)
        return step
    return start


def _cache_argument(forward: Any) -> str | None:
    """The name a Hugging Face ``forward`` gives its key/value cache, in the call and in the output, or None.

    transformers 5 renamed ``past_key_values`` to ``cache``; earlier versions know only the first."""
    return next((n for n in ("cache", "past_key_values") if accepts_keyword(forward, n)), None)


def _kept_cache(out: Any, name: str) -> Any:
    """The cache a Hugging Face model returned as ``out.<name>``; :class:`_NoCache` when it returned none."""
    cache = getattr(out, name, None)
    if cache is None:
        raise _NoCache(f"the model takes use_cache but returned no {name}: it keeps no key/value cache")
    return cache


def _hugging_face_decoder(model: Any) -> Start | None:
    inner = model.model if isinstance(model, HFAdapter) else model
    pad_id = model.pad_id if isinstance(model, HFAdapter) else None  # the adapter hides it in the full pass
    forward = getattr(inner, "forward", None)
    name = _cache_argument(forward)
    called_as_hf = all(accepts_keyword(forward, n) for n in ("input_ids", "attention_mask", "use_cache"))
    if not (isinstance(inner, nn.Module) and hasattr(inner, "config") and name and called_as_hf):
        return None

    def start(src: Tensor | None) -> Callable[[Tensor], Any]:
        held: list[Any] = [None, None]  # the cache, and the ids it holds

        def step(ids: Tensor) -> Any:
            seen = ids if held[1] is None else torch.cat((held[1], ids), dim=1)
            # the mask covers the cached positions and the new ones, as the adapter's full pass builds it
            mask = torch.ones_like(seen) if pad_id is None else hf_attention_mask(seen, pad_id)
            out = inner(input_ids=ids, attention_mask=mask, use_cache=True, **{name: held[0]})
            held[:] = _kept_cache(out, name), seen  # (an encoder, BERT, takes the argument and keeps nothing)
            return out
        return step
    return start


def _generating_decoder(model: Any) -> Any | None:
    """The Hugging Face decoder inside ``model`` (bare or in :class:`HFAdapter`) when it can ``generate``, else None."""
    inner = model.model if isinstance(model, HFAdapter) else model
    can = getattr(inner, "can_generate", None)
    return inner if callable(getattr(inner, "generate", None)) and callable(can) and can() else None


def _generated(mut: ModelUnderTest, inner: Any, prompt: Tensor, new: int, cache: bool) -> tuple[Tensor, Tensor]:
    """Greedy ``generate`` of ``new`` tokens after ``prompt`` (batch, n), with or without the cache: the model's
    logits at each new step (batch, new, vocab) and the tokens chosen (batch, new)."""
    chosen: list[Tensor] = []

    def call() -> Tensor:
        with warnings.catch_warnings():  # (its notes on generation settings are not the check's findings)
            warnings.simplefilter("ignore")
            # greedy whatever the model's generation_config asks (beams, several sequences)
            out = inner.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, num_beams=1, num_return_sequences=1,
                                 use_cache=cache, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        chosen.append(out.sequences[:, prompt.shape[1]:])
        return torch.stack(out.logits, dim=1)
    return mut.invoke(call, rows=prompt.shape[0]), chosen[0].cpu()


def _generate_differs(mut: ModelUnderTest, inner: Any, ids: Tensor, prompt: int, tally: Tally) -> dict | None:
    """Run ``generate`` with and without the cache from the first ``prompt`` ids of each row, as a user generates:
    through the model's own ``prepare_inputs_for_generation``, which the cached forward calls above do not take.
    The first step whose logits differ while both runs had chosen the same tokens so far, as evidence; else None."""
    new = ids.shape[1] - prompt
    start = ids[:, :prompt]  # (copied for each call: a model may edit its ids in place)
    cached, cached_tokens = _generated(mut, inner, start.to(mut.device, copy=True), new, cache=True)
    full, full_tokens = _generated(mut, inner, start.to(mut.device, copy=True), new, cache=False)
    # generate hands back float32 logits whatever the model computes in: the tolerance is the model's precision's
    precision = next((p.dtype for p in inner.parameters() if p.is_floating_point()), full.dtype)
    for row in range(ids.shape[0]):
        agree = (cached_tokens[row] == full_tokens[row]).long().cumprod(0)  # 1 while the tokens chosen agree
        steps = int(agree.sum()) + 1  # those steps, and the step where the choices part (a near tie may do that)
        diff = mut.compare(full[row, :steps], cached[row, :steps], TOLERANCE.for_kernels(precision))
        if tally.judge(diff) and not diff.same:
            return {"row": row, "steps": [p[0] for p in diff.positions], "max_diff": diff.max_diff,
                    "prompt": ids[row, :prompt], "cached_tokens": cached_tokens[row], "tokens": full_tokens[row],
                    "diff": diff}
    return None


def _hugging_face_seq2seq(model: Any) -> Start | None:
    """Hugging Face's encoder-decoder cache, driven through :class:`HFSeq2SeqAdapter` with the adapter's masks."""
    if not isinstance(model, HFSeq2SeqAdapter):
        return None
    inner, forward = model.model, model.model.forward
    name = _cache_argument(forward)
    driven = all(accepts_keyword(forward, n) for n in ("encoder_outputs", "use_cache"))
    if not (name and driven and callable(getattr(inner, "get_encoder", None))):
        return None

    def start(src: Tensor | None) -> Callable[[Tensor], Any]:
        src_mask = model.source_mask(src)  # the full pass hides the source's padding; so must every cached step
        held: list[Any] = [None, None, None]  # the encoder's outputs, the cache, and the target ids it holds

        def step(tgt: Tensor) -> Any:
            if held[0] is None:  # encode once, as generate does, inside the first step where a raise is caught
                held[0] = inner.get_encoder()(input_ids=src, attention_mask=src_mask)
            seen = tgt if held[2] is None else torch.cat((held[2], tgt), dim=1)
            # the target's mask, if the adapter builds one, covers the cached positions and the new ones
            out = inner(encoder_outputs=held[0], attention_mask=src_mask, decoder_input_ids=tgt,
                        decoder_attention_mask=model.target_mask(seen), use_cache=True, **{name: held[1]})
            held[1:] = _kept_cache(out, name), seen
            return out
        return step
    return start


#: Each protocol in words, and the function that finds it on a model, per kind.
PROTOCOLS: dict[str, list[tuple[str, Callable[[Any], Start | None]]]] = {
    "decoder": [("attnlab's caches: new_caches(), forward(ids, caches=...)", _attnlab_decoder),
                ("Hugging Face's cache (past_key_values)", _hugging_face_decoder)],
    "seq2seq": [("attnlab's caches: encode(src), new_caches(), decode(tgt, memory, ..., caches=...)",
                 _attnlab_seq2seq),
                ("Hugging Face's encoder-decoder cache (past_key_values), in HFSeq2SeqAdapter", _hugging_face_seq2seq)],
}


def cache_protocol(model: Any, kind: str) -> tuple[str, Start] | None:
    """The key/value cache protocol ``model`` offers for ``kind``, in words, and how to start a decoding; None
    when it offers none that the check knows."""
    for words, find in PROTOCOLS.get(kind, []):
        start = find(model)
        if start is not None:
            return words, start
    return None


def _source(gen: torch.Generator, contract: Contract) -> Tensor | None:
    """For seq2seq, two source rows, one of them right-padded when the contract has a pad id: decoding reads
    padded sources in batches (translation does), so a cached decode must hide source padding as the full pass
    does. The target side stays unpadded, as decoding feeds it."""
    return padded_rows(gen, contract, 2)[0] if contract.kind == "seq2seq" else None


def _chunks(gen: torch.Generator, width: int, singles: bool) -> list[int]:
    """The sizes the ``width`` positions are fed in: a prefix of 1 to ``width - 1``, then singles or chunks."""
    sizes = [randint(gen, 1, width - 1)]
    while sum(sizes) < width:
        left = width - sum(sizes)
        sizes.append(1 if singles else randint(gen, 1, min(CHUNK, left)))
    return sizes


def _cached(mut: ModelUnderTest, start: Start, ids: Tensor, src: Tensor | None, sizes: list[int]) -> Tensor:
    """(batch, width) outputs of feeding ``ids`` through the cache in chunks of ``sizes``."""
    device = mut.device
    step = start(None if src is None else src.to(device, copy=True))
    outputs, fed = [], 0
    for size in sizes:
        chunk = ids[:, fed:fed + size]
        out = mut.invoke(lambda chunk=chunk: step(chunk.to(device, copy=True)), rows=ids.shape[0])
        if out.dim() < 2 or out.shape[1] != size:
            raise OutputError(f"fed {size} new position(s) through the cache, the model returned shape "
                              f"{tuple(out.shape)}: a cached call must return one output per new position")
        outputs.append(out)
        fed += size
    return torch.cat(outputs, dim=1)


def check_kv_cache(mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """Run the KV-cache check over ``seeds``; see the module docstring."""
    contract, tally = mut.contract, Tally()
    tol = f"{TOLERANCE.describe()}, rtol at least {EPS_FACTOR} machine epsilons of a bfloat16 or float16 output"
    if not contract.causal:
        return CheckResult(NAME, "skip", "an encoder is not decoded incrementally", tol)
    found = cache_protocol(mut.model, contract.kind)
    if found is None:
        known = "; ".join(words for words, _ in PROTOCOLS[contract.kind])
        return CheckResult(NAME, "skip", f"the model offers no key/value cache the check can drive ({known})", tol)
    if not mut.per_position:
        return CheckResult(NAME, "skip", "the outputs are not per position (see causal)", tol)
    words, start = found
    longest = min(contract.max_length, LONGEST)
    for done, seed in enumerate(seeds, 1):
        mut.seed, gen = seed, generator(NAME, seed)
        first = done == 1
        width = longest if first else randint(gen, 2, longest)
        ids, src = random_tokens(gen, contract, 2, width), _source(gen, contract)
        sizes = _chunks(gen, width, singles=first)
        full = mut.outputs(ids, src)
        try:
            cached = _cached(mut, start, ids, src, sizes)
        except ModelRaised as raised:
            if isinstance(raised.error, _NoCache):
                return CheckResult(NAME, "skip", str(raised.error), tol)
            raise
        for row in range(2):
            finite = bool(torch.isfinite(full[row]).all()), bool(torch.isfinite(cached[row]).all())
            if finite[0] != finite[1]:  # NaN on one path only is itself the finding, not a comparison to skip
                paths = ("the cached path", "the full forward pass")[:: 1 if finite[0] else -1]
                evidence = {"seed": seed, "input": ids[row], "row": row, "chunks": sizes, "protocol": words,
                            "finite_full_pass": finite[0], "finite_cached_path": finite[1]}
                if src is not None:
                    evidence["source"] = src[row]
                return CheckResult(NAME, "fail", f"seed {seed}: row {row}'s output is not finite on {paths[0]} but "
                                   f"finite on {paths[1]} ({words}; chunks {shown(sizes)}); input {shown(ids[row])}",
                                   tol, done, evidence)
            diff = mut.compare(full[row], cached[row], TOLERANCE.for_kernels(full.dtype))
            if not tally.judge(diff) or diff.same:
                continue
            positions = [p[0] for p in diff.positions]
            evidence = {"seed": seed, "input": ids[row], "row": row, "chunks": sizes, "positions": positions,
                        "max_diff": diff.max_diff, "bound": diff.bound, "protocol": words}
            if src is not None:
                evidence["source"] = src[row]
            summary = (f"seed {seed}: decoding with the key/value cache ({words}; {sizes[0]} token(s) at once, then "
                       f"{'one at a time' if first else f'chunks of {shown(sizes[1:])}'}) differs from the full "
                       f"forward pass at position(s) {shown(positions)} by up to {diff} (likely causes: new "
                       f"tokens' positions restarting at 0, keys cached twice or not at all, a look-ahead mask "
                       f"for the new tokens alone, or a full pass that reads later tokens, which causal would "
                       f"fail); input {shown(ids[row])}")
            return CheckResult(NAME, "fail", summary, tol, done, evidence)
    inner = _generating_decoder(mut.model) if words.startswith("Hugging Face") and contract.kind == "decoder" else None
    also = ""
    if inner is not None:
        # A short prompt and a few new tokens: without the cache generate recomputes the whole prefix every step,
        # and positions restarting at 0 show at the first cached step. (The long rows were decoded above.)
        gen = generator(NAME + " generate", seeds[0])
        new = min(GENERATED, longest - 1)
        prompt = randint(gen, 1, min(longest - new, 2 * GENERATED))
        ids = random_tokens(gen, contract, 2, prompt + new)
        found = _generate_differs(mut, inner, ids, prompt, tally)
        if found is not None:
            diff = found.pop("diff")
            return CheckResult(NAME, "fail", (
                f"greedy generate with the cache differs from generate without it at new step(s) "
                f"{shown(found['steps'])} of row {found['row']} by up to {diff}, while both had chosen the same "
                f"tokens so far (the cached path generate takes goes through the model's "
                f"prepare_inputs_for_generation, which its forward alone does not: likely causes there are new tokens' "
                f"position ids restarting at 0, or an attention mask or cache position not advanced); prompt "
                f"{shown(found['prompt'])}"), tol, len(seeds), {**found, "protocol": words})
        also = f"; greedy generate too, {new} new tokens with and without the cache"
    return tally.verdict(NAME, tol, len(seeds), f"cached decoding equals the full forward pass ({words}; the first "
                                                f"seed one token at a time over {longest} positions{also})")
