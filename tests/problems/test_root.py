"""Values and implicit gradients of `pymc_optim.root`.

Every (method, problem) case checks x* against the closed form and against a direct call of
`scipy.optimize.root` with the same method and options, and the gradient of the loss
L = Σ w ⊙ x* against the closed-form gradient and against central finite differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from cases import (
    ROOT_PROBLEMS,
    FlatProblem,
    by_name,
    check_gradient_closed_form,
    check_gradient_finite_differences,
    check_value,
    compiled_solve,
    numeric_x0,
)
from numpy.testing import assert_allclose
from pytensor.gradient import jacobian
from scipy import optimize

import pymc_optim as pmo


@dataclass(frozen=True)
class Case:
    """A solver configuration; `x_tol` is the accuracy of x* its stopping rule delivers here.

    `negate` solves −F = 0 instead (same root, same derivative): the mixing methods assume a
    Jacobian close to −I/α and diverge on the problems' positive-definite Jacobians.
    """

    method: str
    optimizer_kwargs: dict
    x_tol: float
    jac: bool = True
    negate: bool = False
    structure: str = "dense"
    problems: tuple[str, ...] = ()
    id: str = field(default="")

    @property
    def label(self) -> str:
        return self.id or self.method

    def equations(self, built):
        if not self.negate:
            return built.output
        return [-e for e in built.output] if isinstance(built.output, list) else -built.output

    def solve(self, built):
        return pmo.root(
            self.equations(built),
            built.x,
            x0=built.x0,
            method=self.method,
            jac=self.jac,
            structure=self.structure,
            optimizer_kwargs=self.optimizer_kwargs,
        )

    @property
    def scipy_case(self) -> Case:
        """The scipy call to compare with: the same one, or lm (exact Jacobian, which unlike hybr
        also reports success on linear problems) for the graph-native "newton"."""
        if self.method == "newton":
            return Case("lm", {"options": {"xtol": 1e-13, "ftol": 1e-13}}, self.x_tol)
        return self


# The quasi-Newton and Krylov methods of scipy.optimize.nonlin stop on ‖F(x̂)‖∞ ≤ fatol; with
# ‖∂F/∂x⁻¹‖ ≲ 3 on these problems, fatol=1e-12 gives ‖x̂ − x*‖ ≲ 3e-12 (1e-11 with margin).
NONLIN = {"options": {"fatol": 1e-12}}
# hybr: xtol bounds the relative size of the last step; convergence is superlinear, so x̂ is
# within ~1e-15 of x* (measured). It is not given the problems linear in x (vector_linear,
# shared_parameter): there MINPACK solves exactly in one step and then reports "not making good
# progress" (success=False, in scipy itself); lm and the quasi-Newton methods cover them.
NONLINEAR = ("scalar_cubic", "matrix_sqrt", "two_variables", "disconnected", "integer_parameter")
HYBR = Case("hybr", {"options": {"xtol": 1e-12}}, 1e-11, problems=(*NONLINEAR, "arcsin"))
CASES = [
    HYBR,
    Case(
        "hybr",
        {"options": {"xtol": 1e-12}},
        1e-11,
        jac=False,
        problems=("matrix_sqrt",),
        id="hybr-no-jac",
    ),
    Case(
        "lm",
        {"options": {"xtol": 1e-13, "ftol": 1e-13}},
        1e-11,
        problems=("two_variables", "vector_linear"),
    ),
    Case("broyden1", NONLIN, 1e-11, problems=("matrix_sqrt",)),
    Case("broyden2", NONLIN, 1e-11, problems=("two_variables",)),
    Case("anderson", NONLIN, 1e-11, problems=("vector_linear",)),
    Case("krylov", NONLIN, 1e-11, problems=("matrix_sqrt",)),
    # a diagonal Jacobian approximation needs a (nearly) diagonal Jacobian
    Case("diagbroyden", NONLIN, 1e-11, problems=("shared_parameter",)),
    Case("linearmixing", NONLIN, 1e-11, negate=True, problems=("arcsin",)),
    Case("excitingmixing", NONLIN, 1e-11, negate=True, problems=("arcsin",)),
    Case("df-sane", {"options": {"fatol": 1e-12, "ftol": 0.0}}, 1e-11, problems=("arcsin",)),
    # the package's graph-native Newton: stops on max|F| ≤ tol, converging quadratically
    Case("newton", {"tol": 1e-12}, 1e-11, problems=("matrix_sqrt", "two_variables")),
    # A diagonal Jacobian declared as such: the pullback divides by diag(A) instead of solving.
    Case(
        "hybr",
        {"options": {"xtol": 1e-12}},
        1e-11,
        structure="diagonal",
        problems=("arcsin",),
        id="hybr-diagonal",
    ),
    Case(
        "newton",
        {"tol": 1e-12},
        1e-11,
        structure="diagonal",
        problems=("shared_parameter",),
        id="newton-diagonal",
    ),
]

PARAMS = [
    pytest.param(case, by_name(ROOT_PROBLEMS, name), id=f"{case.label}-{name}")
    for case in CASES
    for name in case.problems
]


def solved(case: Case, problem):
    return compiled_solve(("root", case.label), problem, case.solve)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_closed_form(case, problem):
    check_value(solved(case, problem), atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_direct_scipy_call(case, problem):
    c = solved(case, problem)
    x_star, _, _ = c()
    res = _scipy_root(case.scipy_case, problem)
    assert res.success
    for got, expected in zip(x_star, _reference(problem).flat.unpack(res.x), strict=True):
        assert_allclose(got, expected, rtol=0, atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_closed_form(case, problem):
    # Exact at x*; at x̂ the error is ≲ (a few)·‖x̂ − x*‖.
    check_gradient_closed_form(solved(case, problem), atol=10 * case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_finite_differences(case, problem):
    # Step 1e-4 on O(1) parameters: truncation h²·|L'''|/6 ≲ 1e-8 (the largest, ~5e-9, on
    # matrix_sqrt); the solver error x_tol/h ≲ 1e-7 in the worst case and cancels between the
    # ±h solves in practice.
    check_gradient_finite_differences(solved(case, problem), step=1e-4, atol=2e-8)


def test_parameter_scaling_a_vanishing_equation_has_zero_gradient():
    problem = by_name(ROOT_PROBLEMS, "disconnected")
    _, _, grads = solved(HYBR, problem)()
    # ∂F/∂d and ∂F/∂e are multiples of (x − a), zero at x* = a.
    assert abs(grads["d"]) < 1e-12
    assert abs(grads["e"]) < 1e-12


def test_gradient_at_a_singular_jacobian_is_nan_not_an_error():
    p, q, a = pt.scalar("p"), pt.scalar("q"), pt.scalar("a")
    # hybr finds the root (a, 0) exactly and reports success, but ∂F/∂x = diag(1, 3q²) is
    # singular there: the implicit derivative is undefined and should come out as NaN. (With
    # the detected diagonal layout the two equations decouple and dp*/da = 1 is well defined,
    # so the dense solve is asked for explicitly.)
    (p_star, _), success = pmo.root([p - a, q**3], [p, q], x0=[0.0, 0.0], structure="dense")
    fn = pytensor.function([a], [p_star, success, pt.grad(p_star, a)])
    p_value, success_value, grad = fn(1.5)
    assert p_value == 1.5 and success_value
    assert np.isnan(grad)


# --------------------------------------------------------------------------------------------
# the direct scipy reference
# --------------------------------------------------------------------------------------------


class _Reference:
    """The problem's equations on one flat vector z (and their Jacobian), compiled on first use."""

    def __init__(self, problem):
        self.flat = FlatProblem(problem.build())
        equations = self.flat.built.output
        equations = equations if isinstance(equations, list) else [equations]
        self.F = pt.concatenate([e.ravel() for e in self.flat.rewrite(equations)])

    @cached_property
    def equations(self):
        return self.flat.compile(self.F)

    @cached_property
    def equations_and_jac(self):
        return self.flat.compile([self.F, jacobian(self.F, self.flat.z)])


_REFERENCES: dict[str, _Reference] = {}


def _reference(problem) -> _Reference:
    if problem.name not in _REFERENCES:
        _REFERENCES[problem.name] = _Reference(problem)
    return _REFERENCES[problem.name]


def _scipy_root(case: Case, problem):
    """scipy.optimize.root on the same equations, written on one flat vector."""
    ref = _reference(problem)
    values = problem.values
    z0 = ref.flat.pack(numeric_x0(ref.flat.built, values))
    sign = -1.0 if case.negate else 1.0
    if case.jac and case.method in ("hybr", "lm"):

        def fun(z):
            F, J = ref.equations_and_jac(values, z)
            return sign * F, sign * J

        return optimize.root(fun, z0, method=case.method, jac=True, **case.optimizer_kwargs)
    return optimize.root(
        lambda z: sign * ref.equations(values, z), z0, method=case.method, **case.optimizer_kwargs
    )


# --------------------------------------------------------------------------------------------
# sizes known only at run time
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["hybr", "lm", "broyden1", "newton"])
@pytest.mark.parametrize("n_equations", [2, 4])
def test_equations_of_another_size_at_run_time_give_success_false(method, n_equations):
    # 3 unknowns; the equations' size comes from `a`, known only at run time. hybr raised
    # scipy's TypeError from `perform`, and lm solved 4 equations as least squares.
    x, a = pt.vector("x"), pt.vector("a")
    x_star, success = pmo.root(x[:1].sum() + x.sum() - a, x, x0=np.zeros(3), method=method)
    fn = pytensor.function([a], [x_star, success])
    x_value, ok = fn(np.arange(1.0, n_equations + 1))
    assert not ok
    assert x_value.shape == (3,)


# --------------------------------------------------------------------------------------------
# success is decided on the residual at the returned point
# --------------------------------------------------------------------------------------------


def test_hybr_solving_a_linear_system_to_rounding_is_a_success():
    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(4, 4)), rng.normal(size=4)
    # scipy's own verdict on this system: "not making good progress", at a residual of 2e-16
    reference = optimize.root(lambda z: (A @ z - b, A), np.zeros(4), jac=True, method="hybr")
    assert not reference.success and np.abs(A @ reference.x - b).max() < 1e-14
    x, A_var, b_var = pt.vector("x"), pt.matrix("A"), pt.vector("b")
    x_star, success = pmo.root(A_var @ x - b_var, x, x0=np.zeros(4))
    x_value, ok = pytensor.function([A_var, b_var], [x_star, success])(A, b)
    assert ok
    assert_allclose(x_value, np.linalg.solve(A, b), rtol=1e-12)


def test_lm_at_a_minimum_of_the_squares_that_is_no_root_is_a_failure():
    x, a = pt.vector("x"), pt.scalar("a")
    # x₀² + 1 = 0 has no solution: lm stops at x₀ = 0, |F| = 1, and scipy reports success
    x_star, success = pmo.root(pt.stack([x[0] ** 2 + 1.0, x[1] - a]), x, x0=np.ones(2), method="lm")
    x_value, ok = pytensor.function([a], [x_star, success])(2.0)
    assert not ok
    assert_allclose(x_value, [0.0, 2.0], atol=1e-6)
