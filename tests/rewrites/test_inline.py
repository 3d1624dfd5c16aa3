"""One inner solve per evaluation of a Laplace marginal's logp and gradient.

Inlining ``pt.diag`` (an OpFromGraph in the gradient of ``pt.diagonal``, e.g. of a Cholesky
log-determinant) must not copy the solver above it: each surviving copy runs the solve again.
PyTensor 3 inlines without copying the graph above; these tests pin the outcome.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytest

import pymc_optim as pmo
from pymc_optim.backends import iterations as _iterations
from pymc_optim.graph.solver_op import SolverOp

CORRELATION = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, 0.5], [0.2, 0.5, 1.0]])


def _gp_poisson_model():
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        theta = pm.MvNormal("theta", mu=np.zeros(3), cov=s**2 * CORRELATION)
        pm.Poisson("y", mu=np.exp(theta), observed=[1, 3, 2])
    return model


def _solver_nodes(fn) -> int:
    return sum(isinstance(node.op, SolverOp) for node in fn.maker.fgraph.apply_nodes)


@pytest.fixture(scope="module")
def marginal():
    return pmo.marginalize_laplace(_gp_poisson_model(), "theta", hessian_structure="dense")


@pytest.mark.parametrize("mode", ["FAST_RUN", "JAX", "NUMBA"])
def test_marginal_logp_and_gradient_compile_one_solve(marginal, mode):
    with pytensor.config.change_flags(mode=mode):
        fn = marginal.logp_dlogp_function(ravel_inputs=True)._pytensor_function
    assert _solver_nodes(fn) == 1


def test_marginal_logp_and_gradient_call_the_solver_once(marginal, monkeypatch):
    calls = []
    newton = _iterations.newton

    def counted(*args, **kwargs):
        calls.append(1)
        return newton(*args, **kwargs)

    monkeypatch.setattr(_iterations, "newton", counted)
    # the Python solve loop is what is counted: numba compiles the solve to machine code
    with pytensor.config.change_flags(linker="cvm"):
        vg = marginal.logp_dlogp_function(ravel_inputs=True)
    vg.set_extra_values({})
    point = np.array([0.3])
    vg(point)  # compiles the inner functions
    calls.clear()
    logp, dlogp = vg(point)
    assert len(calls) == 1
    assert np.isfinite(logp) and np.all(np.isfinite(dlogp))
