"""The figures of docs/TOUR.md are what scripts/make_figures.py draws today: redrawing
them (from the code's constants and the saved ladder output) gives the same files, and
TOUR.md shows each one."""

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(REPO, "docs", "figures")
SCRIPT = os.path.join(REPO, "scripts", "make_figures.py")
sys.path.insert(0, os.path.join(REPO, "scripts"))

import make_figures  # noqa: E402

NAMES = ["gpu_decode.svg", "kv_cache_gqa.svg", "ladder.svg", "prefill_gemm.svg",
         "transformer_block.svg"]


def test_redrawing_gives_the_committed_figures(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in NAMES:
        with open(tmp_path / name, encoding="utf-8") as f:
            fresh = f.read()
        with open(os.path.join(FIGURES, name), encoding="utf-8") as f:
            assert f.read() == fresh, (f"docs/figures/{name} is out of date: run "
                                       "`python3 scripts/make_figures.py`")


def test_the_tour_shows_every_figure():
    with open(os.path.join(REPO, "docs", "TOUR.md"), encoding="utf-8") as f:
        tour = f.read()
    shown = set(re.findall(r"!\[[^\]]+\]\(figures/([\w.]+)\)", tour))
    assert shown == set(NAMES)


def test_the_gemm_figure_takes_its_sizes_from_the_code():
    """The constants as written in src/cpu (read here with a plain search), and the
    figure's text built from them."""
    with open(os.path.join(REPO, "src", "cpu", "avx2", "avx2.h"), encoding="utf-8") as f:
        header = f.read()
    token_tile = int(re.search(r"kTokenTile = (\d+);", header).group(1))
    row_tile = int(re.search(r"kRowTile = (\d+);", header).group(1))
    constants = make_figures.cpp_constants()
    assert constants["kTokenTile"] == token_tile and constants["kRowTile"] == row_tile
    assert constants["kRowBlock"] % row_tile == 0
    figure = make_figures.prefill_gemm()
    assert f"{row_tile} rows × {token_tile} tokens of sums in" in figure
    assert f"{constants['kRowBlock']} rows ×" in figure


def test_the_ladder_chart_shows_the_saved_run():
    with open(os.path.join(FIGURES, make_figures.LADDER_OUTPUT), encoding="utf-8") as f:
        saved = f.read()
    assert saved.startswith("$ barellm ladder "), "the saved output names its command first"
    command, rows, _ = make_figures.parse_ladder(saved)
    assert [row["rung"] for row in rows] == ["1", "2", "3", "4", "5", "6", "7"]
    chart = make_figures.ladder_chart(saved)
    for row in rows:
        assert f">{float(row['tok/s']):,.0f}<" in chart, row


@pytest.mark.parametrize("name", NAMES)
def test_every_figure_is_well_formed_svg(name):
    root = ElementTree.parse(os.path.join(FIGURES, name)).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.find("{http://www.w3.org/2000/svg}title") is not None
