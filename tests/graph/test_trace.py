"""Opt-in solver traces (`optimizer_kwargs={"trace": ...}` and `pmo.solver_trace`).

Every logged evaluation is checked against the objective, gradient or residual recomputed in
numpy at the logged point, and the counts against what scipy reported for the same solve.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pytensor.graph.replace import vectorize_graph

import pymc_optim as pmo
from pymc_optim.backends.scipy.ops import MinimizeOp

A_VALUE = np.array([1.0, -2.0, 0.5])


def f_numpy(z, a):
    return np.sum(np.exp(z) - a * z) + 0.5 * np.sum(z**2)


def grad_numpy(z, a):
    return np.exp(z) - a + z


def traced_minimize(trace=True, method="BFGS"):
    x, a = pt.dvector("x", shape=(3,)), pt.dvector("a", shape=(3,))
    objective = (pt.exp(x) - a * x).sum() + 0.5 * (x**2).sum()
    x_star, success = pmo.minimize(
        objective, x, x0=np.zeros(3), method=method, optimizer_kwargs={"trace": trace}
    )
    return x_star, success, a


def test_minimize_trace_logs_every_evaluation_with_its_value_and_gradient_norm():
    x_star, success, a = traced_minimize()
    info = pmo.solution_info(x_star)
    fn = pytensor.function([a], [x_star, success, info.n_iterations, info.n_evaluations])
    x_val, ok, nit, nfev = fn(A_VALUE)
    (trace,) = pmo.solver_trace(x_star)

    assert ok and trace.success
    assert (trace.n_iterations, trace.n_evaluations) == (nit, nfev)
    assert trace.x.shape == (nfev, 3)  # BFGS evaluates value and gradient together, nfev times
    assert_allclose(trace.x[0], np.zeros(3))
    assert_allclose(trace.value, [f_numpy(z, A_VALUE) for z in trace.x], rtol=1e-12)
    norms = [np.linalg.norm(grad_numpy(z, A_VALUE)) for z in trace.x]
    assert_allclose(trace.gradient_norm, norms, rtol=1e-10)
    assert trace.gradient_norm[-1] < 1e-5  # scipy's default gtol, met at the end
    assert_allclose(trace.params[0], A_VALUE)
    assert_allclose(trace.x_star[0], x_val)
    assert_allclose(trace.x0[0], np.zeros(3))
    assert "Optimization terminated successfully" in trace.message


def test_one_trace_per_solve_and_only_the_latest_n_are_kept():
    x_star, _, a = traced_minimize(trace=2)
    fn = pytensor.function([a], x_star)
    for shift in (0.0, 1.0, 2.0):
        fn(A_VALUE + shift)
    traces = pmo.solver_trace(x_star)
    assert [t.params[0][0] for t in traces] == [A_VALUE[0] + 1.0, A_VALUE[0] + 2.0]


def test_derivative_free_solves_log_values_without_gradient_norms():
    x_star, _, a = traced_minimize(method="Nelder-Mead")
    pytensor.function([a], x_star)(A_VALUE)
    (trace,) = pmo.solver_trace(x_star)
    assert len(trace.value) == trace.n_evaluations
    assert np.all(np.isnan(trace.gradient_norm))
    assert_allclose(trace.value, [f_numpy(z, A_VALUE) for z in trace.x], rtol=1e-12)


def test_root_trace_logs_residual_norms():
    x, a = pt.dvector("x", shape=(2,)), pt.dscalar("a")
    equations = pt.stack([x[0] ** 3 + x[1] - a, x[1] - 2 * x[0]])
    x_star, success = pmo.root(equations, x, x0=[1.0, 1.0], optimizer_kwargs={"trace": True})
    x_val, ok = pytensor.function([a], [x_star, success])(3.0)
    (trace,) = pmo.solver_trace(x_star)

    def residual(z):
        return np.array([z[0] ** 3 + z[1] - 3.0, z[1] - 2 * z[0]])

    assert ok and trace.success
    assert_allclose(trace.value, [np.linalg.norm(residual(z)) for z in trace.x], rtol=1e-12)
    assert trace.value[-1] < 1e-8
    assert np.all(np.isnan(trace.gradient_norm))
    assert "converged" in trace.message


def test_a_failing_scalar_solve_records_why_it_failed():
    x, a = pt.dscalar("x"), pt.dscalar("a")
    x_star, success = pmo.root_scalar(
        x**2 + a, x, method="brentq", bracket=(-1.0, 1.0), optimizer_kwargs={"trace": True}
    )
    x_val, ok = pytensor.function([a], [x_star, success])(1.0)  # x² + 1 has no root
    (trace,) = pmo.solver_trace(x_star)
    assert not ok and not trace.success and np.isnan(x_val)
    assert "ValueError" in trace.message and "different signs" in trace.message
    assert_allclose(trace.value, [2.0, 2.0])  # |F| at the two ends of the bracket


def test_minimize_scalar_trace():
    x, a = pt.dscalar("x"), pt.dscalar("a")
    x_star, _ = pmo.minimize_scalar(
        (x - a) ** 2, x, bracket=(0.0, 1.0), optimizer_kwargs={"trace": True}
    )
    pytensor.function([a], x_star)(2.0)
    (trace,) = pmo.solver_trace(x_star)
    assert trace.success and len(trace.value) == trace.n_evaluations
    assert_allclose(trace.value, (trace.x[:, 0] - 2.0) ** 2, rtol=1e-12)


def test_vectorized_solves_record_one_trace_per_problem():
    x_star, _, a = traced_minimize()
    a_batch = pt.dmatrix("a_batch")
    xs = vectorize_graph(x_star, {a: a_batch})
    pytensor.function([a_batch], xs)(np.stack([A_VALUE, A_VALUE + 1.0]))
    traces = pmo.solver_trace(xs)
    assert len(traces) == 2
    assert_allclose([t.params[0] for t in traces], [A_VALUE, A_VALUE + 1.0])


def test_traced_scalar_solves_are_not_rewritten():
    x, a = pt.dscalar("x"), pt.dscalar("a")
    x_star, _ = pmo.minimize((x - a) ** 2, x, x0=0.0, optimizer_kwargs={"trace": True})
    fn = pytensor.function([a], x_star)
    assert any(isinstance(n.op, MinimizeOp) for n in fn.maker.fgraph.toposort())
    fn(1.0)
    assert len(pmo.solver_trace(x_star)) == 1


def test_untraced_solves_record_nothing_and_traces_do_not_pickle():
    x_star, _, a = traced_minimize(trace=False)
    pytensor.function([a], x_star)(A_VALUE)
    assert "_traces" not in x_star.owner.op.__dict__
    with pytest.raises(ValueError, match=r"records no trace; build it with .*'trace': True"):
        pmo.solver_trace(x_star)

    traced, _, a = traced_minimize()
    pytensor.function([a], traced)(A_VALUE)
    copy = pickle.loads(pickle.dumps(traced.owner.op))
    assert len(pmo.solver_trace(traced)) == 1 and "_traces" not in copy.__dict__


def test_trace_arguments_are_validated_when_the_graph_is_built():
    with pytest.raises(ValueError, match=r"`optimizer_kwargs\['trace'\]` must be True, False or"):
        traced_minimize(trace=0)
    with pytest.raises(TypeError, match="must be a solution returned by a pymc_optim solver"):
        pmo.solver_trace(pt.dvector("y"))


def test_graph_native_solves_report_iterations_and_final_residual():
    # under numba/JAX the Newton loop is compiled, with no Python to log from: solution_info is
    # its trace there (its outputs under numba are tested in test_numba)
    x, a = pt.dvector("x", shape=(2,)), pt.dscalar("a")
    equations = pt.stack([x[0] ** 3 + x[1] - a, x[1] - 2 * x[0]])
    x_star, success = pmo.root(equations, x, x0=[1.0, 1.0], method="newton")
    info = pmo.solution_info(x_star)
    fn = pytensor.function([a], [x_star, success, info.value, info.n_iterations])
    x_val, ok, residual, nit = fn(3.0)
    z = x_val
    assert ok and 1 <= nit <= 20
    assert_allclose(residual, np.linalg.norm([z[0] ** 3 + z[1] - 3.0, z[1] - 2 * z[0]]), atol=1e-15)
    assert residual < 1e-8
    with pytest.raises(ValueError, match=r"takes only 'tol' and 'max_iter'; got \['trace'\]"):
        pmo.root(equations, x, x0=[1.0, 1.0], method="newton", optimizer_kwargs={"trace": True})
