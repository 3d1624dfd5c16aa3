"""Every notebook in `notebooks/` runs top to bottom; each asserts its own answers.

The notebooks are executed once per test session, by the documentation build (the `site`
fixture in conftest.py: myst-nb with a fresh jupyter-cache, every notebook as a page of the
site). A failing cell, an assert cell included, fails that build; the test below reads the
executed copies, so a notebook is never executed twice in one CI run.
"""

import json

import pytest
from conftest import ROOT, SITE_GROUP

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@SITE_GROUP
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_asserts_hold(site, path):
    executed_path = site.executed / "examples" / path.name
    assert executed_path.exists(), site.log[-6000:]
    executed = json.loads(executed_path.read_text())
    source = json.loads(path.read_text())
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    # the executed copy is this notebook, every code cell ran, none raised
    assert len(code) == sum(c["cell_type"] == "code" for c in source["cells"])
    assert all(c["execution_count"] is not None for c in code), path.name
    outputs = [o for c in code for o in c["outputs"]]
    errors = [o for o in outputs if o["output_type"] == "error"]
    assert not errors, errors[0]["evalue"] if errors else None
    text = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
    assert "IProgress not found" not in text, "install ipywidgets (the notebooks extra)"


def test_every_notebook_has_an_assert_cell():
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text())
        sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
        assert any("assert " in s for s in sources), f"{path.name} checks nothing"
