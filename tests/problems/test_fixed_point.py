"""fixed_point: values and implicit gradients for every method, against closed forms and FD."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

import pymc_optim as pmo

METHODS = ["iteration", "anderson", "newton"]


def dottie(a):
    """x = b cos(a x) at b = 0.9: solved to 1e-14 by scipy's brentq as the reference."""
    from scipy.optimize import brentq

    return np.array(
        [brentq(lambda z, ai=ai: z - 0.9 * np.cos(ai * z), -2, 2, xtol=1e-14) for ai in a]
    )


@pytest.mark.parametrize("method", METHODS)
def test_values_and_gradient_match_closed_form(method):
    x, a = pt.vector("x"), pt.vector("a")
    x_star, success = pmo.fixed_point(0.9 * pt.cos(a * x), x, x0=np.zeros(3), method=method)
    fn = pytensor.function([a], [x_star, success, pt.grad(x_star.sum(), a)])
    a_val = np.array([1.0, 0.5, 0.7])
    value, ok, grad = fn(a_val)
    assert ok
    z = dottie(a_val)
    assert_allclose(value, z, atol=1e-7)
    # implicit function theorem by hand: dz/da = -0.9 z sin(a z) / (1 + 0.9 a sin(a z))
    analytic = -0.9 * z * np.sin(a_val * z) / (1 + 0.9 * a_val * np.sin(a_val * z))
    assert_allclose(grad, analytic, rtol=1e-6)
    # central differences with step 1e-5: truncation O(1e-10), solver noise 1e-8/1e-5 = 1e-3 of
    # tol, so compare at 1e-5 relative
    eps = 1e-5
    fd = [
        (fn(a_val + eps * e)[0].sum() - fn(a_val - eps * e)[0].sum()) / (2 * eps) for e in np.eye(3)
    ]
    assert_allclose(grad, fd, rtol=1e-5)


def test_iteration_reports_failure_on_a_non_contraction():
    x, a = pt.scalar("x"), pt.scalar("a")
    # T(x) = 2x + a repels from its fixed point -a: the iterates double away from it
    x_star, success = pmo.fixed_point(2.0 * x + a, x, x0=0.0, max_iter=200)
    value, ok = pytensor.function([a], [x_star, success])(1.0)
    assert not ok
    assert np.isfinite(value)


def test_newton_solves_what_iteration_cannot():
    x, a = pt.scalar("x"), pt.scalar("a")
    x_star, success = pmo.fixed_point(a * pt.cos(x), x, x0=0.5, method="newton")
    value, ok = pytensor.function([a], [x_star, success])(3.0)
    assert ok
    assert_allclose(value, 3.0 * np.cos(value), atol=1e-8)


def test_bad_input():
    x = pt.vector("x")
    with pytest.raises(ValueError, match="`update` must be shaped like `x`"):
        pmo.fixed_point(x.sum(), x)
    with pytest.raises(ValueError, match="not a method of `fixed_point`"):
        pmo.fixed_point(pt.cos(x), x, method="value_iteration")
    with pytest.raises(ValueError, match="`tol` must be positive"):
        pmo.fixed_point(pt.cos(x), x, tol=0.0)


@pytest.fixture(scope="module")
def unrolled_gradient():
    """An independent route: 60 sweeps of x <- T(x) written out as a graph and differentiated
    through every sweep. The contraction modulus is at most 0.9·0.7 = 0.63 here, so the
    truncation error of the derivative, ~60·0.63^60 ≈ 5e-11, is far below the tolerance."""
    a = pt.vector("a")
    z = pt.zeros(3)
    for _ in range(60):
        z = 0.9 * pt.cos(a * z)
    return pytensor.function([a], pt.grad((z**2).sum(), a))


@pytest.mark.parametrize("method", METHODS)
def test_implicit_gradient_matches_differentiating_the_unrolled_iteration(
    method, unrolled_gradient
):
    x, a = pt.vector("x"), pt.vector("a")
    a_val = np.array([1.0, 0.5, 0.7])
    x_star, _ = pmo.fixed_point(0.9 * pt.cos(a * x), x, x0=np.zeros(3), method=method)
    implicit = pytensor.function([a], pt.grad((x_star**2).sum(), a))(a_val)
    assert_allclose(implicit, unrolled_gradient(a_val), rtol=1e-7)


@pytest.mark.parametrize("method", ["iteration", "anderson", "newton"])
def test_an_update_of_another_size_at_run_time_gives_success_false(method):
    # T(x) has a's size, known only at run time
    x, a = pt.vector("x"), pt.vector("a")
    x_star, success = pmo.fixed_point(0.5 * a + 0.1 * x.sum(), x, x0=np.zeros(3), method=method)
    x_value, ok = pytensor.function([a], [x_star, success])(np.ones(2))
    assert not ok
    assert x_value.shape == (3,)
