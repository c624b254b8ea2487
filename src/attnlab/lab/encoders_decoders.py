"""Section 9: seed 004's encoders and decoders: the causal mask on one head, who reads what, the padding
mask turned the wrong way, and what each kind of position allows.

* Seed 004's causal mask on one ``nn.MultiheadAttention`` head (``torch.manual_seed(0)``, six random
  8-vectors) is recomputed with torch itself, which reproduces the seed's printed weights, and then with
  attnlab's :class:`~attnlab.nn.MultiHeadAttention` holding the same weights, its mask converted at the
  boundary (:func:`~attnlab.nn.from_torch_attn_mask`): the weights agree to float32 rounding. The
  hidden cells are counted against n (n - 1) / 2.
* Who reads what: the last token is changed and each position's output compared, with no mask (an
  encoder) and with the causal mask (a decoder): only the decoder's earlier positions stay exactly put.
* Seed 004's "common mistake": a padding mask written as the tokens to *keep* and passed where torch
  expects the tokens to hide. A router of seed 004's shape built from ``nn.TransformerEncoder`` gives NaN
  scores for every ticket without padding, as the seed reports; attnlab's core gives no NaN (a row with
  every key hidden gets zero weight) but wrong scores, which the seed's own test, a ticket alone against
  the same ticket padded, catches.
* Positions: a learned table has a last row; the sinusoidal encoding has no parameters; with rotary
  positions a query-key score depends only on the distance between the two tokens, measured here.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.lab.html import Section, check, code, esc, heading, matrix, para, table
from attnlab.nn import (
    EncoderClassifier,
    LearnedPositions,
    MultiHeadAttention,
    RotaryEmbedding,
    causal_mask,
    from_torch_attn_mask,
    padding_mask,
    sinusoidal_encoding,
)
from attnlab.presets import MODEL_PRESETS

TOKENS = ["my", "parcel", "arrived", "broken", ",", "please"]  # seed 004's six-token example
#: Seed 004's printed causal weights of one head (torch.manual_seed(0), rounded to 2 decimals).
SEED_CAUSAL_WEIGHTS = [[1.0, 0, 0, 0, 0, 0], [0.6, 0.4, 0, 0, 0, 0], [0.38, 0.2, 0.42, 0, 0, 0],
                       [0.29, 0.23, 0.22, 0.26, 0, 0], [0.22, 0.17, 0.21, 0.18, 0.22, 0],
                       [0.12, 0.16, 0.26, 0.15, 0.15, 0.16]]
ROUTER = MODEL_PRESETS["tiny-router"].kwargs  # the router's shape, torch's copy built to the same numbers
PAD = 0
#: Ticket lengths of the synthetic batch: four use all 120 positions (no padding), as seed 004's T-64707 does.
LENGTHS = [120, 13, 57, 120, 31, 88, 120, 5, 64, 120, 22, 101]
SHORT = 7  # index of the 5-token ticket used for "alone against padded"


def _seed_head() -> tuple[nn.MultiheadAttention, torch.Tensor, torch.Tensor]:
    """Seed 004's code: its causal mask, six random 8-vectors and one torch head, in the seed's order."""
    causal = nn.Transformer.generate_square_subsequent_mask(len(TOKENS))  # (6, 6), 0 / -inf
    torch.manual_seed(0)
    x = torch.randn(1, len(TOKENS), 8)
    head = nn.MultiheadAttention(8, 1, batch_first=True)
    return head, x, causal


def _causal(n: dict) -> str:
    head, x, causal = _seed_head()
    mha = MultiHeadAttention.from_torch(head).eval()
    attend = from_torch_attn_mask(causal)  # 0 -> may attend, -inf -> hidden; (1, 1, 6, 6) bool
    with torch.no_grad():
        torch_w = head(x, x, x, attn_mask=causal)[1][0]  # (6, 6), averaged over its one head
        ours = mha(x, attend_mask=attend, need_weights=True)[1][0, 0]
    seed_match = bool(torch.allclose(torch_w, torch.tensor(SEED_CAUSAL_WEIGHTS), atol=0.005))
    agree = float((torch_w - ours).abs().max())
    counts = {t: int((~causal_mask(t)).sum()) for t in range(1, 9)}
    n["causal_head"] = {"torch_weights": torch_w.tolist(), "attnlab_weights": ours.tolist(),
                        "matches_seed": seed_match, "max_difference": agree,
                        "hidden_cells": counts, "above_diagonal": float(torch.triu(ours, 1).sum())}
    rows_ok = bool(torch.allclose(ours.sum(-1), torch.ones(len(TOKENS)), atol=1e-6))
    return (heading("The causal mask on one head")
            + para("Seed 004 builds the mask with <code>nn.Transformer.generate_square_subsequent_mask(6)</code> (0 =",
                   "may read, -inf = hidden) and runs one <code>nn.MultiheadAttention(8, 1)</code> head on six random",
                   "8-vectors after <code>torch.manual_seed(0)</code>. Run here, torch gives the seed's table; attnlab's",
                   "attention with the same weights, the mask converted by <code>from_torch_attn_mask</code>, gives the",
                   "same weights. The mask, as torch prints it:")
            + code(_torch_mask_text(causal))
            + matrix(ours.numpy(), 2, row_labels=TOKENS, col_labels=TOKENS,
                     caption="attnlab, one head: rows read, columns are read")
            + check(seed_match, "torch's weights equal the seed's printed table (to its 2 decimals)")
            + check(agree < 1e-6 and rows_ok,
                    f"attnlab's weights equal torch's (largest difference {agree:.1e}); every row sums to 1")
            + para("The mask hides the triangle above the diagonal, n (n - 1) / 2 cells of an n &times; n table:")
            + table(["tokens n", *map(str, counts)], [["hidden cells", *map(str, counts.values())],
                                                      ["n (n - 1) / 2", *(str(t * (t - 1) // 2) for t in counts)]])
            + check(all(c == t * (t - 1) // 2 for t, c in counts.items()),
                    f"{counts[6]} of 36 hidden for six tokens, {counts[4]} of 16 for four, as the seed counts"))


def _torch_mask_text(mask: torch.Tensor) -> str:
    """A float 0 / -inf mask, one row a line: ``0`` where a query may read, ``-inf`` where it may not."""
    return "\n".join(" ".join(f"{'0' if v == 0 else '-inf':>4}" for v in row.tolist()) for row in mask)


def _who_reads_what(n: dict) -> str:
    head, x, _ = _seed_head()
    mha = MultiHeadAttention.from_torch(head).eval()
    changed = x.clone()
    changed[0, -1] = torch.randn(8, generator=torch.Generator().manual_seed(1))  # another last token
    change = {}
    with torch.no_grad():
        for kind, mask in (("encoder", None), ("decoder", causal_mask(len(TOKENS)))):
            before, after = mha(x, attend_mask=mask)[0], mha(changed, attend_mask=mask)[0]
            change[kind] = (before - after).abs().amax(-1)[0].tolist()  # (6,): per position
    n["who_reads_what"] = change
    earlier_still = all(v == 0.0 for v in change["decoder"][:-1])
    return (heading("Who reads what")
            + para("The same head reads the six tokens twice, the second time with another vector for the last",
                   "token, <i>please</i>. The largest change of each position's output:")
            + table(["position", *TOKENS],
                    [["no mask (encoder)", *(f"{v:.4f}" for v in change["encoder"])],
                     ["causal mask (decoder)", *(f"{v:.4f}" for v in change["decoder"])]])
            + check(earlier_still and min(change["encoder"]) > 0,
                    "with the causal mask the earlier outputs are exactly unchanged; without it every output moves")
            + para("That is the whole difference between the two kinds of model:")
            + table(["", "Encoder (BERT-like)", "Decoder (GPT-like)"], [
                ("each token reads", "every token, before and after", "itself and the tokens before it"),
                ("masks", "padding", "causal, and padding in padded batches"),
                ("good for", "reading: classify, search, tag", "writing: continue a text, answer, translate"),
                ("seed 004's example", "the ticket router", "the reply writer"),
                ("in attnlab", "EncoderClassifier (attnlab train classify)", "DecoderLM (attnlab train lm)"),
                ("checked by", "attnlab check --kind encoder", "attnlab check --kind decoder"),
            ], css="facts words")
            + para("The router reads a finished ticket, where a \"not\" at the end may change what \"delivery\" at the",
                   "start means, so it is an encoder. A reply is written one token at a time and the next token does",
                   "not exist yet, so the writer is a decoder."))


class _TorchRouter(nn.Module):
    """Seed 004's TinyTransformer shape on torch's own encoder: the mask is passed as torch expects it."""

    def __init__(self) -> None:
        super().__init__()
        d = ROUTER["d_model"]
        self.embed = nn.Embedding(ROUTER["vocab_size"], d)
        self.position = nn.Embedding(ROUTER["max_positions"], d)
        layer = nn.TransformerEncoderLayer(d, ROUTER["num_heads"], ROUTER["d_ff"], batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, ROUTER["num_layers"], enable_nested_tensor=False)
        self.norm, self.out = nn.LayerNorm(d), nn.Linear(d, ROUTER["num_classes"])

    def forward(self, ids: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
        h = self.blocks(h, src_key_padding_mask=key_padding_mask)
        keep = (ids != PAD).unsqueeze(-1).float()  # the average skips padding whatever the mask says
        return self.out((self.norm(h) * keep).sum(1) / keep.sum(1))


def _attnlab_scores(model: EncoderClassifier, ids: torch.Tensor, attend: torch.Tensor | None) -> torch.Tensor:
    """The classifier's scores with ``attend`` (True = may attend; None: no mask) in place of the one it builds."""
    states, _ = model.encoder(ids, attend_mask=attend)
    keep = (ids != PAD).unsqueeze(-1).float()
    return model.out((model.norm(states) * keep).sum(1) / keep.sum(1))


def _inverted(n: dict) -> str:
    gen = torch.Generator().manual_seed(4)
    ids = torch.zeros(len(LENGTHS), ROUTER["max_positions"], dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = torch.randint(1, ROUTER["vocab_size"], (length,), generator=gen)
    alone = ids[SHORT : SHORT + 1, : LENGTHS[SHORT]]
    torch.manual_seed(0)
    torch_router = _TorchRouter().eval()
    torch.manual_seed(0)
    ours = EncoderClassifier(**ROUTER).eval()
    with torch.no_grad():  # as the seed runs it: eval mode, no gradients
        torch_right = torch_router(ids, ids == PAD)  # True = hide: the padding
        torch_wrong = torch_router(ids, ids != PAD)  # the mistake: True on the real tokens
        right = _attnlab_scores(ours, ids, padding_mask(ids))
        wrong = _attnlab_scores(ours, ids, ~padding_mask(ids))  # the same mistake in attnlab's convention
        alone_right = _attnlab_scores(ours, alone, padding_mask(alone))
        alone_wrong = _attnlab_scores(ours, alone, ~padding_mask(alone))
        unmasked = _attnlab_scores(ours, ids, None)  # seed 004's other mistake: no padding mask at all
    full = sum(length == ROUTER["max_positions"] for length in LENGTHS)
    pair = tuple((ids[:2] == PAD).shape)  # seed 004's question: the mask of 2 tickets of 120 tokens
    nan_rows = torch.isnan(torch_wrong).any(1)  # (tickets,)
    nan_torch = int(nan_rows.sum())
    only_full = nan_rows.tolist() == [length == ROUTER["max_positions"] for length in LENGTHS]
    nan_ours = int(torch.isnan(wrong).any(1).sum())
    right_gap = float((alone_right - right[SHORT]).abs().max())
    wrong_gap = float((alone_wrong - wrong[SHORT]).abs().max())
    unmasked_gap = float((alone_right - unmasked[SHORT]).abs().max())
    moved = float((wrong - right).abs().max())
    n["inverted_padding_mask"] = {
        "tickets": len(LENGTHS), "without_padding": full, "torch_nan_tickets": nan_torch,
        "torch_nan_exactly_the_unpadded": only_full,
        "torch_right_nan_tickets": int(torch.isnan(torch_right).any(1).sum()), "attnlab_nan_tickets": nan_ours,
        "attnlab_largest_score_change": moved, "alone_vs_padded_right": right_gap, "alone_vs_padded_wrong": wrong_gap,
        "alone_vs_padded_without_mask": unmasked_gap, "key_padding_mask_shape_two_tickets": list(pair),
    }
    return (heading("A padding mask turned the wrong way")
            + para("Seed 004's mistake: the mask written as the tokens to keep, <code>ids != PAD</code>, passed as",
                   "torch's <code>src_key_padding_mask</code>, where True means hide. Below, two untrained routers of",
                   f"the seed's shape ({ROUTER['d_model']} wide, {ROUTER['num_heads']} heads, {ROUTER['max_positions']}",
                   f"positions, {ROUTER['num_classes']} teams; {ROUTER['num_layers']} layers, feed-forward width",
                   f"{ROUTER['d_ff']} and {ROUTER['vocab_size']:,} token ids are attnlab's choice, which the seed does",
                   "not give), one on torch's",
                   f"<code>nn.TransformerEncoder</code> and one on attnlab's core, read {len(LENGTHS)} synthetic",
                   f"tickets, {full} of them {ROUTER['max_positions']} tokens long and so without any padding.",
                   "The mask holds one value per token of each ticket: for a batch of 2 tickets of",
                   f"{ROUTER['max_positions']} tokens its shape is {pair}, (batch, tokens), with no head or query",
                   "axis (torch broadcasts it over both).")
            + code(f"torch nn.TransformerEncoder, mask ids == PAD: tickets with nan scores: "
                   f"{n['inverted_padding_mask']['torch_right_nan_tickets']}\n"
                   f"torch nn.TransformerEncoder, mask ids != PAD: tickets with nan scores: {nan_torch}\n"
                   f"attnlab, the same mistake (~padding_mask(ids)): tickets with nan scores: {nan_ours}; "
                   f"scores moved by up to {moved:.3f}\n"
                   f"attnlab, a {LENGTHS[SHORT]}-token ticket alone vs padded to {ROUTER['max_positions']}: right mask {right_gap:.1e}, "
                   f"inverted mask {wrong_gap:.3f}, no mask {unmasked_gap:.3f}")
            + check(only_full, f"in torch the {full} tickets without padding, and only they, get nan: every key "
                                       "is hidden, softmax divides 0 by 0 (the seed's symptom, 23 of its tickets)")
            + check(nan_ours == 0 and moved > 0,
                    "attnlab gives a row with every key hidden zero weight instead: no nan, but wrong scores")
            + check(right_gap < 1e-5 < min(wrong_gap, unmasked_gap),
                    "the seed's test, one ticket alone against the same ticket padded, separates the right mask from "
                    "the inverted one and from none at all (padded without a mask, the answer changes)")
            + para("No nan means nothing stops the run, which is why the comparison matters more than the symptom;",
                   "<code>attnlab check --kind encoder</code> makes it (<code>padding-invariance</code>,",
                   "<code>padding-content</code>) on any model. attnlab's own masks say True = may attend and are",
                   "converted at the boundary (<code>from_key_padding_mask</code>), so the two conventions never meet."))


def _positions(n: dict) -> str:
    learned = LearnedPositions(ROUTER["max_positions"], ROUTER["d_model"])
    try:
        learned(1, offset=ROUTER["max_positions"])
        refusal = ""
    except AttnlabError as err:
        refusal = str(err)
    # A query and a key, each 8 wide, placed at positions (m, m - 3) for several m.
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    rotary = RotaryEmbedding(8, 64)
    table_ = sinusoidal_encoding(64, 8)

    def rotary_score(m: int, j: int) -> float:
        return float(rotary(q.view(1, 1, 1, 8), m)[0, 0, 0] @ rotary(k.view(1, 1, 1, 8), j)[0, 0, 0])

    def added_score(m: int, j: int) -> float:
        return float((q + table_[m]) @ (k + table_[j]))

    starts = [3, 10, 30, 60]
    rot = [rotary_score(m, m - 3) for m in starts]
    add = [added_score(m, m - 3) for m in starts]
    n["positions"] = {"learned_table_numbers": learned.table.weight.numel(), "learned_refusal": refusal,
                      "rotary_scores_gap3": rot, "sinusoidal_added_scores_gap3": add,
                      "rotary_spread": max(rot) - min(rot), "sinusoidal_spread": max(add) - min(add)}
    return (heading("Positions and length")
            + para(f"The router's learned table is ({ROUTER['max_positions']}, {ROUTER['d_model']}):",
                   f"{learned.table.weight.numel():,} trainable numbers, and nothing past its last row. Asked for",
                   f"position {ROUTER['max_positions']}, attnlab says: <i>{esc(refusal)}</i>.")
            + para("The sinusoidal encoding has no parameters and any length. Rotary positions turn the query and",
                   "the key instead of adding a vector, so their score depends only on how far apart they are. One",
                   "query and one key, three positions apart, at four places:")
            + table(["query at", *map(str, starts)],
                    [["rotary score", *(f"{v:.6f}" for v in rot)],
                     ["score with sinusoidal vectors added", *(f"{v:.6f}" for v in add)]])
            + check(bool(refusal), f"a position past the table's {ROUTER['max_positions']} rows is refused")
            + check(max(rot) - min(rot) < 1e-5 < max(add) - min(add),
                    "rotary: the same score wherever the pair sits; added positions: it changes with the place"))


def encoders_decoders_section() -> Section:
    """Section 9: seed 004's causal head, encoder against decoder, the inverted padding mask, positions."""
    n: dict = {}
    body = _causal(n) + _who_reads_what(n) + _inverted(n) + _positions(n)
    inv = n["inverted_padding_mask"]
    highlights = [("inverted padding mask, tickets with nan: torch / attnlab",
                   f"{inv['torch_nan_tickets']} / {inv['attnlab_nan_tickets']} of {inv['tickets']}")]
    return Section("encoders_decoders", "Encoders and decoders", n, body, highlights)
