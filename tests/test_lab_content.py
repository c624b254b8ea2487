"""What the lab page tells a learner beyond its numbers: where its figures differ from the seeds and why."""

import html
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attnlab.lab import figures  # noqa: E402
from attnlab.lab.encoding import properties_section  # noqa: E402
from attnlab.lab.explorer import explorer_section  # noqa: E402
from attnlab.lab.masks_demo import masks_section  # noqa: E402


def text(section):
    return html.unescape(re.sub(r"<[^>]+>", "", section.body))


def test_the_encoding_section_gives_the_seeds_figures_when_its_width_differs():
    at_50 = text(properties_section(50, 20))
    assert "Seed 000 measures this at d = 100" in at_50 and "7.071068" in at_50 and "3.266878" in at_50
    assert "Seed 000 measures this" not in text(properties_section(100, 20))  # the seed's own width: no note


def test_the_explorer_note_adds_up_the_cells_it_quotes():
    section = explorer_section()
    late = section.numbers["tokens"].index("late")
    row = np.array(section.numbers["masks"]["none"]["weights"][late])
    shown = re.search(r"'late' gives (\d\.\d\d\d) \+ (\d\.\d\d\d) of its attention to the two padding tokens, "
                      r"(\d\.\d\d\d) in all", text(section))
    assert shown, text(section)
    assert [float(x) for x in shown.groups()] == [round(row[4], 3), round(row[5], 3), round(row[4:].sum(), 3)]


def test_the_masks_section_explains_axes_conventions_and_fully_hidden_rows():
    body = text(masks_section())
    for phrase in ("(batch, heads, queries, keys)", "the sequence that supplies K and V", "key_padding_mask",
                   "attention_mask", "-inf (the seed adds -1e9", "NaN", "-1e9 spreads its weight evenly"):
        assert phrase in body, phrase


def test_word_panels_label_positions_and_axes(monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "to_png", lambda fig: drawn.append(fig) or "")
    points = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]])
    figures.word_panels([points], [["king", "queen", "red"]], [["people", "people", "colours"]], ["one panel"])
    ax = drawn[0].axes[0]
    assert [t.get_text() for t in ax.texts] == ["king@0", "queen@1", "red@2"]
    assert ax.get_xlabel().startswith("PC1") and ax.get_ylabel() == "PC2"


def test_word_panel_labels_of_points_close_together_do_not_overprint(monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "to_png", lambda fig: drawn.append(fig) or "")
    # a tight cluster of four (as king, woman, man in a layout of the page) and two far away to set the scale
    points = np.array([[0.0, 0.0], [0.05, 0.02], [0.1, -0.03], [0.02, 0.08], [5.0, 5.0], [-5.0, -5.0]])
    words = ["woman", "king", "man", "queen", "red", "football"]
    figures.word_panels([points], [words], [["people"] * 4 + ["colours", "sports"]], ["crowded"])
    fig = drawn[0]
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts]
    overlapping = [(a, b) for i, a in enumerate(words) for j, b in enumerate(words)
                   if i < j and boxes[i].overlaps(boxes[j])]
    assert overlapping == []


def test_word_panel_labels_stay_inside_their_frame(monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "to_png", lambda fig: drawn.append(fig) or "")
    # long labels on the points at the panel's right and top edges (queen@1 ran over the right-hand frame line)
    points = np.array([[-3.0, 2.0], [4.0, -0.25], [1.5, -0.5], [2.0, -0.45], [-2.5, -3.9], [-0.1, 2.8]])
    words = ["red", "queen", "king", "woman", "football", "yellow"]
    figures.word_panels([points, points[:, ::-1]], [words] * 2, [["colours"] + ["people"] * 3 + ["sports", "colours"]] * 2,
                        ["one", "two"])
    fig = drawn[0]
    fig.canvas.draw()
    for ax in fig.axes:
        frame = ax.get_window_extent()
        outside = [t.get_text() for t in ax.texts
                   if not (frame.x0 <= t.get_window_extent().x0 and t.get_window_extent().x1 <= frame.x1
                           and frame.y0 <= t.get_window_extent().y0 and t.get_window_extent().y1 <= frame.y1)]
        assert outside == []


def test_the_model_section_shows_padded_outputs_and_the_two_attention_shapes():
    from attnlab.lab.model_checks import model_section

    demo = model_section().numbers["encoder_stack_and_decoder_layer"]
    assert demo["encoder_output_shape"] == [2, 5, 4] and len(demo["padded_output_norms"]) == 3
    assert min(demo["padded_output_norms"]) > 0  # padding hides keys; it does not zero the padded outputs
    assert demo["decoder_layer_output_shape"] == [2, 3, 4]  # seed 000: "output (2, 3, 4)", measured
    assert demo["decoder_self_attention_shape"] == [2, 2, 3, 3]
    assert demo["decoder_cross_attention_shape"] == [2, 2, 3, 5]
    assert demo["encoder"] == {"layers": 2, "vocab_size": 32, "heads": 2}  # the seed's two-layer encoder
    assert demo["layer_cross_on_padded_source"] == 0.0  # the layer reads the encoder output, padding hidden
    block1 = np.array(demo["block1_head0"])  # seed 000's look-ahead structure: row 0 on itself, nothing above
    assert block1[0].tolist() == [1.0, 0.0, 0.0] and np.triu(block1, 1).sum() == 0.0
    assert block1.sum(1) == pytest.approx([1.0] * 3, abs=1e-6)
    stack = demo["decoder_stack"]  # the seed's two-layer decoder: "decoded: (1, 3, 4) | weight tensors: 4"
    assert stack["output_shape"] == [1, 3, 4] and len(stack["weight_tensors"]) == 4
    assert stack["above_diagonal"] == 0.0 and stack["on_padded_source"] == 0.0  # every layer and head


def test_heatmaps_name_what_their_colours_mean(monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "to_png", lambda fig: drawn.append(fig) or "")
    square = np.eye(3)
    figures.heatmap(square, title="t", xlabel="x", ylabel="y", value_label="PE value")
    figures.heatmap_pair(square, square, ("a", "b"), "position", ("dot", "distance"))
    figures.attention_maps([square, square], ["a", "b"], ["x", "x"], "y")
    colour_bars = [ax.get_ylabel() for fig in drawn for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert colour_bars == ["PE value", "dot", "distance", "attention weight"]


def test_seed003s_hide_masks_convert_to_the_cores_cell_for_cell():
    seed003 = masks_section().numbers["seed003"]
    assert seed003["padding_mask"] == [0, 0, 0, 0, 1, 1, 1]  # the seed's printed padding_mask([1, 2, 3, 4, 0, 0, 0])
    assert seed003["look_ahead"] == np.triu(np.ones((5, 5)), 1).tolist()  # its printed lookahead_mask(5)
    assert seed003["decoder_mask"][3] == [0, 0, 0, 1, 1]  # padded keys 3 and 4 hidden in every row
    assert seed003["padding_agrees"] and seed003["look_ahead_agrees"] and seed003["decoder_agrees"]
    body = text(masks_section())  # the seed's lookahead_mask(5) is shown as it prints it, not only described
    assert "seed 003: lookahead_mask(5), 1 = hidden" in body
