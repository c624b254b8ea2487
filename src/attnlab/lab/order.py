"""Section 7: seed 004's shuffle test. Attention alone cannot see word order; positions let it.

Seed 004's code runs first, as printed: after ``torch.manual_seed(0)`` a word table ``nn.Embedding(7, 4)`` and
one ``nn.MultiheadAttention(4, 1)`` head read two sentences with the same seven tokens in different orders,
and the mean of the outputs is each sentence's summary; after ``torch.manual_seed(1)`` a position table
``nn.Embedding(7, 4)`` is added. torch gives the seed's printed vectors, and attnlab's attention holding the
same weights gives the same numbers. Without positions the two summaries are equal (attention permutes its
outputs exactly as its inputs were permuted); with the learned table, or the sinusoidal encoding (seed 000),
they differ. Last, the same test on a whole untrained ``tiny-router`` (seed 004's guided practice, step 4): with its
position table set to zero a ticket and its shuffled tokens get the same scores.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.lab.html import Section, check, code, para, table
from attnlab.nn import LearnedPositions, MultiHeadAttention, sinusoidal_encoding
from attnlab.presets import MODEL_PRESETS, build_preset

WORDS = ["damaged", "on", "arrival", ",", "not", "after", "use"]
ORDER_A = [0, 1, 2, 3, 4, 5, 6]  # damaged on arrival , not after use
ORDER_B = [0, 5, 6, 3, 4, 1, 2]  # damaged after use , not on arrival
WIDTH = 4
ATOL = 1e-6  # summaries count as the same within float32 rounding of a different summation order
# What seed 004 prints, to 4 decimals: the summary without positions (the same for a and b), the output
# for "use" (the same in both sentences), and the two summaries with the learned table added.
SEED_SUMMARY = [-0.1657, -0.0738, 0.3466, -0.1725]
SEED_USE = [-0.0194, -0.0040, 0.2147, -0.0818]
SEED_LEARNED = ([-0.2461, -0.0334, 0.7288, -0.4205], [-0.1802, 0.0059, 0.7413, -0.4107])
PRINTED = 5e-5 + 1e-6  # half a unit of the seed's last printed decimal, and float32 rounding
TICKET_LENGTH = 24  # tokens of the synthetic ticket fed to the whole router


def order_section() -> Section:
    """Section 7: the seed's shuffle test in torch and in attnlab, with and without positions; then a model."""
    # Seed 004's code, in its order: the draws after each manual_seed are what make its printed numbers.
    torch.manual_seed(0)
    words = nn.Embedding(len(WORDS), WIDTH)
    head = nn.MultiheadAttention(WIDTH, 1, batch_first=True)
    torch.manual_seed(1)
    seed_positions = nn.Embedding(len(WORDS), WIDTH)
    attention = MultiHeadAttention.from_torch(head).eval()  # the same weights in attnlab's layer
    learned = LearnedPositions(len(WORDS), WIDTH)
    learned.table.weight.data.copy_(seed_positions.weight.data)
    tables = {"none": None, "learned": learned(len(WORDS)), "sinusoidal": sinusoidal_encoding(len(WORDS), WIDTH)}

    def inputs(order: list[int], positions: torch.Tensor | None) -> torch.Tensor:
        x = words(torch.tensor([order]))  # (1, 7, 4)
        return x if positions is None else x + positions  # (7, 4) broadcast over the batch

    results: dict = {}
    rows = []
    with torch.no_grad():
        # torch, as the seed runs it (its head is in training mode, with dropout 0)
        torch_out = {key: [head(x, x, x)[0][0] for x in (inputs(ORDER_A, p), inputs(ORDER_B, p))]
                     for key, p in tables.items() if key != "sinusoidal"}  # (7, 4) each
        for key, label in (("none", "no positions"), ("learned", "learned position table (seed 004)"),
                           ("sinusoidal", "sinusoidal encoding (seed 000)")):
            out_a, out_b = (attention(inputs(order, tables[key]))[0][0] for order in (ORDER_A, ORDER_B))  # (7, 4)
            sum_a, sum_b = out_a.mean(0), out_b.mean(0)  # one (4,) summary per sentence
            same = bool(torch.allclose(sum_a, sum_b, atol=ATOL))
            diff = float((sum_a - sum_b).abs().max())
            results[key] = {"summary_a": sum_a.tolist(), "summary_b": sum_b.tolist(), "same": same,
                            "max_difference": diff}
            if key in torch_out:
                results[key]["torch_vs_attnlab"] = max(float((t - o).abs().max())
                                                       for t, o in zip(torch_out[key], (out_a, out_b), strict=True))
            rows.append((label, _vec(sum_a), _vec(sum_b), "same" if same else f"differ by {diff:.4f}"))
            if key == "none":
                use_a, use_b = out_a[6], out_b[2]  # "use" sits at position 6 in a and 2 in b
                results[key]["use_equal"] = bool(torch.allclose(use_a, use_b, atol=ATOL))
                results[key]["use_a"], results[key]["use_b"] = use_a.tolist(), use_b.tolist()
                use_text = f"'use' in a, position 6: {_vec(use_a)}\n'use' in b, position 2: {_vec(use_b)}"
    (none_a, none_b), (learned_a, learned_b) = ([o.mean(0) for o in torch_out[k]] for k in ("none", "learned"))
    use = torch_out["none"][0][6]
    printed = [(none_a, SEED_SUMMARY), (none_b, SEED_SUMMARY), (use, SEED_USE),
               (learned_a, SEED_LEARNED[0]), (learned_b, SEED_LEARNED[1])]
    seed_gap = max(float((ours - torch.tensor(want)).abs().max()) for ours, want in printed)
    agree = max(results[k]["torch_vs_attnlab"] for k in torch_out)
    results["seed"] = {"torch_largest_difference_from_printed": seed_gap, "matches_seed": seed_gap <= PRINTED,
                       "attnlab_largest_difference_from_torch": agree}
    model_text = _whole_model(results)

    body = para("Two sentences with the same seven tokens, opposite meanings:")
    body += code(" ".join(WORDS[i] for i in ORDER_A) + "\n" + " ".join(WORDS[i] for i in ORDER_B))
    body += para("Seed 004's code runs first: after <code>torch.manual_seed(0)</code> a word table",
                 "<code>nn.Embedding(7, 4)</code> and one <code>nn.MultiheadAttention(4, 1)</code> head, after",
                 "<code>torch.manual_seed(1)</code> a position table <code>nn.Embedding(7, 4)</code>. attnlab's",
                 "<code>MultiHeadAttention.from_torch</code> takes the head's weights, and its",
                 "<code>LearnedPositions</code> the position table's. The mean of the seven outputs is each",
                 "sentence's summary:")
    body += table(["input", "summary a", "summary b", "result"], rows)
    body += check(results["seed"]["matches_seed"],
                  f"torch gives every vector the seed prints, to its 4 decimals (largest difference {seed_gap:.1e})")
    body += check(agree < 1e-6, f"attnlab's attention with the same weights gives torch's outputs (largest "
                                f"difference {agree:.1e})")
    body += check(results["none"]["same"], "without positions the two summaries are the same")
    body += para("Look inside: without positions the output for 'use' is the same vector in both sentences, only",
                 "at another place. Attention compares each query with every key wherever they sit.")
    body += code(use_text)
    body += check(not results["learned"]["same"] and not results["sinusoidal"]["same"],
                  "with positions added (learned or sinusoidal) the summaries differ")
    body += para("The position vectors here are untrained, so the difference carries no meaning yet; it shows only",
                 "that order can now reach the computation.")
    body += model_text
    model = results["model"]
    highlights = [("shuffle test: same summary without / with positions",
                   f"{results['none']['same']} / {results['learned']['same']} (learned), "
                   f"{results['sinusoidal']['same']} (sinusoidal); seed 004's printed vectors reproduced: "
                   f"{results['seed']['matches_seed']}"),
                  ("whole router, ticket vs shuffled: same scores without / with positions",
                   f"{model['zeroed']['same']} / {model['learned']['same']}")]
    return Section("order", "Order: the shuffle test", results, body, highlights)


def _whole_model(results: dict) -> str:
    """Step 4 of seed 004's guided practice on the untrained ``tiny-router``: scores of a ticket and its shuffle, table zeroed or not."""
    torch.manual_seed(0)
    router = build_preset("tiny-router").eval()
    gen = torch.Generator().manual_seed(7)
    ticket = torch.randint(1, router.config["vocab_size"], (1, TICKET_LENGTH), generator=gen)  # no padding id 0
    shuffled = ticket[:, torch.randperm(TICKET_LENGTH, generator=gen)]
    table_ = router.encoder.embed.positions.table.weight
    model: dict = {"preset": "tiny-router", "tokens": TICKET_LENGTH}
    lines = []
    with torch.no_grad():
        for key, label in (("learned", "position table as initialised"), ("zeroed", "position table set to zero")):
            if key == "zeroed":
                table_.zero_()
            in_order, mixed = router(ticket)[0], router(shuffled)[0]  # (5,) scores each
            diff = float((in_order - mixed).abs().max())
            model[key] = {"in_order": in_order.tolist(), "shuffled": mixed.tolist(), "max_difference": diff,
                          "same": bool(torch.allclose(in_order, mixed, atol=1e-5))}
            lines.append(f"{label}:\n  in order: {_vec(in_order)}\n  shuffled: {_vec(mixed)}")
    results["model"] = model
    layers = MODEL_PRESETS["tiny-router"].kwargs["num_layers"]  # attnlab's choice: seed 004 does not say
    return (para("The whole model, as step 4 of seed 004's guided practice asks: an untrained",
                 f"<code>tiny-router</code> ({layers} encoder layers, mean pooling) reads a ticket of {TICKET_LENGTH}",
                 "random tokens and the same tokens shuffled.",
                 "Its five scores:")
            + code("\n".join(lines))
            + check(model["zeroed"]["same"] and not model["learned"]["same"],
                    f"with the position table zeroed the two get the same scores (largest difference "
                    f"{model['zeroed']['max_difference']:.1e}); with it they differ by up to "
                    f"{model['learned']['max_difference']:.4f}")
            + para("Encoder layers only permute their outputs as the tokens were permuted, and the mean pooling",
                   "forgets the order that is left: positions are the model's only way to see it. The trained",
                   "router's version of the test, on real tickets, is <code>attnlab probe order</code>. Seed 004's",
                   "trained figures (its accuracies, its parcel vectors, the scores of tickets T-64697 and T-64715)",
                   "come from weights its previous lesson trained and tickets that are not in the seeds (its notebooks",
                   "cannot be fetched offline), so this page does not reproduce them: it runs",
                   "the same tests on untrained models, and <code>attnlab train classify</code> trains a router of",
                   "the seed's shape on BANKING77."))


def _vec(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:+.4f}" for v in t.tolist()) + "]"
