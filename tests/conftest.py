"""Shared test set-up: folders mirror the package; `cases` holds the closed-form problems; the
documentation site is built once per test session."""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytensor
import pytest

# One BLAS/OpenMP thread per process. The suite runs two xdist workers, and the documentation
# build's notebook kernels, on two cores: OpenBLAS threads spinning against each other made a
# 100 x 100 triangular solve with 100 right-hand sides take 21.8 ms instead of 1.3 ms (load 7).
# Set before the workers and kernels start, so they inherit it (a value already set is kept).
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# The suite compiles in PyTensor's C backend unless PYMC_OPTIM_TEST_LINKER names another linker
# ("numba" runs it in PyTensor 3's default): numba compiles each distinct graph to machine code
# (seconds to a minute per solver loop with an empty cache), the C backend reuses one compiled
# module per Op across graphs, and the suite's ~1,400 graphs fit CI's time only that way. The
# numba and JAX paths are tested where tests select them (tests/backends/test_numba.py, the
# `NUMBA`/`JAX` parametrizations), and the notebooks run in the default backend, as users do.
pytensor.config.linker = os.environ.get("PYMC_OPTIM_TEST_LINKER", "cvm")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # `from cases import ...` in every folder

# Every test that reads the built site carries this mark; `--dist loadgroup` (pyproject's
# addopts) sends them all to one xdist worker, so the site is built once, by one process,
# while the other worker runs the rest of the suite.
SITE_GROUP = pytest.mark.xdist_group("docs_site")


@dataclass
class Site:
    html: Path  # the HTML output folder
    executed: Path  # the notebooks as myst-nb executed them (jupyter_execute/)
    returncode: int
    log: str  # sphinx-build's stdout and stderr


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Site:
    """Build docs/ with warnings as errors, executing every notebook once (fresh cache).

    The cache lives in this session's temporary folder: a notebook is executed against the
    package as it is now, never taken from an earlier run's cache.
    """
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_nb")
    out = tmp_path_factory.mktemp("site")
    html = out / "html"
    command = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-b",
        "html",
        "-D",
        f"nb_execution_cache_path={out / 'jupyter_cache'}",
        str(ROOT / "docs"),
        str(html),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    return Site(
        html=html,
        executed=out / "jupyter_execute",
        returncode=result.returncode,
        log=result.stdout + result.stderr,
    )
