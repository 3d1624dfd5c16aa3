"""method='newton' (graph-native) agrees with scipy and closed forms, for every structure."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

import pymc_optim as pmo


def softplus_problem():
    """min Σ exp(x) − a x + x²/2: separable, x* solves exp(x) + x = a."""
    x, a = pt.vector("x"), pt.vector("a")
    return (pt.exp(x) - a * x + 0.5 * x**2).sum(), x, a


@pytest.mark.parametrize(
    "structure, block_size", [("dense", None), ("diagonal", None), ("block_diagonal", 2)]
)
def test_minimize_newton_matches_bfgs_for_every_structure(structure, block_size):
    objective, x, a = softplus_problem()
    a_val = np.array([1.0, 2.0, 3.0, 4.0])
    results = []
    for method in ["newton", "BFGS"]:
        x_star, ok = pmo.minimize(
            objective,
            x,
            x0=np.zeros(4),
            method=method,
            structure=structure,
            block_size=block_size,
            optimizer_kwargs={"options": {"gtol": 1e-12}} if method == "BFGS" else None,
        )
        results.append(pytensor.function([a], [x_star, ok, pt.grad(x_star.sum(), a)])(a_val))
    (xn, okn, gn), (xb, okb, gb) = results
    assert okn and okb
    assert_allclose(xn, xb, atol=1e-8)
    assert_allclose(np.exp(xn) + xn, a_val, atol=1e-8)
    assert_allclose(gn, 1 / (np.exp(xn) + 1), rtol=1e-8)  # dx*/da = 1/(e^x + 1)
    assert_allclose(gn, gb, rtol=1e-6)


def test_block_structure_couples_within_blocks():
    """A block-diagonal Hessian with non-zero off-diagonal entries inside each 2x2 block."""
    x, a = pt.vector("x"), pt.vector("a")
    pairs = x.reshape((-1, 2))
    objective = (pt.exp(pairs).sum() + 0.5 * (pairs[:, 0] - pairs[:, 1]) ** 2).sum() - (a * x).sum()
    a_val = np.array([1.0, 2.0, 3.0, 5.0, 2.5, 2.0])
    out = {}
    for structure, block_size in [("dense", None), ("block_diagonal", 2)]:
        x_star, ok = pmo.minimize(
            objective,
            x,
            x0=np.zeros(6),
            method="newton",
            structure=structure,
            block_size=block_size,
        )
        out[structure] = pytensor.function([a], [x_star, ok, pt.grad((x_star**2).sum(), a)])(a_val)
    assert out["dense"][1] and out["block_diagonal"][1]
    assert_allclose(out["dense"][0], out["block_diagonal"][0], atol=1e-10)
    assert_allclose(out["dense"][2], out["block_diagonal"][2], rtol=1e-10)


def test_root_and_scalar_newton():
    x, a = pt.vector("x"), pt.vector("a")
    x_star, ok = pmo.root(x**3 + x - a, x, x0=np.zeros(2), method="newton", structure="diagonal")
    value, success, grad = pytensor.function([a], [x_star, ok, pt.grad(x_star.sum(), a)])(
        np.array([2.0, 10.0])
    )
    assert success
    assert_allclose(value, [1.0, 2.0], atol=1e-10)
    assert_allclose(grad, 1 / (3 * value**2 + 1), rtol=1e-10)

    s, c = pt.scalar("s"), pt.scalar("c")
    s_star, ok = pmo.root_scalar(s**3 - c, s, x0=1.0, method="newton")
    assert_allclose(pytensor.function([c], s_star)(27.0), 3.0, atol=1e-10)
    m_star, ok = pmo.minimize_scalar((s - c) ** 2 + pt.exp(s), s, x0=0.0, method="newton")
    value = pytensor.function([c], m_star)(2.0)
    assert_allclose(2 * (value - 2.0) + np.exp(value), 0.0, atol=1e-8)


def test_failure_is_data():
    """max_iter reached, NaN objective and a singular Jacobian give success=False, no crash."""
    x, a = pt.vector("x"), pt.scalar("a")
    x_star, ok = pmo.minimize(
        (pt.exp(x) - a * x).sum(),
        x,
        x0=np.zeros(2),
        method="newton",
        optimizer_kwargs={"max_iter": 1},
    )
    value, success = pytensor.function([a], [x_star, ok])(100.0)
    assert not success and np.all(np.isfinite(value))

    x_star, ok = pmo.minimize((pt.log(x) * a + x**2).sum(), x, x0=-np.ones(2), method="newton")
    _, success = pytensor.function([a], [x_star, ok])(1.0)
    assert not success

    # x² + a = 0 at x0 = 0: the Jacobian 2x is singular at the start
    x_star, ok = pmo.root(x**2 + a, x, x0=np.zeros(2), method="newton")
    value, success = pytensor.function([a], [x_star, ok])(1.0)
    assert not success and np.all(np.isfinite(value))


def test_newton_options_are_checked():
    objective, x, _ = softplus_problem()
    with pytest.raises(ValueError, match="takes only 'tol' and 'max_iter'"):
        pmo.minimize(objective, x, method="newton", optimizer_kwargs={"gtol": 1e-3})
    with pytest.raises(ValueError, match="needs `block_size`"):
        pmo.minimize(objective, x, method="newton", structure="block_diagonal")
    with pytest.raises(ValueError, match="`structure` must be one of"):
        pmo.minimize(objective, x, method="newton", structure="sparse")


@pytest.mark.parametrize(
    "structure, block_size", [("dense", None), ("diagonal", None), ("block_diagonal", 2)]
)
def test_a_stationary_point_that_is_not_a_minimum_is_not_success(structure, block_size):
    """At x = 0, ((x² − 1)²) is stationary (F = 0) with negative curvature: a local maximum.
    Only a positive definite Hessian makes a stationary point a minimum."""
    x, a = pt.vector("x"), pt.vector("a")
    objective = (((x - a) ** 2 - 1) ** 2).sum()
    x_star, ok = pmo.minimize(
        objective, x, x0=np.zeros(4), method="newton", structure=structure, block_size=block_size
    )
    info = pmo.solution_info(x_star)
    fn = pytensor.function([a], [x_star, ok, info.n_iterations])
    value, success, n_iterations = fn(np.zeros(4))
    assert not success
    assert_allclose(value, 0.0)  # where it stopped: F = 0 there
    assert n_iterations == 0
    # started off the maximum, it leaves it and finds the minima x = ±1 (+ a)
    value, success, _ = fn(np.array([0.3, -0.3, 0.3, -0.3]))
    assert success
    # max|F| ≤ 1e-8 with curvature 8 at the minimum: |x − x*| ≤ 1.25e-9
    assert_allclose(np.abs(value - np.array([0.3, -0.3, 0.3, -0.3])), 1.0, atol=1.25e-9)


def test_scalar_minimization_at_a_maximum_is_not_success():
    s, c = pt.scalar("s"), pt.scalar("c")
    s_star, ok = pmo.minimize_scalar(((s - c) ** 2 - 1) ** 2, s, x0=0.0, method="newton")
    assert not pytensor.function([c], ok)(0.0)


def test_the_rounding_stop_does_not_depend_on_a_constant_offset():
    """1e12 + f(x) has the minimizer of f; its decrease is invisible next to 1e12 from the first
    steps on, so Newton must go on with full steps that reduce the gradient, not stop."""
    x, c = pt.vector("x"), pt.scalar("c")
    f = 1e-7 * pt.cosh(x - 10.0).sum()
    results = []
    for objective in [f + c, 1e12 + f + c]:
        # tol on F = 1e-7 sinh(x − 10): |x − 10| ≤ tol / 1e-7 = 1e-6 at convergence
        x_star, ok = pmo.minimize(
            objective, x, x0=np.zeros(3), method="newton", optimizer_kwargs={"tol": 1e-13}
        )
        info = pmo.solution_info(x_star)
        results.append(pytensor.function([c], [x_star, ok, info.n_iterations])(0.0))
    (x_plain, ok_plain, it_plain), (x_offset, ok_offset, it_offset) = results
    assert ok_plain and ok_offset
    assert_allclose(x_offset, 10.0, atol=1e-6)
    assert_allclose(x_offset, x_plain, atol=1e-6)
    assert it_offset > 1
