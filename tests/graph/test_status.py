"""Why a solve ended (mirrors pymc_optim/graph/status.py): the `status` output of every solver,
the same code for the same failure in every backend."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode
from pytensor.graph.replace import vectorize_graph

import pymc_optim as pmo
from pymc_optim.graph.status import SolverStatus, status_names

pytest.importorskip("jax")

MODES = {"C": Mode(linker="cvm", optimizer="fast_run"), "NUMBA": "NUMBA", "JAX": "JAX"}
#: pytensor says so each time a scipy-backed Op is compiled for NUMBA.
NUMBA_OBJECT_MODE = "ignore:Numba will use object mode to run .*perform method:UserWarning"


def _problems(a, b, x):
    """One Newton or fixed-point solve per reason, at a = 1, b = -1."""
    newton = {"method": "newton"}
    return {
        "converged": pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(3), **newton),
        "max_iter": pmo.root(
            x**3 + x - a, x, x0=np.full(3, 5.0), optimizer_kwargs={"max_iter": 2}, **newton
        ),
        # b < 0 makes the objective NaN everywhere
        "nonfinite": pmo.minimize(
            pt.switch(b > 0, ((x - a) ** 2).sum(), np.nan), x, x0=np.zeros(3), **newton
        ),
        # finite at x0 = 0 only: every trial step is rejected
        "line_search_failed": pmo.minimize(
            ((x - a) ** 2).sum() + pt.switch(pt.all(pt.eq(x, 0.0)), 0.0, np.nan),
            x,
            x0=np.zeros(3),
            **newton,
        ),
        # x0 = a is the maximum
        "not_positive_definite": pmo.minimize(-((x - a) ** 2).sum(), x, x0=np.ones(3), **newton),
        # x² + 1 = 0 has no root: the first step lands on x = 0, where A = 2x is singular
        "singular": pmo.root(x**2 + a**2, x, x0=1.0, **newton),
        # sigma = b < 0: PyMC's parameter check is false
        "invalid_parameters": pmo.minimize(
            -pm.logp(pm.Normal.dist(a, b), x).sum(), x, x0=np.zeros(3), **newton
        ),
        "fixed_point_max_iter": pmo.fixed_point(0.9 * pt.cos(a * x), x, x0=0.0, max_iter=3),
        "fixed_point_nonfinite": pmo.fixed_point(
            pt.switch(b > 0, 0.5 * x, np.nan), x, x0=np.ones(3)
        ),
        "anderson_nonfinite": pmo.fixed_point(
            pt.switch(b > 0, 0.5 * x, np.nan) + a, x, x0=np.ones(3), method="anderson"
        ),
        # the check is −inf in the update, exp(−inf) = 0: the loop converges, on a problem
        # that is undefined
        "fixed_point_invalid_parameters": pmo.fixed_point(
            0.5 * x + 0.1 * pt.exp(pm.logp(pm.Normal.dist(x, b), a)), x, x0=np.ones(3)
        ),
    }


EXPECTED = {
    "converged": "converged",
    "max_iter": "max_iter",
    "nonfinite": "nonfinite",
    "line_search_failed": "line_search_failed",
    "not_positive_definite": "not_positive_definite",
    "singular": "singular",
    "invalid_parameters": "invalid_parameters",
    "fixed_point_max_iter": "max_iter",
    "fixed_point_nonfinite": "nonfinite",
    "anderson_nonfinite": "nonfinite",
    "fixed_point_invalid_parameters": "invalid_parameters",
}


@pytest.fixture(scope="module")
def solved():
    """Each mode's (x*, success, n_iterations, n_evaluations, status) per problem."""
    a, b = pt.vector("a", shape=(3,)), pt.scalar("b")
    x = pt.vector("x", shape=(3,))
    problems = _problems(a, b, x)
    outputs = []
    for x_star, _ in problems.values():
        info = pmo.solution_info(x_star)
        outputs += [x_star, info.success, info.n_iterations, info.n_evaluations, info.status]
    results = {}
    for name, mode in MODES.items():
        values = pytensor.function([a, b], outputs, mode=mode)(np.ones(3), -1.0)
        results[name] = {p: values[5 * i : 5 * i + 5] for i, p in enumerate(problems)}
    return results


@pytest.mark.parametrize("problem", list(EXPECTED))
def test_every_backend_reports_the_same_reason(solved, problem):
    for mode, results in solved.items():
        x_star, success, n_iterations, n_evaluations, status = results[problem]
        assert status_names(status) == EXPECTED[problem], mode
        assert bool(success) == (EXPECTED[problem] == "converged"), mode
        reference = solved["C"][problem]
        np.testing.assert_allclose(x_star, reference[0], rtol=1e-12, err_msg=mode)
        assert int(n_iterations) == int(reference[2]), mode


@pytest.mark.parametrize("mode", list(MODES))
def test_a_batch_reports_a_reason_per_problem(mode):
    """A vectorized Newton solve (one stacked problem, decided per problem): problem 0
    converges, problem 1 has b < 0 (a NaN objective), problem 2 runs out of iterations (far
    from x0, Newton gains a third of the distance per step on the quartic)."""
    a, b = pt.vector("a", shape=(3,)), pt.scalar("b")
    x = pt.vector("x", shape=(3,))
    x_star, _ = pmo.minimize(
        pt.switch(b > 0, ((x - b * a) ** 2 + (x - b * a) ** 4).sum(), np.nan),
        x,
        x0=np.zeros(3),
        method="newton",
        optimizer_kwargs={"max_iter": 3},
    )
    info = pmo.solution_info(x_star)
    bs = pt.vector("bs", shape=(3,))
    batched = vectorize_graph([info.success, info.status], {b: bs})
    fn = pytensor.function([a, bs], batched, mode=MODES[mode])
    success, status = fn(np.ones(3), np.array([0.01, -1.0, 20.0]))
    assert success.tolist() == [True, False, False]
    assert status_names(status).tolist() == ["converged", "nonfinite", "max_iter"]


@pytest.mark.filterwarnings(NUMBA_OBJECT_MODE)
@pytest.mark.parametrize("mode", ["C", "NUMBA"])
def test_a_raising_assert_is_invalid_parameters(mode):
    """An Assert of the problem's graph raises: the C backend catches it by class, numba (which
    catches no exception by class) any exception of the compiled solve."""
    from pytensor.raise_op import Assert

    a, b = pt.vector("a", shape=(3,)), pt.scalar("b")
    x = pt.vector("x", shape=(3,))
    x_star, _ = pmo.minimize(
        Assert("b > 0")(((x - a) ** 2).sum(), b > 0), x, x0=np.zeros(3), method="newton"
    )
    info = pmo.solution_info(x_star)
    fn = pytensor.function([a, b], [x_star, info.success, info.status], mode=MODES[mode])
    x_value, success, status = fn(np.ones(3), -1.0)
    assert not success and status == SolverStatus.INVALID_PARAMETERS
    assert np.isnan(x_value).all()
    assert fn(np.ones(3), 1.0)[2] == SolverStatus.CONVERGED


def test_status_names_and_messages():
    assert status_names(0) == "converged"
    assert status_names(np.array([[1, 6]])).tolist() == [["max_iter", "invalid_parameters"]]
    assert pmo.SolverInfo.Status is SolverStatus
    assert all(code.message for code in SolverStatus)
    with pytest.raises(ValueError, match="99 is not a valid SolverStatus"):
        status_names(99)


def test_unpacking_solution_info_gives_the_four_diagnostics():
    x, a = pt.scalar("x"), pt.scalar("a")
    x_star, _ = pmo.minimize((x - a) ** 2, x, x0=0.0)
    info = pmo.solution_info(x_star)
    success, value, n_iterations, n_evaluations = info
    assert info.status.type.dtype == "int64"
    assert info.status.owner is x_star.owner


def test_scipy_methods_report_scipys_failure_and_its_message():
    """Where scipy gives up, the status is `SOLVER_FAILED` and scipy's message is the solve's
    trace message; a returned point that is not finite is `NONFINITE`; a BFGS point that is a
    maximum is `NOT_POSITIVE_DEFINITE`; an exception of scipy's own ends as `SOLVER_FAILED`."""
    a, s = pt.vector("a", shape=(2,)), pt.scalar("s")
    x = pt.vector("x", shape=(2,))
    trace = {"trace": True}
    budget, _ = pmo.minimize(
        ((x - a) ** 4).sum(),
        x,
        x0=np.zeros(2),
        method="BFGS",
        optimizer_kwargs={"options": {"maxiter": 2}, **trace},
    )
    # x0 is the maximum: scipy stops at once (a zero gradient), the curvature check refuses
    maximum, _ = pmo.minimize(-((x - 10.0) ** 2).sum(), x, x0=np.full(2, 10.0), method="BFGS")
    bracket, _ = pmo.root_scalar(
        s**2 + 1.0, s, bracket=(0.0, 1.0), method="brentq", optimizer_kwargs=trace
    )
    statuses = [pmo.solution_info(v).status for v in (budget, maximum, bracket)]
    fn = pytensor.function([a], statuses, mode=MODES["C"])
    got = status_names(np.array(fn(10 * np.ones(2))))
    assert got.tolist() == ["solver_failed", "not_positive_definite", "solver_failed"]
    (last,) = pmo.solver_trace(budget)
    assert last.status == SolverStatus.SOLVER_FAILED
    assert "Maximum number of iterations" in last.message
    (last,) = pmo.solver_trace(bracket)
    assert last.status == SolverStatus.SOLVER_FAILED and "different signs" in last.message
