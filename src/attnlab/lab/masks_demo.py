"""Section 4: the padding mask and the look-ahead mask, on a softmax and on one attention call.

Seed 000's examples, run through the core: :func:`~attnlab.nn.padding_mask`, :func:`~attnlab.nn.causal_mask`,
:func:`~attnlab.nn.from_keep_mask` (the seed's float "1 = keep" masks), :func:`~attnlab.nn.masked_softmax`
and :func:`~attnlab.nn.attention_reference`. Scores get an explicit query axis, so a (3, 1, 1, 5) mask
meets (3, 1, 1, 5) scores (the seed's change 9: without it the shapes broadcast to nonsense).
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.lab.html import Section, check, code, heading, matrix, para, table
from attnlab.nn import (
    attention_reference,
    causal_mask,
    decoder_self_mask,
    from_hide_mask,
    from_keep_mask,
    masked_softmax,
    padding_mask,
)

#: Seed 000's three sequences with zeros (padding) in different places.
PADDED = [[7, 6, 0, 0, 1], [1, 2, 3, 0, 0], [0, 0, 0, 4, 5]]
#: Seed 000's attention example: one query, three keys, values [0,0], [1,0], [1,0].
Q = [[1.0, 0.0, 1.0, 0.0]]
K = [[1.0, 2.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]]
V = [[0.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
KEEP = [[1.0, 1.0, 0.0]]  # the seed's float mask hiding the last key
SEED003_IDS = [1, 2, 3, 4, 0, 0, 0]  # seed 003's padding_mask example
SEED003_DECODER_IDS = [5, 6, 7, 0, 0]  # a 5-token decoder input for its maximum(padding, look-ahead) mask


def _round(t: torch.Tensor, digits: int = 4) -> list:
    """Nested lists of Python floats rounded for display (float32 values would print 17 digits)."""
    return np.round(t.double().numpy(), digits).tolist()


def _seed003_masks() -> tuple[dict, str]:
    """Seed 003's masks (float, 1 = hide) against the core's: the same cells, the opposite values."""
    ids = np.array(SEED003_IDS)
    seed_padding = (ids == 0).astype(np.float32)  # its padding_mask: 1 where the id is 0
    ours = padding_mask(torch.tensor([SEED003_IDS]))[0, 0, 0]  # (7,) bool, True = may attend
    dec = np.array(SEED003_DECODER_IDS)
    look_ahead = 1.0 - np.tril(np.ones((len(dec), len(dec)), dtype=np.float32))  # its lookahead_mask(5)
    combined = np.maximum((dec == 0).astype(np.float32)[None, :], look_ahead)  # maximum(padding, look-ahead)
    decoder = decoder_self_mask(torch.tensor([SEED003_DECODER_IDS]))[0, 0]  # (5, 5) bool
    padding_same = bool(torch.equal(from_hide_mask(torch.tensor(seed_padding)), ours))
    look_ahead_same = bool(torch.equal(from_hide_mask(torch.tensor(look_ahead)), causal_mask(len(dec))[0, 0]))
    decoder_same = bool(torch.equal(from_hide_mask(torch.tensor(combined)), decoder))
    numbers = {"padding_mask": seed_padding.tolist(), "look_ahead": look_ahead.tolist(),
               "decoder_mask": combined.tolist(), "padding_agrees": padding_same,
               "look_ahead_agrees": look_ahead_same, "decoder_agrees": decoder_same}
    labels = {"row_labels": [f"q {i}" for i in range(len(dec))], "col_labels": [f"k {j}" for j in range(len(dec))]}
    return numbers, (heading("Seed 003's masks: 1 = hide")
            + para("Seed 003 writes its masks the other way round, as floats with 1 on the cells to hide:",
                   f"<code>padding_mask({SEED003_IDS})</code> is <code>{seed_padding.astype(int).tolist()}</code>",
                   "where attnlab's is <code>" + str(ours.int().tolist()) + "</code> (1 = may attend), and its",
                   "<code>lookahead_mask(5)</code> has 1 above the diagonal, where <code>causal_mask(5)</code> has 0.",
                   "Its decoder mask is the element-wise maximum of the two, hiding a cell when either mask hides",
                   "it; attnlab's <code>decoder_self_mask</code> is the logical <i>and</i> of the two attend masks,",
                   "the same thing said the other way.")
            + matrix(look_ahead.astype(int), **labels, caption="seed 003: lookahead_mask(5), 1 = hidden",
                     css="matrix mask")
            + para(f"Its decoder mask for the decoder input {SEED003_DECODER_IDS}, whose last two ids are padding:")
            + matrix(combined.astype(int), **labels,
                     caption="seed 003: maximum(padding_mask, lookahead_mask), 1 = hidden", css="matrix mask")
            + check(padding_same and look_ahead_same and decoder_same,
                    "from_hide_mask turns the seed's three masks into attnlab's padding_mask, causal_mask and "
                    "decoder_self_mask, cell for cell"))


#: Key widths for the scaling experiment, up to seed 003's 512; queries drawn per width, keys per query.
SCALING_WIDTHS = (4, 16, 64, 256, 512)
SCALING_QUERIES, SCALING_KEYS = 2000, 16


def _scaling() -> tuple[dict, str]:
    """Why the scores are divided by sqrt(d_k): their variance and the softmax's largest weight, with and without.

    Queries and keys have independent entries of mean 0 and variance 1 (seed 000's argument). Undoing the
    division (queries multiplied by sqrt(d_k) before :func:`attention_reference` divides) gives the raw scores.
    """
    gen = torch.Generator().manual_seed(0)
    rows = {}
    for d_k in SCALING_WIDTHS:
        q = torch.randn(SCALING_QUERIES, 1, d_k, generator=gen, dtype=torch.float64)  # one query per row
        k = torch.randn(SCALING_QUERIES, SCALING_KEYS, d_k, generator=gen, dtype=torch.float64)
        v = torch.zeros(SCALING_QUERIES, SCALING_KEYS, 1, dtype=torch.float64)  # only the weights matter
        entry = {}
        for key, factor in (("scaled", 1.0), ("raw", d_k ** 0.5)):
            _, w = attention_reference(q * factor, k, v)  # (queries, 1, keys)
            scores = (q * factor) @ k.transpose(-2, -1) / d_k ** 0.5
            entry[key] = {"score_variance": float(scores.var()), "mean_largest_weight": float(w.amax(-1).mean()),
                          "saturated_share": float((w.amax(-1) > 0.99).double().mean())}
        rows[str(d_k)] = entry
    numbers = {"queries": SCALING_QUERIES, "keys": SCALING_KEYS, "by_width": rows}
    uniform = 1 / SCALING_KEYS
    steady = all(0.85 < r["scaled"]["score_variance"] < 1.15 for r in rows.values())
    tracks = all(0.85 < r["raw"]["score_variance"] / int(d) < 1.15 for d, r in rows.items())
    widest = rows[str(SCALING_WIDTHS[-1])]
    return numbers, (
        heading("Why divide by sqrt(d_k)")
        + para("A dot product of two vectors whose entries are independent, of mean 0 and variance 1, is a sum of d<sub>k</sub>",
               "such products: its variance is d<sub>k</sub>. Measured on", f"{SCALING_QUERIES:,} random queries, each",
               f"against {SCALING_KEYS} random keys (uniform attention would give each key {uniform:g}):")
        + table(["d_k", "score variance, raw", "divided by sqrt(d_k)", "mean largest weight, raw",
                 "divided", "rows with one weight > 0.99, raw", "divided"],
                [(d, f"{r['raw']['score_variance']:.1f}", f"{r['scaled']['score_variance']:.3f}",
                  f"{r['raw']['mean_largest_weight']:.3f}", f"{r['scaled']['mean_largest_weight']:.3f}",
                  f"{r['raw']['saturated_share']:.1%}", f"{r['scaled']['saturated_share']:.1%}")
                 for d, r in rows.items()])
        + check(tracks and steady, "the raw scores' variance is d_k (within 15%); divided by sqrt(d_k) it "
                                   "stays near 1 at every width")
        + check(widest["raw"]["saturated_share"] > 0.5 > widest["scaled"]["saturated_share"],
                f"at d_k = {SCALING_WIDTHS[-1]} the raw softmax puts more than 0.99 of the weight on one key in "
                f"{widest['raw']['saturated_share']:.0%} of the rows (a saturated softmax, whose gradient almost "
                f"vanishes); divided, in {widest['scaled']['saturated_share']:.0%}"))


def masks_section() -> Section:
    """Section 4: padding mask and softmax, look-ahead mask, attention with and without a mask."""
    ids = torch.tensor(PADDED)  # (3, 5)
    mask = padding_mask(ids)  # (3, 1, 1, 5) bool, True on real tokens
    # The seed writes the same mask as floats, 1 = keep; the converter must agree with padding_mask.
    seed_style = 1.0 - (ids == 0).float()
    agrees = bool(torch.equal(from_keep_mask(seed_style)[:, None, None, :], mask))
    scores = ids.float()[:, None, None, :]  # (3, 1, 1, 5): one query position per sequence
    plain = masked_softmax(scores)[:, 0, 0]  # (3, 5)
    masked = masked_softmax(scores, attend_mask=mask)[:, 0, 0]
    pad_weight = float((masked * (~mask[:, 0, 0]).float()).sum())
    rows_ok = bool(torch.allclose(masked.sum(-1), torch.ones(3), atol=1e-6))

    look_ahead = causal_mask(4)  # (1, 1, 4, 4)

    q, k, v = torch.tensor(Q), torch.tensor(K), torch.tensor(V)
    out, w = attention_reference(q, k, v)  # (1, 2), (1, 3)
    keep = from_keep_mask(torch.tensor(KEEP))  # (1, 3) bool, the same rank as the (1, 3) scores
    out_m, w_m = attention_reference(q, k, v, attend_mask=keep)

    labels = [f"seq {i}" for i in range(3)]
    body = heading("Padding mask")
    body += para("A mask in attnlab is boolean, <b>True = may attend</b>. Every id 0 is padding and is hidden:")
    body += code(f"ids {tuple(ids.shape)} -> padding_mask(ids) {tuple(mask.shape)} {mask.dtype}")
    body += para("The four axes are those of the attention scores, (batch, heads, queries, keys). A padding mask",
                 "describes the <i>keys</i>, the sequence that supplies K and V, so it varies only on the batch and",
                 "key axes; its two axes of size 1 let one row of it broadcast over every head and every query.",
                 "Having the scores' rank is what keeps it from broadcasting the wrong way",
                 '(<a href="#bugs">the silent bugs</a>, bug 3).')
    body += para("Conventions differ between the seeds and libraries, which is how masks end up inverted: seed",
                 "003, and torch's <code>nn.MultiheadAttention</code> and <code>nn.Transformer*</code> modules in",
                 "their <code>key_padding_mask</code> and bool <code>attn_mask</code>, say True (1) = hide; seed 000",
                 "and Hugging Face's <code>attention_mask</code> say 1 = keep, and so does torch's own function",
                 "<code>F.scaled_dot_product_attention</code>, whose bool <code>attn_mask</code> is True = attend",
                 "(the opposite of the modules built on it). attnlab's masks are True = may attend; it converts at the",
                 "boundary (<code>from_hide_mask</code>, <code>from_key_padding_mask</code>,",
                 "<code>from_hf_attention_mask</code>, <code>from_keep_mask</code>) and refuses a mask that is not",
                 "bool. Hidden scores are set to -inf (the seed adds -1e9; while a row keeps one key visible, both",
                 "give a hidden key a weight of exactly 0 in float32). They part on a row whose keys are <i>all</i>",
                 "hidden: -1e9 spreads its weight evenly over the hidden keys, reading padding without a sign, and",
                 "-inf gives 0/0 = NaN. attnlab gives such a row zero weight and zero output, so an inverted mask",
                 "shows up as wrong numbers, not NaN (seed 004's symptom); <code>attnlab check</code>'s padding",
                 "checks catch it.")
    body += matrix(mask[:, 0, 0].int().numpy(), row_labels=labels, col_labels=[f"key {j}" for j in range(5)],
                   caption="padding_mask, shown as 1 = attend, 0 = hidden", css="matrix mask")
    body += check(agrees, "from_keep_mask on the seed's float mask (1 = keep) gives the same mask")
    body += para("The ids themselves serve as scores. Without the mask the padding keeps a share of the weight;",
                 "with it, padding gets exactly 0 and the real keys share the whole distribution.")
    keys = [f"key {j}" for j in range(plain.shape[-1])]
    body += matrix(plain.numpy(), row_labels=labels, col_labels=keys, caption="softmax without the mask")
    body += matrix(masked.numpy(), row_labels=labels, col_labels=keys, caption="masked_softmax with the padding mask")
    body += check(pad_weight == 0.0 and rows_ok, f"weight on padding with the mask: {pad_weight}; every row sums to 1")
    body += heading("Look-ahead mask")
    body += para("causal_mask(4): row t may attend to keys 0..t. The first token sees only itself, the last sees all.")
    body += matrix(look_ahead[0, 0].int().numpy(), row_labels=[f"q {i}" for i in range(4)],
                   col_labels=[f"k {j}" for j in range(4)], caption="causal_mask(4), 1 = attend", css="matrix mask")
    seed003, seed003_body = _seed003_masks()
    body += seed003_body
    body += heading("Scaled dot-product attention")
    body += para("softmax(QK<sup>T</sup> / sqrt(d<sub>k</sub>)) V for one query and three keys, with values",
                 "[0, 0], [1, 0], [1, 0]: the output's first number is the weight on keys 1 and 2.")
    body += code(
        f"weights: {_round(w)}  sum = {float(w.sum()):.6f}\n"
        f"output:  {_round(out)}\n"
        f"with the last key hidden (attend_mask {keep.int().tolist()}, shape {tuple(keep.shape)}):\n"
        f"weights: {_round(w_m)}  sum = {float(w_m.sum()):.6f}\n"
        f"output:  {_round(out_m)}"
    )
    body += check(float(w_m[0, 2]) == 0.0, "the hidden key gets weight 0 and the other two renormalise")
    scaling, scaling_body = _scaling()
    body += scaling_body

    numbers = {
        "seed003": seed003,
        "scaling": scaling,
        "padding_mask": mask[:, 0, 0].int().tolist(),
        "from_keep_mask_agrees": agrees,
        "softmax_plain": plain.tolist(),
        "softmax_masked": masked.tolist(),
        "weight_on_padding": pad_weight,
        "look_ahead_mask": look_ahead[0, 0].int().tolist(),
        "attention": {"weights": w.tolist(), "output": out.tolist(),
                      "masked_weights": w_m.tolist(), "masked_output": out_m.tolist()},
    }
    highlights = [("attention weights, unmasked / masked", f"{_round(w[0])} / {_round(w_m[0])}")]
    return Section("masks", "Masks", numbers, body, highlights)
