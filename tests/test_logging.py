"""`pymc_optim._logging`: a first numba or JAX compilation of a solver loop says that it is
compiling (it can take minutes, and a silent sampler looks hung), once per process."""

import logging

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo
from pymc_optim import _logging


@pytest.mark.parametrize("mode, backend", [("NUMBA", "numba"), ("JAX", "JAX")])
def test_the_first_compilation_of_a_solver_loop_says_it_is_compiling(
    mode, backend, caplog, monkeypatch
):
    pytest.importorskip(backend.lower())
    monkeypatch.setattr(_logging, "_announced", set())  # as in a new process
    a = pt.vector("a", shape=(2,))
    x = pt.vector("x", shape=(2,))
    x_star, _ = pmo.minimize((pt.exp(x) - a * x).sum(), x, x0=np.zeros(2), method="newton")
    with caplog.at_level(logging.INFO, logger="pymc_optim"):
        first = pytensor.function([a], x_star, mode=mode)
        pytensor.function([a], 2 * x_star, mode=mode)  # a second compilation: no repeat
    said = [r.getMessage() for r in caplog.records if r.name == "pymc_optim"]
    assert len(said) == 1, said
    assert said[0].startswith(f"pymc_optim: compiling a graph-native NewtonOp solve for {backend}")
    np.testing.assert_allclose(first(np.array([2.0, 3.0])), np.log([2.0, 3.0]), rtol=1e-10)
