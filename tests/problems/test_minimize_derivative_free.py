"""`minimize` when the objective's gradient cannot be built: derivative-free forward solves,
``method="auto"``, and the build-time error for the implicit gradient of such a solution."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pytensor.compile.ops import wrap_py
from pytensor.gradient import grad_undefined
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from scipy import optimize

import pymc_optim as pmo

A_VALUE = np.array([1.0, -2.0, 0.5])


def _numpy_objective(v, a):
    return float(np.sum(np.log(np.cosh(v - a))) + 0.1 * np.sum((v - a) ** 2))


@wrap_py(itypes=[pt.dvector], otypes=[pt.dscalar])
def opaque_loss(d):
    """log cosh + quadratic in numpy: an Op with no gradient at all (NotImplementedError)."""
    return np.asarray(np.sum(np.log(np.cosh(d))) + 0.1 * np.sum(d**2))


class UndefinedGradientLoss(Op):
    """The same loss, declaring its gradient undefined (pytensor's NullType route)."""

    def make_node(self, d):
        d = pt.as_tensor_variable(d)
        return Apply(self, [d], [pt.dscalar()])

    def perform(self, node, inputs, output_storage):
        (d,) = inputs
        output_storage[0][0] = np.asarray(np.sum(np.log(np.cosh(d))) + 0.1 * np.sum(d**2))

    def pullback(self, inputs, outputs, output_grads):
        return [grad_undefined(self, 0, inputs[0], "a black-box loss")]


LOSSES = {"not-implemented": opaque_loss, "undefined": UndefinedGradientLoss()}


def problem(loss="not-implemented"):
    x, a = pt.dvector("x", shape=(3,)), pt.dvector("a", shape=(3,))
    return LOSSES[loss](x - a), x, a


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("method", ["Nelder-Mead", "Powell", "COBYLA"])
def test_derivative_free_methods_solve_without_a_gradient(method, loss):
    objective, x, a = problem(loss)
    options = {"tol": 1e-10, "options": {"maxiter": 20_000}}
    x_star, success = pmo.minimize(
        objective, x, x0=np.zeros(3), method=method, optimizer_kwargs=options
    )
    x_val, ok = pytensor.function([a], [x_star, success])(A_VALUE)
    direct = optimize.minimize(
        _numpy_objective, np.zeros(3), args=(A_VALUE,), method=method, **options
    )
    assert ok and direct.success
    assert_allclose(x_val, direct.x, rtol=1e-12, atol=1e-12)  # the same algorithm on the same f
    assert_allclose(x_val, A_VALUE, atol=1e-4)  # the minimizer is x* = a


def test_auto_warns_which_method_it_picked_and_why():
    objective, x, a = problem()
    with pytest.warns(pmo.PymcOptimWarning, match=r"chose 'Powell' \(derivative-free\).*cannot "):
        x_star, success = pmo.minimize(objective, x, x0=np.zeros(3), method="auto")
    assert x_star.owner.op.method == "Powell"
    x_val, ok = pytensor.function([a], [x_star, success])(A_VALUE)
    assert ok
    assert_allclose(x_val, A_VALUE, atol=1e-4)


def test_auto_uses_bfgs_silently_when_the_gradient_exists():
    x, a = pt.dvector("x", shape=(3,)), pt.dvector("a", shape=(3,))
    objective = pt.log(pt.cosh(x - a)).sum() + 0.1 * ((x - a) ** 2).sum()
    x_star, _ = pmo.minimize(objective, x, x0=np.zeros(3), method="auto")  # warnings are errors
    assert x_star.owner.op.method == "BFGS"
    grad = pytensor.function([a], pt.grad(x_star.sum(), a))(A_VALUE)
    assert_allclose(grad, np.ones(3), rtol=1e-4)  # x* = a


@pytest.mark.parametrize("method", ["BFGS", "trust-ncg", "newton"])
def test_gradient_methods_refuse_an_objective_without_gradient(method):
    objective, x, _ = problem()
    with pytest.raises(ValueError, match=rf"`method` '{method}' needs the objective's gradient.*"
                       r"pullback not implemented.*'Nelder-Mead', 'Powell'.*'auto'"):  # fmt: skip
        pmo.minimize(objective, x, x0=np.zeros(3), method=method)


def test_auto_refuses_jac_and_hess_choices():
    objective, x, _ = problem()
    with pytest.raises(ValueError, match=r"`method='auto'` chooses BFGS or Powell itself"):
        pmo.minimize(objective, x, x0=np.zeros(3), method="auto", jac=False)


def test_scipy_finite_differences_remain_available_with_jac_false():
    objective, x, a = problem()
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(3), method="BFGS", jac=False)
    x_val, ok = pytensor.function([a], [x_star, success])(A_VALUE)
    assert ok
    assert_allclose(x_val, A_VALUE, atol=1e-4)


@pytest.mark.parametrize("loss", LOSSES)
def test_implicit_gradient_of_such_a_solution_is_refused_when_the_graph_is_built(loss):
    objective, x, a = problem(loss)
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(3), method="Powell")
    with pytest.raises(
        NotImplementedError,
        match=r"needs the objective's derivatives .* gradient cannot be built",
    ):
        pt.grad(x_star.sum(), a)
    # the forward solve and its diagnostics are unaffected
    value = pytensor.function([a], pmo.solution_info(x_star).value)(A_VALUE)
    assert_allclose(value, 0.0, atol=1e-8)  # log cosh 0 + 0 at x* = a


def test_pymc_model_evaluates_logp_and_refuses_dlogp():
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=3)
        x = pt.dvector("x", shape=(3,))
        x_star, _ = pmo.minimize(opaque_loss(x - a), x, x0=np.zeros(3), method="Powell")
        pm.Potential("pull", -0.5 * ((x_star - 1.0) ** 2).sum())
    point = {"a": A_VALUE}
    expected = (
        -0.5 * np.sum(A_VALUE**2) - 1.5 * np.log(2 * np.pi) - 0.5 * np.sum((A_VALUE - 1) ** 2)
    )
    assert_allclose(model.compile_logp()(point), expected, atol=1e-6)
    with pytest.raises(NotImplementedError, match="needs the objective's derivatives"):
        model.compile_dlogp()


# --- a gradient without second derivatives (pt.prod's) --------------------------------------------
def _prod_objective():
    x, a = pt.vector("x"), pt.vector("a")
    return x, a, 0.01 * pt.prod(x + 3) + (x**2).sum() - (a * x).sum()


def _numpy_prod_objective(v, a):
    return 0.01 * np.prod(v + 3) + np.sum(v**2) - np.sum(a * v)


@pytest.mark.parametrize("method", ["BFGS", "auto", "L-BFGS-B"])
def test_first_order_methods_solve_an_objective_without_second_derivatives(method):
    """The curvature check at x* is skipped (there is no Hessian to check), not a crash at the
    first call."""
    x, a, objective = _prod_objective()
    x_star, success = pmo.minimize(objective, x, x0=pt.zeros_like(a), method=method)
    found, ok = pytensor.function([a], [x_star, success])(A_VALUE)
    expected = optimize.minimize(_numpy_prod_objective, np.zeros(3), args=(A_VALUE,), tol=1e-10).x
    assert ok
    assert_allclose(found, expected, atol=1e-5)  # BFGS's gtol 1e-5 on a curvature ~2


@pytest.mark.parametrize("method", ["newton", "Newton-CG", "trust-ncg"])
def test_second_order_methods_refuse_an_objective_without_second_derivatives(method):
    x, a, objective = _prod_objective()
    with pytest.raises(ValueError, match=f"`method` '{method}' uses the objective's second"):
        pmo.minimize(objective, x, x0=pt.zeros_like(a), method=method)


def test_implicit_gradient_without_second_derivatives_is_refused_when_the_graph_is_built():
    x, a, objective = _prod_objective()
    x_star, _ = pmo.minimize(objective, x, x0=pt.zeros_like(a), method="BFGS")
    with pytest.raises(NotImplementedError, match="objective's Hessian for `minimize`.*prod"):
        pt.grad(x_star.sum(), a)
