"""Section 8: the mask explorer (seed 004's "Explore" panel), computed here and embedded in the page.

"my parcel is late" and two padding tokens go through the first encoder block of the ``tiny-router``
preset (seed 004's TinyTransformer shape: width 64, 4 heads, learned positions; seeded, untrained).
Its attention weights, averaged over the 4 heads, are computed under four masks: none, padding,
causal, both. The four 6 x 6 tables are rendered into the page; a few lines of plain JavaScript switch
between them, so the saved page works without a server. Hidden cells are marked and counted:
0, 12, 15 and 18 of 36.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.lab.html import Section, check, esc, fmt, para
from attnlab.nn import causal_mask, padding_mask
from attnlab.presets import build_preset

TOKENS = ["my", "parcel", "is", "late", "pad", "pad"]
IDS = [[1, 2, 3, 4, 0, 0]]  # any ids of the vocabulary; 0 is the preset's padding id
SEED = 0
MASKS = (("none", "No mask"), ("padding", "Padding mask"), ("causal", "Causal mask"), ("both", "Both masks"))

SCRIPT = """
(function () {
  var root = document.getElementById('explorer-widget');
  if (!root) { return; }
  var buttons = root.querySelectorAll('button[data-mask]');
  function show(key) {
    root.querySelectorAll('table[data-mask]').forEach(function (t) { t.hidden = t.dataset.mask !== key; });
    buttons.forEach(function (b) { b.setAttribute('aria-pressed', String(b.dataset.mask === key)); });
    var table = root.querySelector('table[data-mask="' + key + '"]');
    root.querySelector('#hidden-count').textContent = table.dataset.hidden;
    root.querySelector('#visible-count').textContent = table.dataset.visible;
    root.querySelector('#first-reads').textContent = table.dataset.firstReads;
    root.querySelector('#explorer-note').textContent = table.dataset.note;
  }
  buttons.forEach(function (b) { b.addEventListener('click', function () { show(b.dataset.mask); }); });
  show('none');
})();
"""


def explorer_weights() -> dict[str, dict]:
    """Head-averaged weights of the block under each mask.

    Returns:
        mask key -> {"weights": (6, 6) list, "hidden": (6, 6) bool list, "hidden_count": int,
        "row_sums": visible weight per row}.
    """
    torch.manual_seed(SEED)
    model = build_preset("tiny-router").eval()
    ids = torch.tensor(IDS)  # (1, 6)
    n = ids.shape[1]
    masks = {
        "none": None,
        "padding": padding_mask(ids),  # (1, 1, 1, 6)
        "causal": causal_mask(n),  # (1, 1, 6, 6)
        "both": causal_mask(n) & padding_mask(ids),  # (1, 1, 6, 6)
    }
    out = {}
    with torch.no_grad():
        x = model.encoder.embed(ids)  # (1, 6, 64): token vectors + learned positions
        block = model.encoder.layers[0]
        for key, mask in masks.items():
            _, weights = block(x, attend_mask=mask, need_weights=True)  # (1, 4, 6, 6)
            avg = weights[0].mean(0)  # (6, 6): the average of the 4 heads
            hidden = torch.zeros(n, n, dtype=torch.bool) if mask is None else ~mask[0, 0].expand(n, n)
            visible_sums = avg.masked_fill(hidden, 0.0).sum(-1)
            out[key] = {"weights": avg.tolist(), "hidden": hidden.tolist(), "hidden_count": int(hidden.sum()),
                        "row_sums": visible_sums.tolist(),
                        "hidden_weight": float(avg.masked_select(hidden).sum())}
    return out


def _quoted(data: dict[str, dict]) -> dict[str, Any]:
    """The figures the notes below quote, by name (the notes are written from these; ``numbers.json`` keeps them)."""
    w = {k: torch.tensor(v["weights"]) for k, v in data.items()}
    late, parcel = TOKENS.index("late"), TOKENS.index("parcel")
    return {"late_to_padding_tokens_none": w["none"][late, 4:].tolist(),
            "late_to_padding_none": float(w["none"][late, 4:].sum()),
            "late_to_real_tokens_padding": dict(zip(TOKENS[:4], w["padding"][late, :4].tolist())),
            "my_to_itself_causal": float(w["causal"][0, 0]), "parcel_to_my_causal": float(w["causal"][parcel, 0]),
            "parcel_to_itself_causal": float(w["causal"][parcel, parcel]),
            "real_rows_both_vs_causal": float((w["both"][:4] - w["causal"][:4]).abs().max())}


def _notes(data: dict[str, dict], q: dict[str, Any]) -> dict[str, str]:
    """One sentence per mask, written from the figures :func:`_quoted` picked out."""
    first, second = q["late_to_padding_tokens_none"]
    both_vs_causal = q["real_rows_both_vs_causal"]
    same = "identical" if both_vs_causal == 0.0 else f"largest difference {both_vs_causal:.1e}"
    return {
        "none": (f"No cell is hidden: every token reads every token, the padding too. 'late' gives "
                 f"{fmt(first, 3)} + {fmt(second, 3)} of its attention to the two padding "
                 f"tokens, {fmt(q['late_to_padding_none'], 3)} in all."),
        "padding": (f"The two padding columns are hidden, {data['padding']['hidden_count']} of 36 cells. The real "
                    "tokens' weights grow to fill the gap: 'late' now reads "
                    + ", ".join(f"'{t}' {fmt(v, 2)}" for t, v in q["late_to_real_tokens_padding"].items())
                    + ", 1 in all."),
        "causal": (f"The cells above the diagonal are hidden, {data['causal']['hidden_count']} of 36. 'my' reads "
                   f"only itself ({fmt(q['my_to_itself_causal'], 2)}); 'parcel' gives "
                   f"{fmt(q['parcel_to_my_causal'], 2)} to 'my' and {fmt(q['parcel_to_itself_causal'], 2)} to itself."),
        "both": (f"{data['both']['hidden_count']} of 36 cells are hidden. With the padding at the end the causal "
                 f"mask already hides it from the real tokens, so their rows match the causal table ({same}); "
                 "only the padding rows change."),
    }


def _table(key: str, entry: dict, note: str) -> str:
    n = len(TOKENS)
    seen = n - sum(entry["hidden"][0])
    first_reads = f"{seen} token{'s' if seen != 1 else ''}"
    attrs = (f'data-mask="{key}" data-hidden="{entry["hidden_count"]}" data-visible="{n * n - entry["hidden_count"]}" '
             f'data-first-reads="{first_reads}" data-note="{esc(note)}"')
    out = [f'<table class="explorer-table" {attrs}{"" if key == "none" else " hidden"}>',
           "<caption>" + esc(dict(MASKS)[key]) + "</caption>",
           '<tr><td></td>' + "".join(f'<th scope="col">{esc(t)}</th>' for t in TOKENS)
           + '<th scope="col" class="sum">sum of visible</th></tr>']
    for i, token in enumerate(TOKENS):
        cells = []
        for j in range(n):
            weight = entry["weights"][i][j]
            if entry["hidden"][i][j]:
                cells.append('<td class="hidden" title="hidden">&ndash;</td>')
            else:
                ink = "#fff" if weight > 0.55 else "#111"
                cells.append(f'<td style="background: rgba(31, 119, 180, {weight:.3f}); color: {ink}">'
                             f"{fmt(weight, 2)}</td>")
        out.append(f'<tr><th scope="row">{esc(token)}</th>{"".join(cells)}'
                   f'<td class="sum">{fmt(entry["row_sums"][i], 2)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def explorer_section() -> Section:
    """Section 8: the interactive mask table."""
    data = explorer_weights()
    quoted = _quoted(data)
    notes = _notes(data, quoted)
    rows_ok = all(abs(s - 1.0) < 1e-5 for entry in data.values() for s in entry["row_sums"])
    hidden_zero = all(entry["hidden_weight"] == 0.0 for entry in data.values())
    n = len(TOKENS)
    body = para("The attention weights of the first encoder block of the <code>tiny-router</code> preset (seed 004's",
                "TinyTransformer shape; seeded, <b>untrained</b>, so the values differ from seed 004's trained ones),",
                "averaged over its 4 heads, for \"my parcel is late\" and 2 padding tokens. Pick a mask; predict",
                "first which cells it hides.")
    buttons = "".join(f'<button type="button" data-mask="{key}" aria-pressed="{str(key == "none").lower()}">'
                      f"{esc(label)}</button>" for key, label in MASKS)
    body += (
        '<div class="explorer" id="explorer-widget">'
        f'<div class="buttons" role="group" aria-label="mask">{buttons}</div>'
        '<div class="stats">'
        f'<div><span class="label">Hidden cells</span><span class="value"><span id="hidden-count">0</span> of {n * n}</span></div>'
        f'<div><span class="label">Visible cells</span><span class="value" id="visible-count">{n * n}</span></div>'
        f'<div><span class="label">"my" reads</span><span class="value" id="first-reads">{n} tokens</span></div>'
        "</div>"
        f'<p id="explorer-note">{esc(notes["none"])}</p>'
        '<p class="hint">Rows: the token that reads. Columns: the token it reads. &ndash; marks a hidden cell.</p>'
        + "".join(_table(key, data[key], notes[key]) for key, _ in MASKS)
        + "</div>\n"
        + f"<script>{SCRIPT}</script>\n"
    )
    counts = {key: data[key]["hidden_count"] for key, _ in MASKS}
    body += check(counts == {"none": 0, "padding": 12, "causal": 15, "both": 18},
                  "hidden cells: " + ", ".join(f"{dict(MASKS)[k].lower()} {v}" for k, v in counts.items()) + " of 36")
    body += check(rows_ok and hidden_zero, "every row's visible weights sum to 1; hidden cells get exactly 0")
    body += para("Two details: the padding rows still get weights (the block computes them; a classifier drops them",
                 "when it pools), and with padding at the end the causal mask already hides the padding from the",
                 "real tokens, so adding the padding mask changes only the padding rows.")
    numbers = {"tokens": TOKENS, "preset": "tiny-router", "block": 1, "hidden_counts": counts,
               "rows_sum_to_one": rows_ok, "quoted": quoted, "masks": data}
    highlights = [("mask explorer hidden cells", ", ".join(f"{k} {v}" for k, v in counts.items()))]
    return Section("explorer", "Mask explorer", numbers, body, highlights)
