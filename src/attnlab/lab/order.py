"""Section 7: seed 004's shuffle test. Attention alone cannot see word order; positions let it.

One attention layer (:class:`attnlab.nn.MultiHeadAttention`, one head, width 4) reads two sentences with
the same seven tokens in different orders and averages its outputs into a summary. Without positions the
two summaries are equal (attention permutes its outputs exactly as its inputs were permuted); with a
learned position table (seed 004) or the sinusoidal encoding (seed 000) added, they differ.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.lab.html import Section, check, code, para, table
from attnlab.nn import LearnedPositions, MultiHeadAttention, sinusoidal_encoding

WORDS = ["damaged", "on", "arrival", ",", "not", "after", "use"]
ORDER_A = [0, 1, 2, 3, 4, 5, 6]  # damaged on arrival , not after use
ORDER_B = [0, 5, 6, 3, 4, 1, 2]  # damaged after use , not on arrival
WIDTH = 4
ATOL = 1e-6  # summaries count as the same within float32 rounding of a different summation order


def order_section() -> Section:
    """Section 7: the shuffle test without positions, with learned positions, with sinusoidal ones."""
    torch.manual_seed(0)
    tokens = nn.Embedding(len(WORDS), WIDTH)  # one random 4-vector per word
    attention = MultiHeadAttention(WIDTH, 1).eval()
    torch.manual_seed(1)
    learned = LearnedPositions(len(WORDS), WIDTH)
    sinusoidal = sinusoidal_encoding(len(WORDS), WIDTH)  # (7, 4)

    def outputs(order: list[int], positions: torch.Tensor | None) -> torch.Tensor:
        x = tokens(torch.tensor([order]))  # (1, 7, 4)
        if positions is not None:
            x = x + positions  # (7, 4) broadcast over the batch
        out, _ = attention(x)
        return out[0]  # (7, 4)

    results = {}
    rows = []
    with torch.no_grad():
        for key, label, positions in (("none", "no positions", None),
                                      ("learned", "learned position table (seed 004)", learned(len(WORDS))),
                                      ("sinusoidal", "sinusoidal encoding (seed 000)", sinusoidal)):
            out_a, out_b = outputs(ORDER_A, positions), outputs(ORDER_B, positions)
            sum_a, sum_b = out_a.mean(0), out_b.mean(0)  # one (4,) summary per sentence
            same = bool(torch.allclose(sum_a, sum_b, atol=ATOL))
            diff = float((sum_a - sum_b).abs().max())
            results[key] = {"summary_a": sum_a.tolist(), "summary_b": sum_b.tolist(), "same": same,
                            "max_difference": diff}
            rows.append((label, _vec(sum_a), _vec(sum_b), "same" if same else f"differ by {diff:.4f}"))
            if key == "none":
                use_a, use_b = out_a[6], out_b[2]  # "use" sits at position 6 in a and 2 in b
                results[key]["use_equal"] = bool(torch.allclose(use_a, use_b, atol=ATOL))
                use_text = f"'use' in a, position 6: {_vec(use_a)}\n'use' in b, position 2: {_vec(use_b)}"

    body = para("Two sentences with the same seven tokens, opposite meanings:")
    body += code(" ".join(WORDS[i] for i in ORDER_A) + "\n" + " ".join(WORDS[i] for i in ORDER_B))
    body += para("One attention layer reads each; the mean of its seven outputs is the sentence's summary.")
    body += table(["input", "summary a", "summary b", "result"], rows)
    body += check(results["none"]["same"], "without positions the two summaries are the same")
    body += para("Look inside: without positions the output for 'use' is the same vector in both sentences, only",
                 "at another place. Attention compares each query with every key wherever they sit.")
    body += code(use_text)
    body += check(not results["learned"]["same"] and not results["sinusoidal"]["same"],
                  "with positions added (learned or sinusoidal) the summaries differ")
    body += para("The position vectors here are untrained, so the difference carries no meaning yet; it shows only",
                 "that order can now reach the computation. Its size depends on the random weights: seed 004 runs",
                 "torch's <code>nn.MultiheadAttention</code>, initialised differently from attnlab's layer, and",
                 "prints other numbers (a learned-position difference near 0.07); what must agree is the pattern,",
                 "equal without positions and different with them. The trained router's version of the test, on",
                 "real tickets, is <code>attnlab probe order</code>.")
    highlights = [("shuffle test: same summary without / with positions",
                   f"{results['none']['same']} / {results['learned']['same']} (learned), "
                   f"{results['sinusoidal']['same']} (sinusoidal)")]
    return Section("order", "Order: the shuffle test", results, body, highlights)


def _vec(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:+.4f}" for v in t.tolist()) + "]"
