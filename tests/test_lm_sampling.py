"""Sampling for the language model: top-k / top-p bounds, seeds, and the KV-cache decoding loop."""

import math

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.nn import DecoderLM
from attnlab.tasks.sampling import generate, next_token, top_k_filter, top_p_filter


def random_logits(rows=4, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_top_k_keeps_exactly_k_even_with_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0, -1.0]])
    kept = top_k_filter(logits, 2)
    assert int(torch.isfinite(kept).sum()) == 2
    assert set(torch.isfinite(kept)[0].nonzero().squeeze(1).tolist()) <= {1, 2, 3}
    assert torch.equal(top_k_filter(logits, 100), logits)  # k above the vocabulary keeps everything


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_samples_stay_among_the_k_most_likely(k):
    logits = random_logits()
    allowed = logits.topk(k, dim=-1).indices
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        ids = next_token(logits, temperature=2.0, top_k=k, generator=g)  # a high temperature spreads the draws
        assert all(int(i) in allowed[row].tolist() for row, i in enumerate(ids))


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_keeps_the_smallest_set_reaching_p(p):
    logits = random_logits(rows=6, vocab=30, seed=2)
    kept = torch.isfinite(top_p_filter(logits, p))
    probs = logits.softmax(-1)
    for row in range(logits.shape[0]):
        order = probs[row].argsort(descending=True)
        n = int(kept[row].sum())
        assert kept[row, order[:n]].all()  # the kept tokens are the most likely ones
        assert float(probs[row, order[:n]].sum()) >= p - 1e-6  # together they reach p ...
        assert n == 1 or float(probs[row, order[: n - 1]].sum()) < p  # ... and one fewer would not


def test_top_p_samples_stay_in_the_nucleus_and_the_top_token_always_survives():
    logits = random_logits(rows=3, vocab=40, seed=3)
    nucleus = torch.isfinite(top_p_filter(logits, 0.6))
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = next_token(logits, top_p=0.6, generator=g)
        assert all(bool(nucleus[row, i]) for row, i in enumerate(ids.tolist()))
    tiny = torch.isfinite(top_p_filter(logits, 1e-9))
    assert torch.equal(tiny.sum(-1), torch.ones(3, dtype=torch.long))
    assert torch.equal(tiny.float().argmax(-1), logits.argmax(-1))


def test_seed_reproduces_the_draws_and_another_seed_changes_them():
    logits = random_logits(rows=1, vocab=100)

    def draws(seed):
        g = torch.Generator().manual_seed(seed)
        return [int(next_token(logits, temperature=1.5, generator=g)) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


@pytest.mark.parametrize("temperature", [1e-3, 1e-38, 1e-45, 1e-300])
def test_a_tiny_temperature_approaches_the_arg_max_instead_of_failing(temperature):
    logits = random_logits(rows=3, vocab=40) * 30  # wide logits: dividing them by 1e-38 overflows float32
    g = torch.Generator().manual_seed(0)
    assert torch.equal(next_token(logits, temperature=temperature, generator=g), logits.argmax(-1))
    tied = torch.tensor([[5.0, 5.0, -1.0]])  # in the limit, tied maxima share the probability
    drawn = {int(next_token(tied, temperature=temperature, generator=g)) for _ in range(40)}
    assert drawn == {0, 1}


@pytest.mark.parametrize("temperature", [1e39, 1e300])
def test_a_temperature_past_float32_samples_evenly_and_still_never_a_banned_token(temperature):
    logits = torch.tensor([[3.0, -math.inf, 1.0, -2.0]])  # id 1 banned (padding, say)
    g = torch.Generator().manual_seed(0)
    drawn = [int(next_token(logits, temperature=temperature, generator=g)) for _ in range(300)]
    assert set(drawn) == {0, 2, 3} and min(drawn.count(i) for i in (0, 2, 3)) > 60  # about 100 each


def test_bad_sampling_settings_are_errors():
    logits = random_logits()
    for kwargs in ({"temperature": 0.0}, {"temperature": -1.0}, {"temperature": math.nan}, {"top_k": 0},
                   {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(AttnlabError):
            next_token(logits, **kwargs)
    assert torch.equal(next_token(logits, greedy=True, temperature=0.0), logits.argmax(-1))  # greedy ignores them


def tiny_lm(positions="learned", max_positions=12, seed=0):
    # Untied output and PyTorch's default initialisation: a random tied model mostly predicts its last input
    # token again, and a constant text would hide a cache bug; this one writes varied text.
    torch.manual_seed(seed)
    return DecoderLM(20, 32, 2, 4, max_positions=max_positions, positions=positions, tie_output=False).eval()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_greedy_with_cache_equals_recomputing_the_prefix(positions):
    model = tiny_lm(positions)
    prompt = [3, 7, 1]
    cached = list(generate(model, prompt, 9, greedy=True))  # 3 + 9 = 12 positions: the whole context
    uncached = list(generate(model, prompt, 9, greedy=True, use_cache=False))
    assert cached == uncached
    assert len(set(cached)) > 1  # not a constant run, which many cache bugs would also produce
    # The cache gives the same logits, not just the same arg-max.
    caches = model.new_caches()
    ids = torch.tensor([prompt + cached])
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :3], caches=caches)[:, -1]]
        steps += [model(ids[:, t : t + 1], caches=caches)[:, -1] for t in range(3, ids.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 2:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keep", [None, 12, 11, 1])
def test_past_the_context_the_window_slides_as_documented(keep):
    """The cached loop equals a cache-free re-implementation of the sliding rule, far past the context."""
    model = tiny_lm(max_positions=12)
    prompt, n = [5, 2, 9, 4], 40
    got = list(generate(model, prompt, n, greedy=True, keep=keep))
    span, k = 12, keep or 6
    context, start = list(prompt), 0
    expected = []
    with torch.no_grad():
        for _ in range(n):
            if len(context) - start > span:  # the cache would overflow: restart from the last k tokens
                start = len(context) - k
            token = int(model(torch.tensor([context[start:]]))[0, -1].argmax())
            expected.append(token)
            context.append(token)
    assert got == expected
    assert len(list(generate(model, prompt, n, greedy=True, use_cache=False))) == n  # no failure without cache


@pytest.mark.parametrize("caller_setting", [True, False])
def test_one_position_float32_steps_run_without_onednn_and_the_callers_setting_is_kept(caller_setting):
    """oneDNN's GELU costs a fixed 10-35 us a call, more than a cached step's whole GELU in torch's own kernel: it is
    off for single positions only (float32 on the CPU), never turned on, and back as the caller had it after."""
    model = tiny_lm()
    seen: list[tuple[int, bool]] = []  # (positions fed, oneDNN enabled) for every forward pass
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (args[0].shape[1], torch.backends.mkldnn.enabled)), with_kwargs=True)
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = caller_setting
    try:
        tokens = generate(model, [1, 2, 3], 5, seed=0)
        next(tokens)  # the prompt's pass, then a token: the caller runs between tokens
        assert torch.backends.mkldnn.enabled is caller_setting
        assert len(list(tokens)) == 4
        assert torch.backends.mkldnn.enabled is caller_setting
        assert seen == [(3, caller_setting)] + [(1, False)] * 4
        seen.clear()  # the whole window every step: never switched
        assert len(list(generate(model, [1, 2, 3], 3, seed=0, use_cache=False))) == 3
        assert seen == [(3, caller_setting), (4, caller_setting), (5, caller_setting)]
        seen.clear()  # in bfloat16 the matrix products need oneDNN: left as it is
        list(generate(model.to(torch.bfloat16), [1, 2, 3], 2, seed=0))
        assert seen == [(3, caller_setting), (1, caller_setting)]
    finally:
        torch.backends.mkldnn.enabled = was


def test_generation_is_reproducible_with_a_seed():
    model = tiny_lm()
    a = list(generate(model, [1, 2], 30, seed=4, top_k=10))
    b = list(generate(model, [1, 2], 30, seed=4, top_k=10))
    c = list(generate(model, [1, 2], 30, seed=5, top_k=10))
    assert a == b and a != c


def test_banned_ids_and_bad_requests():
    model = tiny_lm()
    logits_top = int(model(torch.tensor([[1]]))[0, -1].argmax())
    out = list(generate(model, [1], 20, seed=0, banned=[logits_top]))
    assert logits_top not in out
    # Refused when called, before any token is asked for (the command line has printed nothing yet).
    with pytest.raises(AttnlabError, match="empty"):
        generate(model, [], 5)
    with pytest.raises(AttnlabError, match="at least 1"):
        generate(model, [1], 0)
    for keep in (0, 13):
        with pytest.raises(AttnlabError, match="keep must be between 1 and 12"):
            generate(model, [1], 3, keep=keep)


def test_a_model_with_a_context_of_one_generates_with_and_without_the_cache():
    model = tiny_lm(max_positions=1)
    cached = list(generate(model, [3, 4], 10, greedy=True))
    fresh = list(generate(model, [3, 4], 10, greedy=True, use_cache=False))
    with torch.no_grad():  # each token from the one before it alone
        expected, last = [], 4
        for _ in range(10):
            last = int(model(torch.tensor([[last]]))[0, -1].argmax())
            expected.append(last)
    assert cached == fresh == expected


def test_a_top_p_below_float32s_smallest_number_keeps_the_top_token():
    logits = torch.tensor([[2.0, 1.0, 0.5], [0.0, 3.0, 1.0]])
    kept = top_p_filter(logits, 1e-46)  # 1e-46 is 0 in float32: "0 >= 0" dropped every token, NaN followed
    assert torch.isfinite(kept).sum(-1).tolist() == [1, 1] and kept.argmax(-1).tolist() == [0, 1]
    assert next_token(logits, top_p=1e-46).tolist() == [0, 1]


def test_nan_or_infinite_scores_are_an_error_and_a_banned_token_is_not():
    """A diverged model's NaN scores made torch.multinomial fail with a traceback, and greedy pick token 0."""
    logits = random_logits()
    logits[:, 0] = -math.inf  # a token ruled out: fine
    assert next_token(logits, greedy=True).shape == (4,)
    for bad in (math.nan, math.inf):
        broken = logits.clone()
        broken[2, 5] = bad
        for greedy in (True, False):
            with pytest.raises(AttnlabError, match="scores for the next token are NaN or infinite"):
                next_token(broken, greedy=greedy, generator=torch.Generator().manual_seed(0))
