"""Every notebook in `notebooks/` runs top to bottom; each asserts its own answers."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# A notebook is meant to run in about a minute; this ceiling only stops a hung kernel.
CELL_TIMEOUT_SECONDS = 900


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_asserts_hold(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_SECONDS,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()


def test_every_notebook_has_an_assert_cell():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        sources = [c.source for c in notebook.cells if c.cell_type == "code"]
        assert any("assert " in s for s in sources), f"{path.name} checks nothing"
