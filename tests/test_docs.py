"""The documentation site: it builds with warnings as errors, its notebook pages show what the
notebooks computed, every public name has an API page, and the pages render in a browser.

The build (the `site` fixture in conftest.py) executes every notebook once; the notebook tests in
test_notebooks.py read that build instead of executing the notebooks a second time.
"""

import inspect
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SITE_GROUP

import pymc_optim
from pymc_optim import datasets, distributions

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PUBLIC_NAMES = (
    [f"pymc_optim.{name}" for name in pymc_optim.__all__]
    + [f"pymc_optim.datasets.{name}" for name in datasets.__all__]
    + [f"pymc_optim.distributions.{name}" for name in distributions.__all__]
)

# Every test that reads the built site is marked slow (the build executes the notebooks) and
# SITE_GROUP (one xdist worker builds it once).


class _Images(HTMLParser):
    """Collects the `src` of every <img> element of a page."""

    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs).get("src", ""))


def image_sources(page: Path) -> list[str]:
    parser = _Images()
    parser.feed(page.read_text())
    return parser.sources


@pytest.mark.slow
@SITE_GROUP
def test_site_builds_with_warnings_as_errors(site):
    # A broken docstring, cross-reference or notebook (a failing assert cell included) is a
    # warning or an error of sphinx-build, and -W makes it fail the build.
    assert site.returncode == 0, site.log[-6000:]
    assert (site.html / "index.html").exists()


@pytest.mark.slow
@SITE_GROUP
def test_every_public_name_has_an_api_page(site):
    missing = [n for n in PUBLIC_NAMES if not (site.html / "generated" / f"{n}.html").exists()]
    assert not missing, missing
    api = (site.html / "api.html").read_text()
    assert all(f"generated/{name}.html" in api for name in PUBLIC_NAMES)
    # the page holds the docstring, not an empty stub: its Examples section rendered too
    minimize_page = (site.html / "generated" / "pymc_optim.minimize.html").read_text()
    assert "Examples" in minimize_page and "x_star" in minimize_page


@pytest.mark.slow
@SITE_GROUP
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_page_contains_its_figures(site, path):
    executed = json.loads((site.executed / "examples" / path.name).read_text())
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    n_figures = sum("image/png" in o.get("data", {}) for o in outputs)
    assert n_figures >= 1, f"{path.name} draws no figure"
    page = site.html / "examples" / f"{path.stem}.html"
    figures = [s for s in image_sources(page) if s.endswith(".png")]
    assert len(figures) == n_figures, (figures, n_figures)
    for source in figures:
        assert (page.parent / source).resolve().is_file(), source
    # a table (a DataFrame's HTML) and printed text rendered as outputs too
    assert "<table" in page.read_text()
    assert not [o for o in outputs if o["output_type"] == "error"]


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0:
        # Debian's package; CI runs as root on a Debian machine.
        for step in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            subprocess.run(step, capture_output=True, timeout=600, check=False)
        found = shutil.which("chromium")
    if found is None:
        pytest.fail("headless Chromium is needed: apt-get install -y chromium")
    return found


def screenshot(page: Path, png: Path, tmp_path: Path) -> np.ndarray:
    Image = pytest.importorskip("PIL.Image")
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--hide-scrollbars",
        "--window-size=1280,1600",
        "--virtual-time-budget=5000",  # let MathJax and the theme's scripts finish
        f"--screenshot={png}",
        page.as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert png.exists(), result.stderr[-3000:]
    return np.asarray(Image.open(png).convert("L"), dtype=float)


def _assert_not_blank(pixels: np.ndarray, what: str):
    # A blank (or single-colour) page has zero variance. Text on the theme's white background
    # puts a few percent of the pixels near black: require both contrast and content.
    assert pixels.std() > 10, f"{what}: pixel sd {pixels.std():.1f}, page looks blank"
    assert (pixels < 128).mean() > 0.01, f"{what}: almost no dark pixels"


@pytest.mark.slow
@SITE_GROUP
def test_landing_page_renders_in_a_browser(site, tmp_path):
    pixels = screenshot(site.html / "index.html", tmp_path / "index.png", tmp_path)
    _assert_not_blank(pixels, "index.html")


@pytest.mark.slow
@SITE_GROUP
def test_notebook_page_renders_in_a_browser(site, tmp_path):
    page = site.html / "examples" / "laplace_inla.html"
    pixels = screenshot(page, tmp_path / "notebook.png", tmp_path)
    _assert_not_blank(pixels, page.name)


@pytest.mark.slow
@SITE_GROUP
def test_the_blas_page_states_a_measured_cost(site):
    text = (site.html / "blas.html").read_text()
    assert "could not link to a BLAS installation" in text
    assert re.search(r"\d+(\.\d+)?\s*(x|×)", text), "the page gives no measured ratio"


def test_every_public_function_has_an_example_that_runs_as_a_doctest():
    # pytest collects the Examples with --doctest-modules (pyproject's addopts): here we check
    # that every public function (and the data loaders) has one.
    functions = [getattr(pymc_optim, name) for name in pymc_optim.__all__]
    functions += [getattr(datasets, name) for name in datasets.__all__]
    functions = [f for f in functions if inspect.isfunction(f)]
    lacking = [
        f.__name__
        for f in functions
        if "Examples\n" not in (f.__doc__ or "") or ">>> " not in (f.__doc__ or "")
    ]
    assert not lacking, f"public functions without an Examples section: {lacking}"
