"""Section 10: the silent bugs of seed 000's port, and its six review questions.

Seed 000 lists the things that went wrong when its notebooks moved to Keras 3 and the slips its own
text warns about. The dangerous ones raise nothing: the shapes work and the numbers are merely wrong.
Each block below shows the wrong form, measures its effect with numpy or the core, and shows what
attnlab does about it: the core refusing the form (its own error message, caught live) or the
``attnlab check`` check that catches it in someone else's model (run live where it is cheap).
The review questions then get short answers tied to numbers computed here. Nothing is hard-coded
except the inputs and the seed's one quoted Keras result, which needs Keras weights to reproduce.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import torch
from torch import nn

from attnlab.checks import Contract, run_checks
from attnlab.errors import AttnlabError
from attnlab.lab.encoding import SEED_WIDTH
from attnlab.lab.html import Section, check, code, esc, heading, para, table
from attnlab.lab.masks_demo import KEEP, PADDED, K, Q, V
from attnlab.lab.model_checks import SEED, SOURCE, TARGET, encoder_layer_demo
from attnlab.lab.parameters import D_K, D_MODEL, HEADS
from attnlab.nn import (
    MultiHeadAttention,
    Transformer,
    attention_reference,
    from_keep_mask,
    masked_softmax,
    padding_mask,
    sinusoidal_encoding,
)
from attnlab.presets import MODEL_PRESETS, build_preset

SEED_KERAS_WEIGHTS = [0.887, 0.095, 0.018]  # seed 000's positional-mask result (Keras weights, not reproducible)
SEQ2SEQ = Contract(kind="seq2seq", vocab_size=30, max_length=5)  # lab-toy: 30 source ids, 5 source positions


def _raised(call) -> str:
    """The exception ``call()`` raises, as 'Type: message' (the section claims a refusal, so none is a bug)."""
    try:
        call()
    except (AttnlabError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    raise AssertionError("the core accepted a form it is meant to refuse")


def _r(t: torch.Tensor) -> list:
    """Rounded for display (float32 values would print 17 digits)."""
    return np.round(t.double().numpy(), 4).tolist()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _keras_like(mha: MultiHeadAttention, keras3: bool):
    """A call with Keras's parameter order (seed 000, change 2), routing only ``attention_mask`` to the core."""
    def keras2_call(query, value, key=None, attention_mask=None):
        return mha(query, attend_mask=attention_mask, need_weights=True)[1][0, 0, 0]

    def keras3_call(query, value, key=None, query_mask=None, value_mask=None, key_mask=None, attention_mask=None):
        # Keras 3 overwrites query_mask with the query tensor's own mask metadata: what was passed is lost.
        return mha(query, attend_mask=attention_mask, need_weights=True)[1][0, 0, 0]
    return keras3_call if keras3 else keras2_call


def _positional_mask(n: dict) -> str:
    torch.manual_seed(SEED)
    mha = MultiHeadAttention(4, 2, head_dim=4).eval()  # the seed's full-width Keras heads
    x = torch.randn(1, 3, 4)  # self-attention: query = value = key
    hide_last = from_keep_mask(torch.tensor(KEEP))[:, None, None, :]  # (1, 1, 1, 3): the last key hidden
    k2, k3 = _keras_like(mha, False), _keras_like(mha, True)
    binds = {f.__name__: next(p for p, v in inspect.signature(f).bind(x, x, x, hide_last).arguments.items()
                              if v is hide_last) for f in (k2, k3)}
    with torch.no_grad():
        plain = k3(x, x, x)
        ignored = k3(x, x, x, hide_last)  # the seed's self.mha1(x, x, x, look_ahead_mask) on Keras 3
        masked = k3(x, x, x, attention_mask=hide_last)
        keras2 = k2(x, x, x, hide_last)
    same = bool(torch.equal(plain, ignored))
    differs = not torch.allclose(plain, masked) and bool(torch.equal(keras2, masked))
    refusals = [_raised(lambda: mha(x, hide_last)), _raised(lambda: mha(x, x, x, hide_last))]
    n["positional_mask"] = {"binds_to": binds, "no_mask": plain.tolist(), "ignored": ignored.tolist(),
                            "masked": masked.tolist(), "ignored_equals_no_mask": same, "refusals": refusals}
    return (heading("1. A mask passed by position lands on another parameter")
            + para(f"<code>mha(x, x, x, mask)</code>: the fourth argument binds to <code>{binds['keras2_call']}</code>",
                   f"in Keras 2 but to <code>{binds['keras3_call']}</code> in Keras 3, which <code>call</code> overwrites.",
                   f"The seed measured {SEED_KERAS_WEIGHTS} that way with Keras weights, the same as no mask.",
                   "Keras does not run here: the two signatures are wrappers around the core layer (4 wide) that,",
                   "as Keras 3 does, drop whatever reaches <code>query_mask</code>. Where the argument binds is",
                   "Python's own answer (<code>inspect.signature</code>); the weights are the core's:")
            + code(f"no mask          {_r(plain)}\nmask by position {_r(ignored)}\nattend_mask=...  {_r(masked)}")
            + check(binds["keras2_call"] == "attention_mask" != binds["keras3_call"] and differs,
                    "with the two signatures written here, the fourth argument lands on attention_mask under Keras "
                    "2's signature only; the real mask changes the outputs, so a mask lost this way shows only in "
                    "the numbers")
            + para("(The row for the mask passed by position equals the one without a mask by construction: the",
                   "wrapper, like Keras 3, drops it. What is measured is where it binds and what the real mask does.)")
            + para("attnlab's masks are keyword-only, so the same slip raises:")
            + code("\n".join(f"{call}: {said}" for call, said in zip(("mha(x, mask)", "mha(x, x, x, mask)"), refusals))))


class _CrossMaskFromTarget(nn.Module):
    """The lab-toy model with its cross-attention mask built from the target ids (seed 000, change 8)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory, _ = self.model.encode(src)
        return self.model.decode(tgt, memory, memory_attend_mask=padding_mask(tgt))[0]


def _cross_mask(n: dict, model: Transformer) -> str:
    src, tgt = torch.tensor(SOURCE), torch.tensor(TARGET)  # both 5 long: the wrong mask has the right shape
    with torch.no_grad():
        memory, right_mask = model.encode(src)
        right, w_right = model.decode(tgt, memory, memory_attend_mask=right_mask, need_weights=True)
        wrong, w_wrong = model.decode(tgt, memory, memory_attend_mask=padding_mask(tgt), need_weights=True)
    cross = "decoder_layer1_block2_decenc_att"
    diff = float((right - wrong).abs().max())
    # Source position 4 is padding, position 3 a real token that the target's padding happens to cover.
    on_pad = [float(w[cross][..., 4].mean()) for w in (w_right, w_wrong)]  # mean over heads and target rows
    on_real = [float(w[cross][..., 3].mean()) for w in (w_right, w_wrong)]
    shorter = _raised(lambda: _CrossMaskFromTarget(model)(src, tgt[:, :4]))
    verdicts = {name: run_checks(m, SEQ2SEQ, seeds=1, only=["padding-invariance"]).results[0]
                for name, m in (("source mask", model), ("target mask", _CrossMaskFromTarget(model)))}
    n["cross_mask"] = {"logit_max_difference": diff,
                       "cross_weight_on_source_padding": dict(zip(("source", "target"), on_pad)),
                       "cross_weight_on_source_token_3": dict(zip(("source", "target"), on_real)),
                       "shorter_target": shorter, "padding_invariance": {k: v.status for k, v in verdicts.items()}}
    return (heading("2. The cross-attention padding mask built from the target")
            + para("A padding mask describes the sequence that supplies the keys and values; in cross-attention",
                   f"that is the source. lab-toy, source {SOURCE[0]}, target {TARGET[0]} (both 5 long):")
            + code(f"largest logit difference, target mask vs source mask: {diff:.4f}\n"
                   f"layer 1 cross-attention weight (mean of 4 heads x 5 rows), source mask / target mask:\n"
                   f"  on source position 4, padding:     {on_pad[0]:.4f} / {on_pad[1]:.4f}\n"
                   f"  on source position 3, a real token: {on_real[0]:.4f} / {on_real[1]:.4f}\nwith a 4-token target the core refuses the shape: {shorter}")
            + check(diff > 1e-4 and on_real[1] == 0.0 < on_real[0],
                    "the wrong mask has the right shape, hides a real source token and changes the outputs")
            + para("With other lengths of padding it would let source padding in instead.")
            + para("<code>attnlab check --kind seq2seq</code> catches it, here in padding-invariance (the check run",
                   "below): it draws sources and targets of different lengths, where a mask built from the target no",
                   "longer fits the scores and the model raises. On equal lengths, as above, only the numbers show it.")
            + code("\n".join(f"{k}: {v.status}: {v.summary}" for k, v in verdicts.items())))


def _broadcast(n: dict) -> str:
    ids = np.array(PADDED, dtype=float)  # the seed's demo uses the ids themselves as scores
    keep = (ids != 0)[:, None, :].astype(float)  # (3, 1, 5)
    right = np.stack([_softmax(ids[i] + (1 - keep[i, 0]) * -1e9) for i in range(3)])  # (3, 5)
    wrong = _softmax(ids + (1 - keep) * -1e9)  # (3, 5) + (3, 1, 5) -> (3, 3, 5): wrong[i, j] = scores j, mask i
    diagonal_ok = all(np.allclose(wrong[i, i], right[i]) for i in range(3))
    off_wrong = sum(not np.allclose(wrong[i, j], right[j]) for i in range(3) for j in range(3) if i != j)
    refusal = _raised(lambda: masked_softmax(torch.tensor(ids), attend_mask=torch.tensor(keep, dtype=torch.bool)))
    n["broadcast"] = {"shape": list(wrong.shape), "diagonal_rows_correct": diagonal_ok,
                      "off_diagonal_pairings_wrong": off_wrong, "refusal": refusal,
                      "row_0_0": wrong[0, 0].tolist(), "row_1_0": wrong[1, 0].tolist()}  # the two rows printed
    return (heading("3. A (3, 1, 5) mask added to (3, 5) scores")
            + code(f"{ids.shape} + {keep.shape} -> {wrong.shape}\nrow [0, 0] {np.round(wrong[0, 0], 4).tolist()} "
                   f"(correct)\nrow [1, 0] {np.round(wrong[1, 0], 4).tolist()} (sequence 0's scores, 1's mask)")
            + check(diagonal_ok, f"the diagonal rows equal the correct ones; {off_wrong} of 6 other pairings differ")
            + para("A diagonal row, such as [0, 0], is right and an off-diagonal one is not, so a row printed to",
                   "check can look right. The core refuses another rank:")
            + code(refusal))


def _rank(n: dict) -> str:
    q, k, v = np.array(Q), np.array(K), np.array(V)
    scores = q @ k.T / math.sqrt(k.shape[-1])  # (1, 3)
    mask = np.array(KEEP)[:, None, :]  # (1, 1, 3)
    out = _softmax(scores + (1 - mask) * -1e9) @ v
    refusal = _raised(lambda: attention_reference(torch.tensor(Q), torch.tensor(K), torch.tensor(V),
                                                  attend_mask=torch.tensor(mask, dtype=torch.bool)))
    n["rank"] = {"scores": list(scores.shape), "mask": list(mask.shape), "output": list(out.shape), "refusal": refusal}
    return (heading("4. A (1, 1, 3) mask on (1, 3) scores")
            + code(f"scores {scores.shape} + mask {mask.shape} -> weights {(scores + mask).shape}; "
                   f"weights @ V -> {out.shape}, not (1, 2)\n{refusal}"))


class _ForgotEval(nn.Module):
    """A model whose call switches dropout on, as a forgotten ``training=False`` does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.model.train()(src, tgt)


def _training_flag(n: dict, model: Transformer) -> str:
    layer_numbers, _ = encoder_layer_demo()  # the same layer and calls as "The model" section
    verdict = run_checks(_ForgotEval(model), SEQ2SEQ, seeds=1, only=["mode"]).results[0]
    model.eval()
    n["training_flag"] = {"train_max_difference": layer_numbers["train_max_difference"],
                          "eval_identical": layer_numbers["eval_identical"], "mode_check_dropout_at_eval": verdict.status,
                          "mode_check_summary": verdict.summary, "mode_check_evidence": verdict.evidence}
    return (heading("5. The training flag forgotten")
            + code(f"encoder layer of 'The model', two calls in train mode: largest difference "
                   f"{n['training_flag']['train_max_difference']:.4f}; in eval mode identical: "
                   f"{n['training_flag']['eval_identical']}\nmode check, lab-toy with dropout left on (its outputs are "
                   f"logits): {verdict.status}: {verdict.summary}")
            + para("Dropout at evaluation makes predictions random; missing in training removes the regulariser.",
                   "The <code>mode</code> check catches the first; attnlab layers follow <code>model.train()</code>."))


def _head_width(n: dict) -> str:
    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())
    # (head_dim = d as the seed's Keras key_dim, d / heads as the paper, d_k = 64 in all as seed 003's layers)
    rows = {f"d {d}, {h} heads": (count(MultiHeadAttention(d, h, head_dim=d)), count(MultiHeadAttention(d, h)),
                                  count(MultiHeadAttention(d, h, head_dim=D_K // h)) if d == D_MODEL else None)
            for d, h in ((4, 4), (D_MODEL, HEADS))}
    toy = dict(MODEL_PRESETS["lab-toy"].kwargs, head_dim=None)
    rows["lab-toy model"] = (build_preset("lab-toy").num_parameters(), Transformer(**toy).num_parameters(), None)
    n["head_width"] = {k: {"key_dim_embedding_dim": a, "per_head": b,
                           **({"seed003_d_k_64": c} if c is not None else {})} for k, (a, b, c) in rows.items()}
    return (heading("6. key_dim = embedding_dim: full-width heads")
            + para("Keras's key_dim is the width of one head. attnlab's head_dim is the same thing, default d / heads.",
                   "Parameters of one attention block (its four projections with biases), or of the whole model:")
            + table(["parameters of", "head_dim = d (seed 000)", "head_dim = d / heads (the paper)",
                     "d_k = 64 over all heads (seed 003)"],
                    [(k, f"{a:,}", f"{b:,}", f"{c:,}" if c is not None else "") for k, (a, b, c) in rows.items()])
            + para("Full-width heads multiply the attention parameters by about the number of heads, and seed 003's",
                   "64 in all divides them by about as much (the output projection's bias, d wide, does not change):",
                   '<a href="#parameters">parameter summaries</a>.'))


def _multiply(n: dict) -> str:
    scores = np.array([-1.0, -2.0, 3.0])  # key 2 hidden; the real scores happen to be negative
    keep = np.array([1.0, 1.0, 0.0])
    multiplied, added = _softmax(scores * keep), _softmax(scores + (1 - keep) * -1e9)
    after = _softmax(scores) * keep  # masked after the softmax: the right zeros, but the rest no longer sums to 1
    core = masked_softmax(torch.tensor(scores), attend_mask=torch.tensor(keep, dtype=torch.bool))
    n["multiply"] = {"multiplied": multiplied.tolist(), "added": added.tolist(), "core": core.tolist(),
                     "after_softmax": after.tolist(), "after_softmax_sum": float(after.sum())}
    return (heading("7. Multiplying the scores by the mask")
            + code(f"scores {scores.tolist()}, key 2 hidden\nscores * mask           -> "
                   f"{np.round(multiplied, 4).tolist()}\nscores + (1-mask)*-1e9  -> {np.round(added, 4).tolist()}\n"
                   f"softmax(scores) * mask  -> {np.round(after, 4).tolist()}, sum {after.sum():.4f}")
            + check(multiplied[2] > 0 and float(core[2]) == 0.0,
                    f"multiplied, the hidden key keeps e^0 and the largest weight, {multiplied[2]:.4f}; added, 0")
            + check(after.sum() < 1,
                    f"multiplied after the softmax, the hidden key gets 0 but the weights sum to {after.sum():.4f}: "
                    "the context shrinks, by as much as the hidden keys would have taken")
            + para("Caught by <code>causal</code> (decoders) and <code>padding-content</code> (encoders);",
                   "a dropped look-ahead mask also shows in <code>attnlab experiment leak</code>."))


def _questions(n: dict, model: Transformer) -> str:
    d = SEED_WIDTH  # the seed's encoding width, whatever the page's word vectors are
    pe0 = sinusoidal_encoding(1, d)[0]
    rng = np.random.default_rng(SEED)
    e, p = rng.uniform(-0.05, 0.05, d), sinusoidal_encoding(3, d)[2].double().numpy()  # Keras-sized embedding
    up, down = math.sqrt(d) * e + p, e + p / math.sqrt(d)
    torch.manual_seed(SEED)
    mha, x = MultiHeadAttention(4, 2).eval(), torch.randn(1, 4, 4)
    with torch.no_grad():
        weights = mha(x, need_weights=True)[1]  # (1, heads, 4, 4), no look-ahead mask
        future = float(torch.triu(weights, 1).sum() / weights.sum())  # share of all weight on later positions
        memory, _ = model.encode(torch.tensor(SOURCE))
    pad_norm = float(memory[0, 4].norm())
    n["questions"] = {"pe0_first8": pe0[:8].tolist(), "pe0_norm": float(pe0.norm()),
                      "scale_ratio": float(np.linalg.norm(up) / np.linalg.norm(down)),
                      "embedding_to_encoding_norm": float(np.linalg.norm(e) * math.sqrt(d) / np.linalg.norm(p)),
                      "sum_norms": {"embedding_scaled_up": float(np.linalg.norm(up)),
                                    "encoding_scaled_down": float(np.linalg.norm(down))},
                      "unmasked_future_weight": future, "padded_output_norm": pad_norm}
    qa = [
        ("What is position 0's encoding, given that its angles are all 0?",
         f"Sine and cosine of 0 alternate: {np.round(pe0[:8].numpy(), 1).tolist()}..., norm {float(pe0.norm()):.4f} ="
         f" sqrt(d/2) for d = {d}. It is not zero, so the first token is shifted like every other one."),
        ("Why add a large negative number to hidden scores instead of multiplying them by the mask?",
         f"A zero score still counts e^0 = 1: silent bug 7 above gave the hidden key {n['multiply']['multiplied'][2]:.4f}. "
         f"Multiplied after the softmax, the weights left sum to {n['multiply']['after_softmax_sum']:.4f}, not 1, so "
         "the context vector shrinks by an amount that depends on how much is padding. Added before the softmax, "
         "-1e9 underflows to 0 and the real keys share the whole weight."),
        ("Why is the cross-attention padding mask built from the source?",
         "Its keys and values come from the source. Built from the target, silent bug 2's mask hid a real source token"
         f" (weight {n['cross_mask']['cross_weight_on_source_token_3']['source']:.4f} -> 0) and moved the logits by "
         f"{n['cross_mask']['logit_max_difference']:.4f}."),
        ("A Keras 3 port passes the look-ahead mask by position; training loss falls. What happened?",
         f"The mask was dropped, so the decoder reads the future: unmasked, {future:.0%} of a 4-token self-attention's "
         "weight lies above the diagonal. Validation leaks too; the causal check and generation (attnlab experiment leak) expose it."),
        ("Why scale the embedding by sqrt(d) rather than divide the encoding by sqrt(d)?",
         f"The two terms keep the same ratio (for a Keras-sized embedding, entries near +-0.05, its term is "
         f"{n['questions']['embedding_to_encoding_norm']:.2f} times the encoding's norm either way), but the sums "
         f"differ in scale: norms {n['questions']['sum_norms']['embedding_scaled_up']:.2f} against "
         f"{n['questions']['sum_norms']['encoding_scaled_down']:.3f}, a factor sqrt(d) = {math.sqrt(d):g} by "
         "construction. Scaling up gives inputs of the size the layers expect, near the encoding's own norm "
         f"sqrt(d/2) = {math.sqrt(d / 2):.2f}; scaling down leaves them far below it where dropout and the first "
         "residual act. Beyond that it is a convention tied to the initialisation scale: both forms train."),
        ("The encoder still outputs a vector at a padded position. Is that a bug?",
         f"No: lab-toy's output at source position 4 (padding) has norm {pad_norm:.4f}; the cross-attention mask "
         f"gives it weight {n['cross_mask']['cross_weight_on_source_padding']['source']}, and losses must skip it."),
    ]
    return heading("The review questions") + para(
        f"Where an answer uses the encoding it is computed at the seed's width, d = {d}, whatever the page's",
        "word vectors are.") + "".join(
        f"<p><b>{i}. {esc(q)}</b><br>{esc(a)}</p>\n" for i, (q, a) in enumerate(qa, 1))


def bugs_section() -> Section:
    """Section 10: seven silent bugs (wrong form, effect, what attnlab does) and the six review questions."""
    torch.manual_seed(SEED)
    model = build_preset("lab-toy").eval()
    n: dict = {}
    body = para("Each of these runs without an error in the seed's stack. The effects are computed below.")
    body += _positional_mask(n) + _cross_mask(n, model) + _broadcast(n) + _rank(n)
    body += _training_flag(n, model) + _head_width(n) + _multiply(n) + _questions(n, model)
    paper = n["head_width"][f"d {D_MODEL}, {HEADS} heads"]
    highlights = [
        ("(3,5) scores + (3,1,5) mask", f"{tuple(n['broadcast']['shape'])}, diagonal rows "
                                         + ("correct" if n["broadcast"]["diagonal_rows_correct"] else "wrong too")),
        ("hidden key weight, multiplied / added", f"{n['multiply']['multiplied'][2]:.4f} / {n['multiply']['added'][2]}"),
        ("attention parameters at d 512, 8 heads: Keras key_dim=d / paper",
         f"{paper['key_dim_embedding_dim']:,} / {paper['per_head']:,}"),
    ]
    return Section("bugs", "Silent bugs of the port, and the review questions", n, body, highlights)
